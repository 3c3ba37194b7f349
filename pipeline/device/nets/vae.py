"""SDXL's VAE (AutoencoderKL): pixels <-> latents, 8x smaller per side, 4 channels.

`encode` gives the posterior (its `mean`, `std`; the engine takes the mean: deterministic), `decode` the pixels in
[-1, 1]. The configuration is the checkpoint's `vae/config.json` (`VAEConfig.from_dict`); `scaling_factor` is
what the latents are multiplied by before the UNet sees them (SDXL: 0.13025).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from . import layers
from .resnet import conv1x1, conv3x3
from .vae_blocks import DownEncoderBlock2D, UpDecoderBlock2D, VAEMidBlock2D


@dataclasses.dataclass(frozen=True)
class VAEConfig:
    """The fields of a diffusers `vae/config.json` that shape SDXL's VAE (defaults: SDXL base 1.0's)."""

    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",) * 4
    up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",) * 4
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    latent_channels: int = 4
    norm_num_groups: int = 32
    sample_size: int = 1024
    scaling_factor: float = 0.13025

    @classmethod
    def from_dict(cls, config: dict) -> VAEConfig:
        """From a config.json's fields (others, such as `_class_name` or `act_fn`, are not read); lists -> tuples."""
        names = {field.name for field in dataclasses.fields(cls)}
        values = {key: tuple(v) if isinstance(v, list) else v for key, v in config.items() if key in names}
        return cls(**values)


@flax.struct.dataclass
class DiagonalGaussian:
    """The encoder's posterior per latent: mean and log-variance (clipped to [-30, 20]), NHWC [B, h, w, 4]."""

    mean: jax.Array
    logvar: jax.Array

    @property
    def std(self):
        return jnp.exp(0.5 * self.logvar)

    @classmethod
    def of(cls, moments) -> DiagonalGaussian:
        mean, logvar = jnp.split(moments, 2, axis=-1)
        return cls(mean=mean, logvar=jnp.clip(logvar, -30.0, 20.0))


@flax.struct.dataclass
class EncoderOutput:
    latent_dist: DiagonalGaussian


@flax.struct.dataclass
class DecoderOutput:
    sample: jax.Array  # [B, 3, H, W] in [-1, 1] (NCHW, as diffusers)


class Encoder(nn.Module):
    """Pixels [B, H, W, 3] -> moments [B, H/8, W/8, 2 x latent channels] (mean ++ log-variance)."""

    config: VAEConfig
    dtype: Any = jnp.float32

    def setup(self) -> None:
        config, channels = self.config, self.config.block_out_channels
        self.conv_in = conv3x3(channels[0], self.dtype)
        groups, last, depth = config.norm_num_groups, len(config.down_block_types) - 1, config.layers_per_block
        self.down_blocks = [
            DownEncoderBlock2D(channels[max(i - 1, 0)], channels[i], depth, groups, i < last, self.dtype)
            for i in range(last + 1)
        ]
        self.mid_block = VAEMidBlock2D(channels[-1], resnet_groups=config.norm_num_groups, dtype=self.dtype)
        self.conv_norm_out = layers.GroupNorm(num_groups=config.norm_num_groups, epsilon=1e-6)
        self.conv_out = conv3x3(2 * config.latent_channels, self.dtype)

    def __call__(self, sample):
        sample = self.conv_in(sample)
        for block in self.down_blocks:
            sample = block(sample)
        sample = self.mid_block(sample)
        return self.conv_out(nn.swish(self.conv_norm_out(sample)))


class Decoder(nn.Module):
    """Latents [B, h, w, latent channels] -> pixels [B, 8h, 8w, 3]."""

    config: VAEConfig
    dtype: Any = jnp.float32

    def setup(self) -> None:
        config, channels = self.config, tuple(reversed(self.config.block_out_channels))
        self.conv_in = conv3x3(channels[0], self.dtype)
        self.mid_block = VAEMidBlock2D(channels[0], resnet_groups=config.norm_num_groups, dtype=self.dtype)
        groups, last, depth = config.norm_num_groups, len(config.up_block_types) - 1, config.layers_per_block + 1
        self.up_blocks = [
            UpDecoderBlock2D(channels[max(i - 1, 0)], channels[i], depth, groups, i < last, self.dtype)
            for i in range(last + 1)
        ]
        self.conv_norm_out = layers.GroupNorm(num_groups=config.norm_num_groups, epsilon=1e-6)
        self.conv_out = conv3x3(config.out_channels, self.dtype)

    def __call__(self, sample):
        sample = self.mid_block(self.conv_in(sample))
        for block in self.up_blocks:
            sample = block(sample)
        return self.conv_out(nn.swish(self.conv_norm_out(sample)))


class AutoencoderKL(nn.Module):
    """SDXL's VAE; its parameter tree is diffusers' Flax autoencoder's for the same config."""

    config: VAEConfig = VAEConfig()
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.encoder = Encoder(self.config, dtype=self.dtype)
        self.decoder = Decoder(self.config, dtype=self.dtype)
        self.quant_conv = conv1x1(2 * self.config.latent_channels, self.dtype)
        self.post_quant_conv = conv1x1(self.config.latent_channels, self.dtype)

    def encode(self, sample, return_dict: bool = True):
        """Pixels [B, 3, H, W] in [-1, 1] -> the posterior over latents (NHWC [B, H/8, W/8, 4])."""
        moments = self.quant_conv(self.encoder(jnp.transpose(sample, (0, 2, 3, 1))))
        posterior = DiagonalGaussian.of(moments)
        return EncoderOutput(latent_dist=posterior) if return_dict else (posterior,)

    def decode(self, latents, return_dict: bool = True):
        """Latents [B, 4, h, w] (or NHWC) -> pixels [B, 3, 8h, 8w] in about [-1, 1]."""
        if latents.shape[-1] != self.config.latent_channels:
            latents = jnp.transpose(latents, (0, 2, 3, 1))
        sample = jnp.transpose(self.decoder(self.post_quant_conv(latents)), (0, 3, 1, 2))
        return DecoderOutput(sample=sample) if return_dict else (sample,)

    def __call__(self, sample):
        """Encode, take the posterior's mean, decode: what `init` traces (every parameter is used)."""
        return self.decode(self.encode(sample).latent_dist.mean)

    def init_weights(self, rng) -> dict:
        """Parameters for the config's shapes (the loaders trace this with `jax.eval_shape`)."""
        size = self.config.sample_size
        return self.init(rng, jnp.zeros((1, self.config.in_channels, size, size), jnp.float32))["params"]
