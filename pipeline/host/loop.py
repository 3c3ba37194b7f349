"""The denoising loop on the host: one request's plan (steps, sampler, stop), dispatched a call ahead.

    plan = sampler_config.plan(steps, "DPM++ 2M", "Karras")      # host numpy: one coefficient row per UNet call
    pixels = run(programs, params, inputs, plan, size=(h, w), on_step=..., should_stop=...)

Each call of a compiled step program (`programs.py`) runs one step when somebody follows the steps (progress,
previews, Stop), else up to `rows_per_call` consecutive steps of one program (device/step_block.py: each call
costs the hand-over of the UNet's weights). JAX dispatches asynchronously, so the host queues call k + 1 before it
waits for call k: the devices never wait for Python between calls, and at most two are in flight. Between calls the
host reports progress (the steps whose result is ready) and asks whether to stop, so Stop frees the devices within
about one step, and no program needs a host callback (every one of them can live in the persistent compilation
cache). On several processes every process must make the same calls: `gate` turns each process's wish to stop into
one decision they all follow (see cluster/protocol.py).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ..contract.stopping import Stopped
from ..device.cross_kv import CROSS_KV
from ..device.image_prompt import IMAGE_PROMPT
from .compiling.programs import BASE_STEPS, ProgramKey, ServedPrograms, windows_key
from .planning.extras_plan import UNetExtras
from .planning.sampler_plan import COEFFICIENTS, Plan
from .planning.speed_plan import SpeedPlan, speed_plan

logger = logging.getLogger(__name__)

#: What a progress listener receives after each denoising step: (steps done, total steps).
Listener = Callable[[int, int], None]
#: Asked before each step: True = stop now.
StopCheck = Callable[[], bool]
#: Multi-process: (step index, this process wants to stop) -> the decision every process follows (True = stop).
Gate = Callable[[int, bool], bool]
#: What a preview listener receives: (steps done, total steps, uint8 [b, h, w, 3] at latent size, this process's).
PreviewListener = Callable[[int, int, np.ndarray], None]
#: A preview every this many steps (the page's "watch it form").
PREVIEW_EVERY = 2
#: The shape of one image's plan row on the devices (`Stage.per_image`)
ROW = (len(COEFFICIENTS),)


@dataclass(frozen=True)
class RequestInputs:
    """One request's batch arrays, already on the devices (split over the batch)."""

    prompt_ids: jax.Array  # int32 [B, 2, K*77] (K: 1, or the server's N for a long prompt)
    negative_ids: jax.Array  # int32 [B, 2, K*77]
    has_negative: jax.Array  # bool [B]
    windows: jax.Array  # int32 [B, 2]: the 77-token windows the negative prompt and the prompt fill
    guidance: jax.Array  # float32 [B]
    seeds: jax.Array  # uint32 [B]
    prompt_weights: jax.Array  # float32 [B, 2, K*77]: each token's emphasis (A1111's weights; 1 = none)
    negative_weights: jax.Array  # float32 [B, 2, K*77]
    embedding_tables: tuple[jax.Array, jax.Array]  # float32 [E, D1], [E, D2] (replicated): the embeddings' vectors
    clip_skip: jax.Array  # int32 [] (replicated): the request's layers before the penultimate (device/text.skipped)


@dataclass(frozen=True)
class PictureInputs:
    """One request's picture (image to image, inpainting), on the devices (split over the batch)."""

    pixels: jax.Array  # uint8 [B, H, W, 3]: the picture, fitted to the size
    keep: jax.Array  # bool [B, H, W]: all True (its latents x0)
    keep_unmasked: jax.Array  # bool [B, H, W]: True outside the repaint mask (an inpainting UNet's masked picture)
    repaint: jax.Array  # float32 [B, 1, h, w]: 1 = repaint (1 everywhere without a mask)
    #: float32 [B]: start latents = weight·x0 + init_sigma·n (0: pure noise, an inpainting request at strength 1),
    #: each image its own (a merged call's pictures)
    weight: np.ndarray


