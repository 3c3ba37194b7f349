"""`python -m bench unet`: one UNet denoising step per attention core, on random weights made on the device.

    python -m bench unet --attention xla,splash --height 1024 --width 1024       # TPU VM (one chip)
    python -m bench unet --attention xla,cudnn --height 1024 --width 1024        # H100
    python -m bench unet --model tiny --height 64 --width 64 --steps 2 --runs 1  # CPU smoke test
    python -m bench unet --cost --attention diffusers,xla,splash                 # lowered cost only, any host
    python -m bench unet --quality                                               # bf16 vs float32 images, tiny

The timed program is the engine's inner loop: `--steps` UNet calls on a CFG batch (default 2) in one `fori_loop`,
compiled once, run `--runs` times; ms per step = median seconds per call / steps. MFU divides the UNet's *unfused*
FLOPs (XLA's cost analysis of diffusers' own attention, ~13.5 TFLOP for SDXL at 1024x1024, batch 2: fused kernels
report no FLOPs) by the step time and the device's peak bf16 FLOP/s. The weights are SDXL-shaped (2.57 B parameters)
and random, initialised on the device in bf16: no download (`--model tiny` uses the tiny checkpoint's own random
weights). One device is used (per-chip figures).
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

SDXL = "sdxl"
TINY = "tiny"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench unet",
        description="Time one SDXL UNet step per attention core (random bf16 weights made on the device).",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--attention", default="xla,auto", help="comma-separated cores: auto, xla, splash, cudnn, diffusers")
    add("--model", choices=(SDXL, TINY), default=SDXL, help="UNet geometry: SDXL base 1.0 or the tiny checkpoint's")
    add("--height", type=int, default=1024, help="image height (latents are height/8; default 1024)")
    add("--width", type=int, default=1024, help="image width (default 1024)")
    add("--batch", type=int, default=2, help="UNet batch (default 2: one image with classifier-free guidance)")
    add("--steps", type=int, default=10, help="UNet calls in the timed loop (default 10)")
    add("--runs", type=int, default=3, help="timed calls of the loop (default 3)")
    add("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bfloat16, float32 on CPU")
    add("--profile", metavar="DIR", default=None, help="write a jax.profiler trace of the timed runs to DIR")
    add("--cost", action="store_true", help="only report XLA's lowered cost per core (nothing compiled or run)")
    add("--quality", action="store_true", help="only compare bf16 images with float32 ones on the tiny checkpoint")
    add("--out", default="bench-results", help="directory for unet.json (default bench-results/)")
    add("--cpu-devices", type=int, default=0, help="virtual CPU devices when XLA_FLAGS is unset (default 0)")
    args = parser.parse_args(argv)
    args.kinds = [kind.strip() for kind in args.attention.split(",") if kind.strip()]
    from ..engine import ATTENTIONS

    unknown = sorted(set(args.kinds) - set(ATTENTIONS))
    if unknown or not args.kinds:
        parser.error(f"--attention takes some of {', '.join(ATTENTIONS)}; got {args.attention!r}")
    if min(args.height, args.width, args.batch, args.steps, args.runs) < 1 or args.height % 8 or args.width % 8:
        parser.error("--height/--width must be positive multiples of 8; --batch, --steps, --runs at least 1")
    return args


def build_unet(model: str, dtype):
    """The engine's UNet (pipeline/device/nets/unet.py) with SDXL's or the tiny checkpoint's geometry; no weights."""
    from .flops import sdxl_networks

    if model == SDXL:
        return sdxl_networks(dtype)["unet"]
    return tiny_model(dtype).networks.unet


@functools.cache
def tiny_model(dtype):
    """The tiny checkpoint as the engine loads it, its weights cast to `dtype` on the host."""
    import jax.numpy as jnp

    from ..engine import load_model

    return load_model(TINY, dtype=jnp.dtype(dtype).name)


