"""Regenerate tests/fixtures/tiny-pt (a PyTorch-format tiny SDXL checkpoint) and its reference outputs.

Needs torch, so it runs only in a separate environment, never in CI or at run time:

    /work/torchenv/bin/python scripts/make_torch_fixtures.py                      # writes tests/fixtures/
    /work/torchenv/bin/python scripts/make_torch_fixtures.py --sdxl-unet-shapes   # assets/sdxl_unet_pt_shapes.json
    /work/torchenv/bin/python scripts/make_torch_fixtures.py --references-only    # only the reference images

What it writes (all from diffusers' and transformers' PYTORCH classes, torch-seeded):
- tests/fixtures/tiny-pt/: `StableDiffusionXLPipeline.save_pretrained(safe_serialization=True)` of a checkpoint with
  exactly the geometry, configs and tokenizers of `checkpoint/tiny.py` (the Flax tiny checkpoint is built first and
  its configs reused); float32 weights, a `fp16` variant of every component, and the float32 UNet sharded
  (`*.safetensors.index.json`). Its scheduler is SDXL base's (EulerDiscreteScheduler, leading, steps_offset=1).
- tests/fixtures/tiny-pt-from-pt.json: sha256 (and shape) of every leaf of the Flax parameters that the libraries'
  own torch-based conversion gives (`Flax*.from_pretrained(..., from_pt=True)`), for an exact leaf-by-leaf check
  without committing a second copy of the weights.
- tests/fixtures/tiny-pt-expected.npz + .json: images from diffusers' PyTorch `StableDiffusionXLPipeline` for fixed
  initial latents (float32, 64x64): leading spacing with classifier-free guidance, with no negative prompt (None:
  PyTorch then uses zero embeddings, as the engine does for an empty negative) and with one; and, for the sampler
  work, trailing spacing with guidance 0 (no CFG) at 2 and 4 steps; for the host loop's samplers, DPM++ 2M with and
  without Karras sigmas at 8 steps with CFG. The latents, prompts and settings are saved too.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FIXTURES = REPO / "tests" / "fixtures"
CHECKPOINT = FIXTURES / "tiny-pt"
SEED = 0
#: Shard size for the float32 UNet (12 MB): a few shards and an index file.
UNET_SHARD_SIZE = "5MB"
FLAX_ONLY_KEYS = {"split_head_dim", "use_memory_efficient_attention", "dtype"}

#: Reference generations: (name, prompt, negative prompt or None, guidance, steps, timestep_spacing, sampler).
CASES = [
    ("leading_cfg_no_negative", "a cozy cabin in a snowy forest, warm light", None, 6.5, 2, "leading", "euler"),
    (
        "leading_cfg_negative",
        "a cozy cabin in a snowy forest, warm light",
        "blurry, low quality",
        6.5,
        2,
        "leading",
        "euler",
    ),
    ("trailing_no_cfg_2_steps", "a red fox in a green field", None, 0.0, 2, "trailing", "euler"),
    ("trailing_no_cfg_4_steps", "a red fox in a green field", None, 0.0, 4, "trailing", "euler"),
    # The host loop's samplers: DPMSolverMultistepScheduler (dpmsolver++, order 2), 8 steps with CFG.
    (
        "dpmpp_2m_karras_cfg_8_steps",
        "a lighthouse on a cliff at dusk",
        "blurry, low quality",
        6.5,
        8,
        "leading",
        "dpmpp_2m_karras",
    ),
    ("dpmpp_2m_cfg_8_steps", "a lighthouse on a cliff at dusk", None, 6.5, 8, "leading", "dpmpp_2m"),
]
SIZE = 64
LATENT_SEED = 1234


def _config(path: Path) -> dict:
    config = json.loads(path.read_text())
    return {k: v for k, v in config.items() if not k.startswith("_") and k not in FLAX_ONLY_KEYS}


def _perturb(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Give every 1-D parameter (biases, norm scales) random values, so no two leaves are equal by construction."""
    with torch.no_grad():
        for param in module.parameters():
            if param.ndim == 1:
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)


