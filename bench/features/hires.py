"""What the second pass costs per request on the served engine: the plain request, with the refiner, with a hires
pass, and with both.

    python -m bench --only hires

The engine is the bench's checkpoint and size with `--hires-scales 2` and the tests' tiny refiner
(bench/features/refiner.py); requests with the hires fix off, with "Latent" (bilinear in latent space) and with
"Lanczos" (decode, PIL resize, encode) at ×2 (second pass: as many steps as the first, A1111's denoise 0.55, so they run
on a schedule of steps ÷ 0.55), with the refiner from 0.8 of the steps, and with both (the refiner finishes the second
pass, A1111's default) are interleaved, so a load change on the machine spreads over all of them. Per-request
milliseconds are `generate`'s wall time; the compilations counted while timing must be 0. The second pass runs the UNet
at 4× the pixels, so on SDXL at 1024² the ratio grows with the UNet's share of the time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..common import Progress, interleaved_seconds, progress
from .millis import Millis
from .refiner import REFINER

PROMPT = "a photo of an astronaut riding a horse on the moon"
SCALE = 2.0
#: (label, the request's hires fields)
SWITCH = 0.8
CASES = (
    ("off", {}),
    ("×2 Latent", {"hires_scale": SCALE, "hires_upscaler": "Latent"}),
    ("×2 Lanczos", {"hires_scale": SCALE, "hires_upscaler": "Lanczos"}),
    (f"refiner {SWITCH:g}", {"refiner_switch": SWITCH}),
    (f"×2 Latent + refiner {SWITCH:g}", {"hires_scale": SCALE, "hires_upscaler": "Latent", "refiner_switch": SWITCH}),
)


@dataclass(frozen=True)
class HiresRow:
    case: str  # the hires fix off, or its scale and upscaler
    request: Millis  # `Generator.generate`
    vs_plain: float  # median / the plain request's median


@dataclass(frozen=True)
class HiresCost:
    size: str  # width×height of the first pass
    hires_size: str  # width×height of the second
    steps: int
    devices: int
    warmup_s: float  # the engine's compile + first run, with the hires programs
    rows: list[HiresRow]
    compiles: int  # programs compiled while the requests ran (0: nothing compiles per request)


def hires_cost(config, runs: int, say: Progress = progress) -> HiresCost:
    """An engine of `config` with `--hires-scales 2` and the fixture refiner; interleaved requests of CASES."""
    from ..engine import Generator

    generator = Generator.load(dataclasses.replace(config, hires_scales=(SCALE,), refiner=str(REFINER)))
    warm = generator.warmup()
    requests = {label: generator.request(PROMPT, seed=5, **fields) for label, fields in CASES}
    seconds, compiles = interleaved_seconds(generator, requests, runs)
    plain = Millis.of_seconds(seconds["off"]).median
    rows = [HiresRow(label, Millis.of_seconds(s), Millis.of_seconds(s).median / plain) for label, s in seconds.items()]
    say(
        "hires: "
        + ", ".join(f"{r.case} {r.request.median:.0f} ms ({r.vs_plain:.2f}×)" for r in rows)
        + f"; {compiles} compilations"
    )
    height, width = generator.sizes[0]
    big_height, big_width = generator.hires_sizes[((height, width), SCALE)]
    return HiresCost(
        f"{width}×{height}",
        f"{big_width}×{big_height}",
        generator.config.steps,
        generator.device_count,
        warm["compile_s"] + warm["first_run_s"],
        rows,
        compiles,
    )


def markdown(cost) -> list[str]:
    """The part's table (`cost` as results.json holds it: a dict, or the dataclass)."""
    cost = cost if isinstance(cost, dict) else dataclasses.asdict(cost)
    lines = [
        "",
        f"## Second pass: the plain request, a ×2 hires pass, the refiner, both ({cost['size']} → "
        f"{cost['hires_size']}, "
        f"{cost['steps']} + {cost['steps']} steps, {cost['devices']} devices; {cost['compiles']} compilations "
        "while timing)",
        "",
        "| second pass | request ms, median (p90; min–max) | vs plain |",
        "|---|---|---|",
    ]
    for row in cost["rows"]:
        request = row["request"]
        lines.append(
            f"| {row['case']} | {request['median']:.0f} (p90 {request['p90']:.0f}; "
            f"{request['min']:.0f}–{request['max']:.0f}) | {row['vs_plain']:.2f}× |"
        )
    return lines
