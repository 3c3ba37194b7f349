"""Regenerate the img2img / inpainting fixtures from diffusers' PyTorch SDXL pipelines (needs torch; never run by CI).

    /work/torchenv/bin/python scripts/make_image_fixtures.py                  # inputs, 9-channel UNet, references
    /work/torchenv/bin/python scripts/make_image_fixtures.py --references-only

What it writes under tests/fixtures/:
- image-input.png (96x80 RGB) and image-mask.png (96x80 greyscale, white = repaint, with a ramp of grey levels
  around the 0.5 threshold): the request inputs, drawn deterministically.
- tiny-pt-inpaint/: a 9-channel inpainting UNet with tiny-pt's geometry (`UNet2DConditionModel`, in_channels 9,
  torch-seeded random weights), only `unet/config.json` + `unet/diffusion_pytorch_model.fp16.safetensors` (fp16
  keeps it at half the size) and a `model_index.json` naming `StableDiffusionXLInpaintPipeline`, as
  diffusers/stable-diffusion-xl-1.0-inpainting-0.1 does. Its other components are tiny-pt's: `assemble_inpaint` links
  them into one checkpoint directory (the tests do the same), loaded with variant "fp16" on both sides.
- image-expected.npz + .json: what diffusers' PyTorch `StableDiffusionXLImg2ImgPipeline` and
  `StableDiffusionXLInpaintPipeline` make on tests/fixtures/tiny-pt (float32, 64x64) from those inputs: img2img
  (Euler at strengths 0.5, 0.75 and 1, Euler a, DPM++ 2M, DPM++ 2M Karras), inpainting with the 4-channel UNet
  (Euler at 0.75 and 1, DPM++ 2M) and with the 9-channel one (Euler at 0.6 and 1, with and without CFG, DPM++ 2M).
  Also diffusers' own fit of the inputs to 64x64 (`VaeImageProcessor.resize(..., resize_mode="crop")`, the mask
  processor's binarized mask and its `interpolate` to latent size), the VAE posterior mean × scaling factor of the
  fitted image, and each case's start latents (scheduler scale) and the timesteps it ran.

How the engine's settings get in without changing the pipelines' code paths:
- the posterior MEAN: the pipelines call `retrieve_latents(...)` with the default sample_mode "sample" and have no
  switch, so the module's `retrieve_latents` is wrapped to pass sample_mode="argmax" (diffusers' own mean branch);
- the engine's noise: the module's `randn_tensor` (called once, in `prepare_latents`) returns the engine's per-seed
  noise (`pipeline.device.denoise.initial_latents`), and for Euler a the scheduler module's `randn_tensor` returns the
  engine's ancestral noise of each step run (`samplers.ancestral_noise`, index = the step's position in the run).
Everything else (preprocess, get_timesteps/set_begin_index, add_noise, the blend, the 9-channel concat, guidance,
decode) is the pipelines' own.
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

FIXTURES = REPO / "tests" / "fixtures"
CHECKPOINT = FIXTURES / "tiny-pt"
INPAINT = FIXTURES / "tiny-pt-inpaint"
INPUT_IMAGE = FIXTURES / "image-input.png"
INPUT_MASK = FIXTURES / "image-mask.png"
EXPECTED = FIXTURES / "image-expected"
SIZE = 64
INPUT_SIZE = (96, 80)  # (width, height): not square, so the fit scales and crops
UNET_SEED = 9
PROMPT = "a cozy cabin in a snowy forest, warm light"

#: (name, pipeline, unet channels, sampler, steps, strength, guidance, seed)
CASES = [
    ("img2img_euler_s0.5", "img2img", 4, "euler", 4, 0.5, 6.5, 1234),
    ("img2img_euler_s0.75", "img2img", 4, "euler", 8, 0.75, 6.5, 77),
    ("img2img_euler_s1", "img2img", 4, "euler", 4, 1.0, 6.5, 1234),
    ("img2img_euler_a_s0.6", "img2img", 4, "euler_ancestral", 5, 0.6, 6.5, 5),
    ("img2img_dpmpp_2m_s0.6", "img2img", 4, "dpmpp_2m", 8, 0.6, 6.5, 1234),
    ("img2img_dpmpp_2m_karras_s0.5", "img2img", 4, "dpmpp_2m_karras", 8, 0.5, 6.5, 21),
    ("inpaint4_euler_s0.75", "inpaint", 4, "euler", 8, 0.75, 6.5, 1234),
    ("inpaint4_euler_s1", "inpaint", 4, "euler", 4, 1.0, 6.5, 1234),
    ("inpaint4_dpmpp_2m_s0.6", "inpaint", 4, "dpmpp_2m", 8, 0.6, 6.5, 3),
    ("inpaint9_euler_s0.6", "inpaint", 9, "euler", 5, 0.6, 6.5, 1234),
    ("inpaint9_euler_s1", "inpaint", 9, "euler", 4, 1.0, 6.5, 1234),
    ("inpaint9_euler_no_cfg_s1", "inpaint", 9, "euler", 4, 1.0, 0.0, 8),
    ("inpaint9_dpmpp_2m_s0.75", "inpaint", 9, "dpmpp_2m", 8, 0.75, 6.5, 1234),
]


# ---- inputs ----------------------------------------------------------------------------------------------------------


def make_inputs() -> None:
    """A small picture (sky gradient, sun, house, ground) and a mask: a white ellipse, a grey ramp across 0.5."""
    width, height = INPUT_SIZE
    y, x = np.mgrid[0:height, 0:width]
    sky = np.stack([40 + x * 1.2, 90 + y * 1.1, 200 - y * 0.8], axis=-1)
    image = Image.fromarray(np.clip(sky, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 56, width, height), fill=(70, 140, 60))
    draw.ellipse((64, 6, 86, 28), fill=(250, 210, 60))
    draw.rectangle((16, 34, 50, 64), fill=(150, 70, 50))
    draw.polygon([(12, 36), (33, 18), (54, 36)], fill=(90, 40, 40))
    image.save(INPUT_IMAGE, optimize=True)
    mask = Image.new("L", INPUT_SIZE, 0)
    draw = ImageDraw.Draw(mask)
    draw.ellipse((10, 14, 58, 70), fill=255)
    ramp = np.asarray(mask).copy()
    ramp[4:12, 60:92] = np.linspace(110, 146, 32).round().astype(np.uint8)[None, :]  # levels around 127.5
    Image.fromarray(ramp, "L").save(INPUT_MASK, optimize=True)


# ---- the 9-channel UNet ----------------------------------------------------------------------------------------------


def make_inpaint_unet() -> None:
    from diffusers import UNet2DConditionModel
    from make_torch_fixtures import _perturb

    config = json.loads((CHECKPOINT / "unet" / "config.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    config["in_channels"] = 9
    torch.manual_seed(UNET_SEED)
    unet = UNet2DConditionModel.from_config(config)
    _perturb(unet, torch.Generator().manual_seed(UNET_SEED))
    if INPAINT.exists():
        shutil.rmtree(INPAINT)
    unet.to(torch.float16).save_pretrained(INPAINT / "unet", variant="fp16", safe_serialization=True)
    for file in (INPAINT / "unet").iterdir():
        file.chmod(0o644)
    index = json.loads((CHECKPOINT / "model_index.json").read_text())
    index["_class_name"] = "StableDiffusionXLInpaintPipeline"
    index["requires_aesthetics_score"] = False
    index["force_zeros_for_empty_prompt"] = True
    (INPAINT / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")


def assemble_inpaint(target: Path) -> Path:
    """tiny-pt with the 9-channel UNet: links to tiny-pt's components, the fixture's UNet and model index."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in CHECKPOINT.iterdir():
        if entry.name not in ("unet", "model_index.json"):
            (target / entry.name).symlink_to(entry.resolve())
    (target / "unet").symlink_to((INPAINT / "unet").resolve())
    shutil.copy(INPAINT / "model_index.json", target / "model_index.json")
    return target


