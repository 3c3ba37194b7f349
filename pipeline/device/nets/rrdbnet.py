"""RRDBNet, ESRGAN's generator (R-ESRGAN 4x+, 4x-UltraSharp and their kin), as a Flax module, NHWC.

basicsr's `RRDBNet` (the layout Real-ESRGAN ships) is: conv_first -> `blocks` RRDBs -> conv_body, added to
conv_first's output -> ×2 nearest upsample + conv + LeakyReLU(0.2), `upsamples` times -> conv_hr + LeakyReLU ->
conv_last. Each RRDB is three residual dense blocks (five 3x3 convs with dense skips, growth `growth`, the last one
scaled by 0.2 and added to the input), itself scaled by 0.2 and added to its input. Real-ESRGAN's ×2 and ×1 models
pixel-unshuffle the input by 2 or 4 first (conv_first takes 12 or 48 channels), keeping two ×2 upsamples. The
original ESRGAN layout's ×2 models have one upsample instead: `upsamples` covers both.

The parameter tree is `conv_first`, `body_N/rdb{1,2,3}/conv{1..5}`, `conv_body`, `conv_up{1..}`, `conv_hr`,
`conv_last`, each `{kernel [3, 3, in, out], bias [out]}`: `checkpoint/upscaler_loading.py` fills it from either
PyTorch layout; tests/engine/test_esrgan.py pins it against torch's outputs.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from .resnet import conv3x3

#: ESRGAN's LeakyReLU slope and residual scale.
NEGATIVE_SLOPE = 0.2
RESIDUAL_SCALE = 0.2


def _lrelu(x):
    return nn.leaky_relu(x, NEGATIVE_SLOPE)


def pixel_unshuffle(x, factor: int):
    """[B, H, W, C] -> [B, H/f, W/f, C·f²], channels ordered (c, dy, dx) as torch's pixel_unshuffle orders them."""
    if factor == 1:
        return x
    b, h, w, c = x.shape
    x = x.reshape(b, h // factor, factor, w // factor, factor, c)
    return x.transpose(0, 1, 3, 5, 2, 4).reshape(b, h // factor, w // factor, c * factor * factor)


def upsample_nearest2x(x):
    """[B, H, W, C] -> [B, 2H, 2W, C]: torch's interpolate(scale_factor=2, mode="nearest")."""
    return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)


class ResidualDenseBlock(nn.Module):
    """Five 3x3 convs, each seeing the input and every earlier output; the last one's output × 0.2 + the input."""

    features: int
    growth: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.conv1 = conv3x3(self.growth, self.dtype)
        self.conv2 = conv3x3(self.growth, self.dtype)
        self.conv3 = conv3x3(self.growth, self.dtype)
        self.conv4 = conv3x3(self.growth, self.dtype)
        self.conv5 = conv3x3(self.features, self.dtype)

    def __call__(self, x):
        seen = [x]
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            seen.append(_lrelu(conv(jnp.concatenate(seen, axis=-1))))
        return self.conv5(jnp.concatenate(seen, axis=-1)) * RESIDUAL_SCALE + x


class RRDB(nn.Module):
    """Three residual dense blocks in a row; their output × 0.2 + the input."""

    features: int
    growth: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.rdb1 = ResidualDenseBlock(self.features, self.growth, self.dtype)
        self.rdb2 = ResidualDenseBlock(self.features, self.growth, self.dtype)
        self.rdb3 = ResidualDenseBlock(self.features, self.growth, self.dtype)

    def __call__(self, x):
        return self.rdb3(self.rdb2(self.rdb1(x))) * RESIDUAL_SCALE + x


class RRDBNet(nn.Module):
    """RGB [B, H, W, 3] in [0, 1] -> [B, H·scale, W·scale, 3] (not clipped: the caller clips)."""

    blocks: int = 23  # RRDBs (num_block)
    features: int = 64  # num_feat
    growth: int = 32  # num_grow_ch
    unshuffle: int = 1  # the input's pixel-unshuffle factor (Real-ESRGAN x2: 2, x1: 4)
    upsamples: int = 2  # ×2 nearest upsamples, each with its conv (old ESRGAN ×2 models: 1)
    in_channels: int = 3
    out_channels: int = 3
    dtype: Any = jnp.float32

    @property
    def scale(self) -> float:
        """How many times larger the output is than the input on each side."""
        return 2**self.upsamples / self.unshuffle

    def setup(self) -> None:
        self.conv_first = conv3x3(self.features, self.dtype)
        self.body = [RRDB(self.features, self.growth, self.dtype) for _ in range(self.blocks)]
        self.conv_body = conv3x3(self.features, self.dtype)
        self.conv_up = [conv3x3(self.features, self.dtype, name=f"conv_up{i + 1}") for i in range(self.upsamples)]
        self.conv_hr = conv3x3(self.features, self.dtype)
        self.conv_last = conv3x3(self.out_channels, self.dtype)

    def __call__(self, x):
        feat = self.conv_first(pixel_unshuffle(x.astype(self.dtype), self.unshuffle))
        body = feat
        for block in self.body:
            body = block(body)
        feat = feat + self.conv_body(body)
        for conv in self.conv_up:
            feat = _lrelu(conv(upsample_nearest2x(feat)))
        return self.conv_last(_lrelu(self.conv_hr(feat)))

    def init_params(self, seed: int = 0) -> dict:
        """Random parameters of this shape (tests; shapes for the loader's checks)."""
        size = 4 * self.unshuffle
        return self.init(jax.random.PRNGKey(seed), jnp.zeros((1, size, size, self.in_channels)))["params"]
