"""What the request features cost on the served engine: LoRA sets, image inputs, and the speed levers.

    python -m bench --only lora       # merge program compile; ms per request after a LoRA switch vs with the same set
    python -m bench --only img2img    # ms per request: text to image vs image to image (0.5, 1.0) vs inpainting
    python -m bench --only levers     # ms per request: cfg_end {1, 0.5} x deepcache {1, 2, 3} at --feature-steps

Every figure is a real `Generator.generate` call on the bench's checkpoint (the tiny one by default) with the same
8-device CPU mesh as the other parts; requests of the kinds compared are interleaved, so a load change on the machine
spreads over all of them. Per-request milliseconds are `generate`'s wall time (the request parsed before, untimed).
On CPU the ratios between kinds are not what a TPU gives: the tiny model's UNet is a small part of a call, and XLA:CPU
runs a shallow UNet or a guidance-free batch with other overheads than a TPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..common import Progress, progress, timed
from .millis import Millis

REPO = Path(__file__).resolve().parents[2]
#: The LoRA files the tests check against diffusers (tests/fixtures/lora): made for the tiny checkpoint's geometry.
LORA_FIXTURES = REPO / "tests" / "fixtures" / "lora"
#: The picture and repaint mask of the image tests (96×80 and its mask; fitted to the bench's size).
INIT_IMAGE = REPO / "tests" / "fixtures" / "image-input.png"
MASK_IMAGE = REPO / "tests" / "fixtures" / "image-mask.png"
PROMPT = "a photo of an astronaut riding a horse on the moon"
CPU_NOTE = (
    "CPU ratios are not TPU ratios: on XLA:CPU with the tiny model a call's fixed costs (text encoders, VAE, "
    "dispatch) weigh more and a smaller UNet batch saves less than on a TPU running SDXL."
)


def _size(generator) -> str:
    height, width = generator.sizes[0]
    return f"{width}×{height}"


def _generate_s(generator, request, **listeners) -> float:
    """Wall seconds of one `generate` call."""
    started = time.perf_counter()
    generator.generate(request, **listeners)
    return time.perf_counter() - started


# ---- LoRA ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoraSwitching:
    """A LoRA set switched per request vs kept, on an engine offering --lora-fixtures' files."""

    size: str  # width×height
    steps: int  # steps per request
    devices: int  # devices (one image each)
    offered: tuple[str, ...]  # the LoRAs the engine accepted from the directory (the others are logged and left out)
    set_a: tuple[tuple[str, float, float], ...]  # (name, text-encoder weight, UNet weight) each
    set_b: tuple[tuple[str, float, float], ...]
    kernels: int  # kernels the merge layout touches (the union of every accepted LoRA's)
    rank: int  # the layout's rank R (every slot padded to it)
    slot_mb: float  # one packed slot's factors, float32
    merge_lower_s: float  # tracing and lowering the merge program
    merge_compile_s: float  # XLA compiling it, JAX's persistent cache off (what a first start pays)
    merge_alone: Millis  # `LoraSets.params_for(other set)` until the merged kernels are ready, alternating A and B
    switch_request: Millis  # a request whose set differs from the previous request's (merge + generate)
    same_request: Millis  # the next request, same set (nothing merged)
    no_lora_request: Millis  # a request without LoRA (the unmerged weights; switching to none merges nothing)
    switch_cost_ms: float  # switch_request.median - same_request.median
    rounds: int  # rounds of (A, A, B, B, none)
    compiles_while_timing: int  # XLA compilations during the timed requests (must be 0)


def lora_sets(names: tuple[str, ...]) -> tuple[tuple, tuple]:
    """Two different sets from the offered names: A = the first at weight 1; B = the next two (or the second) at
    0.8 and -0.5 (a negative weight is as cheap as a positive one: one merge either way)."""
    if len(names) < 2:
        raise ValueError(f"the lora part needs at least 2 LoRAs this checkpoint takes; got {len(names)}")
    set_a = ((names[0], 1.0, 1.0),)
    set_b = ((names[1], 0.8, 0.8),) + (((names[2], -0.5, -0.5),) if len(names) > 2 else ())
    return set_a, set_b


