"""A request's whole run, planned once on the host: read `plan_run` top to bottom to know what a request does.

    run = plan_run(request, context)       # frozen: every choice the run makes, each check made here, once
    pixels = loop.run(...)                 # host/loop.py executes it (Generator.generate places its arrays)

The plan is diffusers' `__call__` in data, in the order the run meets it:

1. **first pass** (`FirstPass`): the size, the sampler's rows (`sampler_plan.py`; with a picture the rows that run,
   `image_plan.py`; with the refiner the base's rows to the switch and then the refiner's, `refiner_plan.py`),
   guidance on or off, and per step guided or not, whole UNet or shallow (`speed_plan.py`), FreeU's and PAG's
   numbers per row (`extras_plan.py`);
2. **conditioning** (`Conditioning`): both texts as token ids and emphasis weights with the embeddings they name
   (`tokens.py`), the text cache's key, clip skip, the LoRA set and the ControlNet units;
3. **second pass** (`SecondPass`): the hires fix's size, upscaler and rows (`hires_plan.py`), the refiner's share;
4. **output** (`Output`): each image's seed, how many the request gets back and each one's `parameters` text.

Whether the request may share a merged call (`--merge-requests`) and with whom (`RunPlan.merge_key`) is decided here
too. Nothing here touches a device: the plan is numpy and Python, so a test reads it without running anything.

Where a new feature plugs in (an image prompt, regional prompts, PAG, FreeU ...): a field row
(`contract/fields.py`: check, default, A1111 name), a stage here (a frozen dataclass and the lines of `plan_run` that
fill it from the request) and its device code (`device/`, chosen by a `ProgramKey` field when it changes a program's
shape, else an argument), which `host/loop.py` runs from the stage. docs/architecture.md, "Adding a feature".
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ...contract.controlnet_units import ControlUnit
from ...contract.errors import InvalidInput
from ...contract.image_inputs import latent_mask
from ...contract.overlay import Paste
from ...contract.parameters import describe, text_settings, written_settings
from ...contract.request import Picture, Request, RequestRules
from ...contract.sampler_names import sampler_label
from ...contract.styles import PLACEHOLDER
from ..text_cache import text_key
from .emphasis import has_emphasis
from .extras_plan import UNetExtras, extras_plan
from .hires_plan import HiresPlan, hires_plan
from .image_plan import image_plan
from .image_prompt_plan import ImagePromptPlan, ServedAdapters, image_prompt_plan
from .refiner_plan import refiner_plan
from .region_plan import RegionPlan, check_part_lengths, region_plan
from .sampler_plan import Plan, SamplerConfig
from .speed_plan import SpeedPlan, speed_plan
from .tokens import ExtraRows, PromptReader, dropped_text, summarize_dropped

SEED_MODULUS = 2**32
#: A request's per-step program choice, computed once per (steps, cfg_end, deepcache, cfg, guided).
cached_speed_plan = functools.lru_cache(maxsize=256)(speed_plan)


@functools.lru_cache(maxsize=64)
def cached_plan(
    config: SamplerConfig, steps: int, sampler: str, schedule_type: str | None = None, first: int = 0
) -> Plan:
    """`config.plan(steps, sampler, schedule_type, first)`, computed once per argument set."""
    return config.plan(steps, sampler, schedule_type, first)


@dataclass(frozen=True)
class RunContext:
    """What planning a run reads of the engine, fixed when it loaded (`Generator.__init__`)."""

    sampler: SamplerConfig  # the checkpoint's scheduler with the server's overrides; `.cfg`: guidance compiled
    levers: bool  # the guidance-free and shallow step programs are compiled (--speed-levers)
    vae_scale_factor: int
    inpainting_unet: bool  # a 9-channel UNet: at strength 1 a picture starts from pure noise
    prompts: PromptReader  # texts -> token ids, emphasis weights, embeddings
    windows: int  # N, the server's 77-token windows (--prompt-windows)
    images_per_call: int  # B: images per device call, every device
    num_images: int  # images a request gets back (one per device with --merge-requests)
    merging: bool  # --merge-requests
    hires_sizes: Mapping[tuple[tuple[int, int], float], tuple[int, int]]  # ((size), scale) -> hires (H, W)
    rules: RequestRules  # what requests were checked against (the upscalers read, the styles)
    model: str  # what `parameters` names: the model, the --unet file, the dtype
    unet: str | None
    dtype: str
    refiner: str = ""  # the --refiner's name ("" none)
    lora_hashes: Callable[[tuple], str] | None = None  # A1111's `Lora hashes` of a LoRA set (None: no LoRAs)
    unet_levels: int = 3  # the UNet's resolutions (its down blocks): the grids regional prompts blend at
    adapters: ServedAdapters | None = None  # the IP-Adapters served (None: no image prompts)


@dataclass(frozen=True)
class PictureRows:
    """A request's picture as one image's host rows, repeated for each image of its block when placed
    (`host/placement.py`), so a merged call's requests each bring their own."""

    arrays: tuple[np.ndarray, ...]  # pixels uint8 [1, H, W, 3], keep [1, H, W], keep_unmasked [1, H, W], repaint mask
    #                                 at latent size float32 [1, 1, h, w] (`loop.PictureInputs`' order)
    weight: float  # start latents = weight·x0 + init_sigma·n (`image_plan.ImagePlan.image_weight`)


