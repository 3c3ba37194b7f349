"""Reference images for FreeU and perturbed-attention guidance, from diffusers' PyTorch SDXL pipelines (needs torch;
never run by CI).

    /work/torchenv/bin/python scripts/make_freeu_pag_fixtures.py [ENGINE_SITE_PACKAGES]

(ENGINE_SITE_PACKAGES: where JAX is, for the engine's noise; default the project's .venv.)

On tests/fixtures/tiny-pt (float32, 64x64, Euler, leading), each case starts from the engine's own initial noise for
its seed (`device/denoise.initial_latents`, passed as `latents=`), as scripts/make_speed_fixtures.py does:
- `freeu`: `StableDiffusionXLPipeline` after `enable_freeu(b1=1.3, b2=1.4, s1=0.9, s2=0.2)`;
- `pag_cfg`, `pag_no_cfg`: `StableDiffusionXLPAGPipeline` with `pag_applied_layers=["mid"]`, PAG scale 3, at
  guidance 5 (uncond, cond, perturbed) and 1 (cond, perturbed), the latter with `pag_adaptive_scale=0.001` (the
  scale lowered on the early steps, as the host's plan does);
- `freeu_pag`: the PAG pipeline of `pag_cfg` after the same `enable_freeu`: both at once (the engine's
  ProgramKey.extras ("freeu", "pag") step);
- `plain`: the base pipeline alone, the request with both off.
Every case is the same prompt and seed, so each shows what its feature changes.
Writes tests/fixtures/freeu-pag-expected.npz (images float32 [1, 64, 64, 3] in [0, 1], and each case's noise) and
.json (the cases, the scheduler, the versions).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FIXTURES = REPO / "tests" / "fixtures"
CHECKPOINT = FIXTURES / "tiny-pt"
ENGINE_SITE_PACKAGES = REPO / ".venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
SIZE = 64
FREEU = {"b1": 1.3, "b2": 1.4, "s1": 0.9, "s2": 0.2}
PROMPT = "a lighthouse on a cliff at dusk"
#: (name, pipeline, negative prompt, guidance, steps, pag_scale, pag_adaptive_scale, freeu, seed)
CASES = [
    ("plain", "base", "blurry", 5.0, 4, 0.0, 0.0, False, 7),
    ("freeu", "base", "blurry", 5.0, 4, 0.0, 0.0, True, 7),
    ("pag_cfg", "pag", "blurry", 5.0, 4, 3.0, 0.0, False, 7),
    ("pag_no_cfg", "pag", None, 1.0, 4, 3.0, 0.001, False, 7),
    ("freeu_pag", "pag", "blurry", 5.0, 4, 3.0, 0.0, True, 7),
]


def engine_noise(seed: int) -> np.ndarray:
    """The engine's standard-normal initial noise for `seed`: float32 [1, 4, 8, 8]."""
    from pipeline.device.denoise import initial_latents

    return np.array(initial_latents(np.asarray([seed], np.uint32), SIZE, SIZE, 8), np.float32)


def run_case(pipes: dict, case) -> np.ndarray:
    name, kind, negative, guidance, steps, pag_scale, pag_adaptive_scale, freeu, seed = case
    pipe = pipes[kind]
    if freeu:
        pipe.enable_freeu(**FREEU)
    kwargs = dict(
        prompt=PROMPT,
        negative_prompt=negative,
        num_inference_steps=steps,
        guidance_scale=guidance,
        height=SIZE,
        width=SIZE,
        latents=torch.from_numpy(engine_noise(seed)),
        output_type="np",
    )
    if kind == "pag":
        kwargs.update(pag_scale=pag_scale, pag_adaptive_scale=pag_adaptive_scale)
    try:
        with torch.no_grad():
            return np.asarray(pipe(**kwargs).images, np.float32)  # [1, 64, 64, 3]
    finally:
        if freeu:
            pipe.disable_freeu()


def main() -> None:
    if len(sys.argv) > 1:
        sys.path.append(sys.argv[1])
    else:
        sys.path.append(str(ENGINE_SITE_PACKAGES))
    import diffusers
    from diffusers import StableDiffusionXLPAGPipeline, StableDiffusionXLPipeline

    base = StableDiffusionXLPipeline.from_pretrained(str(CHECKPOINT), torch_dtype=torch.float32)
    pag = StableDiffusionXLPAGPipeline.from_pipe(base, pag_applied_layers=["mid"])
    for pipe in (base, pag):
        pipe.set_progress_bar_config(disable=True)
    arrays, cases = {}, []
    for case in CASES:
        print(case[0])
        arrays[case[0]] = run_case({"base": base, "pag": pag}, case)
        arrays[f"{case[0]}/noise"] = engine_noise(case[-1])
        names = ("name", "pipeline", "negative_prompt", "guidance_scale", "steps", "pag_scale", "pag_adaptive_scale")
        cases.append({**dict(zip(names, case, strict=False)), "prompt": PROMPT, "freeu": case[-2], "seed": case[-1]})
    manifest = {
        "what": "diffusers' PyTorch StableDiffusionXLPipeline (enable_freeu) and StableDiffusionXLPAGPipeline "
        "(pag_applied_layers=['mid']) on tests/fixtures/tiny-pt (float32, 64x64)",
        "freeu": FREEU,
        "images": "npz key = case name, float32 [1, 64, 64, 3] in [0, 1]; '<case>/noise': the engine's noise",
        "scheduler": dict(base.scheduler.config),
        "cases": cases,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__},
    }
    np.savez_compressed(FIXTURES / "freeu-pag-expected.npz", **arrays)
    (FIXTURES / "freeu-pag-expected.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    print(f"wrote {FIXTURES / 'freeu-pag-expected.npz'} and .json")


if __name__ == "__main__":
    main()
