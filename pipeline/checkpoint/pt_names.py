"""PyTorch tensor names -> the Flax networks' tree keys, one tensor at a time, with the transpose each layout needs.

These are the renaming rules of diffusers' and transformers' PyTorch-to-Flax helpers (the only parts of their Flax
code the torch-free conversion used, written here so it needs neither library), kept to the rules an SDXL checkpoint
meets. `lookup` is the target tree, flattened: {key tuple: shape-bearing leaf} (convert.target_shapes).

- UNet and VAE (diffusers' names): "down_blocks.0.resnets.1.conv1.weight" -> ("down_blocks_0", "resnets_1",
  "conv1", "kernel"); attention projections take diffusers' old Flax names (to_q -> query, ...); norms' weight ->
  scale; conv kernels [O, I, kh, kw] -> [kh, kw, I, O]; linear kernels transposed.
- CLIP text encoders (transformers' names, which keep their dots: "text_model.encoder.layers.0.mlp.fc1.weight"),
  the same norm, embedding, conv and linear rules; `prefix` is the Flax base model's name ("text_model").
"""

from __future__ import annotations

import re

import numpy as np

#: diffusers' PyTorch attention projections -> the Flax networks' names for them.
ATTENTION_NAMES = {"to_out_0": "proj_attn", "to_k": "key", "to_v": "value", "to_q": "query"}


def diffusers_key(name: str) -> tuple[str, ...]:
    """A module name followed by its index becomes one Flax module name: "down_blocks.0.attentions.1.proj_in.weight"
    -> ("down_blocks_0", "attentions_1", "proj_in", "weight")."""
    for pattern in re.findall(r"\w+[.]\d+", name):
        name = name.replace(pattern, "_".join(pattern.split(".")))
    return tuple(name.split("."))


def rename_diffusers(key: tuple[str, ...], tensor: np.ndarray, lookup: dict) -> tuple[tuple[str, ...], np.ndarray]:
    """One UNet or VAE tensor's Flax key and value (diffusers' `rename_key_and_reshape_tensor`; an attention
    projection whose shape does not fit is returned renamed all the same, for the caller's shape check to name)."""
    scale = key[:-1] + ("scale",)
    if len(key) > 1 and key[-2] in ATTENTION_NAMES:
        renamed = key[:-2] + (ATTENTION_NAMES[key[-2]], "kernel" if key[-1] == "weight" else key[-1])
        if renamed in lookup:
            return renamed, tensor.T
    if any("norm" in part for part in key) and key[-1] == "bias" and key not in lookup and scale in lookup:
        return scale, tensor
    if key[-1] in ("weight", "gamma") and scale in lookup:
        return scale, tensor
    if key[-1] == "weight" and key[:-1] + ("embedding",) in lookup:
        return key[:-1] + ("embedding",), tensor
    return _kernel_or_layer_norm(key, tensor, lambda _: False)


def rename_transformers(
    key: tuple[str, ...], tensor: np.ndarray, lookup: dict, prefix: str
) -> tuple[tuple[str, ...], np.ndarray]:
    """One CLIP text encoder tensor's Flax key and value (transformers' `rename_key_and_reshape_tensor`): a key
    counts as present with or without the base model's `prefix` in front."""

    def present(candidate: tuple[str, ...]) -> bool:
        return candidate in lookup or (prefix, *candidate) in lookup

    for last, flax_name in (("weight", "scale"), ("gamma", "scale"), ("weight", "embedding")):
        if key[-1] == last and present(key[:-1] + (flax_name,)):
            return key[:-1] + (flax_name,), tensor
    return _kernel_or_layer_norm(key, tensor, present)


def _kernel_or_layer_norm(key: tuple[str, ...], tensor: np.ndarray, present) -> tuple[tuple[str, ...], np.ndarray]:
    """The rules both libraries share: conv and linear kernels (unless the PyTorch key itself is a target), and the
    old PyTorch layer norms' gamma/beta."""
    if key[-1] == "weight" and not present(key):
        if tensor.ndim == 4:
            return key[:-1] + ("kernel",), tensor.transpose(2, 3, 1, 0)  # [O, I, kh, kw] -> [kh, kw, I, O]
        return key[:-1] + ("kernel",), tensor.T  # [out, in] -> [in, out]
    if key[-1] == "gamma":
        return key[:-1] + ("weight",), tensor
    if key[-1] == "beta":
        return key[:-1] + ("bias",), tensor
    return key, tensor