@dataclass(frozen=True)
class FirstPass:
    """Stage 1: the rows the first pass runs and the program each step picks."""

    size: tuple[int, int]  # (height, width): one of the compiled sizes
    plan: Plan  # one coefficient row per UNet call; rows from `refiner_row` on are the refiner's
    speed: SpeedPlan  # per step: guided or not, whole UNet or shallow
    guided: bool  # guidance > 1, or the server compiled no guidance-free programs
    picture: PictureRows | None  # image to image / inpainting: the picture's rows (None: text to image)
    refiner_row: int  # the first row the refiner runs (`plan.rows`: none)
    extras: UNetExtras | None = None  # FreeU's factors and PAG's scale per row (`extras_plan.py`; None: neither)


@dataclass(frozen=True)
class Conditioning:
    """Stage 2: what the UNet is conditioned on, as host rows (one per image of the call, `RequestInputs`' order)."""

    rows: tuple[np.ndarray, ...]  # ids, negative ids [B, 2, K*77], has_negative, windows, guidance, seeds, weights
    windows: int  # K: the 77-token windows the texts are read in (1, or N for a long prompt)
    embeddings: ExtraRows  # the embeddings both texts name, each once (their table rows)
    text_key: tuple  # the texts' key in the text cache (host/text_cache.py)
    overflow: bool  # the prompt needs more than N windows: its end was dropped
    clip_skip: int
    loras: tuple  # ((name, text-encoder weight, UNet weight), ...)
    controlnets: tuple[ControlUnit, ...]
    aesthetic: tuple[float, float]  # the refiner's (negative, positive) aesthetic scores


@dataclass(frozen=True)
class SecondPass:
    """Stage 3: the hires fix (None without it): image to image at the hires size, the refiner's share in it."""

    hires: HiresPlan  # size, upscaler, rows; `refiner_row`: the refiner's first row (None: none)
    speed: SpeedPlan
    extras: UNetExtras | None = None  # FreeU and PAG on the second pass's rows (None: neither)


@dataclass(frozen=True)
class Output:
    """Stage 4: the images the request gets back and what each says of itself."""

    seeds: tuple[int, ...]  # the call's: image i from seed + i (mod 2**32)
    returned: int  # the first `returned` images are the request's
    parameters: tuple[str, ...]  # each returned image's `parameters` text (A1111's infotext)
    truncated: str  # "" or a sentence naming the words past the text encoders' windows
    refined: bool  # the refiner runs (`Refiner:` in the parameters)
    paste: Paste | None = None  # how each image goes back over the request's picture (`contract/overlay.py`)


@dataclass(frozen=True)
class RunPlan:
    """One request's run, decided before anything runs (`plan_run`)."""

    request: Request
    first: FirstPass
    conditioning: Conditioning
    second: SecondPass | None
    output: Output
    merge_key: tuple | None  # what a merged call's requests share (None: the request runs alone)
    regions: RegionPlan | None = None  # regional prompts of several parts: their blend per attention grid
    image_prompt: ImagePromptPlan | None = None  # image prompts (IP-Adapter): their pixels, slots and scales

    @property
    def steps(self) -> int:
        """The denoising steps the run makes, both passes."""
        return self.first.plan.steps + (self.second.hires.plan.steps if self.second is not None else 0)


