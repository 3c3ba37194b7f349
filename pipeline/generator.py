"""The generation engine: load once, replicate once, compile once, then run requests that never recompile.

    gen = Generator.from_pretrained("tiny", height=128, width=128, steps=4)   # or Generator.load(EngineConfig(...))
    gen.warmup()                                  # compile + first run, timed apart
    result = gen.generate(gen.request("a photo of a cat", seed=7, steps=8, sampler="DPM++ 2M Karras"))
    result.images                                 # one PIL image per device x per-device batch

Static settings (offered sizes, per-device batch, dtype, device count, CFG on/off, attention) select the compiled
programs (`host/programs.py`), built ahead of time with `jit(...).lower(...).compile()`. Everything a request sets
is an argument: the host loop (`host/loop.py`) runs one compiled step per denoising step, so no request can trigger
a compilation. This module wires the chain: request -> tokens -> device arrays -> loop -> pixels -> images.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from PIL import Image

from .checkpoint.controlnet_loading import load_controlnets
from .checkpoint.embeddings import EmbeddingDirectory, load_embeddings_dir
from .checkpoint.loading import LoadedModel, load_model
from .checkpoint.lora import LoraFile, load_lora_dir, lora_targets
from .checkpoint.refiner_loading import RefinerWeights, load_refiner
from .checkpoint.upscaler_loading import load_upscaler_dir
from .config import SDXL_BASE, EngineConfig
from .contract import image_files as image_io
from .contract.engine import REQUESTS_AT_ONCE
from .contract.errors import InvalidInput
from .contract.hires import LATENT_UPSCALERS, PIXEL_UPSCALERS, UPSCALERS
from .contract.image_inputs import latent_mask
from .contract.parameters import describe, text_settings, written_settings
from .contract.request import Picture, Request, RequestRules, parse_request
from .contract.sampler_names import sampler_label
from .contract.stopping import Stopped
from .contract.styles import PLACEHOLDER
from .device import attention as attention_core
from .device.denoise import LATENT_CHANNELS
from .device.lora import MergeLayout
from .device.modules import Modules
from .device.quantize import quantize_unet_params, quantized_unet
from .device.sharding import batch_sharded, data_mesh, global_batch, replicate_tree, replicated, to_host
from .host import loop
from .host.compile_cache import CompileCounter, configure_compilation_cache
from .host.compiler_options import check as check_compiler_options
from .host.controlnet_plan import ServedControlNets, control_inputs
from .host.emphasis import has_emphasis
from .host.executable_store import StartupPrograms, build_served
from .host.hires_plan import HiresPlan, hires_plan, hires_seeds
from .host.image_plan import image_plan
from .host.loop import Blank, Gate, Listener, PictureInputs, PreviewListener, RefinerInputs, RequestInputs, StopCheck
from .host.lora_sets import LoraSets
from .host.merging import CallMerger, GroupWatchers, Ticket
from .host.plan import HISTORY, Plan, SamplerConfig, stacked
from .host.programs import ProgramKey, ServedPrograms, program_keys
from .host.refiner_plan import refiner_plan
from .host.speed_plan import SpeedPlan, speed_plan
from .host.text_cache import TextCache, text_key
from .host.tokens import ExtraRows, PromptReader, dropped_text, extra_capacity, summarize_dropped
from .host.upscale_tiles import OVERLAP, TILE, TILE_BATCH, TiledUpscaler, tile_starts

logger = logging.getLogger(__name__)

SEED_MODULUS = 2**32
#: A request's per-step program choice (`host/speed_plan.py`), computed once per (steps, cfg_end, deepcache, cfg).
cached_speed_plan = functools.lru_cache(maxsize=256)(speed_plan)


@dataclass(frozen=True)
class MergedPart:
    """What the generator keeps with a request's ticket for its merged call (`Generator._run_group`)."""

    plan: Plan  # its own sampler's rows
    speed: SpeedPlan  # the same for every request of the call (the key)
    windows: int  # K, the 77-token windows its text is read in (the key)
    embeddings: ExtraRows  # the embeddings its texts name (the key: the same names, so the same tables)
    text_key: tuple  # its text's key in the text cache
    text: Any = None  # what reading its prompt found (`PromptReader.read`: the overflow its result reports)
    picture: PictureRows | None = None  # its picture (image to image, inpainting; the key: all or none have one)


@dataclass(frozen=True)
class PictureRows:
    """A request's picture on the host (`Generator._picture_rows`): one image's rows, repeated for each image of its
    block when placed (`Generator._place_pictures`), so a merged call's requests each bring their own."""

    arrays: tuple[np.ndarray, ...]  # pixels uint8 [1, H, W, 3], keep [1, H, W], keep_unmasked [1, H, W], repaint mask
    #                                 at latent size float32 [1, 1, h, w] (`PictureInputs`' order)
    weight: float  # start latents = weight·x0 + init_sigma·n (`image_plan.ImagePlan.image_weight`)


@dataclass(frozen=True)
class GenerationResult:
    """What one call produced, and how."""

    images: list[Image.Image]  # one per device x per-device batch, each with .info["parameters"]
    seeds: list[int]  # seed of each image: image i alone is image 0 of a call with seeds[i]
    prompt: str  # the prompt the encoders read (style applied)
    negative_prompt: str  # the negative prompt the encoders read ("" = none)
    truncated: str  # "" or a sentence naming the words past CLIP's 77-token limit
    parameters: list[str]  # the PNG `parameters` text of each image
    timings: dict[str, float] = field(default_factory=dict)  # total_s, host_s, device_s, first_step_s
    steps: int = 0  # denoising steps this call ran
    sampler: str = ""  # the sampler it ran, by A1111's name (e.g. "DPM++ 2M Karras")

    def save_pngs(self, directory: str | Path, stem: str = "image") -> list[Path]:
        """Write the images as `<stem>-00000.png`, ... with their `parameters` text chunks, numbered on from the
        folder's highest: an earlier run's images are never replaced."""
        return image_io.save_pngs(self.images, directory, stem)


def style_tail(rules: RequestRules, style: str) -> str:
    """The words a style's template puts after the prompt ("" for none): what a long styled prompt loses first."""
    template = rules.styles.get(style)
    return template.prompt.partition(PLACEHOLDER)[2] if template is not None else ""