def unet_inputs(unet, batch: int, height: int, width: int, dtype):
    """Abstract UNet inputs: latents [B, 4, h, w], timesteps [B], text states [B, 77, D], added conditioning."""
    import jax
    import jax.numpy as jnp

    config = unet.config
    text_dim = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
    return (
        jax.ShapeDtypeStruct((batch, config.in_channels, height // 8, width // 8), dtype),
        jax.ShapeDtypeStruct((batch,), jnp.int32),
        jax.ShapeDtypeStruct((batch, 77, config.cross_attention_dim), dtype),
        {
            "text_embeds": jax.ShapeDtypeStruct((batch, text_dim), dtype),
            "time_ids": jax.ShapeDtypeStruct((batch, 6), dtype),
        },
    )


def step_function(unet, kind: str):
    """One UNet call with attention core `kind` (resolved) hooked in while it is traced."""
    from ..engine import hooked

    def apply(params, sample, timesteps, hidden, added):
        return unet.apply({"params": params}, sample, timesteps, hidden, added_cond_kwargs=added).sample

    return hooked(apply, kind)


def lowered_cost(unet, kind: str, params, inputs, platform: str) -> dict:
    """XLA's cost analysis (flops, bytes accessed) of one UNet call lowered for `platform`; abstract weights.

    `bytes_accessed` is counted on the lowered (pre-fusion) program: a measure of the traffic the fused kernels
    remove, not of what the compiled program moves. `fused_kernel_sites` counts where a splash/cuDNN kernel appears
    in the lowered text (identical calls share one function, so it is not the number of calls).
    """
    import jax

    started = time.perf_counter()
    lowered = jax.jit(step_function(unet, kind)).trace(params, *inputs).lower(lowering_platforms=(platform,))
    analysis, text = lowered.cost_analysis(), lowered.as_text()
    if isinstance(analysis, list | tuple):
        analysis = analysis[0]
    return {
        "attention": kind,
        "platform": platform,
        "flops": float(analysis.get("flops", 0.0)),
        "bytes_accessed": float(analysis.get("bytes accessed", 0.0)),
        "fused_kernel_sites": text.count("@tpu_custom_call") + text.count("__cudnn$fmha"),
        "lower_s": time.perf_counter() - started,
    }


def cost_report(args, progress) -> list[dict]:
    """Lowered cost of the UNet step per core: diffusers/xla for this host's platform, splash for TPU, cudnn for GPU."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(args.dtype or "bfloat16")
    unet = build_unet(args.model, dtype)
    inputs = unet_inputs(unet, args.batch, args.height, args.width, dtype)
    params = jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, dtype), jax.eval_shape(unet.init_weights, jax.random.PRNGKey(0))
    )
    rows = []
    for kind in args.kinds:
        platform = {"splash": "tpu", "cudnn": "cuda"}.get(kind, jax.default_backend())
        if kind == "auto":
            progress("  cost: 'auto' is a per-device choice; name the core (xla, splash, cudnn) instead")
            continue
        try:
            row = lowered_cost(unet, kind, params, inputs, platform)
        except Exception as exc:  # cuDNN cannot lower on a host without the CUDA plugin: say so, go on
            progress(f"  cost: {kind} cannot be lowered for {platform} here: {type(exc).__name__}: {exc}")
            continue
        if kind in ("splash", "cudnn") and not row["fused_kernel_sites"]:
            progress(
                f"  cost: {kind} put no fused kernel in the program for {platform} here (every shape fell back;"
                " cuDNN needs the CUDA plugin, which jax checks while tracing)"
            )
            continue
        rows.append(row)
        progress(
            f"  cost: {kind:9s} for {platform}: {row['flops'] / 1e12:7.3f} TFLOP, "
            f"{row['bytes_accessed'] / 1e9:7.2f} GB accessed, {row['fused_kernel_sites']} fused kernel sites "
            f"(lowered in {row['lower_s']:.0f} s)"
        )
    return rows


def random_params(unet, dtype):
    """Random UNet weights made leaf by leaf on the default device, in `dtype`; never on the host
    (`bench.accelerator.end_to_end.random_like`: N(0, 1/fan_in) kernels, zero biases, unit norm scales)."""
    import jax

    from .end_to_end import random_like

    return random_like(jax.eval_shape(unet.init_weights, jax.random.PRNGKey(0)), dtype)


def tiny_params(dtype):
    """The tiny checkpoint's own (random) UNet weights, on the default device: seconds instead of compiling an init."""
    import jax

    return jax.device_put(tiny_model(dtype).params["unet"])


def time_kinds(args, progress) -> dict:
    """Compile and time the `--steps`-call UNet loop for each attention core; ms/step, MFU, agreement with the first."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ..common import Stats
    from ..engine import resolve_attention
    from .flops import PEAK_BY_DEVICE_KIND, lowered_flops

    device = jax.devices()[0]
    dtype = jnp.dtype(args.dtype or ("float32" if device.platform == "cpu" else "bfloat16"))
    unet = build_unet(args.model, dtype)
    abstract = unet_inputs(unet, args.batch, args.height, args.width, dtype)
    latents = f"{args.height // 8}x{args.width // 8}"
    progress(
        f"unet: {args.model} geometry, {args.height}x{args.width} (latents {latents}), batch {args.batch}, "
        f"{dtype.name}, on {device.device_kind}; making random weights on the device ..."
    )
    started = time.perf_counter()
    params = tiny_params(dtype) if args.model == TINY else random_params(unet, dtype)
    count = sum(leaf.size for leaf in jax.tree_util.tree_leaves(params))
    progress(f"unet: {count / 1e6:.1f} M parameters in {time.perf_counter() - started:.1f} s")
    param_specs = jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), params)
    unfused = lowered_flops(step_function(unet, "diffusers"), param_specs, *abstract)
    peak = PEAK_BY_DEVICE_KIND.get(device.device_kind)
    progress(f"unet: unfused cost {unfused / 1e12:.3f} TFLOP per step (XLA cost analysis, diffusers' attention)")

    rng = np.random.default_rng(0)
    sample = jnp.asarray(rng.standard_normal(abstract[0].shape), dtype)  # [B, 4, h, w]
    hidden = jnp.asarray(rng.standard_normal(abstract[2].shape), dtype)  # [B, 77, D]
    added = {name: jnp.ones(spec.shape, dtype) for name, spec in abstract[3].items()}
    results, first_out = [], None
    for requested in args.kinds:
        kind = resolve_attention(requested, device.platform, dtype.name)
        step = step_function(unet, kind)

        def loop(params, sample, hidden, added, step=step):
            def body(i, x):
                t = jnp.full((x.shape[0],), 999 - 40 * i, jnp.int32)
                return x - 0.02 * step(params, x, t, hidden, added).astype(x.dtype)

            return jax.lax.fori_loop(0, args.steps, body, sample)

        started = time.perf_counter()
        compiled = jax.jit(loop).lower(params, sample, hidden, added).compile()
        compile_s = time.perf_counter() - started
        out = jax.block_until_ready(compiled(params, sample, hidden, added))  # first run, untimed
        seconds = []
        if args.profile:
            jax.profiler.start_trace(str(Path(args.profile) / kind))
        for _ in range(args.runs):
            started = time.perf_counter()
            jax.block_until_ready(compiled(params, sample, hidden, added))
            seconds.append(time.perf_counter() - started)
        if args.profile:
            jax.profiler.stop_trace()
        stats = Stats.of(seconds)
        step_s = stats.median / args.steps
        out = np.asarray(out, np.float32)
        first_out = out if first_out is None else first_out
        row = {
            "attention": requested,
            "resolved": kind,
            "compile_s": compile_s,
            "ms_per_step": step_s * 1e3,
            "runs_s": seconds,
            "mfu": unfused / step_s / peak if peak else None,
            "max_abs_diff_vs_first": float(np.abs(out - first_out).max()),
            "finite": bool(np.isfinite(out).all()),
        }
        results.append(row)
        mfu = f"{row['mfu']:.1%} MFU" if peak else "MFU n/a (peak unknown for this device)"
        progress(
            f"unet: {requested} ({kind}): {row['ms_per_step']:.1f} ms/step, {mfu}, compile {compile_s:.1f} s, "
            f"max |diff| vs {args.kinds[0]} {row['max_abs_diff_vs_first']:.3g}"
        )
    return {
        "device_kind": device.device_kind,
        "platform": device.platform,
        "model": args.model,
        "height": args.height,
        "width": args.width,
        "batch": args.batch,
        "steps": args.steps,
        "dtype": dtype.name,
        "parameters": count,
        "unfused_flops_per_step": unfused,
        "peak_flops": peak,
        "kinds": results,
    }


def quality(progress, seeds: int = 8) -> dict:
    """bf16 images vs float32 images on the tiny checkpoint (8-bit levels), diffusers' attention vs the xla core."""
    import numpy as np

    from ..engine import Generator

    def images(attention, dtype):
        generator = Generator.from_pretrained("tiny", height=128, width=128, steps=4, dtype=dtype, attention=attention)
        generator.warmup()
        prompt = "a lighthouse on a cliff at dusk"
        calls = [generator.generate(generator.request(prompt, seed=100 * s)).images for s in range(seeds)]
        return np.stack([np.asarray(im) for call in calls for im in call]).astype(np.int32)  # [N, H, W, 3]

    reference = images("xla", "float32")
    rows = {}
    for attention in ("diffusers", "xla"):
        diff = np.abs(images(attention, "bfloat16") - reference)
        rows[attention] = {"mean_levels": float(diff.mean()), "max_levels": int(diff.max()), "images": len(diff)}
        progress(
            f"quality: bf16 with {attention} attention vs float32: mean {diff.mean():.3f}, max {diff.max()} "
            f"levels over {len(diff)} images (tiny, 128x128, 4 steps)"
        )
    return rows


def main(argv: list[str]) -> int:
    from ..common import configure_platform

    args = parse_args(argv)
    configure_platform(args.cpu_devices)
    from ..common import machine_info, progress
    from ..report.outputs import write_json

    results: dict = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine_info()}
    if args.cost:
        results["cost"] = cost_report(args, progress)
    elif args.quality:
        results["quality"] = quality(progress)
    else:
        results["unet"] = time_kinds(args, progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = write_json(results, out / "unet.json")
    progress(f"done: {path}")
    return 0
