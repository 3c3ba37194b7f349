"""Regenerate the inpaint-only-masked fixtures from diffusers' PyTorch SDXL inpainting pipeline (needs torch; never
run by CI).

    /work/torchenv/bin/python scripts/make_inpaint_modes_fixtures.py [ENGINE_SITE_PACKAGES]

What it writes under tests/fixtures/:
- inpaint-crop-expected.npz + .json: what diffusers' PyTorch `StableDiffusionXLInpaintPipeline` (4-channel UNet,
  tests/fixtures/tiny-pt, float32, 64x64) makes with `padding_mask_crop` (A1111's "Inpaint area: Only masked"): the
  mask's box plus the padding, widened to 1:1, cropped from the picture and the mask, resized to 64x64 ("fill"),
  inpainted, resized back into the box and pasted over the picture (`apply_overlay`). The picture is diffusers' own
  fit of tests/fixtures/image-input.png to 64x64 (`fit_image`); the mask (`mask`, 0/255) is drawn here, off-centre
  so the box is a real part of the picture. Also each case's crop box (`get_crop_region`).

The engine's noise and the posterior mean get in as scripts/make_image_fixtures.py does (its `patched`): the
pipeline's own code paths otherwise (get_crop_region, preprocess with crops_coords, the blend, apply_overlay).
ENGINE_SITE_PACKAGES: the engine's packages (JAX) for its per-seed noise, when this environment lacks them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
if len(sys.argv) > 1:
    sys.path.append(sys.argv[1])

FIXTURES = REPO / "tests" / "fixtures"
CHECKPOINT = FIXTURES / "tiny-pt"
EXPECTED = FIXTURES / "inpaint-crop-expected"
SIZE = 64
PROMPT = "a cozy cabin in a snowy forest, warm light"

#: (name, sampler, steps, strength, guidance, seed, padding)
CASES = [
    ("only_masked_euler_s0.75_pad8", "euler", 4, 0.75, 6.5, 1234, 8),
    ("only_masked_euler_s1_pad4", "euler", 4, 1.0, 6.5, 77, 4),
]


def mask_image() -> Image.Image:
    """A 64x64 mask, white = repaint: a tilted blob right of centre (its box 18x14 pixels)."""
    mask = Image.new("L", (SIZE, SIZE), 0)
    ImageDraw.Draw(mask).ellipse((36, 20, 54, 34), fill=255)
    return mask


def references() -> tuple[dict, dict]:
    import diffusers
    from diffusers import StableDiffusionXLInpaintPipeline
    from diffusers.pipelines.stable_diffusion_xl import pipeline_stable_diffusion_xl_inpaint as inpaint_module
    from diffusers.schedulers import scheduling_euler_ancestral_discrete as ancestral_module
    from make_image_fixtures import INPUT_IMAGE, patched
    from make_torch_fixtures import scheduler_for

    pipe = StableDiffusionXLInpaintPipeline.from_pretrained(
        str(CHECKPOINT), torch_dtype=torch.float32, add_watermarker=False
    )
    assert pipe.unet.config.in_channels == 4
    base_config = pipe.scheduler.config
    fitted = pipe.image_processor.resize(Image.open(INPUT_IMAGE).convert("RGB"), SIZE, SIZE, resize_mode="crop")
    mask = mask_image()
    arrays = {"fit_image": np.asarray(fitted, np.uint8), "mask": np.asarray(mask, np.uint8)}
    cases = []
    for name, sampler, steps, strength, guidance, seed, padding in CASES:
        pipe.scheduler = scheduler_for(base_config, sampler, "leading")
        engine, restore = patched(inpaint_module, seed, ancestral_module)
        try:
            with torch.no_grad():
                image = pipe(
                    prompt=PROMPT,
                    image=fitted,
                    mask_image=mask,
                    height=SIZE,
                    width=SIZE,
                    strength=strength,
                    num_inference_steps=steps,
                    guidance_scale=guidance,
                    padding_mask_crop=padding,
                    output_type="pil",  # apply_overlay takes PIL images
                ).images[0]
        finally:
            restore()
        assert engine.noise_calls == 1, (name, engine.noise_calls)
        box = pipe.mask_processor.get_crop_region(mask, SIZE, SIZE, pad=padding)
        arrays[name] = np.asarray(image, np.uint8)[None]  # [1, 64, 64, 3]
        cases.append(
            {
                "name": name,
                "sampler": sampler,
                "steps": steps,
                "strength": strength,
                "guidance_scale": guidance,
                "seed": seed,
                "padding_mask_crop": padding,
                "crop_box": [int(v) for v in box],
                "prompt": PROMPT,
            }
        )
        print(f"{name}: box {box}")
    manifest = {
        "what": "diffusers' PyTorch StableDiffusionXLInpaintPipeline with padding_mask_crop on tests/fixtures/tiny-pt "
        "(float32, 64x64), posterior mean, the engine's per-seed noise; scripts/make_inpaint_modes_fixtures.py",
        "height": SIZE,
        "width": SIZE,
        "arrays": {
            "fit_image": "uint8 [64, 64, 3]: VaeImageProcessor.resize(image-input.png, 64, 64, resize_mode='crop')",
            "mask": "uint8 [64, 64]: the mask, 255 = repaint",
            "<case>": "uint8 [1, 64, 64, 3]: the pipeline's PIL output (apply_overlay's)",
        },
        "cases": cases,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__},
    }
    return arrays, manifest


def main() -> None:
    arrays, manifest = references()
    np.savez_compressed(EXPECTED.with_suffix(".npz"), **arrays)
    EXPECTED.with_suffix(".json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    print(f"wrote {EXPECTED.name}.npz/.json")


if __name__ == "__main__":
    main()
