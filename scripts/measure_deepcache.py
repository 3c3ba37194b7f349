"""What a DeepCache shallow step saves: XLA's FLOP estimates and CPU timings of full vs shallow steps.

    /work/venv/bin/python scripts/measure_deepcache.py            # tiny checkpoint (64, 128 px) + SDXL at 1024x1024
    /work/venv/bin/python scripts/measure_deepcache.py --no-sdxl  # the tiny checkpoint only

- Tiny checkpoint (tests/fixtures/tiny-pt, float32), one image with CFG (2 UNet rows): the served step bodies
  (`diffusion.step_local`, `deepcache.step_full_local`, `deepcache.step_shallow_local`) jitted on one CPU device;
  FLOPs from the compiled programs' cost analysis, seconds as medians of interleaved runs.
- SDXL base's UNet (assets/sdxl_unet_config.json, bfloat16, split_head_dim as the engine serves it) at 1024x1024,
  CFG batch 2: abstract parameters (`jax.eval_shape`), FLOPs of the LOWERED programs (nothing compiled or run).
Prints one JSON object.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline import deepcache  # noqa: E402

ROUNDS = 15


def _flops(analysis) -> float:
    if isinstance(analysis, list | tuple):
        analysis = analysis[0]
    return float(analysis["flops"])


def tiny(size: int) -> dict:
    """Compiled FLOPs and interleaved median seconds of the three step bodies at `size` px, CFG, one image."""
    from pipeline.diffusion import Modules, step_local
    from pipeline.loading import load_model

    model = load_model(str(REPO / "tests" / "fixtures" / "tiny-pt"), dtype="float32", conversion_cache=False)
    modules, params = Modules.of(model.pipeline), {"unet": model.params["unet"]}
    latent = size // modules.vae_scale_factor
    rng = np.random.default_rng(0)
    latents = jnp.asarray(rng.standard_normal((1, 4, latent, latent)), jnp.float32)  # [1, 4, h, w]
    hidden = jnp.asarray(rng.standard_normal((2, 77, 96)), jnp.float32)  # [2, 77, D]
    pooled = jnp.asarray(rng.standard_normal((2, 64)), jnp.float32)  # [2, P]
    guidance, seeds = jnp.asarray([5.0], jnp.float32), jnp.zeros(1, jnp.uint32)
    row = jnp.asarray([501.0, 1.5, 0.7, 0.3, 0.0, 0.0], jnp.float32)
    args = (params, latents, latents, hidden, pooled, guidance, seeds, row, jnp.int32(0))
    settings = {"cfg": True, "prediction_type": "epsilon"}
    bodies = {
        "plain": jax.jit(functools.partial(step_local, modules, **settings)),
        "full": jax.jit(functools.partial(deepcache.step_full_local, modules, **settings)),
    }
    feature = bodies["full"](*args)[2]
    bodies["shallow"] = jax.jit(functools.partial(deepcache.step_shallow_local, modules, **settings))
    call_args = {"plain": args, "full": args, "shallow": (*args, feature)}
    compiled = {name: body.lower(*call_args[name]).compile() for name, body in bodies.items()}
    flops = {name: _flops(program.cost_analysis()) for name, program in compiled.items()}
    for name, program in compiled.items():  # warm up
        jax.block_until_ready(program(*call_args[name]))
    seconds: dict[str, list[float]] = {name: [] for name in compiled}
    for _ in range(ROUNDS):
        for name, program in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(program(*call_args[name]))
            seconds[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    return {
        "size": f"{size}x{size}",
        "feature_shape": list(feature.shape),
        "flops": flops,
        "flops_shallow_over_full": flops["shallow"] / flops["full"],
        "median_ms": {name: round(value * 1e3, 2) for name, value in medians.items()},
        "time_shallow_over_full": medians["shallow"] / medians["full"],
        "rounds": ROUNDS,
    }


def sdxl() -> dict:
    """Lowered FLOPs of SDXL's UNet at 1024x1024, CFG batch 2: plain apply, DeepCache full, DeepCache shallow."""
    from diffusers import FlaxUNet2DConditionModel

    config = json.loads((REPO / "assets" / "sdxl_unet_config.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    unet = FlaxUNet2DConditionModel.from_config(config, split_head_dim=True, dtype=jnp.bfloat16)
    started = time.perf_counter()
    params = jax.eval_shape(unet.init_weights, jax.random.PRNGKey(0))
    params = jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, jnp.bfloat16), params)
    batch, latent = 2, 128

    def spec(*shape, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dtype)

    inputs = (
        spec(batch, 4, latent, latent),
        spec(batch, dtype=jnp.float32),
        spec(batch, 77, 2048),
        {"text_embeds": spec(batch, 1280), "time_ids": spec(batch, 6)},
    )
    feature = spec(*deepcache.feature_shape(unet, batch, latent, latent))

    def plain(params, sample, t, hidden, added):
        return unet.apply({"params": params}, sample, t, encoder_hidden_states=hidden, added_cond_kwargs=added).sample

    flops = {
        "plain": _flops(jax.jit(plain).lower(params, *inputs).cost_analysis()),
        "full": _flops(jax.jit(functools.partial(deepcache.unet_full, unet)).lower(params, *inputs).cost_analysis()),
        "shallow": _flops(
            jax.jit(functools.partial(deepcache.unet_shallow, unet)).lower(params, *inputs, feature).cost_analysis()
        ),
    }
    return {
        "what": "SDXL UNet call, 1024x1024, CFG batch 2, bfloat16, lowered HLO (not compiled)",
        "feature_shape": list(feature.shape),
        "tflop": {name: value / 1e12 for name, value in flops.items()},
        "flops_shallow_over_full": flops["shallow"] / flops["full"],
        "analysis_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    report = {"device": jax.devices()[0].device_kind, "tiny": [tiny(64), tiny(128)]}
    if "--no-sdxl" not in sys.argv[1:]:
        report["sdxl"] = sdxl()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
