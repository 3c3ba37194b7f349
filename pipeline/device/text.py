"""Both CLIP text encoders on the device: token ids -> the embeddings SDXL's UNet is conditioned on.

The token ids come from the host (`host/tokens.py`) as `[B, 2, 77]` int32 (encoder 1, encoder 2), so the encode
program has one input shape whatever the prompt. The prompt and the negative prompt are encoded in one batch; an empty
negative prompt is a traced flag (zero embeddings, as SDXL's reference does for `neg_prompt_ids=None`), not another
program.
"""

from __future__ import annotations

import jax.numpy as jnp

from .modules import Modules


def encode_prompts(text_encoder, text_encoder_2, params: dict, prompt_ids):
    """Embeddings SDXL's UNet is conditioned on, computed as diffusers' reference pipeline computes them.

    prompt_ids: int32 [N, 2, 77]. Returns (hidden states [N, 77, D1 + D2] from the penultimate layers, pooled
    projection of encoder 2 [N, P]).
    """
    out_1 = text_encoder(prompt_ids[:, 0, :], params=params["text_encoder"], output_hidden_states=True)
    out_2 = text_encoder_2(prompt_ids[:, 1, :], params=params["text_encoder_2"], output_hidden_states=True)
    hidden = jnp.concatenate([out_1["hidden_states"][-2], out_2["hidden_states"][-2]], axis=-1)  # [N, 77, D1+D2]
    return hidden, out_2["text_embeds"]  # [N, 77, D], [N, P]


def encode_local(modules: Modules, params, prompt_ids, negative_ids, has_negative, *, cfg: bool):
    """Both text encoders: ids [b, 2, 77] -> (hidden [2b or b, 77, D], pooled [2b or b, P]), unconditional first.

    Without CFG (static `cfg=False`) only the prompt is encoded.
    """
    both_ids = jnp.concatenate([negative_ids, prompt_ids], axis=0) if cfg else prompt_ids  # [2b or b, 2, 77]
    hidden, pooled = encode_prompts(modules.text_encoder, modules.text_encoder_2, params, both_ids)
    # An empty negative prompt means "no negative": zero embeddings, as SDXL's reference does.
    keep = jnp.concatenate([has_negative, jnp.ones_like(has_negative)]) if cfg else jnp.ones_like(has_negative)
    hidden = jnp.where(keep[:, None, None], hidden, 0)  # [2b, 77, D]
    pooled = jnp.where(keep[:, None], pooled, 0)  # [2b, P]
    return hidden, pooled
