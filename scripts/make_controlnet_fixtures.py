"""Regenerate the ControlNet fixtures from diffusers' PyTorch classes (needs torch; never run by CI).

    /work/torchenv/bin/python scripts/make_controlnet_fixtures.py [ENGINE_SITE_PACKAGES]

(ENGINE_SITE_PACKAGES: where JAX is, for the engine's noise; default the project's .venv.)

What it writes under tests/fixtures/:
- controlnet-a/, controlnet-b/: two tiny SDXL ControlNets made with `ControlNetModel.from_unet` of tests/fixtures/
  tiny-pt's UNet (so they have its transformer depth per block and its `text_time` add-embedding), a small
  conditioning embedding (16, 16, 32, 32), every weight perturbed (the zero convolutions too, or the control would do
  nothing) and rounded to float16, saved as `config.json` + `diffusion_pytorch_model.fp16.safetensors` only (half the
  size; the loader takes the one variant present).
- controlnet-map-a.png, controlnet-map-b.png: 64x64 control maps (white strokes on black, as a canny map looks).
- controlnet-expected.npz + .json:
  - module parity: each ControlNet's residuals on fixed random inputs (`module_*` keys);
  - pixels: diffusers' PyTorch `StableDiffusionXLControlNetPipeline` on tiny-pt (float32, 64x64, Euler, the engine's
    per-seed noise, as scripts/make_image_fixtures.py feeds it): weight 0.8 over all steps; 1.2 over 0.25-0.75;
    two ControlNets at once; and `StableDiffusionXLControlNetImg2ImgPipeline` (posterior mean) at strength 0.75.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

FIXTURES = REPO / "tests" / "fixtures"
#: The engine's noise needs JAX, which the torch environment lacks: the project's venv is read after torch's own.
ENGINE_SITE_PACKAGES = REPO / ".venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
CHECKPOINT = FIXTURES / "tiny-pt"
SIZE = 64
PROMPT = "a cozy cabin in a snowy forest, warm light"
CONDITIONING_CHANNELS = (16, 16, 32, 32)
NETS = {"controlnet-a": 11, "controlnet-b": 12}  # name -> torch seed of its perturbation
MAPS = ("controlnet-map-a.png", "controlnet-map-b.png")
#: (name, pipeline, nets, maps, weights, starts, ends, steps, strength, guidance, seed)
CASES = [
    ("weight0.8", "txt2img", ["controlnet-a"], [0], [0.8], [0.0], [1.0], 4, 1.0, 6.5, 1234),
    ("weight1.2_window", "txt2img", ["controlnet-a"], [0], [1.2], [0.25], [0.75], 4, 1.0, 6.5, 77),
    (
        "two_controlnets",
        "txt2img",
        ["controlnet-a", "controlnet-b"],
        [0, 1],
        [0.8, 0.6],
        [0.0, 0.5],
        [1.0, 1.0],
        4,
        1.0,
        6.5,
        5,
    ),
    ("img2img_s0.75", "img2img", ["controlnet-a"], [1], [1.0], [0.0], [1.0], 4, 0.75, 6.5, 1234),
]


def make_maps() -> None:
    """Two deterministic stroke maps (white on black), the shape of what a canny preprocessor gives."""
    for index, name in enumerate(MAPS):
        image = Image.new("RGB", (SIZE, SIZE), (0, 0, 0))
        draw = ImageDraw.Draw(image)
        if index == 0:
            draw.rectangle((12, 20, 40, 52), outline=(255, 255, 255))
            draw.line((12, 20, 26, 8, 40, 20), fill=(255, 255, 255))
            draw.ellipse((44, 6, 58, 20), outline=(255, 255, 255))
        else:
            draw.line((0, 44, 63, 36), fill=(255, 255, 255), width=2)
            draw.ellipse((18, 10, 46, 38), outline=(255, 255, 255))
        image.save(FIXTURES / name, optimize=True)


def make_controlnet(name: str, seed: int):
    from diffusers import ControlNetModel, UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(str(CHECKPOINT / "unet"), torch_dtype=torch.float32)
    torch.manual_seed(seed)
    net = ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=CONDITIONING_CHANNELS)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in net.parameters():  # every weight, the zero convolutions included
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    target = FIXTURES / name
    if target.exists():
        shutil.rmtree(target)
    net.to(torch.float16).save_pretrained(target, variant="fp16", safe_serialization=True)
    for file in target.iterdir():
        file.chmod(0o644)
    return ControlNetModel.from_pretrained(str(target), variant="fp16", torch_dtype=torch.float32).eval()


def module_outputs(nets: dict) -> dict:
    """Each ControlNet's residuals on the same fixed inputs (CFG batch of 2), scale 1."""
    rng = np.random.default_rng(7)
    config = nets["controlnet-a"].config
    text_dim = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
    inputs = {
        "sample": rng.standard_normal((2, 4, SIZE // 8, SIZE // 8)).astype(np.float32),
        "timesteps": np.array([501.0, 501.0], np.float32),
        "hidden": rng.standard_normal((2, 77, config.cross_attention_dim)).astype(np.float32),
        "text_embeds": rng.standard_normal((2, text_dim)).astype(np.float32),
        "time_ids": np.array([[SIZE, SIZE, 0, 0, SIZE, SIZE]] * 2, np.float32),
        "control": rng.uniform(0, 1, (2, 3, SIZE, SIZE)).astype(np.float32),
    }
    arrays = {f"module_input_{k}": v for k, v in inputs.items()}
    t = {k: torch.from_numpy(v) for k, v in inputs.items()}
    for name, net in nets.items():
        with torch.no_grad():
            down, mid = net(
                t["sample"],
                t["timesteps"],
                t["hidden"],
                t["control"],
                added_cond_kwargs={"text_embeds": t["text_embeds"], "time_ids": t["time_ids"]},
                return_dict=False,
            )
        for i, residual in enumerate(down):
            arrays[f"module_{name}_down_{i}"] = residual.numpy()  # [2, C, h, w]
        arrays[f"module_{name}_mid"] = mid.numpy()
    return arrays


def reference_images(nets: dict) -> tuple[dict, list]:
    from diffusers import StableDiffusionXLControlNetImg2ImgPipeline, StableDiffusionXLControlNetPipeline
    from diffusers.pipelines.controlnet import pipeline_controlnet_sd_xl as txt2img_module
    from diffusers.pipelines.controlnet import pipeline_controlnet_sd_xl_img2img as img2img_module
    from diffusers.schedulers import scheduling_euler_ancestral_discrete as ancestral_module
    from make_image_fixtures import patched
    from make_torch_fixtures import scheduler_for

    base = StableDiffusionXLControlNetPipeline.from_pretrained(
        str(CHECKPOINT), controlnet=nets["controlnet-a"], torch_dtype=torch.float32, add_watermarker=False
    )
    maps = [Image.open(FIXTURES / name).convert("RGB") for name in MAPS]
    fitted = Image.fromarray(np.load(FIXTURES / "image-expected.npz")["fit_image"], "RGB")  # 64x64 init picture
    arrays, cases = {}, []
    for name, kind, net_names, map_ids, weights, starts, ends, steps, strength, guidance, seed in CASES:
        controlnet = [nets[n] for n in net_names] if len(net_names) > 1 else nets[net_names[0]]
        cls, module = (
            (StableDiffusionXLControlNetPipeline, txt2img_module)
            if kind == "txt2img"
            else (StableDiffusionXLControlNetImg2ImgPipeline, img2img_module)
        )
        pipe = cls.from_pipe(base, controlnet=controlnet)
        pipe.scheduler = scheduler_for(base.scheduler.config, "euler", "leading")
        control = [maps[i] for i in map_ids] if len(map_ids) > 1 else maps[map_ids[0]]
        one = len(net_names) == 1
        kwargs = dict(
            prompt=PROMPT,
            num_inference_steps=steps,
            guidance_scale=guidance,
            output_type="np",
            controlnet_conditioning_scale=weights[0] if one else weights,
            control_guidance_start=starts[0] if one else starts,
            control_guidance_end=ends[0] if one else ends,
        )
        if kind == "txt2img":
            kwargs.update(image=control, height=SIZE, width=SIZE)
        else:
            kwargs.update(image=fitted, control_image=control, strength=strength)
        placeholder = not hasattr(module, "retrieve_latents")  # txt2img encodes no picture
        if placeholder:
            module.retrieve_latents = print  # never called: a callable for `patched` to wrap
        engine, restore = patched(module, seed, ancestral_module)
        try:
            with torch.no_grad():
                image = pipe(**kwargs).images  # float32 [1, 64, 64, 3] in [0, 1]
        finally:
            restore()
            if placeholder:
                del module.retrieve_latents
        assert engine.noise_calls == 1, name
        arrays[name] = np.round(np.asarray(image, np.float64) * 255).astype(np.uint8)
        cases.append(
            {
                "name": name,
                "pipeline": cls.__name__,
                "controlnets": net_names,
                "maps": [MAPS[i] for i in map_ids],
                "weights": weights,
                "starts": starts,
                "ends": ends,
                "steps": steps,
                "strength": strength,
                "guidance_scale": guidance,
                "seed": seed,
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

    make_maps()
    nets = {name: make_controlnet(name, seed) for name, seed in NETS.items()}
    arrays = module_outputs(nets)
    images, cases = reference_images(nets)
    arrays.update(images)
    np.savez_compressed(FIXTURES / "controlnet-expected.npz", **arrays)
    manifest = {
        "what": "diffusers' PyTorch SDXL ControlNet pipelines on tests/fixtures/tiny-pt with the tiny ControlNets "
        "controlnet-a/b (float32, 64x64, Euler, the engine's per-seed noise, posterior mean for img2img); "
        "scripts/make_controlnet_fixtures.py",
        "height": SIZE,
        "width": SIZE,
        "arrays": {
            "module_input_*": "the fixed inputs of the module check (NCHW, CFG batch 2)",
            "module_<net>_down_<i>, module_<net>_mid": "float32 [2, C, h, w]: ControlNetModel's residuals, scale 1",
            "<case>": "uint8 [1, 64, 64, 3]: round(the pipeline's float32 image x 255)",
        },
        "cases": cases,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__},
    }
    (FIXTURES / "controlnet-expected.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print("wrote the ControlNet fixtures under", FIXTURES)


if __name__ == "__main__":
    main()