@dataclass(frozen=True)
class Blank:
    """What a step reads for "no picture" (text to image), made once per size on the devices."""

    latents: jax.Array  # float32 [B, 4, h, w]: zeros (x0)
    repaint: jax.Array  # float32 [B, 1, h, w]: ones (repaint everything: the blend is the identity)
    masked: jax.Array  # float32 [B, 4, h, w]: an inpainting UNet's masked picture: a grey one's latents (else zeros)
    history: jax.Array  # float32 [B, 4, 4, h, w]: zeros, the samplers' history before the first step


@dataclass(frozen=True)
class ControlInputs:
    """One request's ControlNet units (`contract/controlnet_units.py`): their maps on the devices, weights and
    per-step scales."""

    maps: tuple  # one float32 [B, 3, H, W] map in [0, 1] per unit (split over the batch)
    trees: tuple  # each unit's ControlNet weights (replicated)
    nets: tuple[int, ...]  # static: each unit's architecture (`ProgramKey.nets`)
    scales: np.ndarray  # float32 [plan rows, units]: weight x window per step (0: that unit is off there)
    types: np.ndarray | None = None  # int32 [units]: a union unit's control type (-1: plain); None without a union


@dataclass(frozen=True)
class RegionInputs:
    """A regional prompt's blend (host/planning/region_plan.py) on the devices: its steps blend its parts by it."""

    parts: int  # static: P, the prompt's parts (`ProgramKey.parts`)
    weights: tuple  # float32 [P, cells] per attention grid (replicated)


@dataclass(frozen=True)
class RefinerInputs:
    """One request's refiner stage (host/planning/refiner_plan.py): where it takes over and its aesthetic scores."""

    switch_row: int  # plan rows from this one run the refiner's step
    aesthetic: jax.Array  # float32 [2] (replicated): the negative prompt's and the prompt's aesthetic score


@dataclass(frozen=True)
class HiresInputs:
    """One request's hires fix (host/planning/hires_plan.py): its second pass's size, rows, speed plan and inputs."""

    size: tuple[int, int]  # (height, width) of the second pass
    upscaler: str  # A1111's name: a latent upscaler (the `upscale` program) or a pixel one (`resize`)
    latent: bool  # the upscaler works on latents (else: decode, `resize`, encode)
    plan: Plan  # the rows the second pass runs (image to image at `size`)
    speed: SpeedPlan  # per row: guided or not, whole UNet or shallow
    seeds: jax.Array  # uint32 [B]: the second pass's noise seeds
    blank: Blank  # the hires size's stand-ins (mask, history)
    keep: jax.Array  # bool [B, H, W]: all True (the upscaled picture's latents)
    resize: Callable[[jax.Array], jax.Array] | None  # a pixel upscaler: uint8 [B, h, w, 3] -> [B, H, W, 3]
    refiner: RefinerInputs | None = None  # the refiner's stage in the second pass (A1111's "second pass" default)
    extras: UNetExtras | None = None  # FreeU and PAG on the second pass's rows (None: neither)


def follows_steps(on_step, should_stop, on_preview) -> bool:
    """Whether a request with these listeners is followed step by step (progress, previews or Stop): then each call
    runs one step, so each is reported and Stop comes at the next one; else a call runs up to
    `ServedPrograms.rows_per_call` steps (device/step_block.py): fewer calls, less work, the same pixels."""
    return on_step is not None or should_stop is not None or on_preview is not None


def ignore_step(done: int, total: int) -> None:
    """The progress listener of a process that reports nobody's progress but makes the calls of a request someone
    follows step by step (a follower, when the leader's request has a listener: every process makes the same calls)."""


def ignore_preview(done: int, total: int, pixels) -> None:
    """The listener of a process that shows nobody its previews but runs their program (a follower, when the
    leader's request has a listener: every process makes the same calls)."""


