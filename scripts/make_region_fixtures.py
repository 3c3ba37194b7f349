"""Regenerate the regional prompts' fixtures from diffusers' PyTorch SDXL pipeline (needs torch; never run by CI).

    /work/torchenv/bin/python scripts/make_region_fixtures.py [ENGINE_SITE_PACKAGES]

(ENGINE_SITE_PACKAGES: where JAX is, for the engine's noise; default the project's .venv.)

What it writes under tests/fixtures/: region-expected.npz + .json, what diffusers' `StableDiffusionXLPipeline` makes
on tests/fixtures/tiny-pt (float32, 64x64, Euler, the engine's per-seed noise, as scripts/make_image_fixtures.py feeds
it) when every cross-attention processor of its UNet does Regional Prompter's Attention-mode blend
(`RegionalProcessor`, below, written here from the rule, not from the engine's code):

- the prompt's parts (split on BREAK) are encoded one by one by the pipeline's own `encode_prompt` and laid side by
  side ([1, P*77, 2048]); the pooled embeds are the first part's; the negative prompt's states are the same for
  every part (encoded once, repeated);
- each cross-attention runs to_q once, and for each part to_k, to_v, the attention and to_out, then blends the
  parts' outputs per cell of its own grid: a cell belongs to a region when its centre lies inside it, overlaps are
  averaged, and with base ratio r > 0 the first part is the base: r·base + (1 − r)·regions, the base alone where
  no region is;
- cases: `columns 1,1` with r = 0 (two regions), `columns 1,2` with r = 0.3 (the base and two regions), and one
  part with r = 0, which must equal the plain pipeline (also stored, `plain`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

FIXTURES = REPO / "tests" / "fixtures"
#: The engine's noise needs JAX, which the torch environment lacks: the project's venv is read after torch's own.
ENGINE_SITE_PACKAGES = REPO / ".venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
CHECKPOINT = FIXTURES / "tiny-pt"
SIZE = 64
WINDOW = 77
NEGATIVE = "blurry, dark"
#: (name, prompt parts, regions as (top, left, bottom, right) boxes, base ratio, steps, guidance, seed, divide syntax)
CASES = [
    (
        "columns_1_1",
        ["a red apple on a table", "a blue sky with clouds"],
        [(0.0, 0.0, 1.0, 0.5), (0.0, 0.5, 1.0, 1.0)],
        0.0,
        4,
        6.5,
        1234,
        "columns 1,1",
    ),
    (
        "columns_1_2_base0.3",
        ["a cozy cabin in a snowy forest", "a red fox", "a green pine tree"],
        [(0.0, 0.0, 1.0, 1 / 3), (0.0, 1 / 3, 1.0, 1.0)],
        0.3,
        4,
        6.5,
        77,
        "columns 1,2",
    ),
    ("one_part", ["a cozy cabin in a snowy forest, warm light"], [(0.0, 0.0, 1.0, 1.0)], 0.0, 4, 6.5, 5, "columns 1"),
]


def blend_weights(boxes, base: float, side: int) -> torch.Tensor:
    """float32 [parts, side*side]: each part's share of each cell of a square grid (see the module's rule)."""
    centres = (torch.arange(side, dtype=torch.float64) + 0.5) / side
    y, x = torch.meshgrid(centres, centres, indexing="ij")
    cover = torch.stack(
        [((top <= y) & (y < bottom) & (left <= x) & (x < right)).flatten() for top, left, bottom, right in boxes]
    ).double()
    held = cover.sum(0)
    shares = cover / held.clamp(min=1)
    if base > 0:
        weights = torch.cat([torch.where(held > 0, base, 1.0)[None], (1 - base) * shares])
    else:
        weights = shares.clone()
        weights[0] += (held == 0).double()
    return weights.float()


class RegionalProcessor:
    """A cross-attention processor blending the text's parts (77 tokens each) by region; self-attention as usual."""

    def __init__(self, boxes, base: float):
        self.boxes, self.base = boxes, base

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kwargs):
        assert encoder_hidden_states is not None and attention_mask is None
        batch, cells, _ = hidden_states.shape
        heads = attn.heads
        query = attn.to_q(hidden_states)
        head_dim = query.shape[-1] // heads

        def split(x):  # [B, L, heads*d] -> [B, heads, L, d]
            return x.view(batch, -1, heads, head_dim).transpose(1, 2)

        outputs = []
        for part in range(encoder_hidden_states.shape[1] // WINDOW):
            context = encoder_hidden_states[:, part * WINDOW : (part + 1) * WINDOW]
            out = F.scaled_dot_product_attention(split(query), split(attn.to_k(context)), split(attn.to_v(context)))
            out = out.transpose(1, 2).reshape(batch, cells, heads * head_dim)
            outputs.append(attn.to_out[1](attn.to_out[0](out)))
        weights = blend_weights(self.boxes, self.base, int(round(cells**0.5)))  # [P, cells]
        assert weights.shape[0] == len(outputs)
        return sum(w[None, :, None] * out for w, out in zip(weights, outputs, strict=True))


def side_by_side(pipe, parts: list[str]):
    """The parts' text states side by side, the first part's pooled embeds, the negative prompt's per part."""
    encoded = [
        pipe.encode_prompt(part, device="cpu", do_classifier_free_guidance=True, negative_prompt=NEGATIVE)
        for part in parts
    ]
    prompt = torch.cat([states for states, _, _, _ in encoded], dim=1)  # [1, P*77, 2048]
    negative = torch.cat([encoded[0][1]] * len(parts), dim=1)
    return {
        "prompt_embeds": prompt,
        "negative_prompt_embeds": negative,
        "pooled_prompt_embeds": encoded[0][2],
        "negative_pooled_prompt_embeds": encoded[0][3],
    }


def reference_images() -> tuple[dict, list]:
    from diffusers import StableDiffusionXLPipeline
    from diffusers.models.attention_processor import AttnProcessor2_0
    from diffusers.pipelines.stable_diffusion_xl import pipeline_stable_diffusion_xl as txt2img_module
    from diffusers.schedulers import scheduling_euler_ancestral_discrete as ancestral_module
    from make_image_fixtures import patched
    from make_torch_fixtures import scheduler_for

    pipe = StableDiffusionXLPipeline.from_pretrained(str(CHECKPOINT), torch_dtype=torch.float32, add_watermarker=False)
    pipe.scheduler = scheduler_for(pipe.scheduler.config, "euler", "leading")
    arrays, cases = {}, []
    txt2img_module.retrieve_latents = print  # never called: a callable for `patched` to wrap
    for name, parts, boxes, base, steps, guidance, seed, divide in CASES:
        for regional in (True, False) if name == "one_part" else (True,):
            processors = {
                key: RegionalProcessor(boxes, base) if regional and "attn2" in key else AttnProcessor2_0()
                for key in pipe.unet.attn_processors
            }
            pipe.unet.set_attn_processor(processors)
            with torch.no_grad():
                texts = side_by_side(pipe, parts)
            engine, restore = patched(txt2img_module, seed, ancestral_module)
            try:
                with torch.no_grad():
                    image = pipe(
                        **texts,
                        num_inference_steps=steps,
                        guidance_scale=guidance,
                        height=SIZE,
                        width=SIZE,
                        output_type="np",
                    ).images  # float32 [1, 64, 64, 3] in [0, 1]
            finally:
                restore()
            assert engine.noise_calls == 1, name
            key = name if regional else "plain"
            arrays[key] = np.round(np.asarray(image, np.float64) * 255).astype(np.uint8)
        cases.append(
            {
                "name": name,
                "prompt": " BREAK ".join(parts),
                "negative_prompt": NEGATIVE,
                "regions": divide,
                "region_base": base,
                "steps": steps,
                "guidance_scale": guidance,
                "seed": seed,
                "sampler": "euler",
            }
        )
        print(f"{name}: done")
    del txt2img_module.retrieve_latents
    return arrays, cases


def main() -> None:
    import diffusers

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        import jax  # noqa: F401
    except ImportError:
        sys.path.append(str(Path(sys.argv[1] if len(sys.argv) > 1 else ENGINE_SITE_PACKAGES)))
    arrays, cases = reference_images()
    np.savez_compressed(FIXTURES / "region-expected.npz", **arrays)
    manifest = {
        "what": "diffusers' PyTorch StableDiffusionXLPipeline on tests/fixtures/tiny-pt with Regional Prompter's "
        "Attention-mode blend in every cross-attention processor (float32, 64x64, Euler, the engine's per-seed "
        "noise); scripts/make_region_fixtures.py",
        "height": SIZE,
        "width": SIZE,
        "arrays": {
            "<case>": "uint8 [1, 64, 64, 3]: round(the pipeline's float32 image x 255)",
            "plain": "one_part's settings on the pipeline's own processors",
        },
        "cases": cases,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__},
    }
    (FIXTURES / "region-expected.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print("wrote the regional prompt fixtures under", FIXTURES)


if __name__ == "__main__":
    main()
