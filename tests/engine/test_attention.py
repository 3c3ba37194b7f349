"""The attention hook (pipeline/device/attention.py): kernel parity, the hook in the sharded loop, the engine, TPU
lowering.

Splash runs in Pallas' interpreter (`interpret=True`) on CPU; `pltpu.force_tpu_interpret_mode()` is avoided because
it hung inside a 2-device shard_map here. Shapes and heads are small to keep the interpreter fast.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import generate
from jax.sharding import PartitionSpec as P
from reference import reference_attention

from pipeline.checkpoint.loading import load_model
from pipeline.contract.errors import InvalidInput
from pipeline.device import attention
from pipeline.device.sharding import DATA_AXIS, data_mesh, replicate_tree
from pipeline.generator import Generator

HEAD_DIM = 64  # SDXL's head width
SCALE = HEAD_DIM**-0.5
# (query tokens, key tokens, heads): SDXL's self-attention lengths scaled down, and cross-attention on 77 text tokens.
SHAPES = {"self-256": (256, 256, 2), "self-1024": (1024, 1024, 1), "cross-77": (256, 77, 2)}


def qkv(q_len, kv_len, heads, dtype=np.float32, peak=1.0, seed=0):
    """Random q [2, Lq, N, 64], k/v [2, Lk, N, 64]; `peak` > 1 sharpens the softmax (large logits)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, q_len, heads, HEAD_DIM)) * peak
    k = rng.standard_normal((2, kv_len, heads, HEAD_DIM)) * peak
    v = rng.standard_normal((2, kv_len, heads, HEAD_DIM))
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def kernels():
    """name -> attention function of (q, k, v): every core, splash interpreted with its smallest tile (128)."""
    return {
        "diffusers": attention.diffusers_attention,
        "xla": attention.xla_attention,
        "splash": functools.partial(attention.splash_attention, interpret=True, block=128),
    }


def error(out, q, k, v) -> np.ndarray:
    """|out - exact attention of the same (possibly bf16-rounded) inputs|, in float64."""
    return np.abs(np.asarray(out, np.float64) - reference_attention(q, k, v, SCALE))


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_float32_kernels_match_exact_attention(shape):
    q, k, v = qkv(*SHAPES[shape])
    for name, kernel in kernels().items():
        out = jax.jit(kernel, static_argnums=3)(q, k, v, SCALE)
        assert out.shape == q.shape and out.dtype == jnp.float32, name
        assert error(out, q, k, v).max() <= 1e-5, name
    # Only self-attention of a multiple of 128 tokens goes to splash; cross-attention falls back to xla.
    assert attention.splash_supported(q.shape, k.shape) == (shape != "cross-77")


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_bf16_kernels_no_worse_than_diffusers(shape):
    q, k, v = qkv(*SHAPES[shape], dtype=jnp.bfloat16, peak=2.5)  # peaky softmax: where a bf16 softmax errs
    errors = {
        name: error(jax.jit(kernel, static_argnums=3)(q, k, v, SCALE), q, k, v) for name, kernel in kernels().items()
    }
    for name in ("xla", "splash"):
        assert errors[name].max() <= errors["diffusers"].max(), name
        assert errors[name].mean() <= errors["diffusers"].mean(), name


def test_splash_lowers_for_tpu_at_sdxl_shapes():
    """Mosaic lowering of the real kernel at 1024x1024's shapes (CFG batch 2, bf16) catches kernel errors early."""
    for tokens, heads in ((4096, 10), (1024, 20)):
        spec = jax.ShapeDtypeStruct((2, tokens, heads, HEAD_DIM), jnp.bfloat16)
        assert attention.splash_supported(spec.shape, spec.shape)
        core = functools.partial(attention.attend, scale=SCALE, kind="splash")
        lowered = jax.jit(core).trace(spec, spec, spec).lower(lowering_platforms=("tpu",))
        assert "tpu_custom_call" in lowered.as_text()


