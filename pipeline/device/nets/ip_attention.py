"""IP-Adapter's decoupled cross-attention: each UNet cross-attention also attends to an image prompt's tokens.

diffusers' `IPAdapterAttnProcessor2_0`: out = attention(q, text) + scale x attention(q, to_k_ip(image), to_v_ip(image)),
one image term per adapter, the images given to one adapter concatenated (one softmax over their tokens). Here the
keys and values of the image tokens are made once per request (`device/image_prompt.py`: every layer's to_k_ip /
to_v_ip of the tokens, like `cross_kv`'s text table) and handed in by `image_tokens`, with each token's weight this
step [A, T]: its slot's scale inside the slot's step window, 0 outside it (or for an empty slot), in row a of its
adapter. Adapter a's term is a softmax over its tokens of weight > 0, each value scaled by its weight, so one image
(or several at one scale) is diffusers' scale x attention exactly, and a token of weight 0 takes no part at all:
scale 0 is the same as no image prompt.

    with image_tokens({"down_blocks_1/.../attn2": (k, v) [c, T, N*H]}, weights [A, T]):   # around the UNet's apply
        unet.apply(...)   # each listed layer adds image_prompt_term(module, q)
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp

#: Within `image_tokens`: ({layer path: (keys, values) [c, T, N*H]}, weights float32 [A, T]), or None.
_image_tokens: contextvars.ContextVar = contextvars.ContextVar("image_tokens", default=None)


@contextlib.contextmanager
def image_tokens(table: dict | None, weights=None):
    """Within this context (entered inside a traced function, around the UNet's apply only: the paths are its own),
    a cross-attention layer whose path is in `table` adds the image prompt's term. `table`'s rows: c = 2 (the
    unconditional tokens, then the conditional ones) or 1 (conditional), each repeated for the images of a device in
    the UNet's row order (uncond x b, cond x b). None: no image prompt."""
    token = _image_tokens.set(None if table is None else (table, weights))
    try:
        yield
    finally:
        _image_tokens.reset(token)


def image_prompt_term(module, q):
    """The image prompt's term of attention layer `module` for its queries q [B, Lq, N, H] -> [B, Lq, N, H] (before
    the output projection, as the text's attention), or None where the layer has none."""
    found = _image_tokens.get()
    if found is None or module.path is None:
        return None
    table, weights = found
    entry = table.get("/".join(module.path))
    if entry is None:
        return None
    batch, _, heads, head_dim = q.shape
    copies = entry[0].shape[0]

    def rows(x):  # [c, T, N*H] -> [B, T, N, H]: each copy for its block of rows
        return jnp.repeat(x, batch // copies, axis=0).reshape(batch, x.shape[1], heads, head_dim).astype(q.dtype)

    keys, values = rows(entry[0]), rows(entry[1])
    scores = jnp.einsum("bqnh,btnh->bnqt", q, keys).astype(jnp.float32) * head_dim**-0.5  # [B, N, Lq, T]
    total = jnp.zeros(q.shape, jnp.float32)
    for weight in weights:  # each adapter: [T]
        taking = weight > 0
        probs = jax.nn.softmax(jnp.where(taking, scores, jnp.finfo(jnp.float32).min), axis=-1)
        probs = probs * weight  # tokens outside the adapter's window weigh 0; an adapter with none adds 0
        total = total + jnp.einsum("bnqt,btnh->bqnh", probs.astype(q.dtype), values).astype(jnp.float32)
    return total.astype(q.dtype)
