"""`python -m bench accelerator --peer torch`: the engine against diffusers' PyTorch `StableDiffusionXLPipeline`,
eager and `torch.compile`d, on the same architectures, size, steps and guidance, interleaved in one process tree.

The PyTorch pipeline runs in bench/accelerator/torch_worker.py, started with `--torch-python` (default: the bench's own
python) and spoken to in the reference worker's JSON lines (bench/cpu/reference.py's `ReferenceWorker`). torch is in no
requirements file and nothing here imports it: where that python cannot import torch, diffusers and transformers, the
part says so in one line and is skipped. The worker builds its networks from the configs the engine's model has (SDXL
base 1.0's from bench/accelerator/flops.py, or the tiny checkpoint's config.json files with `--model tiny`) with random
weights made on its device, in the engine's dtype; the tokenizers are the tiny checkpoint's, as the engine's, and the
prompts go in as text. After each mode's untimed warm-up calls (`WARMUP_CALLS`: two eager, three compile, whose first
compiles), the calls run interleaved: engine, eager, compile, engine, eager, compile, ... Ratios are engine / mode in
seconds per image (lower: the engine is faster).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..common import Progress, Stats, import_failure, progress, timed
from ..cpu.reference import GUIDANCE, NEGATIVE, PROMPT, ReferenceWorker

MODES = ("eager", "compile")
#: Untimed calls per mode before the timed ones: compile's first call compiles. On this CPU the first two calls of
#: either mode took 4-8 s where the next took 0.2-0.3 s (the tiny networks at 64², 2 steps), so two more of each.
WARMUP_CALLS = {"eager": 2, "compile": 3}
WORKER = Path(__file__).resolve().parent / "torch_worker.py"
#: What the worker imports; a python without them skips the part.
NEEDS = ("torch", "diffusers", "transformers")


class TorchWorker(ReferenceWorker):
    """diffusers' PyTorch pipeline in bench/accelerator/torch_worker.py, run by `python`."""

    script = WORKER
    name = "torch worker"


def torch_missing(python: str) -> str | None:
    """None when `python` imports torch, diffusers and transformers; else the sentence saying why it cannot."""
    return import_failure(python, f"import {', '.join(NEEDS)}", ", ".join(NEEDS))


def torch_spec(model: str, dtype: str, tiny_dir: Path, scheduler_config: dict) -> dict:
    """The worker's load request: the networks' configs (SDXL's, or with `model` "tiny" the tiny checkpoint's own
    config.json files), the tiny checkpoint's tokenizers, the engine's Euler scheduler config, and the dtype."""
    if model == "tiny":
        configs = {
            name: json.loads((tiny_dir / name / "config.json").read_text())
            for name in ("unet", "vae", "text_encoder", "text_encoder_2")
        }
    else:
        from .flops import SDXL_TEXT_2_CONFIG, SDXL_TEXT_CONFIG, SDXL_UNET_CONFIG, SDXL_VAE_CONFIG

        configs = {
            "unet": SDXL_UNET_CONFIG,
            "vae": SDXL_VAE_CONFIG,
            "text_encoder": SDXL_TEXT_CONFIG,
            "text_encoder_2": SDXL_TEXT_2_CONFIG,
        }
    return {
        **configs,
        "dtype": dtype,
        "modes": list(MODES),
        "tokenizer": str(tiny_dir / "tokenizer"),
        "tokenizer_2": str(tiny_dir / "tokenizer_2"),
        "scheduler_config": dict(scheduler_config),
    }


def engine_vs_torch(generator, spec: dict, python: str, runs: int, say: Progress = progress) -> dict:
    """Each mode's warm-up, then `runs` interleaved rounds (engine, then each mode), as a JSON-ready dict."""
    config = generator.config
    kwargs = {
        "prompt": PROMPT,
        "negative_prompt": NEGATIVE,
        "guidance_scale": GUIDANCE,
        "steps": config.steps,
        "height": config.height,
        "width": config.width,
    }

    def engine_call(seed: int):
        return generator.generate(
            generator.request(PROMPT, negative_prompt=NEGATIVE, guidance_scale=GUIDANCE, seed=seed)
        )

    say(f"accelerator: starting diffusers' PyTorch pipeline ({', '.join(MODES)}) with {python} ...")
    started = time.perf_counter()
    with TorchWorker(spec, Path(python)) as worker:
        load_s = time.perf_counter() - started
        warmup = {}
        for mode in MODES:
            warmup[mode] = [worker.call(mode=mode, seed=0, **kwargs)["wall_s"] for _ in range(WARMUP_CALLS[mode])]
            say(f"accelerator: torch {mode} warm-up: {', '.join(f'{s:.1f}' for s in warmup[mode])} s")
        engine_call(0)
        engine_s: list[float] = []
        mode_s: dict[str, list[float]] = {mode: [] for mode in MODES}
        cpu_s: dict[str, list[float]] = {mode: [] for mode in MODES}
        images = {}
        for run in range(runs):
            seed = 1000 + run
            engine_s.append(timed(lambda seed=seed: engine_call(seed))[0])
            for mode in MODES:
                answer = worker.call(mode=mode, seed=seed, **kwargs)
                mode_s[mode].append(answer["wall_s"])
                cpu_s[mode].append(answer["cpu_s"])
                images[mode] = answer["images"]
            say(
                f"  run {run + 1}/{runs}: engine {engine_s[-1]:.3f} s, "
                + ", ".join(f"torch {mode} {mode_s[mode][-1]:.3f} s" for mode in MODES)
            )
        device, packages = worker.ready.get("device"), worker.packages
    engine = Stats.of(engine_s)
    per_image = engine.median / generator.num_images
    modes = {}
    for mode in MODES:
        stats = Stats.of(mode_s[mode])
        ratio = per_image / (stats.median / images[mode])
        modes[mode] = {
            "seconds": mode_s[mode],
            "median_s": stats.median,
            "images_per_call": images[mode],
            "cpu_s": cpu_s[mode],
            "warmup_s": warmup[mode],
            "engine_over_mode": ratio,
            "pair_ratios": [
                e / generator.num_images / (m / images[mode]) for e, m in zip(engine_s, mode_s[mode], strict=True)
            ],
        }
        say(
            f"accelerator: engine {engine.median:.3f} s, torch {mode} {stats.median:.3f} s per request: "
            f"engine / torch {mode} = {ratio:.3f} per image"
        )
    return {
        "python": python,
        "device": device,
        "packages": packages,
        "dtype": spec["dtype"],
        "load_s": load_s,
        "engine": {"seconds": engine_s, "median_s": engine.median, "images_per_call": generator.num_images},
        "modes": modes,
    }