def test_auto_resolves_per_platform_and_fused_kinds_need_their_device():
    assert attention.resolve("auto", "tpu", "bfloat16") == "splash"
    assert attention.resolve("auto", "gpu", "bfloat16") == attention.resolve("auto", "cuda", "bfloat16") == "cudnn"
    assert attention.resolve("auto", "gpu", "float32") == "xla"  # cuDNN's flash attention takes no float32
    assert attention.resolve("auto", "cpu", "float32") == attention.resolve("auto", "cpu", "bfloat16") == "xla"
    assert attention.resolve("diffusers", "tpu", "bfloat16") == "diffusers"
    with pytest.raises(attention.AttentionUnavailable, match="needs a TPU"):
        attention.resolve("splash", "cpu", "float32")
    # The engine refuses before loading anything: one clear line.
    with pytest.raises(InvalidInput, match="needs a GPU"):
        Generator.from_pretrained("tiny", attention="cudnn")
    with pytest.raises(InvalidInput, match="Unknown attention"):
        Generator.from_pretrained("tiny", attention="flash")


def test_hook_in_sharded_loop_matches_plain_unet(tiny_dir):
    """jit(shard_map(fori_loop(UNet))) on 2 devices: hooked (splash, interpreted) == diffusers' own, float32.

    32x32 latents give 256-token self-attention in the tiny UNet, so splash really runs (not its fallback).
    """
    loaded = load_model(str(tiny_dir), dtype="float32")
    unet = loaded.networks.unet
    mesh = data_mesh(jax.devices()[:2])
    params = replicate_tree(loaded.params["unet"], mesh)
    rng = np.random.default_rng(0)
    latents = jnp.asarray(rng.standard_normal((2, 4, 32, 32)), jnp.float32)  # [B, 4, h, w], 1 per device
    context = jnp.asarray(rng.standard_normal((2, 77, unet.config.cross_attention_dim)), jnp.float32)  # [B, 77, D]
    text_dim = unet.config.projection_class_embeddings_input_dim - 6 * unet.config.addition_time_embed_dim
    added = {"text_embeds": jnp.zeros((2, text_dim)), "time_ids": jnp.ones((2, 6)) * 32}

    def loop(params, latents, context, added):
        def step(i, x):
            t = jnp.full((x.shape[0],), 999 - 300 * i, jnp.int32)
            noise = unet.apply({"params": params}, x, t, context, added_cond_kwargs=added).sample
            return x - 0.1 * noise

        return jax.lax.fori_loop(0, 2, step, latents)

    def run(kind):
        local = attention.hooked(loop, kind, interpret=True)
        batch = P(DATA_AXIS)
        program = jax.jit(
            jax.shard_map(local, mesh=mesh, in_specs=(P(), batch, batch, batch), out_specs=batch, check_vma=False)
        )
        return np.asarray(program(params, latents, context, added))

    np.testing.assert_allclose(run("splash"), run("diffusers"), atol=1e-4, rtol=1e-4)


def pixels(generator, seed=11) -> np.ndarray:
    images = generate(generator, "a lighthouse on a cliff at dusk", negative_prompt="blurry", seed=seed).images
    return np.stack([np.asarray(image) for image in images]).astype(np.int32)  # [B, H, W, 3]


def same_engine(engine, attention_kind, *, warm: bool = True) -> Generator:
    """An engine with the session engine's settings (8 devices, float32) and another attention setting, warmed up
    (`warm`), else compiling only the programs its requests run."""
    config = engine.config
    generator = Generator.from_pretrained(
        config.model,
        height=config.height,
        width=config.width,
        steps=config.steps,
        dtype=config.dtype,
        attention=attention_kind,
        prompt_windows=1 if attention_kind == "diffusers" else config.prompt_windows,
    )  # diffusers' own attention has no hook to mask a prompt's empty 77-token windows
    if warm:
        generator.warmup()
    return generator


def test_engine_auto_is_xla_on_cpu_without_another_compilation(engine):
    """The session engine runs the default, auto; an xla engine is the same program, served by the cache."""
    from pipeline.host.compiling.compile_cache import CompileCounter

    assert engine.config.attention == "xla"
    hits = CompileCounter.cache_hits()
    xla = same_engine(engine, "xla")
    assert xla.config == engine.config
    loaded = xla.startup_programs.count("executables")  # the session engine's programs, stored whole
    assert xla.compile_count + loaded >= 1 and CompileCounter.cache_hits() - hits == xla.compile_count  # none anew
    np.testing.assert_array_equal(pixels(xla), pixels(engine))


def test_engine_hooked_images_equal_diffusers_float32(engine):
    plain = same_engine(engine, "diffusers", warm=False)  # one plain request: its 4 programs, not the levers' too
    assert plain.config.attention == "diffusers"
    diff = np.abs(pixels(plain) - pixels(engine))
    assert diff.max() <= 1 and diff.mean() < 0.01  # float32 rounding may move a pixel by one 8-bit level