@dataclass(frozen=True)
class Stage:
    """What every stage of one `run` call reads: the programs, the weights, the size and the host's callbacks."""

    programs: ServedPrograms
    params: Any
    height: int
    width: int
    text: int | None  # static: ProgramKey.windows of the request's text
    put: Callable[[np.ndarray], jax.Array]
    split: Callable[[np.ndarray], jax.Array]  # per-image host arrays [B, ...] onto the devices, split over the batch
    timings: dict | None
    #: The text programs' outputs for this request's text, kept across requests (host/text_cache.py); None: not kept
    kept: dict | None = None
    extras: UNetExtras | None = None  # this pass's FreeU and PAG per row (host/planning/extras_plan.py); None: neither
    regions: RegionInputs | None = None  # a regional prompt's blend: its base steps run the regional step
    image_prompt: dict | None = None  # this pass's image prompt on the devices (device/image_prompt.py); None: none

    def once(self, name: str, make: Callable[[], Any]):
        """`make()`, or what it returned for the same text in a recent request (`kept`): a text program runs once
        per text, not once per request."""
        if self.kept is None:
            return make()
        if name not in self.kept:
            self.kept[name] = make()
        return self.kept[name]

    def per_image(self, values, shape: tuple[int, ...] = ()) -> jax.Array:
        """float32 `values` of each image on the devices, [B, *shape] split over the batch: a plan's row [13] or
        sigma [] is every image's; a stacked plan's (`host/planning/sampler_plan.stacked`) [B, 13] or [B] each image its
        own."""
        rows = np.broadcast_to(np.asarray(values, np.float32), (self.programs.batch, *shape))
        return self.split(rows)

    def per_row(self, rows: list, shape: tuple[int, ...] = ()) -> jax.Array:
        """float32 values of each image for a call's rows (each as `per_image` takes it), [B, R, *shape] split over
        the batch: R is the programs' `rows_per_call`, the rows after the call's last repeat it (never read)."""
        batch = self.programs.batch
        stacked = [np.broadcast_to(np.asarray(row, np.float32), (batch, *shape)) for row in rows]
        return self.split(np.stack(self.padded(stacked), axis=1))

    def padded(self, rows: list) -> list:
        """A call's rows, the last repeated up to the programs' `rows_per_call`."""
        return [*rows, *[rows[-1]] * (self.programs.rows_per_call - len(rows))]

    def row_block(self, plan: Plan, rows: tuple) -> tuple[jax.Array, jax.Array]:
        """A call's plan rows, float32 [B, R, 13] (each image's), and the first one's index, int32 [] (replicated)."""
        coefficients = self.per_row([plan.coefficients[planned.index] for planned in rows], ROW)
        return coefficients, self.put(np.asarray(rows[0].index, np.int32))

    def count(self, rows: tuple) -> jax.Array:
        """How many rows a call runs, int32 [] (replicated)."""
        return self.put(np.asarray(len(rows), np.int32))

    def compile(
        self,
        kind: str,
        sized: bool = True,
        cfg: bool | None = None,
        windows: int | None = None,
        nets: tuple[int, ...] | None = None,
        extras: tuple[str, ...] = (),
        parts: int | None = None,
    ):
        size = (self.height, self.width) if sized else (None, None)
        tokens = self.programs.image_tokens if self.image_prompt is not None and kind in BASE_STEPS else None
        key = ProgramKey(kind, *size, cfg, windows, nets, extras=extras, parts=parts, image_tokens=tokens)
        return self.programs.compile(key)

    def weights(self, kind: str) -> dict:
        return self.programs.weights(ProgramKey(kind), self.params)

    def base_weights(self) -> dict:
        """The base steps' weights: the UNet's, with the request's image prompt (its table, this pass's slots and
        windows) where it has one."""
        unet = self.weights("step")
        return unet if self.image_prompt is None else {**unet, IMAGE_PROMPT: self.image_prompt}

    def mark(self, name: str) -> None:
        if self.timings is not None:
            self.timings[name] = time.perf_counter()


