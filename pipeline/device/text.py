"""Both CLIP text encoders on the device: token ids -> the embeddings SDXL's UNet is conditioned on.

The token ids come from the host (`host/tokens.py`) as `[B, 2, K*77]` int32 (encoder 1, encoder 2; K windows of
77), so the encode program has one input shape whatever the prompt. The prompt and the negative prompt are encoded
in one batch; an empty negative prompt is a traced flag (zero embeddings, as SDXL's reference does for
`neg_prompt_ids=None`), not another program.
"""

from __future__ import annotations

import jax.numpy as jnp

from .modules import Modules

#: CLIP's window of token ids (the begin and end tokens included).
WINDOW = 77


def encode_prompts(text_encoder, text_encoder_2, params: dict, prompt_ids):
    """Embeddings SDXL's UNet is conditioned on, computed as diffusers' reference pipeline computes them.

    prompt_ids: int32 [N, 2, 77]. Returns (hidden states [N, 77, D1 + D2] from the penultimate layers, pooled
    projection of encoder 2 [N, P]).
    """
    out_1 = text_encoder(prompt_ids[:, 0, :], params=params["text_encoder"], output_hidden_states=True)
    out_2 = text_encoder_2(prompt_ids[:, 1, :], params=params["text_encoder_2"], output_hidden_states=True)
    hidden = jnp.concatenate([out_1["hidden_states"][-2], out_2["hidden_states"][-2]], axis=-1)  # [N, 77, D1+D2]
    return hidden, out_2["text_embeds"]  # [N, 77, D], [N, P]


def encode_local(modules: Modules, params, prompt_ids, negative_ids, has_negative, windows, *, cfg: bool):
    """Both text encoders over every 77-token window: ids [b, 2, K*77] -> hidden [cb, K*77, D], pooled [cb, P]
    and the keys the UNet attends to, [cb] int32 (77 × the windows each text fills); the unconditional half first
    (c = 2), or the prompt alone without CFG (static `cfg=False`, c = 1). `windows` int32 [b, 2]: the windows the
    negative prompt and the prompt fill.

    Each window is encoded on its own and the hidden states are joined along the sequence (A1111's and ComfyUI's
    long prompts); the pooled embedding is the first window's, as theirs.
    """
    both_ids = jnp.concatenate([negative_ids, prompt_ids], axis=0) if cfg else prompt_ids  # [cb, 2, K*77]
    rows, length = both_ids.shape[0], both_ids.shape[-1]
    count = length // WINDOW  # K: static
    per_window = both_ids.reshape(rows, 2, count, WINDOW).transpose(0, 2, 1, 3).reshape(rows * count, 2, WINDOW)
    hidden, pooled = encode_prompts(modules.text_encoder, modules.text_encoder_2, params, per_window)
    hidden = hidden.reshape(rows, count * WINDOW, hidden.shape[-1])  # [cb, K*77, D]
    pooled = pooled.reshape(rows, count, -1)[:, 0]  # [cb, P]: the first window's
    # An empty negative prompt means "no negative": zero embeddings, as SDXL's reference does.
    keep = jnp.concatenate([has_negative, jnp.ones_like(has_negative)]) if cfg else jnp.ones_like(has_negative)
    hidden = jnp.where(keep[:, None, None], hidden, 0)  # [cb, K*77, D]
    pooled = jnp.where(keep[:, None], pooled, 0)  # [cb, P]
    filled = jnp.concatenate([windows[:, 0], windows[:, 1]]) if cfg else windows[:, 1]  # [cb]
    return hidden, pooled, (filled * WINDOW).astype(jnp.int32)