def default_dtype(platform: str | None = None) -> str:
    """bfloat16 where the hardware has it (TPU, GPU); float32 on CPU, where bfloat16 is emulated and slow."""
    platform = platform or jax.default_backend()
    return "float32" if platform == "cpu" else "bfloat16"


def for_platform(config: EngineConfig, platform: str) -> EngineConfig:
    """`config` with what depends on the devices decided: the dtype and the attention core."""
    dtype = config.dtype or default_dtype(platform)
    try:
        attention = attention_core.resolve(config.attention, platform, dtype)
    except attention_core.AttentionUnavailable as exc:
        raise InvalidInput(str(exc)) from None
    if attention == "diffusers" and config.prompt_windows > 1:  # no hook: its cross-attention would read every window
        raise InvalidInput("--attention diffusers reads one 77-token window; use it with --prompt-windows 1.")
    if config.quantize == "int8" and platform in ("gpu", "cuda", "rocm"):  # found compiling it on an H200, jax 0.11.2
        raise InvalidInput("--quantize int8 runs on TPU and CPU only: XLA's GPU backend cannot compile its int8 "
                           "convolutions (cuDNN takes no int32 output).")  # fmt: skip
    return config.replace(dtype=dtype, attention=attention)


def prepare(config: EngineConfig, devices: list | None = None) -> EngineConfig:
    """What a generator needs before weights load: `config` for the devices' platform (`for_platform`), its XLA
    options checked, the compile counter installed and JAX's compilation cache as `config` asks."""
    device = devices[0] if devices else jax.devices()[0]
    config = for_platform(config, device.platform)
    check_compiler_options(config.xla_options, device if devices else None)
    CompileCounter.install()
    configure_compilation_cache(config.compilation_cache)
    return config


def sampler_of(loaded: LoadedModel, config: EngineConfig) -> SamplerConfig:
    """The checkpoint's scheduler config (the loader read it whole), with `config`'s sampler settings over it."""
    return SamplerConfig.from_scheduler_config(loaded.networks.scheduler_config, **config.sampler_overrides())


def read_loras(loaded: LoadedModel, config: EngineConfig) -> tuple[list[LoraFile], MergeLayout | None]:
    """The LoRAs of `config.lora_dir` this checkpoint can take (each refused one logged in one line) and the merge
    layout they need; ([], None) without a directory."""
    if not config.lora_dir:
        return [], None
    targets = lora_targets(loaded.networks.unet_config, loaded.params)
    files = load_lora_dir(config.lora_dir, targets).loras
    logger.info("LoRAs: %d offered from %s", len(files), config.lora_dir)
    return files, (MergeLayout.from_loras(files, targets.shapes, factor_dtype=config.dtype) if files else None)


def read_embeddings(loaded: LoadedModel, config: EngineConfig) -> EmbeddingDirectory:
    """The SDXL embeddings of `config.embeddings_dir` this checkpoint's encoders take and the refused files (each
    logged in one line); none without a directory."""
    if not config.embeddings_dir:
        return EmbeddingDirectory()
    return load_embeddings_dir(config.embeddings_dir, text_widths(loaded.params))