# ---- references ------------------------------------------------------------------------------------------------------


class EngineNoise:
    """Patches the pipeline and scheduler modules so they draw the engine's noise and take the posterior mean."""

    def __init__(self, seed: int):
        from pipeline.device import sampler_update as samplers
        from pipeline.device.denoise import initial_latents

        self.seeds = np.array([seed], np.uint32)
        self.noise = np.asarray(initial_latents(self.seeds, SIZE, SIZE, 8))  # [1, 4, 8, 8]
        self.keys = samplers.ancestral_keys(self.seeds)
        self.ancestral_calls = 0
        self.noise_calls = 0

    def initial(self, shape, generator=None, device=None, dtype=None, layout=None):
        assert tuple(shape) == self.noise.shape, shape
        self.noise_calls += 1
        return torch.from_numpy(self.noise.copy()).to(dtype=dtype)

    def ancestral(self, shape, generator=None, device=None, dtype=None, layout=None):
        from pipeline.device import sampler_update as samplers

        fresh = np.asarray(samplers.ancestral_noise(self.keys, self.ancestral_calls, tuple(shape[1:])))
        self.ancestral_calls += 1
        return torch.from_numpy(fresh).to(dtype=dtype)


def patched(module, seed: int, scheduler_module):
    engine = EngineNoise(seed)
    saved = (module.randn_tensor, module.retrieve_latents, scheduler_module.randn_tensor)
    module.randn_tensor = engine.initial
    module.retrieve_latents = functools.partial(saved[1], sample_mode="argmax")
    scheduler_module.randn_tensor = engine.ancestral

    def restore():
        module.randn_tensor, module.retrieve_latents, scheduler_module.randn_tensor = saved

    return engine, restore


