"""SDXL's two CLIP text encoders: CLIP ViT-L (768 wide, 12 layers) and OpenCLIP bigG (1280, 32, projected).

SDXL conditions its UNet on the penultimate layer's hidden states of both, so the encoder returns the hidden
states entering every layer and leaving the last (`hidden_states`, 1 + layers of them), plus the pooled output
(the final-normed state at each row's end token) and, with a projection, `text_embeds`. Causal self-attention
over the 77 tokens, no padding mask (as SDXL's pipelines call it). Parameter trees are transformers' Flax CLIP
text models' (without and with projection): a `text_model` subtree, layers named "0", "1", ...
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.attention import dot_product_attention_weights

from . import layers

#: CLIP's activations: exact GELU (OpenCLIP bigG) and CLIP's own sigmoid approximation (ViT-L).
ACTIVATIONS = {
    "gelu": functools.partial(nn.gelu, approximate=False),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
}


@dataclasses.dataclass(frozen=True)
class CLIPTextConfig:
    """The fields of a transformers `text_encoder*/config.json` that shape the encoder (defaults: CLIP ViT-L's)."""

    vocab_size: int = 49408
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    eos_token_id: int = 2
    projection_dim: int = 768
    causal: ClassVar[bool] = True  # a text encoder's token attends to those before it (the image encoder's to all)

    @classmethod
    def from_dict(cls, config: dict) -> CLIPTextConfig:
        """From a config.json's fields (others, such as `architectures`, are not read)."""
        return config_from(cls, config)


def config_from(cls, config: dict):
    """A CLIP config dataclass `cls` from a config.json's fields it names (the others are not read); its activation
    checked."""
    names = {field.name for field in dataclasses.fields(cls)}
    made = cls(**{key: value for key, value in config.items() if key in names})
    if made.hidden_act not in ACTIVATIONS:
        raise ValueError(f"hidden_act {made.hidden_act!r}: SDXL's encoders use one of {', '.join(ACTIVATIONS)}")
    return made


@flax.struct.dataclass
class CLIPTextOutput:
    """What the encoders return; subscriptable by name (`out["hidden_states"]`), as transformers' outputs are."""

    last_hidden_state: jax.Array  # [B, 77, D], after the final LayerNorm
    pooler_output: jax.Array  # [B, D]: last_hidden_state at each row's end token
    hidden_states: tuple  # 1 + layers of [B, 77, D]: the embeddings, then each layer's output (not final-normed)
    text_embeds: jax.Array | None = None  # [B, P]: pooler_output projected (CLIPTextModelWithProjection only)

    def __getitem__(self, key: str):
        return getattr(self, key)


class CLIPTextEmbeddings(nn.Module):
    """Token ids [B, 77] -> token vector + position vector [B, 77, D]."""

    config: CLIPTextConfig
    dtype: Any = jnp.float32

    def setup(self) -> None:
        normal = jax.nn.initializers.normal()
        self.token_embedding = layers.Embed(self.config.vocab_size, self.config.hidden_size, embedding_init=normal)
        self.position_embedding = layers.Embed(
            self.config.max_position_embeddings, self.config.hidden_size, embedding_init=normal
        )

    def __call__(self, input_ids, position_ids):
        return self.token_embedding(input_ids.astype("i4")) + self.position_embedding(position_ids.astype("i4"))


class CLIPAttention(nn.Module):
    """Multi-head self-attention, causal where the config is a text encoder's: [B, L, D] -> [B, L, D] (weights from
    flax's own helper, in `dtype`)."""

    config: Any  # CLIPTextConfig, or nets/clip_vision.CLIPVisionConfig (the same layer fields)
    dtype: Any = jnp.float32

    def setup(self) -> None:
        dense = functools.partial(layers.Dense, self.config.hidden_size, dtype=self.dtype)
        self.k_proj, self.v_proj, self.q_proj, self.out_proj = dense(), dense(), dense(), dense()

    def __call__(self, hidden_states):
        heads = self.config.num_attention_heads
        width = self.config.hidden_size

        def split(x):  # [B, L, D] -> [B, L, N, H]
            return x.reshape(x.shape[:2] + (heads, width // heads))

        query, key, value = (split(p(hidden_states)) for p in (self.q_proj, self.k_proj, self.v_proj))
        bias = None
        if self.config.causal:
            length = hidden_states.shape[1]
            causal = nn.make_causal_mask(jnp.ones((1, length), dtype="i4"))  # [1, 1, L, L]
            bias = jax.lax.select(
                causal > 0,
                jnp.full(causal.shape, 0.0).astype(self.dtype),
                jnp.full(causal.shape, jnp.finfo(self.dtype).min).astype(self.dtype),
            )
        weights = dot_product_attention_weights(query, key, bias=bias, dtype=self.dtype)  # [B, N, L, L]
        out = jnp.einsum("...hqk,...khd->...qhd", weights, value)  # [B, L, N, H]
        return self.out_proj(out.reshape(out.shape[:2] + (width,)))


class CLIPMLP(nn.Module):
    config: Any  # a text or vision config
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.fc1 = layers.Dense(self.config.intermediate_size, dtype=self.dtype)
        self.fc2 = layers.Dense(self.config.hidden_size, dtype=self.dtype)

    def __call__(self, hidden_states):
        return self.fc2(ACTIVATIONS[self.config.hidden_act](self.fc1(hidden_states)))


class CLIPEncoderLayer(nn.Module):
    """Pre-norm attention and MLP, each with a residual: [B, L, D] -> [B, L, D]."""

    config: Any  # a text or vision config
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.self_attn = CLIPAttention(self.config, dtype=self.dtype)
        self.layer_norm1 = layers.LayerNorm(epsilon=self.config.layer_norm_eps, dtype=self.dtype)
        self.mlp = CLIPMLP(self.config, dtype=self.dtype)
        self.layer_norm2 = layers.LayerNorm(epsilon=self.config.layer_norm_eps, dtype=self.dtype)

    def __call__(self, hidden_states):
        hidden_states = hidden_states + self.self_attn(self.layer_norm1(hidden_states))
        return hidden_states + self.mlp(self.layer_norm2(hidden_states))


class CLIPLayers(nn.Module):
    """The layers, named "0", "1", ... (transformers' `encoder/layers/<i>`); returns every hidden state."""

    config: Any  # a text or vision config
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.layers = [
            CLIPEncoderLayer(self.config, dtype=self.dtype, name=str(i)) for i in range(self.config.num_hidden_layers)
        ]

    def __call__(self, hidden_states):
        states = (hidden_states,)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
            states += (hidden_states,)
        return states


class CLIPEncoder(nn.Module):
    """Only a level of nesting: transformers' tree is `encoder/layers/<i>`."""

    config: Any  # a text or vision config
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.layers = CLIPLayers(self.config, dtype=self.dtype)

    def __call__(self, hidden_states):
        return self.layers(hidden_states)


class CLIPTextTransformer(nn.Module):
    """Ids [B, L] -> (final-normed last state [B, L, D], pooled [B, D], every hidden state)."""

    config: CLIPTextConfig
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.embeddings = CLIPTextEmbeddings(self.config, dtype=self.dtype)
        self.encoder = CLIPEncoder(self.config, dtype=self.dtype)
        self.final_layer_norm = layers.LayerNorm(epsilon=self.config.layer_norm_eps, dtype=self.dtype)

    def __call__(self, input_ids, position_ids):
        states = self.encoder(self.embeddings(input_ids=input_ids, position_ids=position_ids))
        last = self.final_layer_norm(states[-1])  # [B, L, D]
        # The end token: the largest id when it is 2 (original CLIP configs), else the first eos_token_id.
        eos = self.config.eos_token_id
        ends = input_ids.argmax(axis=-1) if eos == 2 else (input_ids == eos).argmax(axis=-1)  # [B]
        return last, last[jnp.arange(last.shape[0]), ends], states


class CLIPTextModel(nn.Module):
    """CLIP ViT-L, SDXL's first text encoder: `apply({"params": p}, ids)` -> `CLIPTextOutput`."""

    config: CLIPTextConfig
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.text_model = CLIPTextTransformer(self.config, dtype=self.dtype)

    def __call__(self, input_ids, position_ids=None):
        """input_ids int [B, L]; position_ids default 0..L-1."""
        input_ids = jnp.asarray(input_ids, dtype="i4")
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[-1]), input_ids.shape)
        last, pooled, states = self.text_model(input_ids, jnp.asarray(position_ids, dtype="i4"))
        return CLIPTextOutput(last_hidden_state=last, pooler_output=pooled, hidden_states=states)

    def init_weights(self, rng) -> dict:
        """Parameters for the config's shapes (the loaders trace this with `jax.eval_shape`)."""
        return self.init(rng, jnp.zeros((1, self.config.max_position_embeddings), "i4"))["params"]


class CLIPTextModelWithProjection(CLIPTextModel):
    """OpenCLIP bigG, SDXL's second text encoder: also `text_embeds`, the pooled output projected (no bias)."""

    def setup(self) -> None:
        super().setup()
        self.text_projection = layers.Dense(self.config.projection_dim, use_bias=False, dtype=self.dtype)

    def __call__(self, input_ids, position_ids=None):
        output = super().__call__(input_ids, position_ids)
        return output.replace(text_embeds=self.text_projection(output.pooler_output))
