"""Regenerate the ControlNet Union fixtures from diffusers' PyTorch classes (needs torch; never run by CI).

    /work/torchenv/bin/python scripts/make_controlnet_union_fixtures.py [ENGINE_SITE_PACKAGES]

(ENGINE_SITE_PACKAGES: where JAX is, for the engine's noise; default the project's .venv.)

What it writes under tests/fixtures/:
- controlnet-union/: a tiny ControlNet Union (ProMax's 8 control types) made like `ControlNetUnionModel.from_unet`
  of tests/fixtures/tiny-pt's UNet, its union transformer as wide as the UNet's first block (32 channels, 2 heads:
  diffusers' 320 only fits SDXL's 320-channel conv_in), every weight perturbed (the zero convolutions and the
  zero-initialised channel projection too) and rounded to float16, saved as `config.json` +
  `diffusion_pytorch_model.fp16.safetensors`.
- controlnet-union-expected.npz + .json:
  - module parity: the residuals on fixed random inputs (CFG batch of 2) with one condition (canny, scale 0.8) and
    with two (canny 0.8 + tile 0.6): `module_<case>_*` keys;
  - pixels: diffusers' `StableDiffusionXLControlNetUnionPipeline` on tiny-pt (float32, 64x64, Euler, the engine's
    per-seed noise): canny alone, and canny + tile in one pass.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

FIXTURES = REPO / "tests" / "fixtures"
ENGINE_SITE_PACKAGES = REPO / ".venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
CHECKPOINT = FIXTURES / "tiny-pt"
SIZE = 64
PROMPT = "a cozy cabin in a snowy forest, warm light"
NAME = "controlnet-union"
CANNY, TILE = 3, 6  # ProMax's indices
#: (name, control modes, maps ("map": controlnet-map-a.png, "tile": the fitted picture), scales, steps, seed)
CASES = [("canny", [CANNY], ["map"], [0.8], 3, 1234), ("canny_tile", [CANNY, TILE], ["map", "tile"], [0.8, 0.6], 3, 5)]


def make_union():
    from diffusers import ControlNetUnionModel, UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(str(CHECKPOINT / "unet"), torch_dtype=torch.float32)
    torch.manual_seed(21)
    shaped = ControlNetUnionModel.from_unet(unet, load_weights_from_unet=False)
    width = unet.config.block_out_channels[0]
    config = {key: value for key, value in shaped.config.items() if not key.startswith("_")}  # no defaults list
    config.update(num_control_type=8, num_trans_channel=width, num_trans_head=2, num_proj_channel=width)
    net = ControlNetUnionModel.from_config({**config, "conditioning_embedding_out_channels": [16, 16, 32, 32]})
    net.conv_in.load_state_dict(unet.conv_in.state_dict())
    net.time_embedding.load_state_dict(unet.time_embedding.state_dict())
    net.down_blocks.load_state_dict(unet.down_blocks.state_dict(), strict=False)
    net.mid_block.load_state_dict(unet.mid_block.state_dict(), strict=False)
    generator = torch.Generator().manual_seed(21)
    with torch.no_grad():
        for param in net.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    target = FIXTURES / NAME
    if target.exists():
        shutil.rmtree(target)
    net.to(torch.float16).save_pretrained(target, variant="fp16", safe_serialization=True)
    for file in target.iterdir():
        file.chmod(0o644)
    return ControlNetUnionModel.from_pretrained(str(target), variant="fp16", torch_dtype=torch.float32).eval()


def maps() -> dict:
    fitted = np.load(FIXTURES / "image-expected.npz")["fit_image"]  # 64x64 init picture
    return {"map": Image.open(FIXTURES / "controlnet-map-a.png").convert("RGB"), "tile": Image.fromarray(fitted, "RGB")}


def module_outputs(net) -> dict:
    """The residuals on the same fixed inputs (CFG batch of 2) per case, at the case's scales."""
    rng = np.random.default_rng(7)
    config = net.config
    text_dim = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
    inputs = {
        "sample": rng.standard_normal((2, 4, SIZE // 8, SIZE // 8)).astype(np.float32),
        "timesteps": np.array([501.0, 501.0], np.float32),
        "hidden": rng.standard_normal((2, 77, config.cross_attention_dim)).astype(np.float32),
        "text_embeds": rng.standard_normal((2, text_dim)).astype(np.float32),
        "time_ids": np.array([[SIZE, SIZE, 0, 0, SIZE, SIZE]] * 2, np.float32),
        "controls": rng.uniform(0, 1, (2, 2, 3, SIZE, SIZE)).astype(np.float32),  # [slot, batch, 3, H, W]
    }
    arrays = {f"module_input_{k}": v for k, v in inputs.items()}
    t = {k: torch.from_numpy(v) for k, v in inputs.items()}
    for name, modes, _, scales, _, _ in CASES:
        control_type = torch.zeros(config.num_control_type).scatter_(0, torch.tensor(modes), 1)
        with torch.no_grad():
            down, mid = net(
                t["sample"],
                t["timesteps"],
                t["hidden"],
                [t["controls"][i] for i in range(len(modes))],
                control_type.reshape(1, -1).repeat(2, 1),
                modes,
                conditioning_scale=scales,
                added_cond_kwargs={"text_embeds": t["text_embeds"], "time_ids": t["time_ids"]},
                return_dict=False,
            )
        for i, residual in enumerate(down):
            arrays[f"module_{name}_down_{i}"] = residual.numpy()  # [2, C, h, w]
        arrays[f"module_{name}_mid"] = mid.numpy()
    return arrays


def reference_images(net) -> tuple[dict, list]:
    from diffusers import StableDiffusionXLControlNetUnionPipeline
    from diffusers.pipelines.controlnet import pipeline_controlnet_union_sd_xl as module
    from diffusers.schedulers import scheduling_euler_ancestral_discrete as ancestral_module
    from make_image_fixtures import patched
    from make_torch_fixtures import scheduler_for

    pipe = StableDiffusionXLControlNetUnionPipeline.from_pretrained(
        str(CHECKPOINT), controlnet=net, torch_dtype=torch.float32, add_watermarker=False
    )
    pipe.scheduler = scheduler_for(pipe.scheduler.config, "euler", "leading")
    pictures = maps()
    arrays, cases = {}, []
    for name, modes, map_names, scales, steps, seed in CASES:
        placeholder = not hasattr(module, "retrieve_latents")
        if placeholder:
            module.retrieve_latents = print  # never called: a callable for `patched` to wrap
        engine, restore = patched(module, seed, ancestral_module)
        try:
            with torch.no_grad():
                image = pipe(
                    prompt=PROMPT,
                    control_image=[pictures[m] for m in map_names],
                    control_mode=modes,
                    controlnet_conditioning_scale=scales,
                    num_inference_steps=steps,
                    guidance_scale=6.5,
                    height=SIZE,
                    width=SIZE,
                    output_type="np",
                ).images
        finally:
            restore()
            if placeholder:
                del module.retrieve_latents
        assert engine.noise_calls == 1, name
        arrays[name] = np.round(np.asarray(image, np.float64) * 255).astype(np.uint8)
        cases.append(
            {
                "name": name,
                "control_modes": modes,
                "maps": map_names,
                "scales": scales,
                "steps": steps,
                "seed": seed,
                "guidance_scale": 6.5,
                "prompt": PROMPT,
                "sampler": "euler",
            }
        )
        print(f"{name}: done")
    return arrays, cases


def main() -> None:
    import diffusers

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        import jax  # noqa: F401
    except ImportError:
        sys.path.append(str(Path(sys.argv[1] if len(sys.argv) > 1 else ENGINE_SITE_PACKAGES)))

    net = make_union()
    arrays = module_outputs(net)
    images, cases = reference_images(net)
    arrays.update(images)
    np.savez_compressed(FIXTURES / "controlnet-union-expected.npz", **arrays)
    manifest = {
        "what": "diffusers' PyTorch ControlNetUnionModel and StableDiffusionXLControlNetUnionPipeline on "
        "tests/fixtures/tiny-pt with the tiny controlnet-union (float32, 64x64, Euler, the engine's per-seed noise); "
        "scripts/make_controlnet_union_fixtures.py",
        "height": SIZE,
        "width": SIZE,
        "arrays": {
            "module_input_*": "the fixed inputs of the module check (NCHW; controls [slot, batch, 3, H, W])",
            "module_<case>_down_<i>, module_<case>_mid": "float32 [2, C, h, w]: the residuals at the case's scales",
            "<case>": "uint8 [1, 64, 64, 3]: round(the pipeline's float32 image x 255)",
        },
        "cases": cases,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__},
    }
    (FIXTURES / "controlnet-union-expected.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print("wrote the ControlNet Union fixtures under", FIXTURES)


if __name__ == "__main__":
    main()