def run(
    programs: ServedPrograms,
    params,
    inputs: RequestInputs,
    plan: Plan,
    *,
    size: tuple[int, int],
    cfg: bool,
    put: Callable[[np.ndarray], jax.Array],
    split: Callable[[np.ndarray], jax.Array],
    blank: Blank,
    picture: PictureInputs | None = None,
    control: ControlInputs | None = None,
    speed: SpeedPlan | None = None,
    watchers: Watchers | None = None,
    timings: dict | None = None,
    refiner: RefinerInputs | None = None,
    hires: HiresInputs | None = None,
    kept: dict | None = None,
    extras: UNetExtras | None = None,
    regions: RegionInputs | None = None,
    image_prompt: Callable[[int], dict] | None = None,
) -> jax.Array:
    """Encode, the first pass (`first_pass`: the start latents, then the plan's rows: `plan.rows` UNet calls,
    `plan.steps` steps, two per step for Heun), the hires fix's second pass (`hires`, `second_pass`), decode: uint8
    [B, H, W, 3] on the devices. Raises `Stopped`.

    `put` places a small host array on every device (replicated; on several processes each passes the same);
    `split` places per-image arrays [B, ...] split over the batch: each image's plan row and sigmas (`plan` may be
    `host/planning/sampler_plan.stacked`'s, one plan per block of images: a merged call's requests, each on its
    sampler). The text's K windows (`inputs.prompt_ids`' length) pick the programs that read it
    (`programs.program_keys`). `timings`, when given, receives `time.perf_counter()` moments: `started_at` (this call),
    `first_dispatch_at` (step 0 queued), `first_step_at` (its result ready) and, when stopped, `stop_seen_at` (the stop
    decided) and `freed_at` (the last queued step done); and `first_step_s` (started -> first step ready).
    `watchers`: the request's progress, previews and Stop (`Watchers`; None: nobody watches). `picture`, `blank`,
    `control`, `speed` and `refiner` are the first pass's (`first_pass`). Progress, previews and Stop count both
    passes' steps as one request's; with the refiner and the hires fix, the refiner's rows are the second pass's
    (`hires.refiner`; A1111's default), and `refiner` is None. `kept`: what the text programs made for this
    request's text in a recent request (host/text_cache.py: they run only for what it lacks, and fill it).
    `extras`: the first pass's FreeU and PAG (`host/planning/extras_plan.py`; `hires.extras`, the second's).
    `regions`: a regional prompt's blend (its text is one window per part; every base step blends them).
    `image_prompt`: a pass of N plan rows -> the image prompt its base steps read (None: none; `second_pass`).
    """
    text_windows = windows_key(inputs.prompt_ids.shape[-1] // programs.max_tokens)
    first = image_prompt(plan.steps) if image_prompt is not None else None  # the first pass's
    stage = Stage(programs, params, *size, text_windows, put, split, timings, kept, extras, regions, first)
    stage.mark("started_at")
    text = encode_text(stage, inputs, cfg)
    refined = refiner is not None or (hires is not None and hires.refiner is not None)
    refiner_text = encode_text(stage, inputs, cfg, "refiner_encode") if refined else None
    speed = speed or speed_plan(plan.rows, cfg=cfg)
    watchers = watchers or Watchers()
    total = len(speed.schedule) + (len(hires.speed.schedule) if hires is not None else 0)
    refining = (refiner, refiner_text) if refiner is not None else None
    latents = first_pass(stage, inputs, plan, speed, text, blank, watchers, total, picture, control, refining)
    if hires is not None:
        stage, latents = second_pass(
            stage, inputs, text, latents, hires, watchers, len(speed.schedule), total, refiner_text, image_prompt
        )
    return stage.compile("decode")(stage.weights("decode"), latents)


def first_pass(
    stage: Stage,
    inputs: RequestInputs,
    plan: Plan,
    speed: SpeedPlan,
    text: tuple,
    blank: Blank,
    watchers: Watchers,
    total: int,
    picture: PictureInputs | None = None,
    control: ControlInputs | None = None,
    refiner: tuple[RefinerInputs, tuple] | None = None,
) -> jax.Array:
    """The request's start latents, denoised through the plan's rows: the final latents [B, 4, h, w] (`total`: the
    request's steps in all, with a second pass's).

    `picture`: a request's picture (its plan is then the rows that run, `image_plan.py`); `blank` stands in for it
    without one. `speed` (per-request `cfg_end` and `deepcache`, `speed_plan.py`, over the plan's rows) picks each
    row's program: with guidance or without, the whole UNet or the shallow one. A server compiled with those
    programs (`programs.levers`) runs its whole-UNet steps as `step_full`, keeping DeepCache's feature; one without
    runs `step`. `control`: the request's ControlNets; a whole-UNet step where any of them acts runs `step_control`,
    the others (no ControlNet, or outside every unit's window) the plain step. `refiner`: its inputs and its own
    text (encoded with the prompt's): rows from its `switch_row` on run the refiner's step, whole and with the row's
    guidance mode. `stage.extras`: FreeU and PAG, whose whole-UNet steps run their programs (`ProgramKey.extras`).
    """
    latents, image = start_latents(stage, inputs, plan, blank, picture)
    return denoise(
        stage, inputs, plan, speed, text, latents, image, blank.history, watchers, control, refiner, total=total
    )


def second_pass(
    stage: Stage,
    inputs: RequestInputs,
    text: tuple,
    latents,
    hires: HiresInputs,
    watchers: Watchers,
    before: int,
    total: int,
    refiner_text: tuple | None = None,
    image_prompt: Callable[[int], dict] | None = None,
) -> tuple[Stage, jax.Array]:
    """The hires fix after the first pass's `before` steps: its latents upscaled to `hires.size` (in latent space, or
    decoded, resized and encoded), fresh noise at the first row's sigma, the rows of `hires.plan` (from
    `hires.refiner.switch_row` on the refiner's, on `refiner_text`; `image_prompt`'s windows over its own rows): (the
    hires size's stage, its final latents)."""
    height, width = hires.size
    prompt = image_prompt(hires.plan.steps) if image_prompt is not None else None
    big = dataclasses.replace(stage, height=height, width=width, extras=hires.extras, image_prompt=prompt)
    if hires.latent:
        key = ProgramKey("upscale", height, width, source=(stage.height, stage.width), mode=hires.upscaler)
        x0 = stage.programs.compile(key)({}, latents)
    else:
        pixels = hires.resize(stage.compile("decode")(stage.weights("decode"), latents))
        x0 = big.compile("encode_image")(big.weights("encode_image"), pixels, hires.keep)
    second = dataclasses.replace(inputs, seeds=hires.seeds)  # the second pass's own noise (and Euler a's)
    latents, noise = big.compile("start")(
        {}, second.seeds, stage.per_image(hires.plan.init_sigma), x0, stage.per_image(1.0)
    )
    image = {"latents": x0, "noise": noise, "repaint": hires.blank.repaint, "masked": hires.blank.masked}
    refiner = (hires.refiner, refiner_text) if hires.refiner is not None else None
    latents = denoise(
        big,
        second,
        hires.plan,
        hires.speed,
        text,
        latents,
        image,
        hires.blank.history,
        watchers,
        refiner=refiner,
        before=before,
        total=total,
    )
    return big, latents


def encode_text(stage: Stage, inputs: RequestInputs, cfg: bool, kind: str = "encode") -> tuple:
    """The prompts' hidden states, pooled embeddings and key lengths ([cB, K*77, D], [cB, P], [cB]): for the base
    (`encode`, at the request's clip_skip), or the refiner (`refiner_encode`: text encoder 2 and its embedding table
    only, at its own penultimate layer); once per text while `stage.kept` keeps it."""
    texts = (
        inputs.prompt_ids,
        inputs.negative_ids,
        inputs.has_negative,
        inputs.windows,
        inputs.prompt_weights,
        inputs.negative_weights,
    )
    tables = (*inputs.embedding_tables, inputs.clip_skip) if kind == "encode" else inputs.embedding_tables[1:]

    def make():
        return stage.compile(kind, sized=False, cfg=cfg, windows=stage.text)(stage.weights(kind), *texts, *tables)

    return stage.once(kind, make)


def start_latents(stage: Stage, inputs: RequestInputs, plan: Plan, blank: Blank, picture: PictureInputs | None):
    """The start latents [B, 4, h, w] and the step's `image` argument (the picture, or the blank's stand-ins)."""
    x0, repaint, masked, weight = blank.latents, blank.repaint, blank.masked, 0.0
    if picture is not None:
        encode_image, vae = stage.compile("encode_image"), stage.weights("encode_image")
        x0, repaint, weight = encode_image(vae, picture.pixels, picture.keep), picture.repaint, picture.weight
        if stage.programs.inpainting_unet:
            masked = encode_image(vae, picture.pixels, picture.keep_unmasked)
    latents, noise = stage.compile("start")(
        {}, inputs.seeds, stage.per_image(plan.init_sigma), x0, stage.per_image(weight)
    )
    return latents, {"latents": x0, "noise": noise, "repaint": repaint, "masked": masked}


@dataclass(frozen=True)
class Watchers:
    """The host's listeners and stop checks of one request (each may be None).

    `on_step(done, total)` as each step's result is ready; `should_stop()` before each step (`gate`: several
    processes' one decision). `on_preview` gets every PREVIEW_EVERY-th step's predicted picture (the `preview`
    program: the step's D through SDXL's latent-to-RGB projection), when the step is done, before the next one's
    wait: only uint8 at latent size comes back, copied while the devices go on.
    """

    on_preview: PreviewListener | None = None
    on_step: Listener | None = None
    should_stop: StopCheck | None = None
    gate: Gate | None = None

    @property
    def stepwise(self) -> bool:
        """Somebody follows the steps (`follows_steps`): one step a call."""
        return follows_steps(self.on_step, self.should_stop, self.on_preview)

    def stop_now(self, position: int) -> bool:
        wants_stop = bool(self.should_stop and self.should_stop())
        return self.gate(position, wants_stop) if self.gate is not None else wants_stop


def denoise(
    stage: Stage,
    inputs: RequestInputs,
    plan: Plan,
    speed: SpeedPlan,
    text: tuple,
    latents,
    image,
    history,
    watchers: Watchers,
    control: ControlInputs | None = None,
    refiner: tuple[RefinerInputs, tuple] | None = None,
    *,
    before: int = 0,
    total: int | None = None,
) -> jax.Array:
    """Every row of the plan, a call ahead: the final latents [B, 4, h, w]. `history` [B, 4, 4, h, w]: the samplers'
    carried history (zeros at the start: the first row's weights on it are 0). `refiner`: its inputs and text.
    `before`, `total`: the request's steps before these and in all (the hires fix's two passes count as one)."""
    programs = stage.programs
    hidden, pooled, key_lengths = text
    kinds = ("step_full", "step_shallow") if programs.levers else ("step", "step")
    feature = None  # DeepCache's feature, kept by the last whole-UNet step (with levers)
    unet = stage.base_weights()  # with --cross-attention-cache, the first base row adds its text's table
    preview = stage.compile("preview") if watchers.on_preview is not None else None
    pending: list[tuple] = []  # dispatched calls' latents, preview and rows, oldest first
    done = before  # steps whose result is ready, of all
    total = before + len(speed.schedule) if total is None else total

    program_of = functools.partial(row_program, refiner=refiner, control=control)
    most = 1 if watchers.stepwise else programs.rows_per_call
    for position, rows in step_calls(speed.schedule, before, most, program_of):
        if watchers.stop_now(position):
            _stop(stage, pending, position, total)
        if program_of(rows[0])[0] == "refiner":  # the refiner's rows: its whole UNet each
            latents, history = refine_step(stage, inputs, plan, rows, refiner, latents, history, image)
        else:
            latents, history, hidden, pooled, key_lengths, feature, unet = base_step(
                stage,
                inputs,
                plan,
                rows,
                control,
                (hidden, pooled, key_lengths),
                latents,
                history,
                image,
                feature,
                unet,
                kinds,
            )
        shown = _preview(preview, history, position + len(rows), total)  # previews are stepwise: a row a call
        pending.append((latents, shown, len(rows)))
        if position == 0:
            stage.mark("first_dispatch_at")
        if len(pending) > 1:  # this call is queued behind the one we now wait for
            done = _ready(*pending.pop(0), done, total, watchers, stage.timings)
    while pending:
        done = _ready(*pending.pop(0), done, total, watchers, stage.timings)
    return latents


def row_program(planned, refiner: tuple | None, control: ControlInputs | None) -> tuple:
    """What runs a row: consecutive rows of one program, with no host work between them, may share a call."""
    if refiner is not None and planned.index >= refiner[0].switch_row:
        return ("refiner", planned.cfg)
    controlled = control is not None and planned.full and bool(control.scales[planned.index].any())
    return ("base", planned.full, planned.cfg, controlled)


def step_calls(schedule, before: int, most: int, program_of: Callable) -> list[tuple[int, tuple]]:
    """The schedule's rows as step calls, (the first row's position, its rows): consecutive rows of one program
    (`program_of`) share a call, at most `most` of them; a row that needs host work first (the text's or the
    feature's conditional half) starts one."""
    calls: list[tuple[int, tuple]] = []
    for position, planned in enumerate(schedule, start=before):
        if calls:
            start, rows = calls[-1]
            joins = (
                len(rows) < most
                and program_of(rows[-1]) == program_of(planned)
                and not (planned.drop_uncond or planned.halve_feature)
            )
            if joins:
                calls[-1] = (start, (*rows, planned))
                continue
        calls.append((position, (planned,)))
    return calls


def with_cross_kv(stage: Stage, unet: dict, hidden, cfg: bool) -> dict:
    """The base steps' weights: with --cross-attention-cache, + the text's cross-attention keys and values, projected
    once here from `hidden` (encoded with guidance or not: `cfg`) by the UNet's own layers (device/cross_kv.py)."""
    if not stage.programs.cross_attention_cache:
        return unet

    def make():
        return stage.compile("cross_kv", sized=False, cfg=cfg, windows=stage.text)(stage.weights("cross_kv"), hidden)

    return {**unet, CROSS_KV: stage.once(f"cross_kv {'cfg' if cfg else 'no-cfg'}", make)}


def refine_step(stage: Stage, inputs: RequestInputs, plan: Plan, rows: tuple, refiner: tuple, latents, history, image):
    """Rows on the refiner's UNet and text (`refiner_step`), one call: (latents', history')."""
    given, (hidden, pooled, key_lengths) = refiner
    program = stage.compile("refiner_step", cfg=rows[0].cfg, windows=stage.text)
    return program(
        stage.weights("refiner_step"),
        latents,
        history,
        hidden,
        pooled,
        key_lengths,
        inputs.guidance,
        inputs.seeds,
        *stage.row_block(plan, rows),
        image,
        stage.per_row([plan.sigmas[planned.index + 1] for planned in rows]),
        given.aesthetic,
        stage.count(rows),
    )


def base_step(
    stage: Stage,
    inputs: RequestInputs,
    plan: Plan,
    rows: tuple,
    control,
    text: tuple,
    latents,
    history,
    image,
    feature,
    unet,
    kinds,
):
    """Rows of one program on the base's UNet, one call: (latents', history', the text they read next (hidden,
    pooled, key_lengths), DeepCache's feature, the weights the next rows read: `unet`, or with the conditional
    half's table)."""
    put, first = stage.put, rows[0]
    (hidden, pooled, key_lengths), unet = row_text(stage, first, text, unet)
    if first.halve_feature:  # a shallow step without guidance after a whole step with it
        feature = stage.compile("halve_feature")({}, feature)
    # The rows' coefficients, float32 [B, R, 13], and the first one's index, int32 []: placed while a call runs.
    block, at = stage.row_block(plan, rows)
    # [B, R]: the picture outside the mask, re-noised to each row's next sigma
    blend_sigma = stage.per_row([plan.sigmas[planned.index + 1] for planned in rows])
    args = (
        unet,
        latents,
        history,
        hidden,
        pooled,
        key_lengths,
        inputs.guidance,
        inputs.seeds,
        block,
        at,
        image,
        blend_sigma,
    )
    count = stage.count(rows)
    scales = [control.scales[planned.index] for planned in rows] if control is not None else None  # [units] each
    if stage.extras is not None:  # FreeU and/or PAG: the whole UNet with them (DeepCache, ControlNets refused)
        latents, history = extras_step(stage, rows, args, count)
    elif stage.regions is not None:  # a regional prompt: the whole UNet, every cross-attention blending its parts
        latents, history = region_step(stage, first, args, count)
    elif first.full and scales is not None and scales[0].any():
        program = stage.compile("step_control", cfg=first.cfg, windows=stage.text, nets=control.nets)
        weights = {**unet, "controlnets": control.trees}
        types = () if control.types is None else (put(control.types),)  # a union's program only
        latents, history = program(weights, *args[1:], control.maps, put(stage.padded(scales)), *types, count)
    elif first.full and kinds[0] == "step_full":
        program = stage.compile(kinds[0], cfg=first.cfg, windows=stage.text)
        latents, history, feature = program(*args, count)
    elif first.full:
        latents, history = stage.compile(kinds[0], cfg=first.cfg, windows=stage.text)(*args, count)
    else:
        latents, history = stage.compile(kinds[1], cfg=first.cfg, windows=stage.text)(*args, feature, count)
    return latents, history, hidden, pooled, key_lengths, feature, unet


def row_text(stage: Stage, planned, text: tuple, unet) -> tuple[tuple, Any]:
    """The text a base row reads ((hidden, pooled, key_lengths)) and the weights with its cross-attention table: the
    conditional half once guidance has ended, the request's own table made at its first row."""
    hidden, pooled, key_lengths = text
    if planned.drop_uncond:  # guidance has ended: the steps after it read the conditional half
        halve = stage.compile("halve_text", sized=False, windows=stage.text)
        hidden, pooled, key_lengths = halve({}, hidden, pooled, key_lengths)
        unet = with_cross_kv(stage, unet, hidden, False)  # the conditional half's table replaces the CFG one
    elif CROSS_KV not in unet:  # the first base row: its text's table, made here (an unguided one makes no CFG table)
        unet = with_cross_kv(stage, unet, hidden, hidden.shape[0] > stage.programs.batch)
    return (hidden, pooled, key_lengths), unet


def region_step(stage: Stage, planned, args: tuple, count):
    """Rows on the base's whole UNet blending a regional prompt's parts (`ProgramKey.parts`): latents', history'."""
    program = stage.compile("step", cfg=planned.cfg, windows=stage.text, parts=stage.regions.parts)
    return program(*args, stage.regions.weights, count)


def extras_step(stage: Stage, rows: tuple, args: tuple, count):
    """Rows on the base's whole UNet with FreeU and/or PAG (`ProgramKey.extras`): (latents', history')."""
    extras = stage.extras
    program = stage.compile("step", cfg=rows[0].cfg, windows=stage.text, extras=extras.kinds)
    factors = stage.per_row([extras.rows[planned.index] for planned in rows], (extras.rows.shape[1],))  # [B, R, 5]
    return program(*args, factors, count)


def _preview(preview, history, done: int, total: int):
    """The picture after `done` steps ([B, h, w, 3] uint8 of the step's D), every PREVIEW_EVERY-th but the last (its
    picture is the answer), copied to the host while the devices go on; None: no preview then."""
    if preview is None or done % PREVIEW_EVERY or done >= total:
        return None
    shown = preview({}, history)
    shown.copy_to_host_async()
    return shown


def _stop(stage: Stage, pending: list, position: int, total: int) -> None:
    """Stop at `position`: the step already queued finishes (the devices are free once it has), then `Stopped`."""
    stage.mark("stop_seen_at")
    if pending:
        pending[-1][0].block_until_ready()
    stage.mark("freed_at")
    raise Stopped(position, total)


def _ready(latents: jax.Array, shown, rows: int, done: int, total: int, watchers: Watchers, timings) -> int:
    """Wait for a call's `rows` steps, then report them (and its preview)."""
    latents.block_until_ready()
    done += rows
    if timings is not None and done == rows:  # the request's first call
        timings["first_step_at"] = now = time.perf_counter()
        timings["first_step_s"] = now - timings["started_at"]
    try:  # a listener must never break the loop
        if watchers.on_step is not None:
            watchers.on_step(done, total)
        if shown is not None:
            watchers.on_preview(done, total, local_rows(shown))
    except Exception:
        logger.exception("a progress or preview listener failed at step %d", done)
    return done


def local_rows(array: jax.Array) -> np.ndarray:
    """The rows of a batch-split array this process holds, in order (all of them on one process)."""
    if array.is_fully_addressable:
        return np.asarray(array)
    shards = sorted(array.addressable_shards, key=lambda shard: shard.index[0].start or 0)
    return np.concatenate([np.asarray(shard.data) for shard in shards])
