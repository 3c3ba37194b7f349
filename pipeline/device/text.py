"""Both CLIP text encoders on the device: token ids -> the embeddings SDXL's UNet is conditioned on.

The token ids come from the host (`host/planning/tokens.py`) as `[B, 2, K*77]` int32 (encoder 1, encoder 2; K windows of
77), so the encode program has one input shape whatever the prompt. The prompt and the negative prompt are encoded
in one batch; an empty negative prompt is a traced flag (zero embeddings, as SDXL's reference does for
`neg_prompt_ids=None`), not another program.

A1111's emphasis and textual-inversion embeddings are data too: each token's weight ([B, 2, K*77] float32) scales
its hidden states, and ids from `EXTRA_BASE` up take their input vectors from the request's embedding table
([E, D1], [E, D2]) instead of the vocabulary. A text without either runs exactly the plain computation.

The request's `clip_skip` (diffusers' `clip_skip`) is data as well: a traced int32 index into each encoder's stacked
hidden states picks the layer the UNet reads, so every value runs the one compiled program.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from .modules import Modules
from .nets.clip import CLIPTextEmbeddings

#: CLIP's window of token ids (the begin and end tokens included).
WINDOW = 77
#: Token ids at or above this are rows of the request's embedding table (host/planning/tokens.py EXTRA_BASE).
EXTRA_BASE = 1 << 24


def encode_each(text_encoder, text_encoder_2, params: dict, prompt_ids, extra=None, clip_skip=0):
    """Each encoder's penultimate hidden states ([N, 77, D1], [N, 77, D2]) and encoder 2's pooled projection [N, P];
    `extra` ([E, D1], [E, D2]): the input vectors of ids from EXTRA_BASE up (None: the vocabulary's only);
    `clip_skip` (a Python int, or a traced int32 scalar): that many layers before the penultimate (`skipped`)."""
    outputs = []
    for index, (encoder, name) in enumerate(((text_encoder, "text_encoder"), (text_encoder_2, "text_encoder_2"))):
        ids = prompt_ids[:, index, :]  # [N, 77]
        is_extra = ids >= EXTRA_BASE
        vocabulary_ids = jnp.where(is_extra, 0, ids)  # what the encoder sees (its pooled output finds the end token)
        if extra is None:
            outputs.append(encoder.apply({"params": params[name]}, vocabulary_ids))
            continue
        table = extra[index]
        rows = jnp.clip(ids - EXTRA_BASE, 0, table.shape[0] - 1)
        with nn.intercept_methods(_inputs_with(is_extra, table[rows])):
            outputs.append(encoder.apply({"params": params[name]}, vocabulary_ids))
    hidden = tuple(skipped(output["hidden_states"], clip_skip) for output in outputs)
    return hidden, outputs[1]["text_embeds"]


def skipped(hidden_states, clip_skip):
    """hidden_states[-(clip_skip + 2)], as diffusers' SDXL `encode_prompt(clip_skip=...)`: 0 is SDXL's penultimate
    layer. A traced `clip_skip` selects from the stacked states ([L+1, N, 77, D]) with a dynamic index, so the value
    is an argument of the program, not a new one; past the first layer it reads the embeddings' output (index 0: a
    model with fewer layers than the field's bound). The pooled projection always reads the last layer."""
    if isinstance(clip_skip, int):
        return hidden_states[-(clip_skip + 2)]
    last = len(hidden_states) - 2  # the penultimate's index
    index = jnp.clip(last - clip_skip, 0, last)
    return jax.lax.dynamic_index_in_dim(jnp.stack(hidden_states), index, keepdims=False)


def _inputs_with(is_extra, vectors):
    """A flax interceptor of CLIP's input embeddings: the token vectors where `is_extra`, the vocabulary's elsewhere
    (the position embeddings added to both, as CLIP's own embedding layer does)."""

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if context.method_name != "__call__" or not isinstance(module, CLIPTextEmbeddings):
            return next_fun(*args, **kwargs)
        bound = dict(zip(("input_ids", "position_ids"), args, strict=False), **kwargs)
        input_ids, position_ids = bound["input_ids"], bound["position_ids"]
        tokens = module.token_embedding(input_ids.astype("i4"))  # [N, 77, D]
        tokens = jnp.where(is_extra[..., None], vectors.astype(tokens.dtype), tokens)
        return tokens + module.position_embedding(position_ids.astype("i4"))

    return interceptor


def emphasized(hidden, weights, normalize: bool):
    """A1111's emphasis on one encoder's windows: hidden [M, 77, D] × weights [M, 77], then (`normalize`, its
    "Original") each window rescaled so its mean is the unweighted mean ("No norm": not). A window whose weights
    are all 1 is returned untouched (bit for bit)."""
    weighted = hidden * weights[..., None].astype(hidden.dtype)
    if normalize:
        before = jnp.mean(hidden.astype(jnp.float32), axis=(1, 2), keepdims=True)  # [M, 1, 1]
        after = jnp.mean(weighted.astype(jnp.float32), axis=(1, 2), keepdims=True)
        weighted = (weighted * (before / after)).astype(hidden.dtype)
    plain = jnp.all(weights == 1, axis=1)[:, None, None]  # [M, 1, 1]
    return jnp.where(plain, hidden, weighted)


def encode_local(
    modules: Modules,
    params,
    prompt_ids,
    negative_ids,
    has_negative,
    windows,
    prompt_weights,
    negative_weights,
    extra_1,
    extra_2,
    clip_skip=0,
    *,
    cfg: bool,
    normalize: bool = True,
):
    """Both text encoders over every 77-token window: ids [b, 2, K*77] -> hidden [cb, K*77, D], pooled [cb, P]
    and the keys the UNet attends to, [cb] int32 (77 × the windows each text fills); the unconditional half first
    (c = 2), or the prompt alone without CFG (static `cfg=False`, c = 1). `windows` int32 [b, 2]: the windows the
    negative prompt and the prompt fill. `*_weights` float32 [b, 2, K*77]: each token's emphasis; `extra_1`,
    `extra_2` [E, D1], [E, D2]: the request's embedding vectors (static `normalize`: A1111's "Original" emphasis);
    `clip_skip` int32 []: the request's layer before the penultimate (`skipped`; 0: SDXL's own).

    Each window is encoded on its own and the hidden states are joined along the sequence (A1111's and ComfyUI's
    long prompts); the pooled embedding is the first window's, as theirs, and unweighted.
    """
    both_ids = jnp.concatenate([negative_ids, prompt_ids], axis=0) if cfg else prompt_ids  # [cb, 2, K*77]
    both_weights = jnp.concatenate([negative_weights, prompt_weights], axis=0) if cfg else prompt_weights
    rows, length = both_ids.shape[0], both_ids.shape[-1]
    count = length // WINDOW  # K: static

    def per_window(x):  # [cb, 2, K*77] -> [cb*K, 2, 77]
        return x.reshape(rows, 2, count, WINDOW).transpose(0, 2, 1, 3).reshape(rows * count, 2, WINDOW)

    ids, weights = per_window(both_ids), per_window(both_weights)
    (hidden_1, hidden_2), pooled = encode_each(
        modules.text_encoder, modules.text_encoder_2, params, ids, (extra_1, extra_2), clip_skip
    )
    hidden_1 = emphasized(hidden_1, weights[:, 0], normalize)  # [cb*K, 77, D1]
    hidden_2 = emphasized(hidden_2, weights[:, 1], normalize)  # [cb*K, 77, D2]
    hidden = jnp.concatenate([hidden_1, hidden_2], axis=-1)  # [cb*K, 77, D1+D2]
    hidden = hidden.reshape(rows, count * WINDOW, hidden.shape[-1])  # [cb, K*77, D]
    pooled = pooled.reshape(rows, count, -1)[:, 0]  # [cb, P]: the first window's
    # An empty negative prompt means "no negative": zero embeddings, as SDXL's reference does.
    keep = jnp.concatenate([has_negative, jnp.ones_like(has_negative)]) if cfg else jnp.ones_like(has_negative)
    hidden = jnp.where(keep[:, None, None], hidden, 0)  # [cb, K*77, D]
    pooled = jnp.where(keep[:, None], pooled, 0)  # [cb, P]
    filled = jnp.concatenate([windows[:, 0], windows[:, 1]]) if cfg else windows[:, 1]  # [cb]
    return hidden, pooled, (filled * WINDOW).astype(jnp.int32)