def lora_switching(
    config, rounds: int, lora_dir: str | Path = LORA_FIXTURES, say: Progress = progress
) -> LoraSwitching:
    """Load an engine like `config` offering `lora_dir`'s LoRAs, compile its merge program apart (timed, no cache),
    then `rounds` rounds of requests with set A, A, B, B and none (first of a set = a switch)."""
    import jax

    from ..engine import Generator, ProgramKey, configure_compilation_cache

    say(f"lora: loading an engine offering {lora_dir} ...")
    generator = Generator.load(config.replace(lora_dir=str(lora_dir)))
    loras = generator.loras
    names = loras.names if loras is not None else ()
    set_a, set_b = lora_sets(names)
    key = ProgramKey("merge")
    lower_s, lowered = timed(lambda: generator.programs.lower(key))
    configure_compilation_cache(False)  # a real compilation, as on a first start, not a cache read
    try:
        compile_s, compiled = timed(lowered.compile)
    finally:
        configure_compilation_cache(generator.config.compilation_cache)
    generator.programs.install(key, compiled)
    say(f"lora: merge program lowered in {lower_s:.2f} s, compiled in {compile_s:.2f} s; warming up the rest ...")
    generator.warmup()

    def merge_s(choice) -> float:
        started = time.perf_counter()
        jax.block_until_ready(loras.params_for(choice))  # on this thread alone: no request runs meanwhile
        return time.perf_counter() - started

    for choice in (set_a, set_b, ()):  # first use places each LoRA's packed factors on the devices: untimed
        merge_s(choice)
    alone = [merge_s((set_a, set_b)[i % 2]) for i in range(2 * rounds)]
    merge_s(())  # back to none, so the first timed request of set A is a switch

    requests = {
        "a": generator.request(PROMPT, seed=1, loras=[list(x) for x in set_a]),
        "b": generator.request(PROMPT, seed=2, loras=[list(x) for x in set_b]),
        "none": generator.request(PROMPT, seed=3),
    }
    times: dict[str, list[float]] = {"switch": [], "same": [], "none": []}
    before = generator.compile_count
    for _ in range(rounds):
        for name in ("a", "b"):
            times["switch"].append(_generate_s(generator, requests[name]))
            times["same"].append(_generate_s(generator, requests[name]))
        times["none"].append(_generate_s(generator, requests["none"]))
    compiles = generator.compile_count - before
    switch, same, none = (Millis.of_seconds(times[k]) for k in ("switch", "same", "none"))
    layout = loras.layout
    result = LoraSwitching(
        size=_size(generator),
        steps=generator.config.steps,
        devices=generator.device_count,
        offered=names,
        set_a=set_a,
        set_b=set_b,
        kernels=len(layout.leaves),
        rank=layout.rank,
        slot_mb=layout.slot_bytes() / 2**20,
        merge_lower_s=lower_s,
        merge_compile_s=compile_s,
        merge_alone=Millis.of_seconds(alone),
        switch_request=switch,
        same_request=same,
        no_lora_request=none,
        switch_cost_ms=switch.median - same.median,
        rounds=rounds,
        compiles_while_timing=compiles,
    )
    say(
        f"lora: merge alone {result.merge_alone.median:.1f} ms; per request after a switch {switch.median:.0f} ms, "
        f"same set {same.median:.0f} ms, no LoRA {none.median:.0f} ms; {compiles} compilations"
    )
    return result


