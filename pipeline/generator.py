"""The generation engine: load once, replicate once, compile once, then run requests that never recompile.

    gen = Generator.from_pretrained("tiny", height=128, width=128, steps=4)   # or Generator.load(EngineConfig(...))
    gen.warmup()                                  # compile + first run, timed apart
    result = gen.generate(gen.request("a photo of a cat", seed=7, steps=8, sampler="DPM++ 2M Karras"))
    result.images                                 # one PIL image per device x per-device batch

Static settings (offered sizes, per-device batch, dtype, device count, CFG on/off, attention) select the compiled
programs (`host/compiling/programs.py`), built ahead of time with `jit(...).lower(...).compile()`. Everything a request
sets is an argument: the host loop (`host/loop.py`) runs one compiled step per denoising step, so no request can trigger
a compilation. This module wires the chain: request -> tokens -> device arrays -> loop -> pixels -> images.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
from PIL import Image

from .checkpoint.controlnet_loading import load_controlnets
from .checkpoint.embeddings import EmbeddingDirectory, load_embeddings_dir
from .checkpoint.ip_adapter_loading import load_ip_adapters
from .checkpoint.loading import LoadedModel, load_model
from .checkpoint.lora import LoraFile, load_lora_dir, lora_targets
from .checkpoint.refiner_loading import RefinerWeights, load_refiner
from .checkpoint.upscaler_loading import load_upscaler_dir
from .config import SDXL_BASE, EngineConfig
from .contract import image_files as image_io
from .contract.engine import REQUESTS_AT_ONCE
from .contract.errors import InvalidInput
from .contract.hires import UPSCALERS
from .contract.request import Request, RequestRules, parse_request
from .contract.sampler_names import sampler_label
from .contract.stopping import Stopped
from .device import attention as attention_core
from .device.lora import MergeLayout
from .device.modules import Modules
from .device.quantize import quantize_unet_params, quantized_unet
from .device.sharding import data_mesh, replicate_tree, to_host
from .host import loop
from .host.compiling.compile_cache import CompileCounter, configure_compilation_cache
from .host.compiling.compiler_options import check as check_compiler_options
from .host.compiling.executable_store import StartupPrograms
from .host.compiling.programs import ProgramKey, ServedPrograms, program_keys
from .host.image_prompt_tables import ImagePromptTables
from .host.loop import Gate, Listener, PreviewListener, RequestInputs, StopCheck
from .host.lora_sets import LoraSets
from .host.merging import CallMerger, GroupWatchers, Ticket
from .host.placement import Placement
from .host.planning.controlnet_plan import ServedControlNets, control_inputs
from .host.planning.run_plan import RunContext, RunPlan, plan_run
from .host.planning.sampler_plan import SamplerConfig
from .host.planning.tokens import PromptReader
from .host.text_cache import TextCache
from .host.upscale_tiles import OVERLAP, TILE, TILE_BATCH, TiledUpscaler, tile_starts
from .merged_calls import merged_run, ticket_of
from .warmup import warm_up

logger = logging.getLogger(__name__)


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

    @classmethod
    def of(
        cls, run: RunPlan, pixels: np.ndarray, total_s: float, device_s: float, first_step_s: float
    ) -> GenerationResult:
        """What `run` made of its call's `pixels` (uint8 [B, H, W, 3] on this host): the images it returns, each
        with its `parameters` text, their seeds, what the call ran, and its seconds: in all (`total_s`), on the
        devices, on the host (the rest), to the first step's result."""
        output, request = run.output, run.request
        timings = {"total_s": total_s, "device_s": device_s, "host_s": total_s - device_s, "first_step_s": first_step_s}
        returned = pixels[: output.returned] if output.paste is None else output.paste.apply(pixels[: output.returned])
        return cls(
            images=image_io.to_pil(returned, list(output.parameters)),
            seeds=list(output.seeds[: output.returned]),
            prompt=request.styled_prompt,
            negative_prompt=request.styled_negative_prompt,
            truncated=output.truncated,
            parameters=list(output.parameters),
            timings=timings,
            steps=run.steps,
            sampler=run.first.plan.label,
        )

    def save_pngs(self, directory: str | Path, stem: str = "image") -> list[Path]:
        """Write the images as `<stem>-00000.png`, ... with their `parameters` text chunks, numbered on from the
        folder's highest: an earlier run's images are never replaced."""
        return image_io.save_pngs(self.images, directory, stem)


