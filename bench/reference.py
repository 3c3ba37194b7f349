"""Part 1: per-call latency of `Generator.generate` against diffusers' own FlaxStableDiffusionXLPipeline.

The reference is called as Hugging Face's SDXL-on-JAX blog calls it: params replicated once
with flax's `replicate`; per call `prepare_inputs`, `replicate` of the ids, one PRNG key per device, the pmapped
`pipeline(..., jit=True)`, and conversion to PIL. Both sides return PIL images, so the whole user-visible call is
timed on each. Same checkpoint, devices, size, steps and dtype; calls are interleaved after both are warmed.
Each call's part: the engine's programs (encode, start, each step kind, decode; blocking on each, after the timed
runs) and host work, the reference's host work and its one pmapped program. `python -m bench --check` fails when
the CPU-seconds ratio is over `CHECK_RATIO` (the guard CI runs: .ci/run).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .common import Progress, Stats, progress, timed
from .program_times import ProgramTimer

PROMPT = "a photo of an astronaut riding a horse on the moon, highly detailed"
NEGATIVE = "blurry, low quality"
GUIDANCE = 5.0
TARGET_RATIO = 0.9
#: `--check` fails when the engine's process CPU seconds per call exceed the reference's by this factor. CPU seconds,
#: not wall time: they count the work each side does, which the other jobs on a shared machine barely move (on this
#: 2-core VM at load 10-17 the same engine's wall ratio moved 0.85-0.91 and its CPU ratio 1.03-1.06; the issue-35
#: regression gave wall 1.13-1.27 and CPU 1.27-1.32; at 64², 2 steps, CPU 0.96-1.03 against 1.29-1.31). The runs:
#: bench/README.md, "Engine vs diffusers: the regression of issue 35 and its guard".
CHECK_RATIO = 1.15


@dataclass(frozen=True)
class EngineVsReference:
    """Engine vs diffusers' reference pipeline, same work per call."""

    images_per_call: int  # images one call returns (one per device x per-device batch)
    engine: Stats  # seconds per Generator.generate call (PIL images out)
    reference: Stats  # seconds per reference call (tokenize, replicate, pmapped pipeline, PIL images out)
    engine_images_per_s: float  # images_per_call / engine median
    reference_images_per_s: float  # images_per_call / reference median
    ratio: float  # engine median / reference median (lower is better)
    target_ratio: float  # the goal: ratio <= this
    meets_target: bool  # ratio <= target_ratio
    engine_host: Stats  # seconds of each engine call spent on the host (tokenize, transfer in, PIL + PNG text)
    reference_host: Stats  # seconds of each reference call on the host (prepare_inputs, replicate, keys, PIL)
    reference_load_s: float  # seconds to load + cast + replicate the reference's params
    reference_first_call_s: float  # the reference's first call (pmap compile + run)
    pair_ratios: Stats  # engine / reference of each interleaved pair (a load change hits both halves of a pair)
    cpu_ratio: float  # engine / reference in process CPU seconds (medians): the work, whatever else runs
    engine_programs: dict[str, float]  # seconds per call in each program, blocking on each (label -> s)
    engine_programs_s: float  # a call with every program blocked on (their sum plus the host's part)


class _FlaxDeprecationFilter(logging.Filter):
    """Drops diffusers' and transformers' "Flax classes are deprecated" notice: the reference is their last Flax
    release on purpose (requirements.txt says why)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "classes are deprecated and will be removed" not in record.getMessage()


def quiet_flax_deprecation() -> None:
    """The notice once per class would fill the bench's output; the engine itself imports neither library's Flax."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_propagation()  # under CI=true transformers also propagates to the root logger
    transformers_logging.disable_propagation()
    for name, library in (("diffusers", diffusers_logging), ("transformers", transformers_logging)):
        for handler in library.get_logger(name).handlers:
            if not any(isinstance(f, _FlaxDeprecationFilter) for f in handler.filters):
                handler.addFilter(_FlaxDeprecationFilter())


