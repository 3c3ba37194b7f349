"""The image encoder of an image prompt: CLIP's vision transformer with its projection (IP-Adapter's encoders).

h94/IP-Adapter ships two, as transformers' `CLIPVisionModelWithProjection`: OpenCLIP ViT-bigG (`sdxl_models/
image_encoder`, 1664 wide, 48 layers, projected to 1280) and ViT-H (`models/image_encoder`, 1280, 32, to 1024).
A plain adapter reads `image_embeds` (the class token, post-normed and projected); a Plus adapter reads the
penultimate layer's hidden states of every token (`hidden_states[-2]`). The layers are the text encoders' own
(`nets/clip.py`) without the causal mask. Parameter tree: transformers' Flax `FlaxCLIPVisionModelWithProjection`'s
(`vision_model/embeddings/...`, `vision_model/pre_layrnorm` with its misspelling, `visual_projection`), so the
project's PyTorch-name rules (`checkpoint/pt_names.py`) convert its safetensors as they convert the text encoders'.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from . import layers
from .clip import CLIPEncoder, config_from


@dataclasses.dataclass(frozen=True)
class CLIPVisionConfig:
    """The fields of a transformers `image_encoder/config.json` that shape the encoder (defaults: ViT-H/14's)."""

    hidden_size: int = 1280
    intermediate_size: int = 5120
    num_hidden_layers: int = 32
    num_attention_heads: int = 16
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 14
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5
    projection_dim: int = 1024
    causal: ClassVar[bool] = False  # every patch attends to every other

    @classmethod
    def from_dict(cls, config: dict) -> CLIPVisionConfig:
        """From a config.json's fields: a `CLIPVisionModelWithProjection` config, or a whole CLIP config's
        `vision_config` (others, such as `architectures`, are not read)."""
        made = config_from(cls, config.get("vision_config", config))
        if made.image_size % made.patch_size:
            raise ValueError(f"image_size {made.image_size} is not a multiple of patch_size {made.patch_size}")
        return made

    @property
    def patches(self) -> int:
        """Tokens per image: the patches and the class token (ViT-H/14 at 224: 16 x 16 + 1 = 257)."""
        return (self.image_size // self.patch_size) ** 2 + 1


@flax.struct.dataclass
class CLIPVisionOutput:
    """What the encoder returns; subscriptable by name, as transformers' outputs are."""

    image_embeds: jax.Array  # [B, P]: the class token, post-normed and projected
    hidden_states: tuple  # 1 + layers of [B, patches, D]: the pre-normed embeddings, then each layer's output

    def __getitem__(self, key: str):
        return getattr(self, key)


class CLIPVisionEmbeddings(nn.Module):
    """Pixels [B, H, W, C] -> the class token and each patch's vector, plus their positions: [B, patches, D]."""

    config: CLIPVisionConfig
    dtype: Any = jnp.float32

    def setup(self) -> None:
        config = self.config
        self.class_embedding = self.param("class_embedding", jax.nn.initializers.normal(0.02), (config.hidden_size,))
        self.patch_embedding = layers.Conv(
            config.hidden_size,
            kernel_size=(config.patch_size, config.patch_size),
            strides=(config.patch_size, config.patch_size),
            padding="VALID",
            use_bias=False,
            dtype=self.dtype,
        )
        self.position_embedding = layers.Embed(
            config.patches, config.hidden_size, embedding_init=jax.nn.initializers.normal()
        )

    def __call__(self, pixels):
        patches = self.patch_embedding(pixels)  # [B, h, w, D]
        batch, height, width, channels = patches.shape
        patches = patches.reshape(batch, height * width, channels)
        cls = jnp.broadcast_to(self.class_embedding.astype(patches.dtype), (batch, 1, channels))
        embeddings = jnp.concatenate([cls, patches], axis=1)  # [B, patches, D]
        return embeddings + self.position_embedding(jnp.arange(embeddings.shape[1], dtype="i4"))[None]


class CLIPVisionTransformer(nn.Module):
    """Pixels [B, H, W, C] -> (pooled [B, D], every hidden state)."""

    config: CLIPVisionConfig
    dtype: Any = jnp.float32

    def setup(self) -> None:
        eps = self.config.layer_norm_eps
        self.embeddings = CLIPVisionEmbeddings(self.config, dtype=self.dtype)
        self.pre_layrnorm = layers.LayerNorm(epsilon=eps, dtype=self.dtype)  # transformers' spelling
        self.encoder = CLIPEncoder(self.config, dtype=self.dtype)
        self.post_layernorm = layers.LayerNorm(epsilon=eps, dtype=self.dtype)

    def __call__(self, pixels):
        states = self.encoder(self.pre_layrnorm(self.embeddings(pixels)))
        return self.post_layernorm(states[-1][:, 0]), states


class CLIPVisionModelWithProjection(nn.Module):
    """`apply({"params": p}, pixel_values)` with pixel_values [B, 3, H, W] (NCHW, CLIPImageProcessor's) ->
    `CLIPVisionOutput`."""

    config: CLIPVisionConfig
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.vision_model = CLIPVisionTransformer(self.config, dtype=self.dtype)
        self.visual_projection = layers.Dense(self.config.projection_dim, use_bias=False, dtype=self.dtype)

    def __call__(self, pixel_values):
        pooled, states = self.vision_model(jnp.transpose(pixel_values, (0, 2, 3, 1)))
        return CLIPVisionOutput(image_embeds=self.visual_projection(pooled), hidden_states=states)

    def init_weights(self, rng) -> dict:
        """Parameters for the config's shapes (the loader traces this with `jax.eval_shape`)."""
        size = self.config.image_size
        return self.init(rng, jnp.zeros((1, self.config.num_channels, size, size), jnp.float32))["params"]