def default_dtype(platform: str | None = None) -> str:
    """bfloat16 where the hardware has it (TPU, GPU); float32 on CPU, where bfloat16 is emulated and slow."""
    platform = platform or jax.default_backend()
    return "float32" if platform == "cpu" else "bfloat16"


def for_platform(config: EngineConfig, platform: str) -> EngineConfig:
    """`config` with what depends on the devices decided: the dtype, the attention core and, unless set, the
    cross-attention cache (on CPU devices: there a step program pays the text's keys and values again at every
    call, where diffusers' single program computes them once; bench/HISTORY.md, "Where the engine's extra CPU
    time went")."""
    dtype = config.dtype or default_dtype(platform)
    try:
        attention = attention_core.resolve(config.attention, platform, dtype)
    except attention_core.AttentionUnavailable as exc:
        raise InvalidInput(str(exc)) from None
    if attention == "diffusers" and config.prompt_windows > 1:  # no hook: its cross-attention would read every window
        raise InvalidInput("--attention diffusers reads one 77-token window; use it with --prompt-windows 1.")
    if config.quantize == "int8" and platform in ("gpu", "cuda", "rocm"):  # found compiling it on an H200, jax 0.11.2
        raise InvalidInput(
            "--quantize int8 runs on TPU and CPU only: XLA's GPU backend cannot compile its int8 "
            "convolutions (cuDNN takes no int32 output)."
        )
    cache = config.cross_attention_cache
    if cache is None:
        cache = platform == "cpu" and config.quantize == "none" and attention != "diffusers"
    return config.replace(dtype=dtype, attention=attention, cross_attention_cache=cache)


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
    return {
        name: TiledUpscaler(weights.module, weights.params, tile=tile, batch=batch) for name, weights in loaded.items()
    }


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
    loaded: LoadedModel,
    config: EngineConfig,
    params,
    mesh,
    sampler: SamplerConfig,
    layout: MergeLayout | None = None,
    controlnets: tuple = (),
    refiner: RefinerWeights | None = None,
    ip_adapters: ImagePromptTables | None = None,
    images_per_device: int | None = None,
) -> ServedPrograms:
    """The programs a server with `config` runs, on `mesh`, for `params` (placed weights, or their shapes: a TPU
    topology's precompile reads shapes only) and the LoRAs' merge `layout`. The generator and `precompile` both
    build them here. `controlnets`: the served ControlNets' architectures (`ServedControlNets.archs`); `refiner`:
    the --refiner's modules (its weights are `params`' refiner_* entries); `images_per_device`: a merged call's
    size other than `config.per_device_batch` (`EngineConfig.merge_call_sizes`)."""
    modules = dataclasses.replace(served_modules(loaded, config), controlnets=tuple(controlnets))
    if refiner is not None:
        modules = dataclasses.replace(modules, refiner_unet=refiner.unet, refiner_text_encoder_2=refiner.text_encoder_2)
    if ip_adapters is not None:
        modules = dataclasses.replace(modules, **ip_adapters.modules(config.dtype))
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
        ip_slots=config.ip_slots if ip_adapters is not None and ip_adapters.adapters else 0,
        rows_per_call=config.steps_per_call,
    )


def served_program_keys(
    config: EngineConfig,
    cfg: bool,
    multiple: int,
    *,
    lora: bool = False,
    control_sets: tuple[tuple[int, ...], ...] = (),
    refiner: bool = False,
    image_tokens: int | None = None,
) -> list[ProgramKey]:
    """Every program a server with `config` serves (`program_keys`): the offered sizes and their hires sizes
    (`multiple`: `latent_multiple`), the levers, previews, text windows and cross-attention cache as `config` says;
    the LoRA merge, the ControlNets' `control_sets` and the refiner's as it loaded them. The generator and
    `precompile` both list them here."""
    return program_keys(
        list(config.offered_sizes),
        cfg,
        config.speed_levers,
        lora=lora,
        previews=config.previews,
        windows=config.prompt_windows,
        control_sets=control_sets,
        refiner=refiner,
        hires=hires_pairs(config, multiple),
        cross_kv=config.cross_attention_cache,
        extras=config.unet_extras,
        region_parts=config.region_parts,
        image_tokens=image_tokens,
    )