def load_reference(model: str, dtype: str):
    """diffusers' pipeline and replicated params, cast like the blog: bf16 except the scheduler, or all f32."""
    quiet_flax_deprecation()
    from diffusers import FlaxStableDiffusionXLPipeline
    from flax.jax_utils import replicate

    from pipeline.checkpoint.loading import resolve_model

    pipe, params = FlaxStableDiffusionXLPipeline.from_pretrained(
        resolve_model(model), split_head_dim=True, dtype=getattr(jnp, dtype)
    )
    if dtype == "bfloat16":
        scheduler_state = params.pop("scheduler")
        params = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
        params["scheduler"] = scheduler_state
    return pipe, replicate(params)


def sdxl_reference(params: dict, networks, dtype: str):
    """diffusers' pipeline with SDXL base 1.0's architectures (bench/flops.py's configs) over `params` (the engine's
    weights: the trees are the same) and the tokenizers of `networks`, its Euler scheduler from the engine's
    scheduler config; with the params replicated (the blog's way). The reference where no checkpoint folder exists
    (`python -m bench accelerator`'s random SDXL-shaped weights)."""
    import inspect

    quiet_flax_deprecation()
    from diffusers import (
        FlaxAutoencoderKL,
        FlaxEulerDiscreteScheduler,
        FlaxStableDiffusionXLPipeline,
        FlaxUNet2DConditionModel,
    )
    from flax.jax_utils import replicate
    from transformers import CLIPTextConfig, FlaxCLIPTextModel, FlaxCLIPTextModelWithProjection

    from .flops import SDXL_TEXT_2_CONFIG, SDXL_TEXT_CONFIG, SDXL_UNET_CONFIG, SDXL_VAE_CONFIG

    compute = getattr(jnp, dtype)
    pairs = ((FlaxCLIPTextModel, SDXL_TEXT_CONFIG), (FlaxCLIPTextModelWithProjection, SDXL_TEXT_2_CONFIG))
    texts = [
        cls(CLIPTextConfig(**{"vocab_size": 49408, "max_position_embeddings": 77, "eos_token_id": 2, **fields}),
            dtype=compute, _do_init=False)  # eos 2: as SDXL's config.json files say
        for cls, fields in pairs
    ]
    accepted = inspect.signature(FlaxEulerDiscreteScheduler).parameters
    scheduler = FlaxEulerDiscreteScheduler(**{k: v for k, v in networks.scheduler_config.items() if k in accepted})
    pipe = FlaxStableDiffusionXLPipeline(
        text_encoder=texts[0], text_encoder_2=texts[1], vae=FlaxAutoencoderKL(**SDXL_VAE_CONFIG, dtype=compute),
        tokenizer=networks.tokenizer, tokenizer_2=networks.tokenizer_2,
        unet=FlaxUNet2DConditionModel(**SDXL_UNET_CONFIG, split_head_dim=True, dtype=compute), scheduler=scheduler,
    )  # fmt: skip
    return pipe, replicate({**params, "scheduler": scheduler.create_state()})  # the scheduler state in float32


def reference_call(pipe, p_params, *, prompt, negative_prompt, seed, guidance_scale, steps, height, width, host=None):
    """One user-visible call of the reference, exactly as the SDXL-on-JAX blog writes it: PIL images out.

    When `host` is a list, the seconds spent outside the pipeline call (inputs before, PIL after) are appended.
    """
    from flax.jax_utils import replicate

    started = time.perf_counter()
    prompt_ids = replicate(pipe.prepare_inputs(prompt))
    neg_prompt_ids = replicate(pipe.prepare_inputs(negative_prompt))
    rng = jax.random.split(jax.random.PRNGKey(seed), jax.device_count())
    prepared = time.perf_counter()
    images = pipe(
        prompt_ids,
        p_params,
        rng,
        num_inference_steps=steps,
        height=height,
        width=width,
        guidance_scale=guidance_scale,
        neg_prompt_ids=neg_prompt_ids,
        jit=True,
    ).images
    images = images.reshape((images.shape[0] * images.shape[1],) + images.shape[-3:])
    pixels = np.array(images)
    converted = time.perf_counter()
    pil_images = pipe.numpy_to_pil(pixels)
    if host is not None:
        host.append((prepared - started) + (time.perf_counter() - converted))
    return pil_images