def build_pipeline(flax_dir: Path):
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    unet = UNet2DConditionModel.from_config(_config(flax_dir / "unet" / "config.json"))
    vae = AutoencoderKL.from_config(_config(flax_dir / "vae" / "config.json"))
    text_encoder = CLIPTextModel(CLIPTextConfig.from_pretrained(flax_dir / "text_encoder"))
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig.from_pretrained(flax_dir / "text_encoder_2"))
    for module in (unet, vae, text_encoder, text_encoder_2):
        _perturb(module, generator)
        module.eval()
    scheduler_config = _config(flax_dir / "scheduler" / "scheduler_config.json")
    scheduler = EulerDiscreteScheduler(
        **scheduler_config, steps_offset=1, interpolation_type="linear", use_karras_sigmas=False
    )
    return StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=CLIPTokenizer.from_pretrained(flax_dir / "tokenizer"),
        tokenizer_2=CLIPTokenizer.from_pretrained(flax_dir / "tokenizer_2"),
        unet=unet,
        scheduler=scheduler,
    )


def save_checkpoint(pipe, target: Path, scratch: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    pipe.save_pretrained(target, safe_serialization=True)
    # The float32 UNet, sharded.
    (target / "unet" / "diffusion_pytorch_model.safetensors").unlink()
    pipe.unet.save_pretrained(target / "unet", safe_serialization=True, max_shard_size=UNET_SHARD_SIZE)
    # The fp16 variant: saved elsewhere (so the float32 configs stay as they are) and only its weights copied in.
    half = scratch / "fp16"
    copy.deepcopy(pipe).to(torch.float16).save_pretrained(half, safe_serialization=True, variant="fp16")
    for file in half.glob("*/*.fp16.safetensors"):
        shutil.copy(file, target / file.parent.name / file.name)


def flax_from_pt_digests(pipe, scratch: Path) -> dict:
    """The libraries' own torch-based conversion, reduced to a sha256 per leaf (float32 bytes)."""
    from diffusers import FlaxAutoencoderKL, FlaxUNet2DConditionModel
    from flax.traverse_util import flatten_dict
    from transformers import FlaxCLIPTextModel, FlaxCLIPTextModelWithProjection

    params = {}
    for name, flax_class in (("unet", FlaxUNet2DConditionModel), ("vae", FlaxAutoencoderKL)):
        directory = scratch / f"bin-{name}"
        getattr(pipe, name).save_pretrained(directory, safe_serialization=False)  # diffusers' from_pt reads .bin
        _, params[name] = flax_class.from_pretrained(directory, from_pt=True)
    for name, flax_class in (("text_encoder", FlaxCLIPTextModel), ("text_encoder_2", FlaxCLIPTextModelWithProjection)):
        directory = scratch / f"bin-{name}"
        getattr(pipe, name).save_pretrained(directory, safe_serialization=False)
        params[name] = flax_class.from_pretrained(directory, from_pt=True).params
    digests = {}
    for name, tree in params.items():
        leaves = {}
        for path, leaf in sorted(flatten_dict(tree, sep="/").items()):
            array = np.ascontiguousarray(np.asarray(leaf, dtype=np.float32))
            leaves[path] = {"shape": list(array.shape), "sha256": hashlib.sha256(array.tobytes()).hexdigest()}
        digests[name] = leaves
    return digests


def scheduler_for(config, sampler: str, spacing: str):
    """diffusers' PyTorch scheduler for one of the engine's samplers, from the checkpoint's scheduler config."""
    from diffusers import DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler, EulerDiscreteScheduler

    if sampler.startswith("dpmpp_2m"):
        return DPMSolverMultistepScheduler.from_config(
            config,
            timestep_spacing=spacing,
            algorithm_type="dpmsolver++",
            solver_order=2,
            use_karras_sigmas=sampler == "dpmpp_2m_karras",
        )
    cls = EulerAncestralDiscreteScheduler if sampler == "euler_ancestral" else EulerDiscreteScheduler
    return cls.from_config(config, timestep_spacing=spacing)


def reference_images(pipe) -> tuple[dict, dict]:
    latent_shape = (1, 4, SIZE // 8, SIZE // 8)
    latents = np.random.default_rng(LATENT_SEED).standard_normal(latent_shape).astype(np.float32)  # [1, 4, 8, 8]
    base_scheduler = pipe.scheduler
    arrays = {"latents": latents}
    cases = []
    for name, prompt, negative, guidance, steps, spacing, sampler in CASES:
        pipe.scheduler = scheduler_for(base_scheduler.config, sampler, spacing)
        with torch.no_grad():
            image = pipe(
                prompt=prompt,
                negative_prompt=negative,
                num_inference_steps=steps,
                guidance_scale=guidance,
                height=SIZE,
                width=SIZE,
                latents=torch.from_numpy(latents),
                output_type="np",
            ).images  # float32 [1, 64, 64, 3] in [0, 1]
        arrays[name] = np.asarray(image, np.float32)
        cases.append(
            {
                "name": name,
                "prompt": prompt,
                "negative_prompt": negative,
                "guidance_scale": guidance,
                "steps": steps,
                "timestep_spacing": spacing,
                "sampler": sampler,
                "timesteps": [float(t) for t in pipe.scheduler.timesteps],
            }
        )
    pipe.scheduler = base_scheduler
    manifest = {
        "what": "diffusers' PyTorch StableDiffusionXLPipeline on tests/fixtures/tiny-pt (float32), fixed latents",
        "height": SIZE,
        "width": SIZE,
        "latents": "npz key 'latents', float32 [1, 4, 8, 8] (before scaling by init_noise_sigma)",
        "images": "npz key = case name, float32 [1, 64, 64, 3] in [0, 1]",
        "scheduler": dict(base_scheduler.config),
        "cases": cases,
        "versions": {"torch": torch.__version__, **_versions()},
    }
    return arrays, manifest


def _versions() -> dict:
    import diffusers
    import transformers

    return {"diffusers": diffusers.__version__, "transformers": transformers.__version__}


def sdxl_unet_shapes() -> None:
    """assets/sdxl_unet_pt_shapes.json: SDXL UNet's PyTorch names and shapes (meta device: nothing allocated)."""
    from diffusers import UNet2DConditionModel

    config = json.loads((REPO / "assets" / "sdxl_unet_config.json").read_text())
    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config({k: v for k, v in config.items() if not k.startswith("_")})
    shapes = {name: list(tensor.shape) for name, tensor in unet.state_dict().items()}
    what = (
        "PyTorch state_dict names and shapes of SDXL base's UNet (assets/sdxl_unet_config.json), "
        "from UNet2DConditionModel on the meta device (scripts/make_torch_fixtures.py --sdxl-unet-shapes)"
    )
    (REPO / "assets" / "sdxl_unet_pt_shapes.json").write_text(json.dumps({"what": what, "shapes": shapes}))


def main() -> None:
    if "--sdxl-unet-shapes" in sys.argv[1:]:
        sdxl_unet_shapes()
        return
    if "--references-only" in sys.argv[1:]:  # keep the committed checkpoint; only (re)compute the images
        from diffusers import StableDiffusionXLPipeline

        pipe = StableDiffusionXLPipeline.from_pretrained(str(CHECKPOINT), torch_dtype=torch.float32)
        arrays, manifest = reference_images(pipe)
        np.savez(FIXTURES / "tiny-pt-expected.npz", **arrays)
        (FIXTURES / "tiny-pt-expected.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        print(f"wrote the references of {CHECKPOINT} under {FIXTURES}")
        return
    from pipeline.checkpoint.tiny import make_tiny

    with tempfile.TemporaryDirectory(prefix="torch-fixtures-") as tmp:
        scratch = Path(tmp)
        flax_dir = make_tiny(scratch / "flax", seed=SEED)
        pipe = build_pipeline(flax_dir)
        save_checkpoint(pipe, CHECKPOINT, scratch)
        digests = flax_from_pt_digests(pipe, scratch)
    (FIXTURES / "tiny-pt-from-pt.json").write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    arrays, manifest = reference_images(pipe)
    np.savez(FIXTURES / "tiny-pt-expected.npz", **arrays)
    (FIXTURES / "tiny-pt-expected.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    print(f"wrote {CHECKPOINT} and its references under {FIXTURES}")


if __name__ == "__main__":
    main()