def merged_program_keys(config: EngineConfig, cfg: bool) -> list[ProgramKey]:
    """The programs of a --merge-requests call smaller than N: text to image, image to image and inpainting on the
    base alone (no ControlNets, hires fix or refiner; the LoRA merge is N's). The generator and `precompile` both
    list them here."""
    return program_keys(
        list(config.offered_sizes),
        cfg,
        config.speed_levers,
        previews=config.previews,
        windows=config.prompt_windows,
        cross_kv=config.cross_attention_cache,
    )


def with_refiner(params: dict, refiner: RefinerWeights | None) -> dict:
    """The weights the programs take, with the refiner's UNet (and its own text encoder 2, unless it shares the
    base's) as `refiner_unet` / `refiner_text_encoder_2`."""
    if refiner is None:
        return params
    return {**params, **{f"refiner_{name}": tree for name, tree in refiner.params.items()}}


def checked_multiple(modules: Modules, sizes: list[tuple[int, int]]) -> int:
    """`latent_multiple`, after checking that every offered size's sides divide by it (the UNet halves the latents
    once per down block but the last: sides must divide evenly all the way down)."""
    multiple = latent_multiple(modules)
    for size in sizes:
        for name, value in zip(("height", "width"), size, strict=True):  # name the value the user got wrong
            if value % multiple:
                raise InvalidInput(f"{name.capitalize()} must be a multiple of {multiple}; got {value}.")
    return multiple


def place_weights(
    loaded: LoadedModel, config: EngineConfig, refiner: RefinerWeights | None, mesh, ip_adapters=None
) -> tuple[dict, dict]:
    """The weights the programs take (`served_params`, with the refiner's and the IP-Adapters'), on every device
    once, and the load's phases in seconds."""
    started = time.perf_counter()
    served = with_refiner(served_params(loaded, config), refiner)  # --quantize int8: the UNet's int8 kernels
    served = ip_adapters.with_weights(served) if ip_adapters is not None else served
    params = jax.block_until_ready(replicate_tree(served, mesh))
    return params, {"load_s": loaded.load_s, "cast_s": loaded.cast_s, "replicate_s": time.perf_counter() - started}


def load_checkpoints(config: EngineConfig) -> tuple[LoadedModel, list, RefinerWeights | None]:
    """The checkpoints `config` names, read from disk or the Hub (PyTorch files converted, once with the conversion
    cache): the model, its --controlnet ControlNets and its --refiner."""
    loaded = load_model(
        config.model,
        dtype=config.dtype,
        revision=config.revision,
        variant=config.variant,
        unet=config.unet,
        conversion_cache=config.conversion_cache,
    )
    nets = (
        load_controlnets(config.controlnets, config.dtype, variant=config.variant, use_cache=config.conversion_cache)
        if config.controlnets
        else []
    )
    refiner = (
        load_refiner(
            config.refiner, loaded, dtype=config.dtype, variant=config.variant, use_cache=config.conversion_cache
        )
        if config.refiner
        else None
    )
    return loaded, nets, refiner


def request_rules(
    config: EngineConfig,
    sampler: SamplerConfig,
    loras: list[LoraFile],
    embeddings: tuple[str, ...],
    controlnets: ServedControlNets,
    refiner: RefinerWeights | None,
    upscalers: dict[str, TiledUpscaler],
) -> RequestRules:
    """What a request may ask for on a server with these parts and what it gets when it names nothing
    (`parse_request`)."""
    return dataclasses.replace(
        RequestRules.of(config),
        sampler=sampler_label(sampler.sampler),
        cfg=sampler.cfg,
        loras=tuple(lora.name for lora in loras),
        embeddings=embeddings,
        controlnets=controlnets.names,
        union_controlnets=controlnets.unions,
        refiner=refiner.name if refiner is not None else "",
        hires_upscalers=(*UPSCALERS, *upscalers),
    )


