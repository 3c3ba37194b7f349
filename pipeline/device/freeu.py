"""FreeU (Si et al., 2023) on the UNet's first two up blocks, as diffusers' `enable_freeu` runs it, its factors traced.

diffusers (`utils/torch_utils.apply_freeu`, called by `UpBlock2D` / `CrossAttnUpBlock2D` before each resnet): in up
block 0, the first half of the backbone's channels is multiplied by b1 and the skip is Fourier-filtered with scale
s1; in up block 1, b2 and s2; the other up blocks are untouched. `fourier_filter(x, threshold=1, scale)`: the skip's
2-D FFT, shifted so the lowest frequencies are at the centre, the centre's 2 threshold × 2 threshold box multiplied by
`scale`, shifted back, inverse FFT, its real part (float32 whatever the compute dtype: diffusers casts the
non-power-of-2 sizes and bfloat16 up, and float16's FFT is not offered here).

Here the blocks are not touched: a flax method interceptor sees each of those resnets' input, the backbone ++ the skip
along channels (`nets/unet_blocks.py` concatenates them as diffusers does), splits it at the backbone's width (the
block's previous output for its first resnet, its own width after), applies FreeU and calls the resnet. The engine's
attention hook passes resnets through, so both hooks stand. The factors are one row per UNet row (b1, b2, s1, s2),
data: one compiled program serves every value, and a request without FreeU runs the plain step (no such program).
"""

from __future__ import annotations

import contextlib

import flax.linen as nn
import jax.numpy as jnp

from .nets.resnet import ResnetBlock2D

#: The up blocks FreeU changes, by name, and the columns of their factors (backbone, skip) in a row (b1, b2, s1, s2).
STAGES = {"up_blocks_0": (0, 2), "up_blocks_1": (1, 3)}
#: The factors of one image: b1, b2, s1, s2.
FACTORS = 4
#: diffusers' threshold: the half-width of the low-frequency box the skip's scale applies to.
THRESHOLD = 1


def fourier_filter(x, scale, threshold: int = THRESHOLD):
    """diffusers' `fourier_filter` on NHWC features: x [B, H, W, C], scale [B] -> the filtered x, in x's dtype."""
    height, width = x.shape[1:3]
    freq = jnp.fft.fftshift(jnp.fft.fftn(x.astype(jnp.float32), axes=(1, 2)), axes=(1, 2))
    crow, ccol = height // 2, width // 2
    rows = (jnp.arange(height) >= crow - threshold) & (jnp.arange(height) < crow + threshold)
    cols = (jnp.arange(width) >= ccol - threshold) & (jnp.arange(width) < ccol + threshold)
    box = (rows[:, None] & cols[None, :])[None, :, :, None]  # [1, H, W, 1]
    mask = jnp.where(box, scale.astype(jnp.float32)[:, None, None, None], jnp.float32(1))  # [B, H, W, 1]
    filtered = jnp.fft.ifftn(jnp.fft.ifftshift(freq * mask, axes=(1, 2)), axes=(1, 2)).real
    return filtered.astype(x.dtype)


def apply_freeu(hidden, skip, backbone, skip_scale):
    """diffusers' `apply_freeu` for one stage: the backbone's first half of channels × `backbone` [B], the skip
    Fourier-filtered by `skip_scale` [B]: -> (hidden, skip), NHWC."""
    half = hidden.shape[-1] // 2
    scaled = hidden[..., :half] * backbone.astype(hidden.dtype)[:, None, None, None]
    return jnp.concatenate([scaled, hidden[..., half:]], axis=-1), fourier_filter(skip, skip_scale)


def _backbone_channels(resnet) -> int | None:
    """The backbone's width in the input of an up block's resnet (the rest is the skip), or None for another
    module."""
    block = resnet.parent
    if block is None or block.name not in STAGES or not resnet.name or not resnet.name.startswith("resnets_"):
        return None
    index = int(resnet.name.rsplit("_", 1)[1])
    return block.prev_output_channel if index == 0 else block.out_channels


@contextlib.contextmanager
def freeu(factors):
    """Within this context (entered inside a traced function, around the UNet's `apply`), the UNet runs with FreeU:
    `factors` float32 [rows, 4] (b1, b2, s1, s2 per UNet row)."""

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if context.method_name != "__call__" or not isinstance(module, ResnetBlock2D):
            return next_fun(*args, **kwargs)
        channels = _backbone_channels(module)
        if channels is None:
            return next_fun(*args, **kwargs)
        backbone_column, skip_column = STAGES[module.parent.name]
        joined, *rest = args
        hidden, skip = apply_freeu(
            joined[..., :channels], joined[..., channels:], factors[:, backbone_column], factors[:, skip_column]
        )
        return next_fun(jnp.concatenate([hidden, skip], axis=-1), *rest, **kwargs)

    with nn.intercept_methods(interceptor):
        yield
