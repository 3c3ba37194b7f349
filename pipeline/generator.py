"""The generation engine: load once, replicate once, compile once, then serve calls that never recompile.

    gen = Generator.from_pretrained("tiny", height=128, width=128, steps=4)
    gen.warmup()                                  # compile + first run, timed apart
    result = gen.generate("a photo of a cat", seed=7, steps=8, sampler="DPM++ 2M Karras")
    result.images                                 # one PIL image per device x per-device batch

Static settings (offered sizes, per-device batch, dtype, device count, CFG on/off, attention) select the compiled
programs (`programs.py`), built ahead of time with `jit(...).lower(...).compile()`. Prompts, negative prompts,
guidance, seeds, steps and sampler are arguments: the host loop (`loop.py`) runs one compiled step per denoising
step, so no request can trigger a compilation. This module wires loading, sharding, programs and the loop together.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
from PIL import Image

from . import attention as attention_core
from . import images as image_io
from . import loop
from .compilation import CompileCounter, configure_compilation_cache
from .diffusion import Modules
from .distributed import global_batch, to_host
from .loading import LoadedModel, load_model
from .loop import Gate, Listener, RequestInputs, StopCheck
from .programs import ProgramKey, ServedPrograms, program_keys
from .samplers import SamplerConfig, read_scheduler_config, sampler_id, sampler_label
from .settings import DTYPES, SDXL_BASE, EngineConfig
from .sharding import batch_sharded, data_mesh, replicate_tree, replicated
from .text import dropped_text, summarize_dropped, tokenize
from .validation import (
    MAX_STEPS,
    STYLED_MAX_CHARS,
    InvalidInput,
    check_guidance,
    check_shape,
    check_steps,
    clean_text,
    resolve_seed,
)

logger = logging.getLogger(__name__)

SEED_MODULUS = 2**32


@dataclass(frozen=True)
class GenerationResult:
    """What one call produced, and how."""

    images: list[Image.Image]  # one per device x per-device batch, each with .info["parameters"]
    seeds: list[int]  # seed of each image: image i alone is image 0 of a call with seeds[i]
    prompt: str  # the prompt as used (cleaned)
    negative_prompt: str  # the negative prompt as used (cleaned; "" = none)
    truncated: str  # "" or a sentence naming the words past CLIP's 77-token limit
    parameters: list[str]  # the PNG `parameters` text of each image
    timings: dict[str, float] = field(default_factory=dict)  # total_s, host_s, device_s, first_step_s
    steps: int = 0  # denoising steps this call ran
    sampler: str = ""  # the sampler it ran, by A1111's name (e.g. "DPM++ 2M Karras")

    def save_pngs(self, directory: str | Path, stem: str = "image") -> list[Path]:
        """Write the images as `<stem>-00.png`, ... with their `parameters` text chunks."""
        return image_io.save_pngs(self.images, directory, stem)


def default_dtype(platform: str | None = None) -> str:
    """bfloat16 where the hardware has it (TPU, GPU); float32 on CPU, where bfloat16 is emulated and slow."""
    platform = platform or jax.default_backend()
    return "float32" if platform == "cpu" else "bfloat16"


class Generator:
    """SDXL on every device of a 1-D mesh: one compiled program, one image per device (x per-device batch)."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, devices: list | None = None):
        self.config = config
        self.source = loaded.source
        self.mesh = data_mesh(devices)
        self.device_count = self.mesh.devices.size
        self.device_kind = self.mesh.devices.flat[0].device_kind
        self.num_images = self.device_count * config.per_device_batch
        self._tokenizers = (loaded.pipeline.tokenizer, loaded.pipeline.tokenizer_2)
        self._max_tokens = self._tokenizers[0].model_max_length  # 77 for CLIP
        self._modules = Modules.of(loaded.pipeline)
        #: static: the checkpoint's scheduler config, read whole, with this config's overrides (samplers.py)
        self.sampler = SamplerConfig.from_scheduler_config(
            read_scheduler_config(loaded.source, config.revision, fallback=dict(loaded.pipeline.scheduler.config)),
            **_sampler_overrides(config),
        )
        self._check_shape()
        started = time.perf_counter()
        self._params = jax.block_until_ready(replicate_tree(loaded.params, self.mesh))  # placed once, kept
        self.load_timings = {
            "load_s": loaded.load_s,
            "cast_s": loaded.cast_s,
            "replicate_s": time.perf_counter() - started,
        }
        self._batch_sharding = batch_sharded(self.mesh)
        self._replicated = replicated(self.mesh)
        self.programs = ServedPrograms(
            self._modules,
            self._params,
            self.mesh,
            per_device_batch=config.per_device_batch,
            attention=config.attention,
            prediction_type=self.sampler.prediction_type,
            max_tokens=self._max_tokens,
        )
        self._device_lock = threading.Lock()  # one request on the devices at a time
        #: The last calls' outcomes, newest last: steps, done, stopped, sampler and the loop's *_at moments (Stop)
        self.recent_runs: collections.deque[dict] = collections.deque(maxlen=32)
        self._compiles_at_start = CompileCounter.compiles()

    @classmethod
    def from_pretrained(
        cls,
        model: str = SDXL_BASE,
        *,
        height: int = 1024,
        width: int = 1024,
        steps: int = 25,
        dtype: str | None = None,
        per_device_batch: int = 1,
        revision: str | None = None,
        compilation_cache: bool = True,
        devices: list | None = None,
        attention: str = "auto",
        variant: str | None = None,
        unet: str | None = None,
        conversion_cache: bool = True,
        sizes: list[tuple[int, int]] | None = None,
        progress: bool = True,
        sampler: str | None = None,
        timestep_spacing: str | None = None,
        prediction_type: str | None = None,
        steps_offset: int | None = None,
        cfg: bool = True,
        preset: str | None = None,
    ) -> Generator:
        """Load `model` (Hub id, local diffusers directory, or "tiny") and place it on `devices` (default: all).

        PyTorch safetensors are converted without torch (`variant="fp16"` picks *.fp16.safetensors); `unet` swaps in
        a whole-UNet .safetensors file (path or REPO:FILE), e.g. an SDXL-Lightning UNet. `attention` (auto, xla,
        splash, cudnn, diffusers) picks the UNet's attention core; see pipeline/attention.py.
        """
        platform = (devices[0] if devices else jax.devices()[0]).platform
        dtype = dtype or default_dtype(platform)
        if dtype not in DTYPES:
            raise InvalidInput(f"Unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}.")
        try:
            attention = attention_core.resolve(attention, platform, dtype)
        except attention_core.AttentionUnavailable as exc:
            raise InvalidInput(str(exc)) from None
        config = EngineConfig(
            model=model,
            revision=revision,
            height=height,
            width=width,
            steps=steps,
            dtype=dtype,
            per_device_batch=per_device_batch,
            compilation_cache=compilation_cache,
            attention=attention,
            variant=variant,
            unet=unet,
            conversion_cache=conversion_cache,
            sizes=tuple((int(h), int(w)) for h, w in sizes or ()),
            progress=progress,
            sampler=sampler,
            timestep_spacing=timestep_spacing,
            prediction_type=prediction_type,
            steps_offset=steps_offset,
            cfg=cfg,
            preset=preset,
        )
        CompileCounter.install()
        configure_compilation_cache(compilation_cache)
        _check_static(config)
        SamplerConfig().with_overrides(**_sampler_overrides(config))  # bad sampler settings fail before loading
        loaded = load_model(
            model, dtype=dtype, revision=revision, variant=variant, unet=unet, conversion_cache=conversion_cache
        )
        return cls(loaded, config, devices)

    # ---- static shapes -------------------------------------------------------------------------------------------

    def program_keys(self) -> list[ProgramKey]:
        """Every program this generator serves: encode, then start/step/decode per offered size."""
        return program_keys(self.sizes, self.sampler.cfg)

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """The offered (height, width) sizes, the default first: --sizes, else the one height×width."""
        sizes = [(self.config.height, self.config.width)]
        return sizes + [size for size in self.config.sizes if size not in sizes]

    @property
    def device_summary(self) -> str:
        """What runs where, e.g. "8 × cpu", "4 × TPU v5 lite" or "16 × TPU v5 lite on 4 hosts"."""
        hosts = jax.process_count()
        return f"{self.device_count} × {self.device_kind}" + (f" on {hosts} hosts" if hosts > 1 else "")

    @property
    def compile_count(self) -> int:
        """Programs XLA built in this process since this generator was created (compiled, or loaded from the cache)."""
        return CompileCounter.compiles() - self._compiles_at_start

    def _check_shape(self) -> None:
        # The UNet halves the latents once per down block but the last: sides must divide evenly all the way down.
        halvings = len(self._modules.unet.config.down_block_types) - 1
        latent_multiple = self._modules.vae_scale_factor * 2**halvings
        for size in self.sizes:
            for name, value in zip(("height", "width"), size, strict=True):  # name the value the user got wrong
                if value % latent_multiple:
                    raise InvalidInput(f"{name.capitalize()} must be a multiple of {latent_multiple}; got {value}.")

    def warmup(self) -> dict[str, float]:
        """Compile every served program, then run each offered size once; compile_s and first_run_s are totals."""
        started = time.perf_counter()
        for key in self.program_keys():
            compiled_at = time.perf_counter()
            self.programs.compile(key)
            logger.info("compiled %s in %.1f s", key.label, time.perf_counter() - compiled_at)
        timings = {"compile_s": time.perf_counter() - started, "first_run_s": 0.0}
        for height, width in self.sizes:
            started = time.perf_counter()
            self.generate("warm-up", seed=0, size=(height, width))
            first_run_s = time.perf_counter() - started
            timings["first_run_s"] += first_run_s
            logger.info("first run %d×%d, %d steps: %.2f s", width, height, self.config.steps, first_run_s)
        return timings

    # ---- one call ------------------------------------------------------------------------------------------------

    def generate(
        self,
        prompt: str,
        *,
        negative_prompt: str = "",
        seed: int = 0,
        guidance_scale: float = 5.0,
        size: tuple[int, int] | None = None,
        steps: int | None = None,
        sampler: str | None = None,
        progress: Listener | None = None,
        should_stop: StopCheck | None = None,
        gate: Gate | None = None,
    ) -> GenerationResult:
        """Generate `num_images` images for one prompt; image i uses seed (seed + i) mod 2**32.

        `size` (height, width) picks one of the offered sizes (default: the first); `steps` (1..100) and `sampler`
        (an A1111 name, e.g. "DPM++ 2M Karras") default to the server's. `progress(done, total)` is called as each
        step's result is ready; `should_stop()` is asked before each step, and True raises `loop.Stopped`.
        """
        started = time.perf_counter()
        prompt = clean_text(prompt, field="prompt", max_chars=STYLED_MAX_CHARS)
        negative_prompt = clean_text(negative_prompt, field="negative prompt", max_chars=STYLED_MAX_CHARS)
        guidance_scale = check_guidance(guidance_scale)
        if not self.sampler.cfg:  # the guidance-free program ignores both (the UI hides them, the API says so)
            negative_prompt, guidance_scale = "", 0.0
        seed = resolve_seed(seed)
        height, width = size or self.sizes[0]
        check_shape(height, width, self.sizes)
        steps = check_steps(self.config.steps if steps is None else steps)
        plan = loop.cached_plan(self.sampler, steps, sampler_id(self.sampler.sampler if sampler is None else sampler))
        seeds = [(seed + i) % SEED_MODULUS for i in range(self.num_images)]

        n = self.num_images
        prompt_ids = np.broadcast_to(tokenize(self._tokenizers, prompt), (n, 2, self._max_tokens))  # [B, 2, 77]
        negative_ids = np.broadcast_to(tokenize(self._tokenizers, negative_prompt), (n, 2, self._max_tokens))
        has_negative = np.full((n,), bool(negative_prompt))  # [B]
        guidance = np.full((n,), guidance_scale, np.float32)  # [B]
        seed_array = np.asarray(seeds, np.uint32)  # [B]
        inputs = RequestInputs(
            *global_batch((prompt_ids, negative_ids, has_negative, guidance, seed_array), self._batch_sharding)
        )
        loop_timings: dict[str, float] = {}
        run = {"steps": steps, "done": 0, "stopped": False, "sampler": plan.sampler}
        with self._device_lock:
            on_device = time.perf_counter()
            try:
                pixels = loop.run(
                    self.programs,
                    self._params,
                    inputs,
                    plan,
                    size=(height, width),
                    cfg=self.sampler.cfg,
                    put=self._put,
                    on_step=progress if self.config.progress else None,
                    should_stop=should_stop,
                    gate=gate,
                    timings=loop_timings,
                )
            except loop.Stopped as stopped:
                run.update(done=stopped.done, stopped=True)
                raise
            finally:
                run.update({k: v for k, v in loop_timings.items() if k.endswith("_at")})
                self.recent_runs.append(run)
            pixels = to_host(pixels)  # uint8 [B, H, W, 3], gathered from every process
            off_device = time.perf_counter()
            run["done"] = steps

        dropped = dropped_text(self._tokenizers[0], prompt)
        truncated = summarize_dropped(dropped)  # first words and a count: fits in a toast
        parameters = [
            image_io.describe(
                prompt=prompt,
                negative_prompt=negative_prompt,
                seed=s,
                steps=steps,
                guidance_scale=guidance_scale,
                height=height,
                width=width,
                model=self.config.model,  # named without its server path (image_io.model_name)
                unet=self.config.unet,  # the --unet file, by file name
                dtype=self.config.dtype,
                sampler=sampler_label(plan.sampler, self.sampler.prediction_type),
                spacing=None if plan.sampler == "dpmpp_2m_karras" else self.sampler.timestep_spacing,
            )
            for s in seeds
        ]
        images = image_io.to_pil(pixels, parameters)
        finished = time.perf_counter()
        timings = {
            "total_s": finished - started,
            "device_s": off_device - on_device,
            "host_s": (finished - started) - (off_device - on_device),
            "first_step_s": loop_timings.get("first_step_s", 0.0),
        }
        return GenerationResult(
            images=images,
            seeds=seeds,
            prompt=prompt,
            negative_prompt=negative_prompt,
            truncated=truncated,
            parameters=parameters,
            timings=timings,
            steps=steps,
            sampler=plan.label,
        )

    def _put(self, array: np.ndarray) -> jax.Array:
        """A small host array on every device (replicated), on one process or several."""
        return global_batch((np.asarray(array),), self._replicated)[0]


def _sampler_overrides(config: EngineConfig) -> dict:
    """The sampler settings `config` sets explicitly (None = keep the checkpoint's)."""
    names = ("sampler", "timestep_spacing", "prediction_type", "steps_offset", "cfg")
    return {name: getattr(config, name) for name in names}


def _check_static(config: EngineConfig) -> None:
    for name in ("height", "width", "steps", "per_device_batch"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(f"{name.replace('_', ' ').capitalize()} must be a positive whole number; got {value!r}.")
    if config.height > 4096 or config.width > 4096 or config.steps > MAX_STEPS:
        raise InvalidInput(f"Height and width must be at most 4096 and steps at most {MAX_STEPS}.")