def check_processes(config: EngineConfig) -> None:
    """What several JAX processes cannot serve, refused in one sentence."""
    if config.merge_requests and jax.process_count() > 1:
        raise InvalidInput(
            "--merge-requests runs on one process: several processes would each have to merge "
            "the same requests in the same calls."
        )


def run_context(engine: Generator) -> RunContext:
    """What planning a request reads of this engine (`host/planning/run_plan.py`)."""
    config = engine.config
    return RunContext(
        sampler=engine.sampler,
        levers=config.speed_levers,
        vae_scale_factor=engine.programs.modules.vae_scale_factor,
        inpainting_unet=engine.programs.inpainting_unet,
        prompts=engine.prompts,
        windows=config.prompt_windows,
        images_per_call=engine.images_per_call,
        num_images=engine.num_images,
        merging=config.merge_requests,
        hires_sizes=engine.hires_sizes,
        rules=engine.rules,
        model=config.model,
        unet=config.unet,
        dtype=config.dtype,
        refiner=engine.rules.refiner,
        lora_hashes=engine.loras.hashes if engine.loras is not None else None,
        unet_levels=len(engine.programs.modules.unet.config.block_out_channels),
        adapters=engine.image_prompts.served(),
    )


class Generator:
    """SDXL on every device of a 1-D mesh: compiled programs, one image per device (x per-device batch).

    What it keeps: `rules` (what a request may ask for, `parse_request`), `programs` (N images per device; with
    --merge-requests `call_programs`, each call size's), the offered `loras`, `controlnets`, `upscalers`, `refiner`
    and `embedding_files`, `context` (what `host/planning/run_plan.plan_run` reads), `placement` (host rows -> devices),
    `text_cache`, `merger` and `recent_runs` (the last calls' outcomes, newest last: what Stop's tests read).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        config: EngineConfig,
        devices: list | None = None,
        controlnets: list | None = None,
        refiner: RefinerWeights | None = None,
        ip_adapters: list | None = None,
    ):
        check_processes(config)
        self.config, self.source, self.refiner = config, loaded.source, refiner  # config: for the devices' platform
        self.mesh = data_mesh(devices)
        self.device_count, self.device_kind = self.mesh.devices.size, self.mesh.devices.flat[0].device_kind
        self.images_per_call = self.device_count * config.per_device_batch  # B: images per device call
        self.num_images = self.device_count if config.merge_requests else self.images_per_call  # per request
        self.sampler = sampler_of(loaded, config)
        self.latent_multiple = checked_multiple(Modules.of(loaded.networks), self.sizes)
        #: The UNet's parameter count (SDXL's 2.57 B): what a request's time on a CPU grows with (the page's CPU note)
        self.unet_parameters = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(loaded.params["unet"]))
        files, layout = read_loras(loaded, config)
        self.embedding_files = read_embeddings(loaded, config)  # `.offered` (name, vectors, hash) and `.refused`
        self.prompts = PromptReader(
            (loaded.networks.tokenizer, loaded.networks.tokenizer_2), config.emphasis, self.embedding_files.offered
        )
        self.controlnets = ServedControlNets.of(controlnets or [], loaded, self.mesh, config.controlnet_units)
        self.upscalers = read_upscalers(config)  # ESRGAN models by name, each on its tiles (`host/upscale_tiles.py`)
        self.image_prompts = ImagePromptTables(tuple(ip_adapters or ()), config.ip_slots)
        self._params, self.load_timings = place_weights(loaded, config, refiner, self.mesh, self.image_prompts)
        archs, adapters = self.controlnets.archs, self.image_prompts
        self.programs = build_programs(
            loaded, config, self._params, self.mesh, self.sampler, layout, archs, refiner, adapters
        )
        self.placement = Placement(self.mesh, self.programs.text_widths)
        self.call_programs = {
            n: self.programs
            if n == config.per_device_batch
            else build_programs(loaded, config, self._params, self.mesh, self.sampler, layout, images_per_device=n)
            for n in config.merge_call_sizes
        }
        self.loras = (
            LoraSets(files, layout, self.programs, self._params, self._put_all, placed=config.lora_cache)
            if files
            else None
        )
        self.rules = request_rules(
            config, self.sampler, files, tuple(self.prompts.embeddings), self.controlnets, refiner, self.upscalers
        )
        self.image_prompts.bind(self.programs, self._params, self.placement.put)
        self.context = run_context(self)
        self._device_lock = threading.Lock()  # one call on the devices at a time
        self.merger = CallMerger(config.merge_call_sizes, self.run_group) if config.merge_requests else None
        self.requests_at_once = 2 * config.per_device_batch if config.merge_requests else 1  # a call's N and the next's
        self.concurrency = max(REQUESTS_AT_ONCE, self.requests_at_once)  # the page's generate event at once
        self.text_cache = TextCache(config.text_cache)
        self.recent_runs: collections.deque[dict] = collections.deque(maxlen=32)
        self._compiles_at_start = CompileCounter.compiles()
        self.startup_programs: StartupPrograms | None = None  # how `warmup` got each program

    @classmethod
    def load(cls, config: EngineConfig, devices: list | None = None) -> Generator:
        """Load `config.model` and place it on `devices` (default: all); bad settings fail before the weights load.

        PyTorch safetensors are converted without torch (`variant="fp16"` picks *.fp16.safetensors); `unet` swaps in
        a whole-UNet .safetensors file (path or REPO:FILE), e.g. an SDXL-Lightning UNet.
        """
        config = prepare(config, devices)
        SamplerConfig().with_overrides(**config.sampler_overrides())  # bad sampler settings fail before loading
        loaded, controlnets, refiner = load_checkpoints(config)
        adapters = load_ip_adapters(config.ip_adapters, loaded.networks.unet.config, config.dtype)
        return cls(loaded, config, devices, controlnets, refiner, adapters)

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
        lora, control_sets, refined = self.loras is not None, self.controlnets.sets, self.refiner is not None
        return served_program_keys(
            self.config,
            self.sampler.cfg,
            self.latent_multiple,
            lora=lora,
            control_sets=control_sets,
            refiner=refined,
            image_tokens=self.programs.image_tokens,
        )

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

    def warmup(self) -> dict[str, float]:
        """Build every served program, then run each offered size once: the phases' seconds (`warmup.warm_up`)."""
        return warm_up(self)

    # ---- one request ---------------------------------------------------------------------------------------------

    def request(self, prompt: object, **fields) -> Request:
        """`parse_request(prompt, **fields)` against this server's rules: the Python entry point's one check."""
        return parse_request(prompt, rules=self.rules, **fields)

    def plan(self, request: Request) -> RunPlan:
        """What `generate` would run for `request` (`host/planning/run_plan.plan_run`): host data only, nothing runs."""
        return plan_run(request, self.context)

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
        run = self.plan(request)
        timings: dict[str, float] = {}
        if run.merge_key is not None:  # --merge-requests: it waits for a shared call's block
            pixels, device_s = self.merger.submit(ticket_of(run, on_step, should_stop, on_preview))
        else:
            pixels, device_s = self._run(run, loop.Watchers(on_preview, on_step, should_stop, gate), timings)
        total_s = time.perf_counter() - started
        return GenerationResult.of(run, pixels, total_s, device_s, timings.get("first_step_s", 0.0))

    def _run(self, run: RunPlan, watchers: loop.Watchers, timings: dict) -> tuple[np.ndarray, float]:
        """A request alone on the devices: uint8 pixels [B, H, W, 3] on this host and the seconds the devices were
        held."""
        first, conditioning, placement = run.first, run.conditioning, self.placement
        picture = placement.pictures([first.picture], self.images_per_call) if first.picture is not None else None
        with self._device_lock:
            on_device = time.perf_counter()
            hires = placement.hires(
                run.second, run.output.seeds, self.programs, self._params, conditioning.aesthetic, self.upscalers
            )
            control = control_inputs(
                self.controlnets,
                conditioning.controlnets,
                first.plan.steps,
                self.images_per_call,
                placement.batch_sharding,
            )
            pixels = self._on_devices(
                self.programs,
                run,
                placement.request_inputs(conditioning.rows, conditioning),
                (self.programs.batch, conditioning.text_key),
                {"steps": run.steps},
                timings,
                picture=picture,
                control=control,
                # Only a request someone watches runs the preview program (compiled or not, the others run the
                # plain txt2img programs); on several processes the leader tells each follower to run it too.
                watchers=watchers if self.config.previews else dataclasses.replace(watchers, on_preview=None),
                hires=hires,
                refiner=placement.refiner(first.refiner_row, first.plan.rows, conditioning.aesthetic),
                extras=first.extras,
                regions=placement.regions(run.regions),
                image_prompt=self.image_prompts.for_run(run.image_prompt),
            )
            return pixels, time.perf_counter() - on_device

    def run_group(self, tickets: list[Ticket]) -> None:
        """One merged call (the merger's worker) on the programs of the smallest call size that holds the tickets
        (the merger takes exactly one size's worth; any blocks left are padded with the first's): each ticket's rows
        and plan in its block of the batch, the loop over the stacked plans, each ticket answered with its block. The
        text cache serves a call whose requests all read one text."""
        block, slots = self.num_images, min(n for n in self.call_programs if n >= len(tickets))
        programs, padded = self.call_programs[slots], tickets + [tickets[0]] * (slots - len(tickets))
        runs: list[RunPlan] = [ticket.extra for ticket in padded]
        merged, rows = merged_run(runs, block)  # the first's run, each block with its own sampler's rows
        pictures = [run.first.picture for run in runs]  # the key: every ticket has one, or none has
        picture = self.placement.pictures(pictures, block) if merged.first.picture is not None else None
        group = GroupWatchers(tickets, block)
        text_keys = {run.conditioning.text_key for run in runs}  # kept per call size: its outputs are whole batches
        previews = self.config.previews and group.previews
        with self._device_lock:
            on_device = time.perf_counter()
            try:
                pixels = self._on_devices(
                    programs,
                    merged,
                    self.placement.request_inputs(rows, merged.conditioning),
                    (programs.batch, *text_keys) if len(text_keys) == 1 else None,
                    {"steps": merged.first.plan.steps, "requests": len(tickets), "images_per_device": slots},
                    {},
                    picture=picture,
                    watchers=loop.Watchers(
                        group.on_preview if previews else None,
                        group.on_step if group.stepwise else None,  # nobody follows: several steps a call
                        None,
                        group.gate,
                    ),
                )
            except Stopped:  # every request in the call stopped (each already answered)
                return
            group.answer(pixels, time.perf_counter() - on_device)

    def _on_devices(
        self,
        programs: ServedPrograms,
        run: RunPlan,
        inputs: RequestInputs,
        text_key: tuple | None,
        record: dict,
        timings: dict,
        **stages,
    ) -> np.ndarray:
        """`host/loop.run` of `run` on `programs` (the device lock held): uint8 pixels [B, H, W, 3] on this host.
        The text programs run only where the text cache lacks `text_key`'s outputs (None: not kept); the weights are
        those with the run's LoRAs merged. `record` joins `recent_runs`, done or stopped."""
        record = {"done": 0, "stopped": False, "sampler": run.first.plan.sampler, **record}
        params = self.loras.params_for(run.conditioning.loras) if self.loras is not None else self._params
        kept = self.text_cache.outputs(text_key) if text_key is not None else None
        (height, width), placement = run.first.size, self.placement
        try:
            pixels = to_host(
                loop.run(
                    programs,
                    params,
                    inputs,
                    run.first.plan,
                    size=(height, width),
                    cfg=self.sampler.cfg,
                    speed=run.first.speed,
                    put=placement.put,
                    split=placement.split,
                    blank=placement.blank(programs, height, width, params),
                    timings=timings,
                    kept=kept,
                    **stages,
                )
            )  # uint8 [B, H, W, 3], gathered from every process
        except Stopped as stopped:
            record.update(done=stopped.done, stopped=True)
            raise
        except BaseException:  # what the text programs left may be unusable: the next request makes them again
            if text_key is not None:
                self.text_cache.forget(text_key)
            raise
        finally:
            record.update({name: at for name, at in timings.items() if name.endswith("_at")})
            self.recent_runs.append(record)
        record["done"] = record["steps"]
        return pixels

    def _put_all(self, arrays) -> tuple:
        """Host arrays on every device (replicated): the LoRA sets' factors (`host/placement.py`)."""
        return self.placement.put_all(arrays)
