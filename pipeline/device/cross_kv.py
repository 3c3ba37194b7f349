"""The text's keys and values for every cross-attention layer of the UNet, projected once per request.

Each transformer layer of the UNet (70 in SDXL's) projects the text [cb, K*77, 2048] to keys and values with its
own `to_k` and `to_v` at every step, though neither the text nor those kernels change during a request: 140 small
products per SDXL step that read 0.68 GB of kernels (bf16), and on a GPU XLA's dot merger also concatenates their
kernels again every step. With `--cross-attention-cache` the `cross_kv` program (host/compiling/programs.py) makes them
once, after the text is encoded (and again for the conditional half when guidance ends), and each step's UNet reads them
from the table (`attention.text_keys_values`). The products are the same layers on the same inputs, so the pixels
are the same; the step only loses work.

    table = cross_kv_local(modules, {"unet": params}, hidden)  # {"down_blocks_1/.../attn2": (k, v) [cb, T, C]}
    with attention.text_keys_values(table):                    # around the UNet's apply only: the paths are its own
        unet.apply(...)
"""

from __future__ import annotations

from .modules import Modules

#: The key of a step's weights that holds the table (`{"unet": ..., CROSS_KV: table}`).
CROSS_KV = "cross_kv"


def cross_kv_local(modules: Modules, params, hidden) -> dict:
    """The UNet's cross-attention keys and values of `hidden` [cb, T, D] for the images on one device."""
    return modules.unet.apply({"params": params["unet"]}, hidden, method="text_keys_values")


def table_of(params) -> dict | None:
    """A step's table, when its weights carry one (`--cross-attention-cache`), else None."""
    return params.get(CROSS_KV)
