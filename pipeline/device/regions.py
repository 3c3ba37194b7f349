"""Regional prompts on the device (Regional Prompter's Attention mode): each cross-attention blends its parts.

The text of a regional request is its P parts side by side, 77 tokens each ([cb, P*77, D], encoded as P windows by
`device/text.py`). Within `region_weights` every cross-attention of the UNet attends to each part on its own, from
the same queries (a softmax per part), and blends the P outputs per query cell by that grid's weights
([P, cells], `host/planning/region_plan.py`: the parts' shares, summing to 1 in each cell). The blend is folded
into the attention probabilities, so the values are read once:

    out[q] = Σ_p w[p, q] · softmax(q · k_p) v_p

which equals blending the P attention outputs, and (the shares summing to 1) blending after the output projection
as a PyTorch attention processor does. Self-attention is untouched. The weights are arguments of the step program
(`device/region_step.py`), so a new layout runs the same program; only P is compiled (`ProgramKey.parts`).
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp

#: Within `region_weights`: {cells: float32 [P, cells]} per attention grid, or None (no regions).
_region_weights: contextvars.ContextVar = contextvars.ContextVar("region_weights", default=None)


@contextlib.contextmanager
def region_weights(weights):
    """Within this context (entered inside a traced function), a cross-attention with queries on a grid of L cells
    blends the text's parts by `weights`' [P, L] array (a tuple, one array per grid)."""
    token = _region_weights.set({int(w.shape[1]): w for w in weights} if weights is not None else None)
    try:
        yield
    finally:
        _region_weights.reset(token)


def active_weights(queries: int):
    """The blend of a cross-attention with `queries` cells, or None outside `region_weights`."""
    table = _region_weights.get()
    if table is None:
        return None
    if queries not in table:
        raise ValueError(f"regional prompts: no blend weights for a grid of {queries} cells ({sorted(table)})")
    return table[queries]


def regional_attention(q, k, v, scale: float, weights):
    """q [B, Lq, N, H], k/v [B, P*T, N, H] (P parts of T keys), weights [P, Lq] -> [B, Lq, N, H]: each part's
    attention from the same queries, blended per query by `weights` (logits and softmax in float32)."""
    batch, keys, heads, head_dim = k.shape
    parts = weights.shape[0]
    k = k.reshape(batch, parts, keys // parts, heads, head_dim)
    v = v.reshape(batch, parts, keys // parts, heads, head_dim)
    scores = jnp.einsum("bqnh,bpknh->bnqpk", q, k, preferred_element_type=jnp.float32) * scale
    probs = jax.nn.softmax(scores, axis=-1) * weights.T.astype(jnp.float32)[None, None, :, :, None]
    return jnp.einsum("bnqpk,bpknh->bqnh", probs.astype(v.dtype), v)
