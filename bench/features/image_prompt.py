"""What an image prompt (IP-Adapter) costs per request on this machine: requests with 0, 1 and 2 image prompts, and
the `image_prompt` program (encoder, projection, every layer's image keys and values) alone.

    python -m bench.features.image_prompt                          # tiny-pt + the fixture adapters, 64², 4 steps
    python -m bench.features.image_prompt --devices 1 --repeats 20

Every program is compiled first (warm-up, untimed). Then, interleaved `--repeats` times: a request without an image
prompt; with one (a new picture each time: its table is made, as a first request with it); with the same one again
(its table kept: `host/image_prompt_tables.py`); with two (new pictures). The medians are printed with the
compilations counted while timing (must be 0). On this project's tiny checkpoint the figures say what the image
prompt adds to a step program's launch and the table program, not what SDXL's 16 or 4 image tokens cost per step.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def _picture(seed: int) -> bytes:
    pixels = (np.random.default_rng(seed).random((48, 40, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8, help="CPU devices (XLA's host platform device count)")
    parser.add_argument("--size", type=int, default=64, help="the image side in pixels")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds")
    args = parser.parse_args(argv)

    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.devices}")
    import jax  # heavy: after XLA_FLAGS is set (the CPU device count is read when JAX starts)

    from ..engine import CompileCounter, Generator, ProgramKey  # heavy: imports JAX

    adapters = FIXTURES / "ip-adapter"
    engine = Generator.from_pretrained(
        str(FIXTURES / "tiny-pt"),
        devices=jax.devices()[: args.devices],
        height=args.size,
        width=args.size,
        steps=args.steps,
        ip_adapters=(str(adapters / "ip-adapter_tiny.safetensors"), str(adapters / "ip-adapter-plus_tiny.safetensors")),
    )
    started = time.perf_counter()
    engine.warmup()
    warmup_s = time.perf_counter() - started
    fixed = _picture(0)
    cases = {
        "none": lambda i: [],
        "one": lambda i: [{"image": _picture(1000 + i), "adapter": "ip-adapter_tiny"}],
        "one, kept": lambda i: [{"image": fixed, "adapter": "ip-adapter_tiny"}],
        "two": lambda i: [
            {"image": _picture(2000 + i), "adapter": "ip-adapter_tiny"},
            {"image": _picture(3000 + i), "adapter": "ip-adapter-plus_tiny"},
        ],
    }
    for case in cases.values():  # untimed: the first run's transfers
        engine.generate(engine.request("a lighthouse", seed=1, ip_images=case(-1)))
    program = engine.programs.compile(ProgramKey("image_prompt"))
    weights = engine.programs.weights(ProgramKey("image_prompt"), engine._params)
    slots = np.zeros((2, engine.config.ip_slots), np.float32)
    slots[0, 0] = 1.0
    side = engine.programs.modules.image_encoder.config.image_size
    pixels = np.zeros((engine.config.ip_slots, 3, side, side), np.float32)
    put = engine.placement.put
    jax.block_until_ready(program(weights, put(pixels), put(slots)))
    compiles = CompileCounter.compiles()
    seconds: dict[str, list[float]] = {name: [] for name in (*cases, "image_prompt program")}
    for i in range(args.repeats):
        for name, case in cases.items():
            request = engine.request("a lighthouse", seed=1, ip_images=case(i))
            started = time.perf_counter()
            engine.generate(request)
            seconds[name].append(time.perf_counter() - started)
        started = time.perf_counter()
        jax.block_until_ready(program(weights, put(pixels), put(slots)))
        seconds["image_prompt program"].append(time.perf_counter() - started)
    device = jax.devices()[0]
    print(
        f"tiny-pt, {args.size}², {args.steps} steps, {args.devices} × {device.platform} ({device.device_kind}), "
        f"{engine.config.ip_slots} slots, warm-up {warmup_s:.0f} s; medians of {args.repeats}:"
    )
    base = statistics.median(seconds["none"])
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"  {name:22s} {median * 1e3:8.1f} ms  ({median / base:.2f}× none)")
    print(f"compiles while timing: {CompileCounter.compiles() - compiles}")


if __name__ == "__main__":
    main()