def read_upscalers(config: EngineConfig) -> dict[str, TiledUpscaler]:
    """The ESRGAN models of `config.upscaler_dir` by name, each ready to run on tiles (compiled by `warmup`); a file
    that cannot be read is logged in one line and left out; none without a directory or the hires fix."""
    if not config.upscaler_dir or not config.hires_scales:
        return {}
    loaded = load_upscaler_dir(config.upscaler_dir, logger.warning)
    logger.info("upscalers: %d offered from %s", len(loaded), config.upscaler_dir)
    largest = max(max(size) for size in config.offered_sizes)  # no first pass is larger: a smaller tile does
    tile = min(TILE, -(-largest // 4) * 4)  # a multiple of every pixel-unshuffle (1, 2, 4)
    batch = min(TILE_BATCH, len(tile_starts(largest, tile, OVERLAP)) ** 2)  # no blank tiles run for nothing
    return {name: TiledUpscaler(weights.module, weights.params, tile=tile, batch=batch)
            for name, weights in loaded.items()}  # fmt: skip


def text_widths(params) -> tuple[int, int]:
    """(D1, D2): the widths of the two text encoders' input vectors."""
    return tuple(
        int(params[name]["text_model"]["embeddings"]["token_embedding"]["embedding"].shape[1])
        for name in ("text_encoder", "text_encoder_2")
    )


def served_modules(loaded: LoadedModel, config: EngineConfig) -> Modules:
    """The checkpoint's modules as the programs run them: with `--quantize int8`, the UNet's int8 form."""
    modules = Modules.of(loaded.networks)
    if config.quantize == "none":
        return modules
    return dataclasses.replace(modules, unet=quantized_unet(modules.unet))


def served_params(loaded: LoadedModel, config: EngineConfig) -> dict:
    """The weights as the programs take them: with `--quantize int8`, the UNet's kernels int8 + scales."""
    if config.quantize == "none":
        return loaded.params
    return {**loaded.params, "unet": quantize_unet_params(loaded.networks.unet, loaded.params["unet"])}


def latent_multiple(modules: Modules) -> int:
    """What every side of a served size divides by: the VAE's factor, then one halving per UNet down block but the
    last."""
    return modules.vae_scale_factor * 2 ** (len(modules.unet.config.down_block_types) - 1)


def hires_pairs(config: EngineConfig, multiple: int) -> tuple[tuple[tuple[int, int], tuple[int, int]], ...]:
    """(offered size, hires size) for each offered size and hires scale: what `program_keys(hires=...)` compiles."""
    return tuple(dict.fromkeys((size, big) for (size, _), big in config.hires_sizes(multiple).items()))


def build_programs(
    loaded: LoadedModel, config: EngineConfig, params, mesh, sampler: SamplerConfig, layout: MergeLayout | None = None,
    controlnets: tuple = (), refiner: RefinerWeights | None = None, images_per_device: int | None = None,
) -> ServedPrograms:
    """The programs a server with `config` runs, on `mesh`, for `params` (placed weights, or their shapes: a TPU
    topology's precompile reads shapes only) and the LoRAs' merge `layout`. The generator and `precompile` both
    build them here. `controlnets`: the served ControlNets' architectures (`ServedControlNets.archs`); `refiner`:
    the --refiner's modules (its weights are `params`' refiner_* entries); `images_per_device`: a merged call's
    size other than `config.per_device_batch` (`EngineConfig.merge_call_sizes`)."""
    modules = dataclasses.replace(served_modules(loaded, config), controlnets=tuple(controlnets))
    if refiner is not None:
        modules = dataclasses.replace(modules, refiner_unet=refiner.unet, refiner_text_encoder_2=refiner.text_encoder_2)
    return ServedPrograms(
        modules,
        params,
        mesh,
        per_device_batch=images_per_device or config.per_device_batch,
        attention=config.attention,
        prediction_type=sampler.prediction_type,
        max_tokens=loaded.networks.tokenizer.model_max_length,
        prompt_windows=config.prompt_windows,
        levers=config.speed_levers,
        lora_layout=layout,
        emphasis=config.emphasis,
        cfg=sampler.cfg,
        refiner_zero_negative=refiner.zero_empty_negative if refiner is not None else False,
        vae_tile_above=config.vae_tile_above,
        xla_options=config.xla_options,
        cross_attention_cache=config.cross_attention_cache,
    )


def merged_program_keys(config: EngineConfig, cfg: bool) -> list[ProgramKey]:
    """The programs of a --merge-requests call smaller than N: text to image, image to image and inpainting on the
    base alone (no ControlNets, hires fix or refiner; the LoRA merge is N's). The generator and `precompile` both
    list them here."""
    return program_keys(list(config.offered_sizes), cfg, config.speed_levers, previews=config.previews,
                        windows=config.prompt_windows, cross_kv=config.cross_attention_cache)  # fmt: skip


def with_refiner(params: dict, refiner: RefinerWeights | None) -> dict:
    """The weights the programs take, with the refiner's UNet (and its own text encoder 2, unless it shares the
    base's) as `refiner_unet` / `refiner_text_encoder_2`."""
    if refiner is None:
        return params
    return {**params, **{f"refiner_{name}": tree for name, tree in refiner.params.items()}}


class Generator:
    """SDXL on every device of a 1-D mesh: compiled programs, one image per device (x per-device batch)."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, devices: list | None = None,
                 controlnets: list | None = None, refiner: RefinerWeights | None = None):  # fmt: skip
        self.config = config  # resolved for the devices (`for_platform`)
        self.source = loaded.source
        self.mesh = data_mesh(devices)
        self.device_count = self.mesh.devices.size
        self.device_kind = self.mesh.devices.flat[0].device_kind
        #: B: images per device call (--images-per-device on every device)
        self.images_per_call = self.device_count * config.per_device_batch
        #: Images per request: one per device with --merge-requests (a call holds several requests), else the call's
        self.num_images = self.device_count if config.merge_requests else self.images_per_call
        self._tokenizers = (loaded.networks.tokenizer, loaded.networks.tokenizer_2)
        self._max_tokens = self._tokenizers[0].model_max_length  # 77 for CLIP
        self.sampler = sampler_of(loaded, config)
        self._check_sizes(Modules.of(loaded.networks))
        #: The UNet's parameter count (SDXL's 2.57 B): what a request's time on a CPU grows with (the page's CPU note)
        self.unet_parameters = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(loaded.params["unet"]))
        #: What a request may ask for and what it gets when it names nothing (`request.parse_request`).
        files, layout = read_loras(loaded, config)
        #: The embeddings of --embeddings-dir offered (`.offered`: name, vectors, hash) and refused (`.refused`)
        self.embedding_files = read_embeddings(loaded, config)
        #: Prompts -> token ids and weights (A1111's emphasis, the embeddings offered)
        self.prompts = PromptReader(self._tokenizers, config.emphasis, self.embedding_files.offered)
        self.rules = dataclasses.replace(
            RequestRules.of(config), sampler=sampler_label(self.sampler.sampler), cfg=self.sampler.cfg,
            loras=tuple(lora.name for lora in files), embeddings=tuple(self.prompts.embeddings),
        )  # fmt: skip
        #: The ControlNets served (--controlnet; those that fit this UNet), placed on the devices
        self.controlnets = ServedControlNets.of(controlnets or [], loaded, self.mesh, config.controlnet_units)
        self.rules = dataclasses.replace(self.rules, controlnets=self.controlnets.names,
                                         refiner=refiner.name if refiner is not None else "")  # fmt: skip
        #: The ESRGAN hires upscalers of --upscaler-dir by name, each on its tiles (`host/upscale_tiles.py`)
        self.upscalers = read_upscalers(config)
        self.rules = dataclasses.replace(self.rules, hires_upscalers=(*UPSCALERS, *self.upscalers))
        #: The --refiner loaded (None without one): its name, modules and whether it shares text encoder 2
        self.refiner = refiner
        started = time.perf_counter()
        served = with_refiner(served_params(loaded, config), refiner)  # --quantize int8: the UNet's int8 kernels
        self._params = jax.block_until_ready(replicate_tree(served, self.mesh))  # placed once, kept
        self.load_timings = {
            "load_s": loaded.load_s,
            "cast_s": loaded.cast_s,
            "replicate_s": time.perf_counter() - started,
        }
        self._batch_sharding = batch_sharded(self.mesh)
        self._replicated = replicated(self.mesh)
        self.programs = build_programs(loaded, config, self._params, self.mesh, self.sampler, layout,
                                       self.controlnets.archs, refiner)  # fmt: skip
        #: --merge-requests: each call size's programs (images per device -> programs; N's are `programs`). The
        #: smaller ones serve text or picture to image on the base alone, the requests that merge
        #: (`merged_program_keys`).
        self.call_programs = {n: self.programs if n == config.per_device_batch else
                              build_programs(loaded, config, self._params, self.mesh, self.sampler, layout,
                                             images_per_device=n) for n in config.merge_call_sizes}  # fmt: skip
        #: The LoRAs offered and the set merged now (None without any)
        self.loras = LoraSets(files, layout, self.programs, self._params, self._put_all,
                              placed=self.config.lora_cache) if files else None  # fmt: skip
        self._device_lock = threading.Lock()  # one request on the devices at a time
        if config.merge_requests and jax.process_count() > 1:
            raise InvalidInput("--merge-requests runs on one process: several processes would each have to merge "
                               "the same requests in the same calls.")  # fmt: skip
        #: --merge-requests: queued text-to-image requests that share one call (host/merging.py); None: each alone
        self.merger = CallMerger(config.merge_call_sizes, self._run_group) if config.merge_requests else None
        #: Requests the engine works on at once: one, or with merging a call's N and the next call's N
        self.requests_at_once = 2 * config.per_device_batch if config.merge_requests else 1
        #: Requests the page's generate event runs at once (contract/engine.py): with merging, enough to fill the calls
        self.concurrency = max(REQUESTS_AT_ONCE, self.requests_at_once)
        #: The text programs' outputs of the last --text-cache texts, on the devices (host/text_cache.py)
        self.text_cache = TextCache(config.text_cache)
        self._blanks: dict[tuple[int, int, int], Blank] = {}  # per call batch and size: the stand-ins for "no picture"
        self._no_embeddings: dict[int, tuple] = {}  # per K windows: the empty embedding tables, on the devices
        #: The last calls' outcomes, newest last: steps, done, stopped, sampler and the loop's *_at moments (Stop)
        self.recent_runs: collections.deque[dict] = collections.deque(maxlen=32)
        self._compiles_at_start = CompileCounter.compiles()
        #: How `warmup` got each program (loaded, traced, compiled; None before it)
        self.startup_programs: StartupPrograms | None = None

    @classmethod
    def load(cls, config: EngineConfig, devices: list | None = None) -> Generator:
        """Load `config.model` and place it on `devices` (default: all); bad settings fail before the weights load.

        PyTorch safetensors are converted without torch (`variant="fp16"` picks *.fp16.safetensors); `unet` swaps in
        a whole-UNet .safetensors file (path or REPO:FILE), e.g. an SDXL-Lightning UNet.
        """
        config = prepare(config, devices)
        SamplerConfig().with_overrides(**config.sampler_overrides())  # bad sampler settings fail before loading
        loaded = load_model(
            config.model, dtype=config.dtype, revision=config.revision, variant=config.variant, unet=config.unet,
            conversion_cache=config.conversion_cache,
        )  # fmt: skip
        nets = load_controlnets(config.controlnets, config.dtype, variant=config.variant,
                                use_cache=config.conversion_cache) if config.controlnets else []  # fmt: skip
        refiner = load_refiner(config.refiner, loaded, dtype=config.dtype, variant=config.variant,
                               use_cache=config.conversion_cache) if config.refiner else None  # fmt: skip
        return cls(loaded, config, devices, nets, refiner)

    @classmethod
    def from_pretrained(cls, model: str = SDXL_BASE, *, devices: list | None = None, **settings) -> Generator:
        """`load(EngineConfig(model=model, **settings))`: any `EngineConfig` field as a keyword."""
        return cls.load(EngineConfig(model=model, **settings), devices)

    # ---- static shapes -------------------------------------------------------------------------------------------

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """The offered (height, width) sizes, the default first."""
        return list(self.config.offered_sizes)

    def program_keys(self) -> list[ProgramKey]:
        """Every program this generator serves: encode, then start/step/decode per offered size."""
        return program_keys(self.sizes, self.sampler.cfg, self.config.speed_levers, lora=self.loras is not None,
                            previews=self.config.previews, windows=self.config.prompt_windows,
                            control_sets=self.controlnets.sets, refiner=self.refiner is not None,
                            hires=hires_pairs(self.config, self.latent_multiple),
                            cross_kv=self.config.cross_attention_cache)

    def merged_program_keys(self) -> list[ProgramKey]:
        """The programs of a merged call smaller than N (`merged_program_keys`)."""
        return merged_program_keys(self.config, self.sampler.cfg)

    @property
    def hires_sizes(self) -> dict[tuple[int, int], tuple[int, int]]:
        """Each offered size's hires sizes: {((height, width), scale): (H, W)} (`EngineConfig.hires_sizes`)."""
        return self.config.hires_sizes(self.latent_multiple)

    @property
    def device_summary(self) -> str:
        """What runs where, e.g. "8 × cpu", "4 × TPU v5 lite" or "16 × TPU v5 lite on 4 hosts"."""
        hosts = jax.process_count()
        return f"{self.device_count} × {self.device_kind}" + (f" on {hosts} hosts" if hosts > 1 else "")

    @property
    def compile_count(self) -> int:
        """Programs XLA built in this process since this generator was created (compiled, or loaded from the cache)."""
        return CompileCounter.compiles() - self._compiles_at_start

    def _check_sizes(self, modules: Modules) -> None:
        # The UNet halves the latents once per down block but the last: sides must divide evenly all the way down.
        multiple = self.latent_multiple = latent_multiple(modules)
        for size in self.sizes:
            for name, value in zip(("height", "width"), size, strict=True):  # name the value the user got wrong
                if value % multiple:
                    raise InvalidInput(f"{name.capitalize()} must be a multiple of {multiple}; got {value}.")

    def warmup(self) -> dict[str, float]:
        """Build every served program (loaded from this host's executables, or traced, lowered and compiled), then
        run each offered size once; compile_s (all of the programs' phase) and first_run_s are totals, with the
        programs' phases apart (`host/executables.StartupPrograms.timings`)."""
        started = time.perf_counter()
        store = self.config.compilation_cache and self.config.executable_cache
        self.startup_programs = build_served(self.programs, self.program_keys(), store=store)
        for programs in self.call_programs.values():  # --merge-requests: the smaller calls' programs
            if programs is not self.programs:
                self.startup_programs = self.startup_programs.joined(
                    build_served(programs, self.merged_program_keys(), store=store))
        logger.info("%s", self.startup_programs.summary())
        for upscaler in self.upscalers.values():  # each ESRGAN model's one tile program
            upscaler.compile()
        if self.loras is not None:
            self.loras.prepare()
        timings = {"compile_s": time.perf_counter() - started, **self.startup_programs.timings(), "first_run_s": 0.0}
        for height, width in self.sizes:
            started = time.perf_counter()
            self.generate(self.request("warm-up", size=(height, width)))
            for n in list(self.call_programs)[1:] if self.merger is not None else ():  # the other call sizes, once
                request = self.request("warm-up", size=(height, width))
                plan, _, speed, _ = self._plans(request)
                self._run_group([self._ticket(request, plan, speed) for _ in range(n)])
            first_run_s = time.perf_counter() - started
            timings["first_run_s"] += first_run_s
            logger.info("first run %d×%d, %d steps: %.2f s", width, height, self.config.steps, first_run_s)
        return timings

    # ---- one request ---------------------------------------------------------------------------------------------

    def request(self, prompt: object, **fields) -> Request:
        """`parse_request(prompt, **fields)` against this server's rules: the Python entry point's one check."""
        return parse_request(prompt, rules=self.rules, **fields)

    def generate(
        self,
        request: Request,
        on_step: Listener | None = None,
        should_stop: StopCheck | None = None,
        gate: Gate | None = None,
        on_preview: PreviewListener | None = None,
    ) -> GenerationResult:
        """Run `request` (checked where it entered: nothing is checked again) on every device: `num_images` images,
        image i from seed (seed + i) mod 2**32.

        `on_step(done, total)` is called as each step's result is ready; `should_stop()` is asked before each step,
        and True raises `Stopped`. `gate` makes several processes take one stop decision per step.
        `on_preview(done, total, pixels)` gets the picture forming every 2 steps (uint8 [b, h, w, 3] at latent size,
        this process's images), when the server compiled its previews; without a listener no preview runs.
        """
        started = time.perf_counter()
        prompt, negative_prompt = request.styled_prompt, request.styled_negative_prompt
        plan, picture, speed, switch_row = self._plans(request)
        second = self._hires_plan(request)
        seeds = [(request.seed + i) % SEED_MODULUS for i in range(self.images_per_call)]
        loop_timings: dict[str, float] = {}
        if self.merger is not None and self._mergeable(request, second, switch_row, plan):
            seeds = seeds[: self.num_images]
            ticket = self._ticket(request, plan, speed, picture, on_step, should_stop, on_preview)
            text, extra = ticket.extra.text, ticket.extra.embeddings
            pixels, device_s = self.merger.submit(ticket)
        else:
            inputs, text, extra, key = self._inputs(request, seeds)
            pixels, device_s = self._run(request, inputs, plan, speed, picture,
                                         loop.Watchers(on_preview, on_step, should_stop, gate), loop_timings,
                                         switch_row, (second, seeds), text_key=key)  # fmt: skip
            pixels, seeds = pixels[: self.num_images], seeds[: self.num_images]  # with merging: one per device
        windows = self.config.prompt_windows
        dropped = dropped_text(self._tokenizers[0], prompt, windows) if text.overflow else ""
        truncated = summarize_dropped(dropped, windows, style_tail(self.rules, request.style))  # fits a toast
        refined = switch_row < plan.rows or (second is not None and second.refiner_row is not None)
        parameters = self._describe(request, plan, seeds, extra, refined=refined)
        images = image_io.to_pil(pixels, parameters)
        total_s = time.perf_counter() - started
        timings = {"total_s": total_s, "device_s": device_s, "host_s": total_s - device_s,
                   "first_step_s": loop_timings.get("first_step_s", 0.0)}  # fmt: skip
        steps = plan.steps + (second.plan.steps if second is not None else 0)
        return GenerationResult(images=images, seeds=seeds, prompt=prompt, negative_prompt=negative_prompt,
                                truncated=truncated, parameters=parameters, timings=timings, steps=steps,
                                sampler=plan.label)  # fmt: skip

    def _plans(self, request: Request):
        """The request's rows (its sampler's plan; with a picture, the rows that run; with the refiner, the base's
        rows up to its switch and then the refiner's), its picture's host rows (`PictureRows`), its speed plan (per
        step: guided or not, whole UNet or shallow) and the first row the refiner runs (`plan.rows`: none). With the
        hires fix the refiner runs in the second pass only (`_hires_plan`), A1111's default ("Hires fix: which pass
        to enable refiner for": second pass)."""
        given = request.picture(self.programs.modules.vae_scale_factor)
        first = 0 if given is None else request.steps - given.steps_run  # a multistep sampler's history starts there
        plan = loop.cached_plan(self.sampler, request.steps, request.sampler or self.sampler.sampler,
                                request.schedule_type, first)  # fmt: skip
        picture = None
        if given is not None:  # image to image / inpainting: the last int(steps × strength) steps' rows run
            pure_noise = given.repaint is not None or self.programs.inpainting_unet
            started_at = image_plan(plan, given.steps_run, pure_noise=pure_noise)
            plan, picture = started_at.plan, self._picture_rows(given, started_at.image_weight)
        # guidance <= 1 asks for none: the guidance-free step programs, where the levers compiled them
        guided = request.guidance_scale > 1 or not self.config.speed_levers
        switch_row = plan.rows
        if self.refiner is not None and request.refiner_switch < 1 and request.hires_scale == 1.0:
            sampler = request.sampler or self.sampler.sampler
            stages = refiner_plan(plan, request.refiner_switch, self.sampler.num_train_timesteps,
                                  lambda k: loop.cached_plan(self.sampler, request.steps, sampler,
                                                             request.schedule_type, first + k))  # fmt: skip
            plan, switch_row = stages.plan, stages.switch_row
        speed = cached_speed_plan(plan.rows, request.cfg_end, request.deepcache, cfg=self.sampler.cfg, guided=guided)
        return plan, picture, speed, switch_row

    def _hires_plan(self, request: Request) -> HiresPlan | None:
        """The request's second pass (`host/hires_plan.py`): None with the hires fix off. With the refiner, its
        rows are split at `refiner_switch` as the first pass's would be (`host/refiner_plan.py`: diffusers'
        `denoising_end` on the second pass's timesteps), so the refiner finishes the upscaled picture."""
        if request.hires_scale == 1.0:
            return None
        if request.hires_upscaler not in self.rules.hires_upscalers:  # a request checked against a dir's file names
            raise InvalidInput(f"The hires upscaler {request.hires_upscaler} is not offered by this server: its file "
                               "could not be read (the server's log says why).")  # fmt: skip
        size = self.hires_sizes[(request.size, request.hires_scale)]
        sampler = request.sampler or self.sampler.sampler

        def make_plan(schedule: int, first: int):
            return loop.cached_plan(self.sampler, schedule, sampler, request.schedule_type, first)

        second = hires_plan(size, request.hires_upscaler, request.steps, request.hires_steps, request.hires_denoise,
                            make_plan)  # fmt: skip
        if self.refiner is None or request.refiner_switch >= 1:
            return second
        first = second.schedule - second.plan.steps  # the schedule's first step the second pass runs
        stages = refiner_plan(second.plan, request.refiner_switch, self.sampler.num_train_timesteps,
                              lambda k: make_plan(second.schedule, first + k))  # fmt: skip
        refined = stages.switch_row < stages.plan.rows
        return dataclasses.replace(second, plan=stages.plan, refiner_row=stages.switch_row if refined else None)

    def _hires_inputs(self, request: Request, second: HiresPlan | None, seeds: list[int]) -> loop.HiresInputs | None:
        """The second pass's inputs on the devices (its seeds, its size's stand-ins; a pixel upscaler's resize)."""
        if second is None:
            return None
        height, width = second.size
        guided = request.guidance_scale > 1 or not self.config.speed_levers
        speed = cached_speed_plan(second.plan.rows, request.cfg_end, request.deepcache, cfg=self.sampler.cfg,
                                  guided=guided)  # fmt: skip
        keep, seed_array = global_batch((np.ones((self.images_per_call, height, width), bool), hires_seeds(seeds)),
                                        self._batch_sharding)  # fmt: skip
        latent = second.upscaler in LATENT_UPSCALERS
        resize = None if latent else functools.partial(self._resize, size=second.size,
                                                       method=PIXEL_UPSCALERS.get(second.upscaler, "LANCZOS"),
                                                       model=self.upscalers.get(second.upscaler))  # fmt: skip
        refiner = None if second.refiner_row is None else \
            self._refiner_inputs(request, second.refiner_row, second.plan.rows)  # fmt: skip
        return loop.HiresInputs(size=second.size, upscaler=second.upscaler, latent=latent, plan=second.plan,
                                speed=speed, seeds=seed_array, blank=self._blank(height, width, self._params),
                                keep=keep, resize=resize, refiner=refiner)  # fmt: skip

    def _resize(self, pixels: jax.Array, *, size: tuple[int, int], method: str,
                model: TiledUpscaler | None = None) -> jax.Array:  # fmt: skip
        """A pixel upscaler: the first pass's uint8 [B, h, w, 3] gathered, each image resized with PIL's `method`
        (A1111's Lanczos and Nearest are PIL's), placed back split over the batch: uint8 [B, H, W, 3]. With an
        ESRGAN `model`, each image is the model's (tiled) first, then resized to the hires size unless already
        there (A1111's `upscale` then LANCZOS when the model's scale is not the one asked for)."""
        height, width = size
        resample = getattr(Image.Resampling, method)
        images = [model.upscale(image) for image in to_host(pixels)] if model is not None else list(to_host(pixels))
        resized = np.stack([image if image.shape[:2] == (height, width) else
                            np.asarray(Image.fromarray(image).resize((width, height), resample=resample))
                            for image in images])  # fmt: skip
        return global_batch((resized,), self._batch_sharding)[0]

    def _host_rows(self, request: Request, seeds: list[int]) -> tuple[tuple[np.ndarray, ...], int, Any, ExtraRows]:
        """The request's per-image host arrays, one row per seed, in `RequestInputs`' order (ids and weights of both
        texts, has_negative, the windows they fill, guidance, seeds), K (the windows read), what reading the prompt
        found (`text`: overflow) and the embeddings both texts name."""
        n, windows = len(seeds), self.config.prompt_windows
        extra = ExtraRows()  # the embeddings both texts name, each once
        text = self.prompts.read(request.styled_prompt, windows, extra)  # ids, weights [2, N*77], windows it fills
        negative = self.prompts.read(request.styled_negative_prompt, windows, extra)
        k = self.text_windows(max(text.windows, negative.windows))
        read = self._max_tokens * k  # K*77
        rows = [np.broadcast_to(row[:, :read], (n, 2, read)) for row in (text.ids, negative.ids)]  # [B, 2, K*77]
        weights = [np.broadcast_to(row[:, :read], (n, 2, read)) for row in (text.weights, negative.weights)]
        has_negative = np.full((n,), bool(request.styled_negative_prompt))  # [B]
        filled = np.broadcast_to(np.asarray([negative.windows, text.windows], np.int32), (n, 2))  # [B, 2]
        guidance = np.full((n,), request.guidance_scale, np.float32)  # [B]
        seed_array = np.asarray(seeds, np.uint32)  # [B]
        arrays = (*rows, has_negative, filled, guidance, seed_array, *weights)  # RequestInputs' order
        key = text_key(text, negative, read, has_negative[0], request.clip_skip, extra.names, request.loras)
        return arrays, k, (text, key), extra

    def _inputs(self, request: Request, seeds: list[int]):
        """The request's texts as token ids and emphasis weights, its guidance and seeds, on the devices
        (`RequestInputs`); with what reading the prompt found (`text`: overflow), the embeddings it names and the
        text's key in the text cache (`host/text_cache.py`)."""
        arrays, k, (text, key), extra = self._host_rows(request, seeds)
        return self._placed(arrays, k, extra, request.clip_skip), text, extra, key

    def _placed(self, arrays: tuple, k: int, extra: ExtraRows, clip_skip: int) -> RequestInputs:
        """Host rows (`_host_rows`, one per image of the call) on the devices, split over the batch."""
        return RequestInputs(
            *global_batch(arrays, self._batch_sharding),
            embedding_tables=self._embedding_tables(extra, k),
            clip_skip=self._put_all((np.int32(clip_skip),))[0],
        )

    def _run(self, request: Request, inputs: RequestInputs, plan, speed, picture: PictureRows | None,
             watchers: loop.Watchers, loop_timings: dict, switch_row: int, second: tuple,
             text_key: tuple) -> tuple[np.ndarray, float]:  # fmt: skip
        """The host loop on the devices, one request at a time: uint8 pixels [B, H, W, 3] on this host and the
        seconds the devices were held (rows from `switch_row` on: the refiner's). Every run (stopped ones too) joins
        `recent_runs`. The text programs run only where the text cache lacks `text_key`'s outputs."""
        run = {"steps": plan.steps, "done": 0, "stopped": False, "sampler": plan.sampler}
        height, width = request.size
        picture = self._place_pictures([picture], self.images_per_call) if picture is not None else None
        with self._device_lock:
            on_device = time.perf_counter()
            hires = self._hires_inputs(request, *second)  # the second pass's, when the hires fix is on
            run["steps"] += hires.plan.steps if hires is not None else 0
            params = self.loras.params_for(request.loras) if self.loras is not None else self._params
            control = control_inputs(self.controlnets, request.controlnets, plan.steps, self.images_per_call,
                                     self._batch_sharding)  # fmt: skip
            kept = self.text_cache.outputs(text_key)
            try:
                pixels = loop.run(
                    self.programs, params, inputs, plan, size=(height, width), cfg=self.sampler.cfg, speed=speed,
                    put=self._put, split=self._split, blank=self._blank(height, width, params), picture=picture,
                    control=control,
                    # Only a request someone watches runs the preview program (compiled or not, the others run the
                    # plain txt2img programs); on several processes the leader tells each follower to run it too.
                    on_preview=watchers.on_preview if self.config.previews else None, on_step=watchers.on_step,
                    should_stop=watchers.should_stop, gate=watchers.gate, timings=loop_timings,
                    refiner=self._refiner_inputs(request, switch_row, plan.rows), hires=hires, kept=kept,
                )  # fmt: skip
            except Stopped as stopped:
                run.update(done=stopped.done, stopped=True)
                raise
            except BaseException:  # what the text programs left may be unusable: the next request makes them again
                self.text_cache.forget(text_key)
                raise
            finally:
                run.update({k: v for k, v in loop_timings.items() if k.endswith("_at")})
                self.recent_runs.append(run)
            pixels = to_host(pixels)  # uint8 [B, H, W, 3], gathered from every process
            run["done"] = plan.steps + (hires.plan.steps if hires is not None else 0)
            return pixels, time.perf_counter() - on_device

    def _ticket(self, request: Request, plan, speed, picture: PictureRows | None = None,
                on_step: Listener | None = None, should_stop: StopCheck | None = None,
                on_preview: PreviewListener | None = None) -> Ticket:  # fmt: skip
        """A mergeable request's ticket for the merger: its rows (one per device: seeds seed, seed + 1, ...), key,
        listeners and what `_run_group` reads of it."""
        seeds = [(request.seed + i) % SEED_MODULUS for i in range(self.num_images)]
        arrays, k, (text, key), extra = self._host_rows(request, seeds)
        merge_key = self._merge_key(request, plan.rows, k, extra, picture is not None)
        return Ticket(merge_key, arrays, len(speed.schedule), request, on_step, should_stop, on_preview,
                      extra=MergedPart(plan, speed, k, extra, key, text, picture))  # fmt: skip

    def _mergeable(self, request: Request, second, switch_row: int, plan) -> bool:
        """Whether a request may share a call (--merge-requests): text to image, image to image or inpainting on the
        base alone (no ControlNet, no hires fix, no refiner rows), whose inputs are all per-image rows (the picture's
        too) or settings a key names."""
        return second is None and switch_row == plan.rows and not request.controlnets

    def _merge_key(self, request: Request, rows: int, k: int, extra: ExtraRows, picture: bool) -> tuple:
        """What the requests of one merged call share: what fixes its programs (size, guided or not, K), its number
        of UNet calls and speed plan (each row's program is the whole batch's), its weights (the LoRA set), the
        text encoder's replicated inputs (clip skip, the embeddings' tables) and whether they start from pictures
        (each its own, with its own mask and strength: a picture's rows are per image too; text to image reads the
        blank's stand-ins). Not the sampler, schedule type, steps or strength: each image reads its own plan's rows
        (`host/plan.stacked`), so what must agree is their number."""
        guided = request.guidance_scale > 1 or not self.config.speed_levers
        return (request.size, rows, request.cfg_end, request.deepcache, guided, k, request.clip_skip, extra.names,
                request.loras, picture)  # fmt: skip

    def _run_group(self, tickets: list[Ticket]) -> None:
        """One merged call (the merger's worker) on the programs of the smallest call size that holds the tickets
        (the merger takes exactly one size's worth; any blocks left are padded with the first's): each ticket's rows
        and plan in its block of the batch, the loop over the stacked plans, each ticket answered with its block. The
        text cache serves a call whose requests all read one text."""
        first, block = tickets[0], self.num_images
        slots = min(n for n in self.call_programs if n >= len(tickets))
        programs = self.call_programs[slots]
        part: MergedPart = first.extra  # what the key makes the same for every ticket: speed, K, embeddings
        request = first.request
        padded = tickets + [first] * (slots - len(tickets))
        arrays = tuple(np.concatenate(parts) for parts in zip(*(t.rows for t in padded), strict=True))  # [B, ...]
        plan = stacked([ticket.extra.plan for ticket in padded], block)  # each block its own sampler's rows
        inputs = self._placed(arrays, part.windows, part.embeddings, request.clip_skip)
        pictures = [ticket.extra.picture for ticket in padded]  # the key: every ticket has one, or none has
        picture = self._place_pictures(pictures, block) if part.picture is not None else None
        watchers = GroupWatchers(tickets, block)
        text_keys = {(programs.batch, ticket.extra.text_key) for ticket in tickets}  # per call size: whole batches
        run = {"steps": plan.steps, "done": 0, "stopped": False, "sampler": plan.sampler, "requests": len(tickets),
               "images_per_device": slots}  # fmt: skip
        height, width = request.size
        loop_timings: dict[str, float] = {}
        with self._device_lock:
            on_device = time.perf_counter()
            params = self.loras.params_for(request.loras) if self.loras is not None else self._params
            kept = self.text_cache.outputs(next(iter(text_keys))) if len(text_keys) == 1 else None
            try:
                pixels = loop.run(
                    programs, params, inputs, plan, size=(height, width), cfg=self.sampler.cfg,
                    speed=part.speed, put=self._put, split=self._split,
                    blank=self._blank(height, width, params, programs), picture=picture,
                    on_step=watchers.on_step,
                    on_preview=watchers.on_preview if self.config.previews and watchers.previews else None,
                    gate=watchers.gate, timings=loop_timings, kept=kept,
                )  # fmt: skip
                pixels = to_host(pixels)  # uint8 [B, H, W, 3]
            except Stopped as stopped:  # every request in the call stopped (each already answered)
                run.update(done=stopped.done, stopped=True)
                return
            except BaseException:
                if kept is not None:
                    self.text_cache.forget(next(iter(text_keys)))
                raise
            finally:
                run.update({name: at for name, at in loop_timings.items() if name.endswith("_at")})
                self.recent_runs.append(run)
            run["done"] = plan.steps
            watchers.answer(pixels, time.perf_counter() - on_device)

    def _refiner_inputs(self, request: Request, switch_row: int, rows: int) -> RefinerInputs | None:
        """The refiner stage's inputs on the devices, when the request's plan has refiner rows."""
        if switch_row >= rows:
            return None
        scores = np.asarray([request.negative_aesthetic_score, request.aesthetic_score], np.float32)
        return RefinerInputs(switch_row=switch_row, aesthetic=self._put(scores))

    def _describe(self, request: Request, plan, seeds: list[int], extra: ExtraRows, refined: bool = False) -> list[str]:
        """Each image's `parameters` text, as A1111 writes it (`refined`: the refiner ran: `Refiner: <name>`)."""
        prompt, negative_prompt = request.styled_prompt, request.styled_negative_prompt
        height, width = request.size
        reader = self.prompts
        text = text_settings([(name, reader.embeddings[name].short_hash) for name in extra.names], reader.emphasis,
                             reader.emphasis != "original" and any(map(has_emphasis, (prompt, negative_prompt))))
        lora_hashes = self.loras.hashes(request.loras) if request.loras and self.loras is not None else ""
        extra_settings = written_settings(request.plain_values(), style=request.style,
                                          has_picture=request.init_image is not None, lora_hashes=lora_hashes,
                                          text=text, controlnets=request.controlnets)  # fmt: skip
        if refined:  # A1111 writes the refiner's name before its switch
            extra_settings = {"Refiner": self.refiner.name, **extra_settings}
        return [
            describe(
                prompt=request.written_prompt or prompt, negative_prompt=negative_prompt, seed=s, steps=request.steps,
                guidance_scale=request.guidance_scale, height=height, width=width,
                model=self.config.model,  # named without its server path (parameters.model_name)
                unet=self.config.unet,  # the --unet file, by file name
                dtype=self.config.dtype, sampler=sampler_label(plan.sampler, self.sampler.prediction_type),
                spacing=self._spacing_written(plan), extra=extra_settings,
            )  # fmt: skip
            for s in seeds
        ]

    def text_windows(self, filled: int) -> int:
        """K, the 77-token windows a request's texts are read in when the longer fills `filled`: 1 (the 1-window
        programs: a short prompt pays nothing for the long ones), else the server's N. The first window of N-window
        token rows is the 1-window rows, so K = 1 keeps only it."""
        return 1 if filled <= 1 else self.config.prompt_windows

    def _embedding_tables(self, extra: ExtraRows, k: int) -> tuple:
        """The request's embedding tables [E, D1], [E, D2] on every device: the vectors its texts use, or (none used)
        the zero tables placed once per K."""
        if not extra.size and k in self._no_embeddings:
            return self._no_embeddings[k]
        tables = self._put_all(extra.tables(extra_capacity(k), self.programs.text_widths))
        if not extra.size:
            self._no_embeddings[k] = tables
        return tables

    def _picture_rows(self, given: Picture, weight: float) -> PictureRows:
        """A request's picture (uint8 [H, W, 3]) and repaint mask (bool [H, W], None: all) as one image's rows."""
        scale, pixels = self.programs.modules.vae_scale_factor, given.pixels
        repaint = np.ones(pixels.shape[:2], bool) if given.repaint is None else given.repaint
        small = latent_mask(repaint, scale) if given.repaint_latents is None else given.repaint_latents  # [1, h, w]
        arrays = (pixels[None], np.ones((1, *pixels.shape[:2]), bool), ~repaint[None], np.asarray(small)[None])
        return PictureRows(arrays, weight)

    def _place_pictures(self, pictures: list[PictureRows], block: int) -> PictureInputs:
        """Pictures on the devices, split over the batch: each one's rows repeated for the `block` images of its
        request ([len(pictures) · block, ...] each), the start weights per image."""
        def repeated(parts) -> np.ndarray:  # each picture's row for its block's images; one picture: a view
            blocks = [np.broadcast_to(rows, (block, *rows.shape[1:])) for rows in parts]
            return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)

        arrays = tuple(map(repeated, zip(*(picture.arrays for picture in pictures), strict=True)))
        weights = np.repeat(np.asarray([picture.weight for picture in pictures], np.float32), block)  # [B]
        return PictureInputs(*global_batch(arrays, self._batch_sharding), weight=weights)

    def _blank(self, height: int, width: int, params, programs: ServedPrograms | None = None) -> Blank:
        """What a step of `programs` (default: N's) reads without a picture, made once per size and call size (call
        with the device lock held)."""
        programs = programs or self.programs
        if (programs.batch, height, width) not in self._blanks:
            n, scale = programs.batch, programs.modules.vae_scale_factor
            latents = np.zeros((n, LATENT_CHANNELS, height // scale, width // scale), np.float32)
            history = np.zeros((n, HISTORY, *latents.shape[1:]), np.float32)  # [B, 4, 4, h, w]
            zeros, ones, history = global_batch((latents, np.ones_like(latents[:, :1]), history),
                                                self._batch_sharding)  # fmt: skip
            masked = zeros
            if programs.inpainting_unet:  # diffusers' inpainting pipeline with an all-white mask: a grey picture
                pixels, keep = np.zeros((n, height, width, 3), np.uint8), np.zeros((n, height, width), bool)
                grey, keep = global_batch((pixels, keep), self._batch_sharding)
                encode = programs.compile(ProgramKey("encode_image", height, width))
                masked = encode(programs.weights(ProgramKey("encode_image"), params), grey, keep)
            self._blanks[(programs.batch, height, width)] = Blank(latents=zeros, repaint=ones, masked=masked,
                                                                  history=history)  # fmt: skip
        return self._blanks[(programs.batch, height, width)]

    def _spacing_written(self, plan) -> str | None:
        """The timestep spacing a plan ran with, for its parameters (None where its schedule type sets the sigmas)."""
        if plan.schedule_type in ("Karras", "Exponential") or plan.sampler == "lcm":
            return None
        return "trailing" if plan.schedule_type == "SGM Uniform" else self.sampler.timestep_spacing

    def _put(self, array: np.ndarray) -> jax.Array:
        """A small host array on every device (replicated), on one process or several."""
        return global_batch((np.asarray(array),), self._replicated)[0]

    def _split(self, array: np.ndarray) -> jax.Array:
        """A per-image host array [B, ...] on the devices, split over the batch (on one process or several)."""
        return global_batch((np.asarray(array),), self._batch_sharding)[0]

    def _put_all(self, arrays) -> tuple:
        """Host arrays on every device (replicated), on one process or several."""
        return global_batch(tuple(np.asarray(a) for a in arrays), self._replicated)