def reference_images(scratch: Path) -> tuple[dict, dict]:
    import diffusers
    import transformers
    from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLInpaintPipeline
    from diffusers.pipelines.stable_diffusion_xl import pipeline_stable_diffusion_xl_img2img as img2img_module
    from diffusers.pipelines.stable_diffusion_xl import pipeline_stable_diffusion_xl_inpaint as inpaint_module
    from diffusers.schedulers import scheduling_euler_ancestral_discrete as ancestral_module
    from make_torch_fixtures import scheduler_for

    dtype = torch.float32
    img2img = StableDiffusionXLImg2ImgPipeline.from_pretrained(
        str(CHECKPOINT), torch_dtype=dtype, add_watermarker=False
    )
    inpaint4 = StableDiffusionXLInpaintPipeline.from_pipe(img2img)
    inpaint9 = StableDiffusionXLInpaintPipeline.from_pretrained(
        str(assemble_inpaint(scratch / "tiny-pt-inpaint")), torch_dtype=dtype, variant="fp16", add_watermarker=False
    )
    assert inpaint9.unet.config.in_channels == 9 and inpaint4.unet.config.in_channels == 4
    base_config = img2img.scheduler.config

    source, source_mask = Image.open(INPUT_IMAGE), Image.open(INPUT_MASK)
    fitted = img2img.image_processor.resize(source.convert("RGB"), SIZE, SIZE, resize_mode="crop")  # PIL 64x64 RGB
    mask = inpaint4.mask_processor.preprocess(source_mask, SIZE, SIZE, resize_mode="crop")  # [1, 1, 64, 64] in {0, 1}
    fitted_mask = Image.fromarray((mask[0, 0].numpy() * 255).astype(np.uint8), "L")  # binarized already
    mask_latents = torch.nn.functional.interpolate(mask, size=(SIZE // 8, SIZE // 8))  # as prepare_mask_latents
    with torch.no_grad():
        pixels = img2img.image_processor.preprocess(fitted)  # [1, 3, 64, 64] in [-1, 1]
        posterior = img2img.vae.encode(pixels).latent_dist
        image_latents = posterior.mode() * img2img.vae.config.scaling_factor  # [1, 4, 8, 8]
    arrays = {
        "fit_image": np.asarray(fitted, np.uint8),  # [64, 64, 3]
        "fit_mask": mask[0, 0].numpy().astype(np.uint8),  # [64, 64], 1 = repaint
        "mask_latents": mask_latents[0].numpy().astype(np.float32),  # [1, 8, 8]
        "image_latents": image_latents.numpy().astype(np.float32),  # [1, 4, 8, 8]
    }
    cases = []
    for name, kind, channels, sampler, steps, strength, guidance, seed in CASES:
        pipe = img2img if kind == "img2img" else (inpaint4 if channels == 4 else inpaint9)
        module = img2img_module if kind == "img2img" else inpaint_module
        pipe.scheduler = scheduler_for(base_config, sampler, "leading")
        engine, restore = patched(module, seed, ancestral_module)
        start = {}
        original_prepare = pipe.prepare_latents

        def capture(*args, _original=original_prepare, _start=start, **kwargs):
            out = _original(*args, **kwargs)
            _start["latents"] = (out[0] if isinstance(out, tuple) else out).detach().clone()
            return out

        pipe.prepare_latents = capture
        timesteps = []

        def on_step(_pipe, _i, t, kwargs, _timesteps=timesteps):
            _timesteps.append(float(t))
            return kwargs

        extra = {"mask_image": fitted_mask, "height": SIZE, "width": SIZE} if kind == "inpaint" else {}
        try:
            with torch.no_grad():
                image = pipe(
                    prompt=PROMPT,
                    image=fitted,
                    strength=strength,
                    num_inference_steps=steps,
                    guidance_scale=guidance,
                    output_type="np",
                    callback_on_step_end=on_step,
                    **extra,
                ).images  # float32 [1, 64, 64, 3] in [0, 1]
        finally:
            restore()
            del pipe.prepare_latents
        assert engine.noise_calls == 1, (name, engine.noise_calls)
        assert engine.ancestral_calls == (len(timesteps) if sampler == "euler_ancestral" else 0), name
        arrays[name] = np.round(np.asarray(image, np.float64) * 255).astype(np.uint8)  # what the 1-level check uses
        arrays[f"start_{name}"] = start["latents"].numpy().astype(np.float32)  # [1, 4, 8, 8], scheduler scale
        cases.append(
            {
                "name": name,
                "pipeline": type(pipe).__name__,
                "unet_channels": channels,
                "sampler": sampler,
                "steps": steps,
                "strength": strength,
                "guidance_scale": guidance,
                "seed": seed,
                "prompt": PROMPT,
                "negative_prompt": None,
                "timesteps_run": timesteps,
                "scheduler_class": type(pipe.scheduler).__name__,
            }
        )
        print(f"{name}: {len(timesteps)} steps run, timesteps {timesteps}")
    manifest = {
        "what": "diffusers' PyTorch SDXL img2img/inpainting pipelines on tests/fixtures/tiny-pt (float32, 64x64), "
        "posterior mean (sample_mode='argmax'), the engine's per-seed noise; scripts/make_image_fixtures.py",
        "height": SIZE,
        "width": SIZE,
        "inputs": {"image": INPUT_IMAGE.name, "mask": INPUT_MASK.name, "size": list(INPUT_SIZE)},
        "inpaint_checkpoint": "tiny-pt with tiny-pt-inpaint/unet, variant fp16 for every component",
        "arrays": {
            "fit_image": "uint8 [64, 64, 3]: VaeImageProcessor.resize(image, 64, 64, resize_mode='crop')",
            "fit_mask": "uint8 [64, 64]: mask_processor.preprocess(mask, 64, 64, resize_mode='crop'), 1 = repaint",
            "mask_latents": "float32 [1, 8, 8]: interpolate(mask, (8, 8)) (nearest), as prepare_mask_latents",
            "image_latents": "float32 [1, 4, 8, 8]: tiny-pt VAE posterior mean x scaling_factor of fit_image",
            "<case>": "uint8 [1, 64, 64, 3]: round(the pipeline's float32 image in [0, 1] x 255)",
            "start_<case>": "float32 [1, 4, 8, 8]: prepare_latents' output (the scheduler's scale: DPM's is VP)",
        },
        "scheduler": dict(base_config),
        "cases": cases,
        "versions": {
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "transformers": transformers.__version__,
        },
    }
    return arrays, manifest


def main() -> None:
    if "--references-only" not in sys.argv[1:]:
        make_inputs()
        make_inpaint_unet()
    with tempfile.TemporaryDirectory(prefix="image-fixtures-") as tmp:
        arrays, manifest = reference_images(Path(tmp))
    np.savez_compressed(EXPECTED.with_suffix(".npz"), **arrays)
    EXPECTED.with_suffix(".json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    print(f"wrote {INPUT_IMAGE.name}, {INPUT_MASK.name}, {INPAINT.name}/ and {EXPECTED.name}.npz/.json")


if __name__ == "__main__":
    main()
