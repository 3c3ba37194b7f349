"""What ControlNet costs per request on the served engine: 0, 1 and 2 ControlNets.

    python -m bench --only controlnet

The engine is the bench's checkpoint and size with the two tiny ControlNets of the tests (tests/fixtures/controlnet-a
and -b, `ControlNetModel.from_unet` of the tiny UNet: they fit the `tiny` checkpoint's geometry) loaded with
`--controlnet`; requests without a ControlNet, with one (weight 1, every step) and with two are interleaved, so a load
change on the machine spreads over all three. Per-request milliseconds are `generate`'s wall time. On CPU with the
tiny model a ControlNet is about the size of the UNet's encoder half, so its cost here is not a TPU's at 1024²
(`python -m bench tpu --kinds step_control` gives that).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..common import Progress, interleaved_seconds, progress
from .millis import Millis

REPO = Path(__file__).resolve().parents[2]
NETS = (REPO / "tests" / "fixtures" / "controlnet-a", REPO / "tests" / "fixtures" / "controlnet-b")
MAPS = (REPO / "tests" / "fixtures" / "controlnet-map-a.png", REPO / "tests" / "fixtures" / "controlnet-map-b.png")
PROMPT = "a photo of an astronaut riding a horse on the moon"


@dataclass(frozen=True)
class ControlNetRow:
    controlnets: int  # units in the request
    request: Millis  # `Generator.generate`
    vs_none: float  # median / the no-ControlNet median


@dataclass(frozen=True)
class ControlNetCost:
    size: str  # width×height
    steps: int
    devices: int
    warmup_s: float  # the engine's compile + first run, with the step_control programs
    rows: list[ControlNetRow]
    compiles: int  # programs compiled while the requests ran (0: nothing compiles per request)


def controlnet_cost(config, runs: int, say: Progress = progress) -> ControlNetCost:
    """An engine of `config` with both fixture ControlNets; interleaved requests with 0, 1 and 2 of them."""
    from ..engine import Generator

    generator = Generator.load(dataclasses.replace(config, controlnets=tuple(str(net) for net in NETS)))
    warm = generator.warmup()
    units = [{"name": net.name, "image": image, "weight": 1.0} for net, image in zip(NETS, MAPS, strict=True)]
    requests = {count: generator.request(PROMPT, seed=5, controlnets=units[:count]) for count in (0, 1, 2)}
    seconds, compiles = interleaved_seconds(generator, requests, runs)
    base = Millis.of_seconds(seconds[0]).median
    rows = [
        ControlNetRow(count, Millis.of_seconds(s), Millis.of_seconds(s).median / base) for count, s in seconds.items()
    ]
    say(
        "controlnet: "
        + ", ".join(f"{r.controlnets} ControlNet(s) {r.request.median:.0f} ms ({r.vs_none:.2f}×)" for r in rows)
        + f"; {compiles} compilations"
    )
    height, width = generator.sizes[0]
    return ControlNetCost(
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
        f"## ControlNet: requests with 0, 1, 2 ControlNets ({cost['size']}, {cost['steps']} steps, "
        f"{cost['devices']} devices; {cost['compiles']} compilations while timing)",
        "",
        "| ControlNets | request ms, median (p90; min–max) | vs none |",
        "|---|---|---|",
    ]
    for row in cost["rows"]:
        request = row["request"]
        lines.append(
            f"| {row['controlnets']} | {request['median']:.0f} (p90 {request['p90']:.0f}; "
            f"{request['min']:.0f}–{request['max']:.0f}) | {row['vs_none']:.2f}× |"
        )
    return lines
