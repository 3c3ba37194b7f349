"""SDXL's IP-Adapters with abstract weights, for `python -m bench tpu --ip-adapter plain|plus`: h94's
`sdxl_models/ip-adapter_sdxl` (OpenCLIP ViT-bigG/14's image embedding through the plain projection: 4 tokens) and
`sdxl_models/ip-adapter-plus_sdxl_vit-h` (ViT-H/14's penultimate hidden states through the Resampler: 16 tokens), at
the shapes of their files and of their `image_encoder/config.json`s; nothing downloaded, nothing placed.

    tables = abstract_tables("plain", params["unet"], unet.config, "bfloat16")   # a server's, one slot
    modules = dataclasses.replace(modules, **tables.modules("bfloat16"))
    params = tables.with_weights(params)
"""

from __future__ import annotations

ADAPTERS = ("plain", "plus")
#: OpenCLIP ViT-bigG/14 (h94/IP-Adapter sdxl_models/image_encoder/config.json) and ViT-H/14 (models/image_encoder).
VIT_BIGG = dict(
    hidden_size=1664, intermediate_size=8192, num_hidden_layers=48, num_attention_heads=16, projection_dim=1280
)
VIT_H = dict(
    hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16, projection_dim=1024
)
#: Each adapter's encoder and projection (ip_adapter_loading.projection_config reads the same off the files).
SHAPES = {
    "plain": (VIT_BIGG, dict(kind="plain", embed_dim=1280, cross_attention_dim=2048, tokens=4)),
    "plus": (
        VIT_H,
        dict(kind="plus", embed_dim=1280, cross_attention_dim=2048, tokens=16, width=1280, heads=20, depth=4),
    ),
}


def abstract_tables(kind: str, unet_params: dict, unet_config, dtype: str):
    """The `ImagePromptTables` of one served adapter of `kind` with one image prompt slot, its weights abstract in
    `dtype`: the encoder's and the projection's traced from their modules, each attn2's to_k_ip / to_v_ip shaped as
    that layer's to_k (both read the 2048-wide tokens into the layer's width)."""
    import jax
    import jax.numpy as jnp

    from ..engine import (
        CLIPVisionConfig,
        CLIPVisionModelWithProjection,
        ImageEncoderWeights,
        ImageProjectionConfig,
        ImagePromptTables,
        IPAdapterWeights,
        cross_attention_paths,
        image_projection,
        init_projection,
    )

    encoder_shape, projection_shape = SHAPES[kind]
    width = getattr(jnp, dtype)
    encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(**encoder_shape), dtype=width)
    projection = ImageProjectionConfig(**projection_shape)
    key = jax.random.PRNGKey(0)

    def abstract(tree):
        return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, width), tree)

    encoder_params = abstract(jax.eval_shape(encoder.init_weights, key))
    projection_module = image_projection(projection, width)
    projection_params = abstract(jax.eval_shape(lambda rng: init_projection(projection_module, rng), key))
    layers = {}
    for path in cross_attention_paths(unet_config):
        node = unet_params
        for part in path.split("/"):
            node = node[part]
        to_k = jax.ShapeDtypeStruct(node["to_k"]["kernel"].shape, width)
        layers[path] = {"to_k_ip": to_k, "to_v_ip": to_k}
    adapter = IPAdapterWeights(
        name=f"ip-adapter-{kind}",
        projection=projection,
        params={"image_proj": projection_params, "layers": layers},
        encoder=ImageEncoderWeights(encoder, encoder_params, "abstract"),
        source="abstract",
    )
    return ImagePromptTables((adapter,), 1)
