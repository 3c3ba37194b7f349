"""What the refiner costs per request on the served engine: the base alone, and base + refiner from a switch.

    python -m bench --only refiner

The engine is the bench's checkpoint and size with the tiny refiner of the tests (tests/fixtures/tiny-refiner, made
by scripts/make_refiner_fixtures.py: its UNet is smaller than the tiny base's) loaded with `--refiner`; requests with
`refiner_switch` 1 (no refiner), 0.8 and 0.5 are interleaved, so a load change on the machine spreads over all of
them. Per-request milliseconds are `generate`'s wall time; the compilations counted while timing must be 0. On CPU
with the tiny models the refiner's step costs what its small UNet costs, so the ratio here is not SDXL's at 1024²
(refiner 1.0's UNet is 2.3 B parameters, the base's 2.6 B).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..common import Progress, interleaved_seconds, progress
from .millis import Millis

REPO = Path(__file__).resolve().parents[2]
REFINER = REPO / "tests" / "fixtures" / "tiny-refiner"
PROMPT = "a photo of an astronaut riding a horse on the moon"
SWITCHES = (1.0, 0.8, 0.5)


@dataclass(frozen=True)
class RefinerRow:
    switch: float  # the request's refiner_switch (1: the base alone)
    request: Millis  # `Generator.generate`
    vs_base: float  # median / the base-alone median


@dataclass(frozen=True)
class RefinerCost:
    size: str  # width×height
    steps: int
    devices: int
    warmup_s: float  # the engine's compile + first run, with the refiner's programs
    rows: list[RefinerRow]
    compiles: int  # programs compiled while the requests ran (0: nothing compiles per request)


def refiner_cost(config, runs: int, say: Progress = progress) -> RefinerCost:
    """An engine of `config` with the fixture refiner; interleaved requests at each switch of SWITCHES."""
    from ..engine import Generator

    generator = Generator.load(dataclasses.replace(config, refiner=str(REFINER)))
    warm = generator.warmup()
    requests = {switch: generator.request(PROMPT, seed=5, refiner_switch=switch) for switch in SWITCHES}
    seconds, compiles = interleaved_seconds(generator, requests, runs)
    base = Millis.of_seconds(seconds[1.0]).median
    rows = [
        RefinerRow(switch, Millis.of_seconds(s), Millis.of_seconds(s).median / base) for switch, s in seconds.items()
    ]
    say(
        "refiner: "
        + ", ".join(f"switch {r.switch:g} {r.request.median:.0f} ms ({r.vs_base:.2f}×)" for r in rows)
        + f"; {compiles} compilations"
    )
    height, width = generator.sizes[0]
    return RefinerCost(
        f"{width}×{height}",
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
        f"## Refiner: requests with refiner_switch 1 (base alone), 0.8, 0.5 ({cost['size']}, {cost['steps']} "
        f"steps, {cost['devices']} devices; {cost['compiles']} compilations while timing)",
        "",
        "| refiner_switch | request ms, median (p90; min–max) | vs base alone |",
        "|---|---|---|",
    ]
    for row in cost["rows"]:
        request = row["request"]
        lines.append(
            f"| {row['switch']:g} | {request['median']:.0f} (p90 {request['p90']:.0f}; "
            f"{request['min']:.0f}–{request['max']:.0f}) | {row['vs_base']:.2f}× |"
        )
    return lines
