"""Reference code the tests compare the engine with: not served, so kept out of the engine's modules."""

from __future__ import annotations

import functools

import jax
import numpy as np

from pipeline.contract.image_inputs import ImageSource, fit, open_image, to_rgb
from pipeline.host.planning.sampler_plan import HISTORY, Plan

#: run_local's jitted programs by (model, cfg, prediction type); the model is kept so its id stays its own.
_JITTED: dict = {}


def run_local(
    modules,
    params,
    prompt_ids,
    negative_ids,
    has_negative,
    guidance,
    noise,
    plan: Plan,
    *,
    cfg: bool = True,
    prediction_type: str = "epsilon",
    seeds=None,
    text=None,
) -> np.ndarray:
    """The same loop on one device from given standard-normal `noise` [b, 4, h, w]: uint8 [b, H, W, 3] on the host.

    For checks against diffusers' PyTorch pipeline, which takes the initial latents as an argument. `text`: the
    encode program's other arguments (windows [b, 2], prompt and negative weights [b, 2, K*77], embedding tables
    [E, D1], [E, D2]); None: one window, no emphasis, no embeddings.
    """
    from pipeline.device.denoise import step_local
    from pipeline.device.text import encode_local
    from pipeline.device.vae import decode_local

    key = (id(modules), cfg, prediction_type)
    if key not in _JITTED:  # one trace per model and setting for every run (the samplers' rows are data)
        _JITTED[key] = (
            modules,
            jax.jit(functools.partial(encode_local, modules, cfg=cfg)),
            jax.jit(functools.partial(step_local, modules, cfg=cfg, prediction_type=prediction_type)),
            jax.jit(functools.partial(decode_local, modules)),
        )
    _, encode, step, decode = _JITTED[key]
    seeds = np.zeros(len(guidance), np.uint32) if seeds is None else seeds
    if text is None:
        windows = np.ones((len(guidance), 2), np.int32)  # one 77-token window each
        weights = np.ones(np.shape(prompt_ids), np.float32)  # [B, 2, 77]: no emphasis
        extra = [
            np.zeros((1, params[name]["text_model"]["embeddings"]["token_embedding"]["embedding"].shape[1]), np.float32)
            for name in ("text_encoder", "text_encoder_2")
        ]  # no embeddings
        text = (windows, weights, weights, *extra)
    hidden, pooled, lengths = encode(params, prompt_ids, negative_ids, has_negative, *text)
    latents = np.asarray(noise, np.float32) * np.float32(plan.init_sigma)
    zeros = np.zeros_like(latents)
    image = {"latents": zeros, "noise": zeros, "repaint": np.ones_like(latents[:, :1]), "masked": zeros}  # none
    previous = np.zeros((latents.shape[0], HISTORY, *latents.shape[1:]), np.float32)  # the samplers' history
    for index, row in enumerate(plan.coefficients):
        latents, previous = step(
            params,
            latents,
            previous,
            hidden,
            pooled,
            lengths,
            guidance,
            seeds,
            row,
            np.int32(index),
            image,
            np.float32(0),
        )
    return np.asarray(decode(params, latents))


def reference_attention(q, k, v, scale: float) -> np.ndarray:
    """Exact attention in float64 numpy (for tests and benchmarks): q [B, Lq, N, H] -> [B, Lq, N, H]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = np.einsum("bqnh,bknh->bnqk", q, k) * scale
    scores -= scores.max(-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bnqk,bknh->bqnh", probs, v)


def prepare_image(source: ImageSource, height: int, width: int) -> np.ndarray:
    """Decode, convert and fit an init image: uint8 [height, width, 3]."""
    return np.asarray(fit(to_rgb(open_image(source, what="image")), height, width), dtype=np.uint8).copy()
