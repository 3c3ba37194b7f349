"""Regenerate the SDXL refiner fixtures from diffusers' PyTorch classes (needs torch; never run by CI).

    /work/torchenv/bin/python scripts/make_refiner_fixtures.py [ENGINE_SITE_PACKAGES]

(ENGINE_SITE_PACKAGES: where JAX is, for the engine's noise; default the project's .venv.)

What it writes under tests/fixtures/:
- tiny-refiner/: a tiny SDXL refiner in diffusers' layout, as `stabilityai/stable-diffusion-xl-refiner-1.0` is
  (`StableDiffusionXLImg2ImgPipeline`, no text_encoder/tokenizer, `requires_aesthetics_score`, no zeroed empty
  negative prompt): text_encoder_2 + tokenizer_2 are tests/fixtures/tiny-pt's files byte for byte (the real refiner
  shares the base's CLIP-G, so the engine shares them too); its own UNet with the refiner's config (5 time ids: the
  aesthetic score after the crop, so `projection_class_embeddings_input_dim` = 5 x 8 + 64; down blocks Down,
  CrossAttnDown, Down as the refiner's), every weight perturbed and stored as float16 only
  (`diffusion_pytorch_model.fp16.safetensors`); tiny-pt's VAE (float16 file) and scheduler.
- refiner-expected.npz + .json: diffusers' PyTorch `StableDiffusionXLPipeline(denoising_end=s, output_type="latent")`
  on tiny-pt then `StableDiffusionXLImg2ImgPipeline(denoising_start=s)` on the refiner (with the base's VAE, as
  diffusers' documentation pairs them), float32, 64x64, Euler, the engine's initial noise for the seed; uint8 images
  (round(x 255)).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

FIXTURES = REPO / "tests" / "fixtures"
ENGINE_SITE_PACKAGES = REPO / ".venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
BASE = FIXTURES / "tiny-pt"
TARGET = FIXTURES / "tiny-refiner"
SIZE = 64
SEED = 21
#: The refiner's UNet: SDXL refiner 1.0's structure (Down, CrossAttnDown, ..., Down; 5 time ids), tiny.
UNET = {
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [32, 32, 32],
    "layers_per_block": 1,
    "attention_head_dim": [2, 4, 4],
    "transformer_layers_per_block": [1, 1, 1],
    "norm_num_groups": 32,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 8,
    "use_linear_projection": True,
    "sample_size": 16,
}
#: (name, prompt, negative prompt or None, guidance, steps, switch, aesthetic score, negative aesthetic score, seed)
CASES = [
    ("switch0.5_cfg", "a cozy cabin in a snowy forest, warm light", None, 6.5, 4, 0.5, 6.0, 2.5, 1234),
    ("switch0.75_negative", "a red fox in a green field", "blurry, low quality", 5.0, 8, 0.75, 7.0, 2.0, 77),
    ("switch0.5_no_cfg", "a lighthouse on a cliff at dusk", None, 1.0, 4, 0.5, 6.0, 2.5, 5),
]


def make_refiner():
    from diffusers import StableDiffusionXLImg2ImgPipeline, UNet2DConditionModel

    te2 = json.loads((BASE / "text_encoder_2" / "config.json").read_text())
    torch.manual_seed(SEED)
    unet = UNet2DConditionModel(
        **UNET,
        cross_attention_dim=te2["hidden_size"],
        projection_class_embeddings_input_dim=5 * UNET["addition_time_embed_dim"] + te2["projection_dim"],
    )
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for param in unet.parameters():  # every weight: a freshly initialised UNet zeroes its last convolutions
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    if TARGET.exists():
        shutil.rmtree(TARGET)
    unet.to(torch.float16).save_pretrained(TARGET / "unet", variant="fp16", safe_serialization=True)
    for name in ("text_encoder_2", "tokenizer_2", "scheduler"):
        shutil.copytree(BASE / name, TARGET / name, ignore=shutil.ignore_patterns("*.fp16.*"))
    (TARGET / "vae").mkdir()
    for file in ("config.json", "diffusion_pytorch_model.fp16.safetensors"):
        shutil.copy(BASE / "vae" / file, TARGET / "vae" / file)
    index = {
        "_class_name": StableDiffusionXLImg2ImgPipeline.__name__,
        "_diffusers_version": json.loads((BASE / "model_index.json").read_text())["_diffusers_version"],
        "feature_extractor": [None, None],
        "force_zeros_for_empty_prompt": False,
        "image_encoder": [None, None],
        "requires_aesthetics_score": True,
        "scheduler": ["diffusers", "EulerDiscreteScheduler"],
        "text_encoder": [None, None],
        "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
        "tokenizer": [None, None],
        "tokenizer_2": ["transformers", "CLIPTokenizer"],
        "unet": ["diffusers", "UNet2DConditionModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    }
    (TARGET / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    for file in TARGET.rglob("*"):
        file.chmod(0o755 if file.is_dir() else 0o644)


def reference_images() -> tuple[dict, list]:
    from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline
    from make_torch_fixtures import scheduler_for

    from pipeline.device.denoise import initial_latents

    base = StableDiffusionXLPipeline.from_pretrained(str(BASE), torch_dtype=torch.float32, add_watermarker=False)
    refiner = StableDiffusionXLImg2ImgPipeline.from_pretrained(
        str(TARGET), vae=base.vae, torch_dtype=torch.float32, add_watermarker=False, variant="fp16"
    )
    assert refiner.config.requires_aesthetics_score and not refiner.config.force_zeros_for_empty_prompt
    assert refiner.text_encoder is None and refiner.unet.config.projection_class_embeddings_input_dim == 104
    arrays, cases = {}, []
    for name, prompt, negative, guidance, steps, switch, aesthetic, negative_aesthetic, seed in CASES:
        base.scheduler = scheduler_for(base.scheduler.config, "euler", "leading")
        refiner.scheduler = scheduler_for(base.scheduler.config, "euler", "leading")
        noise = np.asarray(initial_latents(np.array([seed], np.uint32), SIZE, SIZE, 8))  # the engine's [1, 4, 8, 8]
        with torch.no_grad():
            latents = base(
                prompt=prompt,
                negative_prompt=negative,
                num_inference_steps=steps,
                guidance_scale=guidance,
                height=SIZE,
                width=SIZE,
                latents=torch.from_numpy(noise),
                denoising_end=switch,
                output_type="latent",
            ).images
            timesteps = [float(t) for t in base.scheduler.timesteps]  # the whole schedule, both stages'
            image = refiner(
                prompt=prompt,
                negative_prompt=negative,
                image=latents,
                num_inference_steps=steps,
                guidance_scale=guidance,
                denoising_start=switch,
                aesthetic_score=aesthetic,
                negative_aesthetic_score=negative_aesthetic,
                output_type="np",
            ).images
        base_steps = sum(t >= round(1000 - switch * 1000) for t in timesteps)  # diffusers' `denoising_end` cut
        arrays[name] = np.round(np.asarray(image, np.float64) * 255).astype(np.uint8)
        cases.append(
            {
                "name": name,
                "prompt": prompt,
                "negative_prompt": negative,
                "guidance_scale": guidance,
                "steps": steps,
                "refiner_switch": switch,
                "aesthetic_score": aesthetic,
                "negative_aesthetic_score": negative_aesthetic,
                "seed": seed,
                "sampler": "euler",
                "timesteps": timesteps,
                "base_steps": base_steps,
            }
        )
        print(f"{name}: done")
    return arrays, cases


def main() -> None:
    import diffusers
    import transformers

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        import jax  # noqa: F401
    except ImportError:
        sys.path.append(str(Path(sys.argv[1] if len(sys.argv) > 1 else ENGINE_SITE_PACKAGES)))

    make_refiner()
    arrays, cases = reference_images()
    np.savez_compressed(FIXTURES / "refiner-expected.npz", **arrays)
    manifest = {
        "what": "diffusers' PyTorch StableDiffusionXLPipeline(denoising_end=s) on tests/fixtures/tiny-pt, then "
        "StableDiffusionXLImg2ImgPipeline(denoising_start=s) on tests/fixtures/tiny-refiner with the base's VAE "
        "(float32, 64x64, Euler leading, the engine's initial noise for the seed); scripts/make_refiner_fixtures.py",
        "height": SIZE,
        "width": SIZE,
        "arrays": {"<case>": "uint8 [1, 64, 64, 3]: round(the refiner pipeline's float32 image x 255)"},
        "cases": cases,
        "versions": {
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "transformers": transformers.__version__,
        },
    }
    (FIXTURES / "refiner-expected.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print("wrote the refiner fixtures under", FIXTURES)


if __name__ == "__main__":
    main()
