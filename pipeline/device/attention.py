"""Which attention core the UNet and ControlNets run: a hook around their attention modules, no fork of them.

The reference core (diffusers' Flax attention's, kept by `nets/attention.Attention`) materialises every
[queries x keys] score matrix and takes its softmax in the compute dtype: at 1024x1024 that is a 4096x4096 matrix
per head in HBM, and a bf16 softmax. The hook below replaces only the core (scores -> softmax -> weighted values)
and keeps the module's own `to_q`/`to_k`/`to_v`/`to_out_0` layers, so parameter trees and checkpoints are
unchanged:

    with attention_hook("splash"):            # entered INSIDE the traced function (see `hooked`)
        unet.apply({"params": params}, ...)

Kinds (`ATTENTIONS`):
- `diffusers`: no hook; diffusers' own einsum + softmax in the compute dtype (the reference).
- `xla`: `jax.nn.dot_product_attention(implementation="xla")`: logits and softmax in float32, any device.
- `cudnn`: cuDNN flash attention (`implementation="cudnn"`) on NVIDIA GPUs in bf16/fp16.
- `splash`: Pallas splash attention on TPU for self-attention (SDXL: 4096 and 1024 tokens at 1024x1024); heads are
  zero-padded to 128 lanes (exact: zero columns add nothing to q.k, and the padded value columns are sliced off),
  queries pre-scaled (the kernel does not scale). A length that is not a multiple of 128 is padded up to one when
  that adds at most 1/8 (SDXL's 1344x768: 4032 -> 4096 and 1008 -> 1024 tokens), the padding masked off with
  segment ids (real tokens attend only to real ones: exact).
- `auto`: splash on TPU, cudnn on GPU with bf16/fp16, xla elsewhere (so on CPU `auto` is exactly `xla`). The TPU
  choice is the compiled cost (`python -m bench tpu`, the real TPU compiler, bench/HISTORY.md): one SDXL UNet call
  at 1024x1024 with CFG on a v5e chip is 12.46 TFLOP / 73.1 GB with splash against 13.99 TFLOP / 111.7 GB with
  xla, a roofline of 89 ms against 136 ms (xla is bound by HBM traffic: it writes every score matrix).

Shapes a fused kernel cannot take (cross-attention with 77 keys, float32 on cuDNN, short lengths splash would pad by
more than 1/8, e.g. the tiny checkpoint's) fall back to `xla`, logged once per shape. Every path keeps the softmax in
float32.

JAX's trace cache does not see an interceptor, so the kind must be a static part of whatever is traced: the engine
keeps it in `EngineConfig.attention` and builds one program per kind (`hooked` closes over it).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import threading

import flax.linen as nn
import jax
import jax.numpy as jnp

from .cores import ATTENTIONS
from .nets.attention import Attention
from .nets.ip_attention import image_prompt_term
from .regions import active_weights, regional_attention

logger = logging.getLogger(__name__)

#: Kinds that need a given platform (jax's platform names).
REQUIRED_PLATFORM = {"splash": "tpu", "cudnn": "gpu"}
#: TPU vector lanes: splash's blocks and padded head width are multiples of this.
LANES = 128
#: Largest splash tile along queries and keys; smaller powers of two down to LANES are tried when it does not divide.
SPLASH_MAX_BLOCK = 512
#: splash pads a self-attention length to a multiple of LANES when that adds at most this fraction of it.
SPLASH_MAX_PADDING = 1 / 8
#: dtypes cuDNN's flash attention takes.
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)

_logged: set = set()
_logged_lock = threading.Lock()


class AttentionUnavailable(ValueError):
    """The requested attention kind cannot run on this platform (e.g. splash without a TPU)."""


def _log_once(key, message: str, *args) -> None:
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    logger.info(message, *args)


def reset_fallback_log() -> None:
    """Log each fallback again (the TPU report collects every program's own fallbacks)."""
    with _logged_lock:
        _logged.clear()


def resolve(kind: str, platform: str, dtype: str) -> str:
    """The concrete kind for `kind` on `platform` ("cpu", "gpu"/"cuda", "tpu") with network `dtype`.

    `auto` picks the fastest kind the platform has; an explicit fused kind on a platform without it is refused
    (one clear line), rather than silently running something else for the whole program.
    """
    platform = "gpu" if platform in ("cuda", "rocm") else platform
    if kind not in ATTENTIONS:
        raise AttentionUnavailable(f"Unknown attention {kind!r}; choose one of: {', '.join(ATTENTIONS)}.")
    if kind == "auto":
        if platform == "tpu":
            return "splash"
        if platform == "gpu" and jnp.dtype(dtype) in [jnp.dtype(d) for d in CUDNN_DTYPES]:
            return "cudnn"
        return "xla"
    needed = REQUIRED_PLATFORM.get(kind)
    if needed and platform != needed:
        raise AttentionUnavailable(
            f"Attention {kind!r} needs a {needed.upper()}, but this machine runs on {platform}; use auto or xla."
        )
    return kind


# ---- the cores: q [B, Lq, N, H], k and v [B, Lk, N, H] -> [B, Lq, N, H] -------------------------------------------


def diffusers_attention(q, k, v, scale: float):
    """diffusers' split_head_dim core as it is (scores and softmax in the compute dtype): the reference."""
    scores = jnp.einsum("b t n h, b f n h -> b n f t", k, q) * scale  # [B, N, Lq, Lk]
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("b n f t, b t n h -> b f n h", probs, v)


def xla_attention(q, k, v, scale: float):
    """`jax.nn.dot_product_attention` on XLA: float32 logits and softmax whatever the input dtype."""
    return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="xla")