def plan_run(request: Request, context: RunContext) -> RunPlan:
    """The whole run of a checked `request` on an engine with `context`."""
    first = first_pass(request, context)
    second = second_pass(request, context)
    regions = regions_of(request, context)
    mergeable = (
        context.merging
        and second is None
        and first.refiner_row == first.plan.rows
        and not request.controlnets
        and first.extras is None
        and regions is None
        and not request.ip_images
    )  # text or picture to image on the base alone, its plain steps
    count = context.num_images if mergeable else context.images_per_call
    seeds = tuple((request.seed + i) % SEED_MODULUS for i in range(count))
    conditioning = conditioning_of(request, context, seeds, regions.parts if regions is not None else None)
    output = output_of(request, context, first, second, conditioning, seeds)
    key = merge_key(request, first, conditioning) if mergeable else None
    image_prompt = image_prompt_plan(request.ip_images, context.adapters) if context.adapters else None
    return RunPlan(request, first, conditioning, second, output, key, regions, image_prompt)


def regions_of(request: Request, context: RunContext) -> RegionPlan | None:
    """Regional prompts' blend weights per attention grid (`region_plan.py`), each part checked to fit its window;
    None without regions or with one part (the plain programs)."""
    layout = request.region_layout()
    scale = context.vae_scale_factor
    plan = region_plan(
        layout, request.region_base, (request.size[0] // scale, request.size[1] // scale), context.unet_levels
    )
    if plan is not None:
        check_part_lengths(context.prompts, request.styled_prompt, request.styled_negative_prompt)
    return plan


def first_pass(request: Request, context: RunContext) -> FirstPass:
    """The first pass's rows (the sampler's plan; with a picture, the rows that run; with the refiner, the base's
    rows up to its switch and then the refiner's) and its speed plan. With the hires fix the refiner runs in the
    second pass only (`second_pass`), A1111's default ("Hires fix: which pass to enable refiner for": second)."""
    sampler = request.sampler or context.sampler.sampler
    given = request.picture(context.vae_scale_factor)
    first = 0 if given is None else request.steps - given.steps_run  # a multistep sampler's history starts there
    plan = cached_plan(context.sampler, request.steps, sampler, request.schedule_type, first)
    picture = None
    if given is not None:  # image to image / inpainting: the last int(steps × strength) steps' rows run
        started_at = image_plan(plan, given.steps_run, pure_noise=given.repaint is not None or context.inpainting_unet)
        plan, picture = started_at.plan, picture_rows(given, started_at.image_weight, context.vae_scale_factor)
    refiner_row = plan.rows
    if context.refiner and request.refiner_switch < 1 and request.hires_scale == 1.0:
        stages = refiner_plan(
            plan,
            request.refiner_switch,
            context.sampler.num_train_timesteps,
            lambda k: cached_plan(context.sampler, request.steps, sampler, request.schedule_type, first + k),
        )
        plan, refiner_row = stages.plan, stages.switch_row
    guided = is_guided(request, context)
    speed = cached_speed_plan(plan.rows, request.cfg_end, request.deepcache, cfg=context.sampler.cfg, guided=guided)
    return FirstPass(request.size, plan, speed, guided, picture, refiner_row, extras_plan(request, plan))


def is_guided(request: Request, context: RunContext) -> bool:
    """guidance <= 1 asks for none: the guidance-free step programs, where the levers compiled them."""
    return request.guidance_scale > 1 or not context.levers


def picture_rows(given: Picture, weight: float, vae_scale_factor: int) -> PictureRows:
    """A request's picture (uint8 [H, W, 3]) and repaint mask (bool [H, W], None: all) as one image's rows."""
    pixels = given.pixels
    repaint = np.ones(pixels.shape[:2], bool) if given.repaint is None else given.repaint
    small = latent_mask(repaint, vae_scale_factor) if given.repaint_latents is None else given.repaint_latents
    arrays = (pixels[None], np.ones((1, *pixels.shape[:2]), bool), ~repaint[None], np.asarray(small)[None])
    return PictureRows(arrays, weight)


def conditioning_of(
    request: Request, context: RunContext, seeds: tuple[int, ...], parts: int | None = None
) -> Conditioning:
    """Both texts as token rows, one per image of the call, in `RequestInputs`' order (ids and weights of both texts,
    has_negative, the windows they fill, guidance, seeds), and what else conditions the UNet. `parts`: a regional
    prompt's, one window each (split on BREAK), and the negative prompt's one window repeated for every part."""
    n, windows = len(seeds), parts or context.windows
    extra = ExtraRows()  # the embeddings both texts name, each once
    text = context.prompts.read(request.styled_prompt, windows, extra)  # ids, weights [2, N*77], windows it fills
    negative = context.prompts.read(request.styled_negative_prompt, 1 if parts else windows, extra)
    if parts:
        tiled = (np.tile(negative.ids, (1, parts)), np.tile(negative.weights, (1, parts)))
        negative = dataclasses.replace(negative, ids=tiled[0], weights=tiled[1], windows=parts)
    k = parts or text_windows(max(text.windows, negative.windows), windows)
    read = context.prompts.tokenizers[0].model_max_length * k  # K*77 (CLIP reads 77)
    ids = [np.broadcast_to(row[:, :read], (n, 2, read)) for row in (text.ids, negative.ids)]  # [B, 2, K*77]
    weights = [np.broadcast_to(row[:, :read], (n, 2, read)) for row in (text.weights, negative.weights)]
    has_negative = np.full((n,), bool(request.styled_negative_prompt))  # [B]
    filled = np.broadcast_to(np.asarray([negative.windows, text.windows], np.int32), (n, 2))  # [B, 2]
    guidance = np.full((n,), request.guidance_scale, np.float32)  # [B]
    seed_array = np.asarray(seeds, np.uint32)  # [B]
    key = text_key(text, negative, read, has_negative[0], request.clip_skip, extra.names, request.loras)
    return Conditioning(
        rows=(*ids, has_negative, filled, guidance, seed_array, *weights),
        windows=k,
        embeddings=extra,
        text_key=key,
        overflow=text.overflow,
        clip_skip=request.clip_skip,
        loras=request.loras,
        controlnets=request.controlnets,
        aesthetic=(request.negative_aesthetic_score, request.aesthetic_score),
    )


def text_windows(filled: int, windows: int) -> int:
    """K, the 77-token windows a request's texts are read in when the longer fills `filled`: 1 (the 1-window
    programs: a short prompt pays nothing for the long ones), else the server's N. The first window of N-window
    token rows is the 1-window rows, so K = 1 keeps only it."""
    return 1 if filled <= 1 else windows


def second_pass(request: Request, context: RunContext) -> SecondPass | None:
    """The hires fix's pass (`hires_plan.py`), None with it off. With the refiner, its rows are split at
    `refiner_switch` as the first pass's would be (`refiner_plan.py`: diffusers' `denoising_end` on the second
    pass's timesteps), so the refiner finishes the upscaled picture."""
    if request.hires_scale == 1.0:
        return None
    if request.hires_upscaler not in context.rules.hires_upscalers:  # a follower's request, checked by the leader
        raise InvalidInput(
            f"The hires upscaler {request.hires_upscaler} is not offered by this server: its file "
            "could not be read (the server's log says why)."
        )
    size = context.hires_sizes[(request.size, request.hires_scale)]
    sampler = request.sampler or context.sampler.sampler

    def make_plan(schedule: int, first: int) -> Plan:
        return cached_plan(context.sampler, schedule, sampler, request.schedule_type, first)

    hires = hires_plan(
        size, request.hires_upscaler, request.steps, request.hires_steps, request.hires_denoise, make_plan
    )
    if context.refiner and request.refiner_switch < 1:
        begun = hires.schedule - hires.plan.steps  # the schedule's first step the second pass runs
        stages = refiner_plan(
            hires.plan,
            request.refiner_switch,
            context.sampler.num_train_timesteps,
            lambda k: make_plan(hires.schedule, begun + k),
        )
        refined = stages.switch_row < stages.plan.rows
        hires = dataclasses.replace(hires, plan=stages.plan, refiner_row=stages.switch_row if refined else None)
    speed = cached_speed_plan(
        hires.plan.rows, request.cfg_end, request.deepcache, cfg=context.sampler.cfg, guided=is_guided(request, context)
    )
    return SecondPass(hires, speed, extras_plan(request, hires.plan))


def output_of(
    request: Request,
    context: RunContext,
    first: FirstPass,
    second: SecondPass | None,
    conditioning: Conditioning,
    seeds: tuple[int, ...],
) -> Output:
    """The images the request gets back (its first `num_images`), each one's `parameters` text as A1111 writes it,
    and the words its prompt lost."""
    returned = min(len(seeds), context.num_images)
    refined = first.refiner_row < first.plan.rows or (second is not None and second.hires.refiner_row is not None)
    prompt, negative_prompt = request.styled_prompt, request.styled_negative_prompt
    reader, extra = context.prompts, conditioning.embeddings
    text = text_settings(
        [(name, reader.embeddings[name].short_hash) for name in extra.names],
        reader.emphasis,
        reader.emphasis != "original" and any(map(has_emphasis, (prompt, negative_prompt))),
    )
    lora_hashes = context.lora_hashes(request.loras) if request.loras and context.lora_hashes else ""
    settings = written_settings(
        request.plain_values(),
        style=request.style,
        has_picture=request.init_image is not None,
        lora_hashes=lora_hashes,
        text=text,
        controlnets=request.controlnets,
        image_prompts=_image_prompt_units(request, context),
        mask=request.mask_use().settings(request.mask_image is not None),
        regions=_divide_mode(request),
    )
    if refined:  # A1111 writes the refiner's name before its switch
        settings = {"Refiner": context.refiner, **settings}
    height, width = request.size
    plan = first.plan
    parameters = tuple(
        describe(
            prompt=request.written_prompt or prompt,
            negative_prompt=negative_prompt,
            seed=seed,
            steps=request.steps,
            guidance_scale=request.guidance_scale,
            height=height,
            width=width,
            model=context.model,  # named without its server path (parameters.model_name)
            unet=context.unet,  # the --unet file, by file name
            dtype=context.dtype,
            sampler=sampler_label(plan.sampler, context.sampler.prediction_type),
            spacing=spacing_written(plan, context.sampler),
            extra=settings,
        )
        for seed in seeds[:returned]
    )
    dropped = dropped_text(reader.tokenizers[0], prompt, context.windows) if conditioning.overflow else ""
    truncated = summarize_dropped(dropped, context.windows, style_tail(context.rules, request.style))  # fits a toast
    given = request.picture(context.vae_scale_factor)
    return Output(seeds, returned, parameters, truncated, refined, None if given is None else given.paste)


def _divide_mode(request: Request) -> tuple[str, str] | None:
    """Regional Prompter's divide mode and ratios, for `parameters` (None: no regions)."""
    layout = request.region_layout()
    return (layout.mode, layout.ratios) if layout is not None else None


def spacing_written(plan: Plan, sampler: SamplerConfig) -> str | None:
    """The timestep spacing a plan ran with, for its parameters (None where its schedule type sets the sigmas)."""
    if plan.schedule_type in ("Karras", "Exponential") or plan.sampler == "lcm":
        return None
    return "trailing" if plan.schedule_type == "SGM Uniform" else sampler.timestep_spacing


def style_tail(rules: RequestRules, style: str) -> str:
    """The words a style's template puts after the prompt ("" for none): what a long styled prompt loses first."""
    template = rules.styles.get(style)
    return template.prompt.partition(PLACEHOLDER)[2] if template is not None else ""


def _image_prompt_units(request: Request, context: RunContext) -> tuple:
    """(module, adapter, scale, start, end) of each image prompt, as its `parameters` entry writes it."""
    if not request.ip_images or context.adapters is None:
        return ()
    modules = dict(zip(context.adapters.names, context.adapters.modules, strict=True))
    return tuple((modules[p.adapter], p.adapter, p.scale, p.start, p.end) for p in request.ip_images)


def merge_key(request: Request, first: FirstPass, conditioning: Conditioning) -> tuple:
    """What the requests of one merged call share: what fixes its programs (size, guided or not, K), its number
    of UNet calls and speed plan (each row's program is the whole batch's), its weights (the LoRA set), the
    text encoder's replicated inputs (clip skip, the embeddings' tables) and whether they start from pictures
    (each its own, with its own mask and strength: a picture's rows are per image too; text to image reads the
    blank's stand-ins). Not the sampler, schedule type, steps or strength: each image reads its own plan's rows
    (`plan.stacked`), so what must agree is their number."""
    return (
        request.size,
        first.plan.rows,
        request.cfg_end,
        request.deepcache,
        first.guided,
        conditioning.windows,
        request.clip_skip,
        conditioning.embeddings.names,
        request.loras,
        first.picture is not None,
    )