def engine_vs_reference(generator, runs: int, say: Progress = progress, reference=None) -> EngineVsReference:
    """Time `runs` interleaved calls of each (engine, reference, engine, ...) after one warm call of each.
    `reference`: diffusers' (pipeline, replicated params) when not the checkpoint the generator loaded."""
    config = generator.config
    kwargs = {"steps": config.steps, "height": config.height, "width": config.width}
    started = time.perf_counter()
    pipe, p_params = reference or load_reference(config.model, config.dtype)
    load_s = time.perf_counter() - started
    say(f"reference loaded in {load_s:.1f} s; first reference call (pmap compile) ...")
    first_s, images = timed(
        lambda: reference_call(
            pipe, p_params, prompt=PROMPT, negative_prompt=NEGATIVE, seed=0, guidance_scale=GUIDANCE, **kwargs
        )
    )
    if len(images) != generator.num_images:
        raise RuntimeError(f"reference returned {len(images)} images, the engine {generator.num_images}")

    def engine_call(seed: int):
        request = generator.request(PROMPT, negative_prompt=NEGATIVE, guidance_scale=GUIDANCE, seed=seed)
        return generator.generate(request)

    engine_call(0)  # engine warm too
    engine_s, reference_s, engine_host, reference_host, engine_cpu, reference_cpu = [], [], [], [], [], []
    for run in range(runs):
        seed = 1000 + run
        cpu = time.process_time()
        t_engine, result = timed(lambda seed=seed: engine_call(seed))
        engine_cpu.append(time.process_time() - cpu)
        cpu = time.process_time()
        t_reference, _ = timed(
            lambda seed=seed: reference_call(
                pipe,
                p_params,
                prompt=PROMPT,
                negative_prompt=NEGATIVE,
                seed=seed,
                guidance_scale=GUIDANCE,
                host=reference_host,
                **kwargs,
            )
        )
        reference_cpu.append(time.process_time() - cpu)
        engine_host.append(result.timings["host_s"])
        engine_s.append(t_engine)
        reference_s.append(t_reference)
        say(f"  run {run + 1}/{runs}: engine {t_engine:.3f} s, reference {t_reference:.3f} s")
    engine, reference = Stats.of(engine_s), Stats.of(reference_s)
    ratio = engine.median / reference.median
    profiled = max(1, min(runs, 3))
    with ProgramTimer(generator.programs, block=True) as timer:
        blocked_s = [timed(lambda seed=seed: engine_call(seed))[0] for seed in range(2000, 2000 + profiled)]
    n = generator.num_images
    return EngineVsReference(
        images_per_call=n,
        engine=engine,
        reference=reference,
        engine_images_per_s=n / engine.median,
        reference_images_per_s=n / reference.median,
        ratio=ratio,
        target_ratio=TARGET_RATIO,
        meets_target=ratio <= TARGET_RATIO,
        engine_host=Stats.of(engine_host),
        reference_host=Stats.of(reference_host),
        reference_load_s=load_s,
        reference_first_call_s=first_s,
        pair_ratios=Stats.of([e / r for e, r in zip(engine_s, reference_s, strict=True)]),
        cpu_ratio=Stats.of(engine_cpu).median / Stats.of(reference_cpu).median,
        engine_programs=timer.per_program(profiled),
        engine_programs_s=Stats.of(blocked_s).median,
    )


def check_ratio(result: EngineVsReference, threshold: float) -> str | None:
    """`--check`: None when the engine / reference ratio of CPU seconds per call is at most `threshold`, else the
    sentence saying by how much, with each side's time and the engine's parts."""
    if result.cpu_ratio <= threshold:
        return None
    parts = ", ".join(f"{label} {seconds * 1000:.1f}" for label, seconds in result.engine_programs.items())
    return (
        f"engine / diffusers = {result.cpu_ratio:.2f} in CPU seconds > {threshold:g} (wall {result.ratio:.2f}: engine "
        f"{result.engine.median * 1000:.0f} ms, diffusers {result.reference.median * 1000:.0f} ms per call; the "
        f"engine's programs in ms: {parts})"
    )