# ---- image inputs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageKind:
    """One kind of request: text to image, image to image at a strength, or inpainting."""

    name: str  # "txt2img", "img2img 0.5", ...
    strength: float | None  # None: no picture
    mask: bool  # a repaint mask (inpainting)
    steps_run: int  # denoising steps the request ran (int(steps × strength) with a picture)
    parse: Millis  # `Generator.request(...)`: the picture and mask decoded, fitted and re-encoded as PNG
    generate: Millis  # `Generator.generate`
    vs_txt2img: float  # generate median / the text-to-image one


@dataclass(frozen=True)
class ImageInputsCost:
    size: str
    steps: int  # steps each request asked for
    devices: int
    picture: str  # the init picture's file (fitted to the size)
    kinds: list[ImageKind]
    compiles_while_timing: int  # must be 0


def image_inputs_cost(generator, runs: int, say: Progress = progress) -> ImageInputsCost:
    """Interleaved requests of each kind at the engine's default size and steps; medians of `runs`."""
    picture, mask = INIT_IMAGE.read_bytes(), MASK_IMAGE.read_bytes()
    kinds = (
        ("txt2img", None, False),
        ("img2img 0.5", 0.5, False),
        ("img2img 1.0", 1.0, False),
        ("inpainting 1.0", 1.0, True),
    )

    def make(strength, masked):
        if strength is None:
            return generator.request(PROMPT, seed=5)
        return generator.request(
            PROMPT, seed=5, init_image=picture, mask_image=mask if masked else None, strength=strength
        )

    parse: dict[str, list[float]] = {name: [] for name, _, _ in kinds}
    generate: dict[str, list[float]] = {name: [] for name, _, _ in kinds}
    steps_run = {}
    for name, strength, masked in kinds:  # one untimed call each
        steps_run[name] = generator.generate(make(strength, masked)).steps
    before = generator.compile_count
    for _ in range(runs):
        for name, strength, masked in kinds:
            parse_s, request = timed(lambda s=strength, m=masked: make(s, m))
            parse[name].append(parse_s)
            generate[name].append(_generate_s(generator, request))
    compiles = generator.compile_count - before
    base = Millis.of_seconds(generate["txt2img"]).median
    rows = []
    for name, strength, masked in kinds:
        cost = Millis.of_seconds(generate[name])
        rows.append(
            ImageKind(name, strength, masked, steps_run[name], Millis.of_seconds(parse[name]), cost, cost.median / base)
        )
    say(
        "img2img: "
        + ", ".join(f"{r.name} {r.generate.median:.0f} ms ({r.steps_run} steps)" for r in rows)
        + f"; {compiles} compilations"
    )
    return ImageInputsCost(
        _size(generator), generator.config.steps, generator.device_count, INIT_IMAGE.name, rows, compiles
    )


# ---- speed levers -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeverRow:
    cfg_end: float
    deepcache: int
    guided_steps: int  # steps run with guidance (the CFG batch)
    whole_unet_steps: int  # steps that run the whole UNet (the others run DeepCache's shallow part)
    request: Millis  # `Generator.generate`
    vs_default: float  # median / the (cfg_end 1, deepcache 1) median


@dataclass(frozen=True)
class SpeedLevers:
    size: str
    steps: int
    devices: int
    rows: list[LeverRow]
    compiles_while_timing: int  # must be 0
    note: str  # CPU_NOTE


CFG_ENDS = (1.0, 0.5)
DEEPCACHES = (1, 2, 3)