def cudnn_attention(q, k, v, scale: float):
    """cuDNN flash attention (NVIDIA, bf16/fp16); falls back to `xla` for what cuDNN refuses, logged once."""
    key = ("cudnn", q.shape, k.shape, q.dtype)
    if q.dtype not in CUDNN_DTYPES:
        _log_once(key, "attention: cuDNN takes bf16/fp16, not %s; using xla for %s", q.dtype, q.shape)
        return xla_attention(q, k, v, scale)
    try:
        return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="cudnn")
    except (NotImplementedError, ValueError, RuntimeError) as exc:  # jax checks shapes and cuDNN at trace time
        _log_once(key, "attention: cuDNN refused q %s, k %s (%s); using xla", q.shape, k.shape, exc)
        return xla_attention(q, k, v, scale)


def splash_block(length: int) -> int | None:
    """The splash tile for a sequence `length`: the largest of 512, 256, 128 dividing it; None if none does."""
    block = SPLASH_MAX_BLOCK
    while block >= LANES:
        if length % block == 0:
            return block
        block //= 2
    return None


def splash_length(length: int) -> int | None:
    """The length splash runs `length` tokens at: the next multiple of 128, if that pads at most 1/8; else None."""
    padded = -(-length // LANES) * LANES
    return padded if padded - length <= length * SPLASH_MAX_PADDING else None


def splash_supported(q_shape, k_shape) -> bool:
    """Self-attention (queries are keys) whose length splash can tile (a multiple of 128, or padded to one)."""
    return q_shape[1] == k_shape[1] and splash_length(q_shape[1]) is not None


@functools.lru_cache(maxsize=64)
def _splash_kernel(heads: int, q_len: int, kv_len: int, block_q: int, block_kv: int, interpret: bool):
    """A forward-only splash kernel over `heads` full (unmasked) heads; its mask metadata built once, concretely."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash  # heavy: Pallas' TPU kernels

    mask = splash.MultiHeadMask([splash.FullMask((q_len, kv_len)) for _ in range(heads)])
    blocks = splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv)
    with jax.ensure_compile_time_eval():  # concrete metadata arrays, safe to cache across traces
        return splash.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1, interpret=interpret)


def splash_attention(q, k, v, scale: float, *, interpret: bool = False, block: int | None = None):
    """Pallas splash attention (TPU; `interpret=True` runs it anywhere, slowly); unsupported shapes use `xla`.

    Heads narrower than 128 lanes are zero-padded: q.k is unchanged and the padded output columns (zero values)
    are dropped. The kernel keeps its running max, sum and output in float32.
    """
    if not splash_supported(q.shape, k.shape):
        why = "cross-attention" if q.shape[1] != k.shape[1] else "a length splash would pad by more than 1/8"
        _log_once(
            ("splash", q.shape, k.shape),
            "attention: splash takes self-attention; %s: using xla for q %s, k %s",
            why,
            q.shape,
            k.shape,
        )
        return xla_attention(q, k, v, scale)
    batch, q_len, heads, head_dim = q.shape
    length = splash_length(q_len)  # tokens, padded to a multiple of 128
    padded = -(-head_dim // LANES) * LANES
    width = [(0, 0), (0, length - q_len), (0, 0), (0, padded - head_dim)]

    def to_kernel(x):  # [B, L, N, H] -> [B, N, length, padded]
        return jnp.pad(x, width).transpose(0, 2, 1, 3)

    q = (q.astype(jnp.float32) * scale).astype(q.dtype)  # the kernel applies no scale
    tile = block or splash_block(length)
    kernel = _splash_kernel(heads, length, length, tile, tile, interpret)
    if length > q_len:  # padded tokens form their own segment: real queries never see them, nor they real keys
        from jax.experimental.pallas.ops.tpu import splash_attention as splash  # heavy: Pallas' TPU kernels

        ids = (jnp.arange(length) >= q_len).astype(jnp.int32)
        kernel = functools.partial(kernel, segment_ids=splash.SegmentIds(q=ids, kv=ids))
    out = jax.vmap(kernel)(to_kernel(q), to_kernel(k), to_kernel(v))  # [B, N, length, padded]
    return out[:, :, :q_len, :head_dim].transpose(0, 2, 1, 3)


CORES = {"diffusers": diffusers_attention, "xla": xla_attention, "cudnn": cudnn_attention, "splash": splash_attention}


def attend(q, k, v, scale: float, kind: str, *, interpret: bool = False):
    """Attention of kind `kind` (a resolved kind, not `auto`): q [B, Lq, N, H], k/v [B, Lk, N, H] -> [B, Lq, N, H]."""
    if kind == "splash":
        return splash_attention(q, k, v, scale, interpret=interpret)
    return CORES[kind](q, k, v, scale)


# ---- the hook ----------------------------------------------------------------------------------------------------


def attention_classes() -> tuple:
    """The modules whose core the hook swaps: the project's `nets.attention.Attention` (the UNet's and the
    ControlNet's), whose projections are `query`, `key`, `value` and `proj_attn`."""
    return (Attention,)


#: Within `context_lengths`: the keys of the text each row of a cross-attention attends to (int32 [B], traced).
_context_lengths: contextvars.ContextVar = contextvars.ContextVar("context_lengths", default=None)


@contextlib.contextmanager
def context_lengths(lengths):
    """Within this context (entered inside a traced function), a cross-attention's row i attends to the first
    `lengths[i]` keys of the text only: a prompt read in several 77-token windows (`device/text.py`) fills some,
    and the windows it leaves empty take no part (softmax weight exactly 0). None: every key."""
    token = _context_lengths.set(lengths)
    try:
        yield
    finally:
        _context_lengths.reset(token)


#: Within `text_keys_values`: {layer path: (keys, values)} of the UNet's cross-attention layers, projected once
#: per request (`device/cross_kv.py`), or None (each layer projects the text itself).
_text_keys_values: contextvars.ContextVar = contextvars.ContextVar("text_keys_values", default=None)


@contextlib.contextmanager
def text_keys_values(table: dict | None):
    """Within this context (entered inside a traced function, around ONE network's `apply`: layer paths are that
    network's), a cross-attention layer whose path is in `table` reads its keys and values [B, T, N*H] from it
    instead of projecting the text (the same products, made once per request rather than once per step). None or
    an empty table: every layer projects its own."""
    token = _text_keys_values.set(table or None)
    try:
        yield
    finally:
        _text_keys_values.reset(token)


def _attention_call(module, kind: str, interpret: bool, hidden_states, context=None):
    """The attention module's `__call__` with another core, using its own projection layers (same parameters)."""
    cross = context is not None  # only cross-attention reads the text
    lengths = _context_lengths.get() if cross else None
    table = _text_keys_values.get() if cross else None
    projected = table.get("/".join(module.path)) if table is not None else None  # the key text_keys_values made
    context = hidden_states if context is None else context
    batch = hidden_states.shape[0]
    heads, head_dim = module.heads, module.dim_head

    def split(x):  # [B, L, N*H] -> [B, L, N, H]
        return x.reshape(batch, -1, heads, head_dim)

    q = split(module.query(hidden_states))
    if projected is None:
        k, v = split(module.key(context)), split(module.value(context))
    else:  # this request's keys and values of the text, projected once (`device/cross_kv.py`)
        k, v = (split(x) for x in projected)
    blend = active_weights(q.shape[1]) if cross else None
    if blend is not None:  # a regional prompt: each part of the text attended to alone, blended per cell
        out = regional_attention(q, k, v, head_dim**-0.5, blend)
    elif lengths is None:
        out = attend(q, k, v, head_dim**-0.5, kind, interpret=interpret)  # [B, Lq, N, H]
    else:  # a few hundred keys: XLA's core, with the empty windows masked
        out = jax.nn.dot_product_attention(
            q, k, v, scale=head_dim**-0.5, key_value_seq_lengths=lengths, implementation="xla"
        )
    image = image_prompt_term(module, q) if cross else None  # an image prompt's term (IP-Adapter), if any
    out = out if image is None else out + image
    return module.proj_attn(out.reshape(batch, -1, heads * head_dim))  # [B, Lq, D]


@contextlib.contextmanager
def attention_hook(kind: str, *, interpret: bool = False):
    """Within this context (entered inside a traced function), every attention module (`attention_classes`) uses
    core `kind`.

    `kind` must be resolved (see `resolve`); `diffusers` installs nothing. `interpret` runs splash in Pallas'
    interpreter (tests on CPU).
    """
    if kind == "auto":
        raise ValueError("attention_hook takes a resolved kind; call resolve() first")
    if kind == "diffusers":
        yield
        return
    classes = attention_classes()

    def interceptor(next_fun, args, kwargs, context):
        if context.method_name != "__call__" or not isinstance(context.module, classes):
            return next_fun(*args, **kwargs)
        return _attention_call(context.module, kind, interpret, *args, **kwargs)

    with nn.intercept_methods(interceptor):
        yield


def hooked(fn, kind: str, *, interpret: bool = False):
    """`fn` with the attention hook entered inside it, so it is active while `fn` is traced (jit, shard_map...)."""
    if kind == "diffusers":
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with attention_hook(kind, interpret=interpret):
            return fn(*args, **kwargs)

    return wrapper
