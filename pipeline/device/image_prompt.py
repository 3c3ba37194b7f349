"""An image prompt (IP-Adapter) on the device: the images -> every cross-attention layer's image keys and values, once
per request; and what each step's UNet reads of them.

The `image_prompt` program (per request, `host/compiling/programs.py`): each slot's picture (CLIPImageProcessor's
pixels, `contract/image_prompts.py`) through the image encoder, then its adapter's projection (`nets/
image_projection.py`) to tokens [S x t, C] (t: the most tokens an adapter served gives, 4 or 16; a plain adapter's
slot is padded), and the unconditional tokens as diffusers makes them (`prepare_ip_adapter_image_embeds`): the
projection of zeros for a plain adapter, of the encoded zero image for a Plus one. Then every attn2 layer's to_k_ip /
to_v_ip of both: the table [2, T, N*H] (uncond, cond), as `cross_kv` makes the text's.

The steps carry it in their weights, `{"unet": ..., IMAGE_PROMPT: {...}}` (ProgramKey.image_tokens: the programs
compiled with it), with each slot's scale and step window and its adapter; `unet_layers` enters it, with the text's
table, around the UNet's apply.
"""

from __future__ import annotations

import contextlib

import jax.numpy as jnp

from . import attention
from .cross_kv import table_of
from .modules import Modules
from .nets.ip_attention import image_tokens

#: The key of a step's weights that holds the request's image prompt (`{"unet": ..., IMAGE_PROMPT: ...}`).
IMAGE_PROMPT = "image_prompt"


def image_prompt_local(modules: Modules, params, pixels, slots):
    """pixels float32 [S, 3, s, s] (an empty slot's: anything), slots float32 [A, S] (one-hot: slot j's adapter a;
    an empty slot's column 0) -> {"keys": {attn2 path: [2, S*t, D]}, "values": {...}} (uncond, cond)."""
    encoder, projections = modules.image_encoder, modules.image_projections
    count = pixels.shape[0]
    batch = jnp.concatenate([jnp.zeros_like(pixels[:1]), pixels]).astype(encoder.dtype)  # the zero image first
    encoded = encoder.apply({"params": params["image_encoder"]}, batch)
    t = max(projection.config.tokens for projection in projections)
    uncond, cond = 0.0, 0.0
    for a, projection in enumerate(projections):
        weights = {"params": params["ip_adapters"][a]["image_proj"]}
        if projection.config.reads_hidden_states:  # Plus: the penultimate layer, the zero image's for uncond
            tokens = projection.apply(weights, encoded.hidden_states[-2])  # [1 + S, t_a, C]
            negative, positive = jnp.broadcast_to(tokens[:1], tokens[1:].shape), tokens[1:]
        else:  # plain: the projected embedding, zeros for uncond
            positive = projection.apply(weights, encoded.image_embeds[1:])  # [S, t_a, C]
            negative = projection.apply(weights, jnp.zeros_like(encoded.image_embeds[1:]))
        pad = ((0, 0), (0, t - positive.shape[1]), (0, 0))
        chosen = slots[a][:, None, None]  # [S, 1, 1]
        uncond = uncond + chosen * jnp.pad(negative, pad)
        cond = cond + chosen * jnp.pad(positive, pad)
    tokens = jnp.stack([uncond, cond]).reshape(2, count * t, -1)  # [2, T, C]
    of_token = jnp.repeat(slots, t, axis=1)  # [A, T]: each token's adapter
    keys, values = {}, {}
    for path in params["ip_adapters"][0]["layers"]:
        keys[path] = sum(
            of_token[a][None, :, None] * (tokens @ adapter["layers"][path]["to_k_ip"].astype(tokens.dtype))
            for a, adapter in enumerate(params["ip_adapters"])
        )
        values[path] = sum(
            of_token[a][None, :, None] * (tokens @ adapter["layers"][path]["to_v_ip"].astype(tokens.dtype))
            for a, adapter in enumerate(params["ip_adapters"])
        )
    return {"keys": keys, "values": values}


def step_weights(prompt, index):
    """Each token's weight at step `index` [A, T]: its slot's scale inside the slot's window [first, stop), 0 outside
    it, in its adapter's row; 0 for a padding token."""
    active = (prompt["first"] <= index) & (index < prompt["stop"])  # [S]
    per_slot = prompt["slots"] * jnp.where(active, prompt["scale"], 0.0)[None]  # [A, S]
    tokens = prompt["tokens"]  # [T]: 1 for a real token, 0 for padding
    return jnp.repeat(per_slot, tokens.shape[0] // per_slot.shape[1], axis=1) * tokens[None]


@contextlib.contextmanager
def unet_layers(params, index, cfg: bool):
    """Around the UNet's apply in a step (its layers' paths only): the text's cross-attention table (`cross_kv`,
    when the weights carry one) and the request's image prompt (when they carry one; `cfg`: the step's rows are
    uncond and cond, else cond only)."""
    prompt = params.get(IMAGE_PROMPT) if isinstance(params, dict) else None
    with attention.text_keys_values(table_of(params)):
        if prompt is None:
            yield
            return
        copies = 2 if cfg else 1
        table = {path: (prompt["keys"][path][-copies:], prompt["values"][path][-copies:]) for path in prompt["keys"]}
        with image_tokens(table, step_weights(prompt, index)):
            yield
