"""Perturbed-attention guidance (Ahn et al., 2024) on the UNet's middle block, as diffusers' SDXL PAG pipeline runs it.

diffusers (`StableDiffusionXLPAGPipeline`, `pag_applied_layers=["mid"]`; `pipelines/pag/pag_utils.PAGMixin`):
- the batch gains a perturbed copy of the conditional rows (`_prepare_perturbed_attention_guidance`): with
  classifier-free guidance uncond, cond, perturbed (3b rows), without it cond, perturbed (2b), for the latents, the
  text, the pooled text and the time ids alike;
- every self-attention (`attn1`) of the middle block runs `PAGCFGIdentitySelfAttnProcessor2_0` (or, without CFG,
  `PAGIdentitySelfAttnProcessor2_0`): the first rows attend as always, the perturbed rows' attention map is the
  identity, so their output is `to_out(to_v(x))`;
- the guidance (`_apply_perturbed_attention_guidance`): u + g·(c − u) + s·(c − p) with CFG, c + s·(c − p) without,
  where s at timestep t is max(pag_scale − pag_adaptive_scale·(1000 − t), 0) (`_get_pag_scale`; the host computes it
  per step, `host/planning/extras_plan.py`).

The middle block's transformer layers are steered by a flax method interceptor around their `__call__`: a layer's
self-attention is the one sub-module the identity replaces, and the engine's attention hook, which answers every
`Attention` call itself, still serves the unperturbed rows.
"""

from __future__ import annotations

import contextlib

import flax.linen as nn
import jax
import jax.numpy as jnp

from .nets.transformer import BasicTransformerBlock

#: diffusers' `pag_applied_layers=["mid"]`: the self-attention of every transformer layer in this block.
PERTURBED_BLOCK = "mid_block"


def with_perturbed_rows(tree, rows: int):
    """Every array of `tree` [c·b, ...] with its last `rows` (b: the conditional rows) appended: [(c + 1)·b, ...],
    the perturbed branch's copy (diffusers' `torch.cat([cond] * 2)` after the unconditional rows)."""
    return jax.tree_util.tree_map(lambda x: jnp.concatenate([x, x[-rows:]]), tree)


def _identity_layer(layer: BasicTransformerBlock, hidden_states, context, rows: int):
    """`BasicTransformerBlock.__call__` with its self-attention the identity on the last `rows` rows: to_out(to_v(x))
    there, as `PAGIdentitySelfAttnProcessor2_0` does."""
    normed = layer.norm1(hidden_states)
    attention = layer.attn1
    attended = jnp.concatenate([attention(normed[:-rows]), attention.proj_attn(attention.value(normed[-rows:]))])
    hidden_states = attended + hidden_states
    hidden_states = layer.attn2(layer.norm2(hidden_states), context) + hidden_states
    return layer.ff(layer.norm3(hidden_states)) + hidden_states


@contextlib.contextmanager
def perturbed_attention(rows: int):
    """Within this context (entered inside a traced function, around the UNet's `apply`), the middle block's
    self-attention is the identity on the batch's last `rows` rows (the perturbed branch)."""

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if (
            context.method_name != "__call__"
            or not isinstance(module, BasicTransformerBlock)
            or module.path[:1] != (PERTURBED_BLOCK,)
        ):
            return next_fun(*args, **kwargs)
        return _identity_layer(module, *args, rows=rows, **kwargs)

    with nn.intercept_methods(interceptor):
        yield


def guide(noise, guidance, scale, cfg: bool):
    """diffusers' PAG guidance: noise [(c + 1)·b, ...] (uncond, cond, perturbed with `cfg`; else cond, perturbed),
    guidance [b, 1, 1, 1], scale (this step's PAG scale) [b, 1, 1, 1] -> [b, ...]. A guidance <= 1 keeps the
    conditional prediction, as the plain step's `sampler_update.guide` does."""
    if cfg:
        uncond, cond, perturbed = jnp.split(noise, 3, axis=0)
        guided = jnp.where(guidance > 1, uncond + guidance * (cond - uncond), cond)
    else:
        cond, perturbed = jnp.split(noise, 2, axis=0)
        guided = cond
    return guided + scale * (cond - perturbed)
