"""How long the served programs of `python app.py --model tiny` take to trace and lower (no XLA compile).

    python -m bench.cpu.tracing                   # the tiny server's 43 programs: its three sizes, 2 CPU devices
    python -m bench.cpu.tracing --runs 3

Why apart from start-up (bench/cpu/lifecycle.py): a cold start is tracing plus XLA's compile, and the two answer to
different levers. Tracing is Python: flax applying the networks under JAX's tracer, once per program, size and
variant, on any accelerator alike (the H200's start-up traced its 14 programs for 71 s). It is what
nets/layers.py halved by reading stored weights without flax's per-trace shape check.
"""

from __future__ import annotations

import argparse
import os
import time

from ..common import configure_platform


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu.tracing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="times every program is traced again (default 1)")
    parser.add_argument("--cpu-devices", type=int, default=2, help="CPU devices, as app.py's default (2)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_platform(args.cpu_devices)
    from ..engine import Generator, offered_sizes, resolve_model, shape_defaults

    height, width, steps = shape_defaults("tiny")  # as app.py --model tiny: its sizes, steps and dtype
    generator = Generator.from_pretrained(
        resolve_model("tiny"),
        height=height,
        width=width,
        steps=steps,
        dtype="float32",
        sizes=tuple(offered_sizes(None, tiny=True)),
    )
    keys = generator.program_keys()
    for run in range(1, args.runs + 1):
        started = time.perf_counter()
        for key in keys:
            generator.programs.lower(key)
        load = os.getloadavg()[0]
        print(
            f"run {run}: {len(keys)} programs traced and lowered in {time.perf_counter() - started:.1f} s "
            f"(load average {load:.1f})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