def speed_levers(generator, steps: int, runs: int, say: Progress = progress) -> SpeedLevers:
    """cfg_end x deepcache at `steps` steps, interleaved; medians of `runs`."""
    from ..engine import speed_plan

    combos = [(cfg_end, deepcache) for cfg_end in CFG_ENDS for deepcache in DEEPCACHES]
    requests = {c: generator.request(PROMPT, seed=9, steps=steps, cfg_end=c[0], deepcache=c[1]) for c in combos}
    for request in requests.values():  # one untimed call each
        generator.generate(request)
    times: dict[tuple, list[float]] = {c: [] for c in combos}
    before = generator.compile_count
    for _ in range(runs):
        for combo in combos:
            times[combo].append(_generate_s(generator, requests[combo]))
    compiles = generator.compile_count - before
    base = Millis.of_seconds(times[combos[0]]).median
    rows = []
    for cfg_end, deepcache in combos:
        plan = speed_plan(steps, cfg_end, deepcache, cfg=generator.sampler.cfg)
        cost = Millis.of_seconds(times[(cfg_end, deepcache)])
        full_steps = sum(step.full for step in plan.schedule)  # whole-UNet steps (DeepCache)
        rows.append(LeverRow(cfg_end, deepcache, plan.guided_steps, full_steps, cost, cost.median / base))
    say(
        "levers: "
        + ", ".join(f"cfg_end {r.cfg_end:g} deepcache {r.deepcache}: {r.request.median:.0f} ms" for r in rows)
        + f" ({steps} steps; {compiles} compilations; CPU ratios)"
    )
    return SpeedLevers(_size(generator), steps, generator.device_count, rows, compiles, CPU_NOTE)


# ---- results.md -----------------------------------------------------------------------------------------------------


def markdown(lora: LoraSwitching | None, images: ImageInputsCost | None, levers: SpeedLevers | None) -> list[str]:
    """The results.md sections of the three parts (those that ran)."""
    lines: list[str] = []
    if lora is not None:
        sets = " vs ".join(", ".join(f"{n} {te:g}/{u:g}" for n, te, u in s) for s in (lora.set_a, lora.set_b))
        lines += [
            f"## LoRA sets ({lora.size}, {lora.steps} steps, {lora.devices} devices; {sets})",
            "",
            f"Merge layout: {lora.kernels} kernels, rank {lora.rank}, {lora.slot_mb:.1f} MB per slot; offered: "
            f"{', '.join(lora.offered)}. Merge program: lowered in {lora.merge_lower_s:.2f} s, compiled in "
            f"{lora.merge_compile_s:.2f} s (no compilation cache).",
            "",
            "| | ms, median (p90; min–max) |",
            "|---|---|",
            f"| merge alone (`params_for`, A ↔ B) | {lora.merge_alone.text()} |",
            f"| request after a switch | {lora.switch_request.text(0)} |",
            f"| request with the same set | {lora.same_request.text(0)} |",
            f"| request without LoRA | {lora.no_lora_request.text(0)} |",
            f"| **switch cost per request** | **{lora.switch_cost_ms:+.0f}** |",
            "",
            f"{lora.rounds} rounds of A, A, B, B, none; {lora.compiles_while_timing} compilations while timing.",
            "",
        ]
    if images is not None:
        lines += [
            f"## Image inputs ({images.size}, {images.steps} steps, {images.devices} devices; picture "
            f"`{images.picture}`)",
            "",
            "| request | steps run | generate, ms median (p90) | × text to image | parse, ms |",
            "|---|---|---|---|---|",
            *[
                f"| {k.name} | {k.steps_run} | {k.generate.text(0)} | {k.vs_txt2img:.2f} | {k.parse.median:.1f} |"
                for k in images.kinds
            ],
            "",
            f"{images.compiles_while_timing} compilations while timing.",
            "",
        ]
    if levers is not None:
        lines += [
            f"## Speed levers ({levers.size}, {levers.steps} steps, {levers.devices} devices)",
            "",
            "| cfg_end | deepcache | guided steps | whole-UNet steps | ms, median (p90) | × default |",
            "|---|---|---|---|---|---|",
            *[
                f"| {r.cfg_end:g} | {r.deepcache} | {r.guided_steps} | {r.whole_unet_steps} | {r.request.text(0)} | "
                f"{r.vs_default:.2f} |"
                for r in levers.rows
            ],
            "",
            f"{levers.note} {levers.compiles_while_timing} compilations while timing.",
            "",
        ]
    return lines
