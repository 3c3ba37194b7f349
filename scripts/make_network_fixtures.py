"""Write tests/fixtures/networks-expected.npz + .json: what diffusers' and transformers' Flax classes compute, for the
project's own networks (pipeline/device/nets/) to be checked against once those classes are gone.

    .venv-reference/bin/python scripts/make_network_fixtures.py  # needs diffusers 0.39 and transformers 4
    .venv-reference/bin/python scripts/make_network_fixtures.py --here OUT.npz [bfloat16]  # outputs on this host

What it writes (never run by CI; tests/engine/test_networks.py reads it and imports neither library's Flax classes):
- per case (a network or one full-width block): its inputs, and its outputs in float32 and in bfloat16 (the module's
  dtype and its parameters cast to it, as the engine runs them), from `jax.jit` of the old class's apply on
  `tests/random_params.random_params` of its tree (every leaf random, seeded by its path: no weights stored);
- per case and per full-size SDXL configuration (base, refiner, 9-channel inpainting UNet; the VAE; CLIP-L and
  CLIP-G; the project's SDXLControlNet at diffusers/controlnet-canny-sdxl-1.0's size): the old class's parameter
  tree, {name: shape}, from `jax.eval_shape` of its init (nothing allocated);
- the configs, the seeds and the library versions.
The tiny networks use the tiny checkpoint's own config.json files (pipeline/checkpoint/tiny.py).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

# The tests' CPU platform (tests/conftest.py): XLA's CPU convolutions split their work by its thread pools, which the
# device count sizes, so the same program can differ in the last bit between 1 and 8 host devices (the tiny VAE's
# decoder does). Set before JAX is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
OUT = REPO / "tests" / "fixtures" / "networks-expected"
SEED = 0
DTYPES = ("float32", "bfloat16")

# SDXL's full-size configurations (the fields that shape the networks; diffusers' and transformers' config.json).
SDXL_UNET = {
    "sample_size": 128,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [320, 640, 1280],
    "layers_per_block": 2,
    "attention_head_dim": [5, 10, 20],
    "transformer_layers_per_block": [1, 2, 10],
    "cross_attention_dim": 2048,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816,
    "use_linear_projection": True,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
}
SDXL_REFINER_UNET = {
    **SDXL_UNET,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [384, 768, 1536, 1536],
    "attention_head_dim": [6, 12, 24, 24],
    "transformer_layers_per_block": 4,
    "cross_attention_dim": 1280,
    "projection_class_embeddings_input_dim": 2560,
}
SDXL_INPAINT_UNET = {**SDXL_UNET, "in_channels": 9}
SDXL_VAE = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "latent_channels": 4,
    "norm_num_groups": 32,
    "sample_size": 1024,
    "scaling_factor": 0.13025,
}
CLIP_L = {
    "vocab_size": 49408,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "projection_dim": 768,
    "eos_token_id": 2,
    "layer_norm_eps": 1e-5,
}
CLIP_G = {
    **CLIP_L,
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "num_hidden_layers": 32,
    "num_attention_heads": 20,
    "hidden_act": "gelu",
    "projection_dim": 1280,
    "eos_token_id": 49407,
}
# A refiner-shaped tiny UNet (5 time ids, four blocks, a plain last down block, depth as one number).
TINY_REFINER_UNET = {
    "sample_size": 8,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [32, 64, 64, 64],
    "layers_per_block": 2,
    "attention_head_dim": [2, 4, 4, 4],
    "transformer_layers_per_block": 1,
    "cross_attention_dim": 64,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 8,
    "projection_class_embeddings_input_dim": 5 * 8 + 64,
    "use_linear_projection": True,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
}
CONTROLNET_EMBEDDING = {"conditioning_embedding_channels": 32, "block_out_channels": [8, 16, 16, 16]}


def _configs() -> dict:
    """The tiny checkpoint's config.json of each component."""
    from pipeline.checkpoint.tiny import tiny_checkpoint

    folder = tiny_checkpoint()
    return {
        name: json.loads((folder / name / "config.json").read_text())
        for name in ("unet", "vae", "text_encoder", "text_encoder_2")
    }


def _unet(config: dict, dtype):
    from diffusers import FlaxUNet2DConditionModel

    accepted = set(FlaxUNet2DConditionModel.__dataclass_fields__) - {"split_head_dim", "dtype", "parent", "name"}
    kept = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k in accepted}
    return FlaxUNet2DConditionModel(**kept, split_head_dim=True, dtype=dtype)


def _vae(config: dict, dtype):
    from diffusers import FlaxAutoencoderKL

    accepted = set(FlaxAutoencoderKL.__dataclass_fields__) - {"dtype", "parent", "name"}
    kept = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k in accepted}
    return FlaxAutoencoderKL(**kept, dtype=dtype)


def _clip(config: dict, dtype, projection: bool):
    from transformers import CLIPTextConfig, FlaxCLIPTextModel, FlaxCLIPTextModelWithProjection

    cls = FlaxCLIPTextModelWithProjection if projection else FlaxCLIPTextModel
    return cls(CLIPTextConfig(**config), dtype=dtype, _do_init=False)


def _clip_init(model):
    return functools.partial(model.init_weights, input_shape=(1, model.config.max_position_embeddings))


def _shapes(init):
    import jax

    return jax.eval_shape(init, jax.random.PRNGKey(0))


def _cast(tree, dtype):
    import jax
    import jax.numpy as jnp

    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), tree)


def _skip_shapes(config: dict, batch: int, size: int) -> list[tuple]:
    """The UNet's skip connections (NHWC), as a ControlNet's residuals: conv_in's, each resnet's, each downsampler's."""
    channels, layers = config["block_out_channels"], config["layers_per_block"]
    shapes = [(batch, size, size, channels[0])]
    for i, width in enumerate(channels):
        shapes += [(batch, size, size, width)] * layers
        if i < len(channels) - 1:
            size //= 2
            shapes.append((batch, size, size, width))
    return shapes


def _inputs(configs: dict, rng) -> dict:
    """Fixed random inputs per case (float32; integer ids stay int32)."""
    unet, refiner = configs["unet"], TINY_REFINER_UNET
    latent, batch = 8, 2

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def ids(config):
        # Random tokens, each row's end token at a different place (the pooled output reads it), padding after.
        rows = rng.integers(1, config["vocab_size"] - 2, (batch, 77)).astype(np.int32)
        for row, end in enumerate((5, 40)):
            rows[row, end:] = config["eos_token_id"]
        return rows

    text_width = unet["projection_class_embeddings_input_dim"] - 6 * unet["addition_time_embed_dim"]
    unet_base = {
        "sample": normal(batch, 4, latent, latent),
        "timesteps": np.array([999.0, 17.5], np.float32),
        "encoder_hidden_states": normal(batch, 77, unet["cross_attention_dim"]),
        "text_embeds": normal(batch, text_width),
        "time_ids": np.array([[1024, 1024, 0, 0, 1024, 1024], [768, 1344, 16, 8, 1024, 1024]], np.float32),
    }
    residuals = {f"residual_{i}": normal(*shape) * 0.5 for i, shape in enumerate(_skip_shapes(unet, batch, latent))}
    mid = unet["block_out_channels"][-1]
    return {
        "unet": unet_base,
        "unet_controlnet": {**unet_base, **residuals, "mid_residual": normal(batch, latent // 4, latent // 4, mid)},
        "unet_refiner": {
            "sample": normal(batch, 4, latent, latent),
            "timesteps": np.array([500.0, 3.0], np.float32),
            "encoder_hidden_states": normal(batch, 77, refiner["cross_attention_dim"]),
            "text_embeds": normal(batch, refiner["cross_attention_dim"]),
            "time_ids": np.array([[1024, 1024, 0, 0, 6.0], [768, 1344, 16, 8, 2.5]], np.float32),
        },
        "vae_encode": {"sample": np.tanh(normal(1, 3, 64, 64))},
        "vae_decode": {"latents": normal(1, 4, latent, latent)},
        "text_encoder": {"input_ids": ids(configs["text_encoder"])},
        "text_encoder_2": {"input_ids": ids(configs["text_encoder_2"])},
        "controlnet_embedding": {"conditioning": np.tanh(normal(1, 32, 32, 3))},
        "transformer_1280": {"hidden_states": normal(1, 4, 4, 1280), "context": normal(1, 8, 2048)},
        "resnet_640_1280": {"hidden_states": normal(1, 4, 4, 640), "temb": normal(1, 1280)},
        "vae_mid_512": {"hidden_states": normal(1, 4, 4, 512)},
        "clip_l_layer": {"hidden_states": normal(1, 16, 768)},
        "clip_g_layer": {"hidden_states": normal(1, 16, 1280)},
    }


def _cases(configs: dict):
    """Per case: (old module for a dtype, its init for the shapes, apply(module, params, inputs) -> {name: array})."""
    import jax.numpy as jnp
    from diffusers.models.attention_flax import FlaxTransformer2DModel
    from diffusers.models.controlnets.controlnet_flax import FlaxControlNetConditioningEmbedding
    from diffusers.models.resnet_flax import FlaxResnetBlock2D
    from diffusers.models.vae_flax import FlaxUNetMidBlock2D
    from transformers import CLIPTextConfig
    from transformers.models.clip.modeling_flax_clip import FlaxCLIPEncoderLayer

    def unet_call(module, params, x):
        residuals = sorted((k for k in x if k.startswith("residual_")), key=lambda k: int(k.split("_")[1]))
        out = module.apply(
            {"params": params},
            x["sample"],
            x["timesteps"],
            x["encoder_hidden_states"],
            added_cond_kwargs={"text_embeds": x["text_embeds"], "time_ids": x["time_ids"]},
            down_block_additional_residuals=tuple(x[k] for k in residuals) if residuals else None,
            mid_block_additional_residual=x.get("mid_residual"),
        )
        return {"sample": out.sample}

    def encode_call(module, params, x):
        posterior = module.apply({"params": params}, x["sample"], method=module.encode).latent_dist
        return {"mean": posterior.mean, "std": posterior.std}

    def decode_call(module, params, x):
        return {"sample": module.apply({"params": params}, x["latents"], method=module.decode).sample}

    def clip_call(module, params, x):
        out = module(x["input_ids"], params=params, output_hidden_states=True)
        result = {"last_hidden_state": out.last_hidden_state}
        result.update({f"hidden_state_{i}": h for i, h in enumerate(out.hidden_states)})
        pooled = ("text_embeds", out.text_embeds) if hasattr(out, "text_embeds") else ("pooler_output", out[1])
        return {**result, pooled[0]: pooled[1]}

    def block_call(*names):
        def call(module, params, x):
            return {"output": module.apply({"params": params}, *(x[n] for n in names))}

        return call

    def layer_call(module, params, x):
        return {"output": module.apply({"params": params}, x["hidden_states"], None)[0]}

    def init_of(module, *example):
        return lambda key: module.init(key, *example)["params"]

    def clip_layer(config):
        return lambda dtype: FlaxCLIPEncoderLayer(CLIPTextConfig(**config), dtype=dtype)

    f32 = jnp.float32
    transformer = functools.partial(
        FlaxTransformer2DModel,
        in_channels=1280,
        n_heads=20,
        d_head=64,
        depth=1,
        use_linear_projection=True,
        split_head_dim=True,
    )
    embedding = functools.partial(
        FlaxControlNetConditioningEmbedding,
        **{k: tuple(v) if isinstance(v, list) else v for k, v in CONTROLNET_EMBEDDING.items()},
    )
    return {
        "unet": (lambda d: _unet(configs["unet"], d), lambda m: m.init_weights, unet_call),
        "unet_controlnet": (lambda d: _unet(configs["unet"], d), lambda m: m.init_weights, unet_call),
        "unet_refiner": (lambda d: _unet(TINY_REFINER_UNET, d), lambda m: m.init_weights, unet_call),
        "vae_encode": (lambda d: _vae(configs["vae"], d), lambda m: m.init_weights, encode_call),
        "vae_decode": (lambda d: _vae(configs["vae"], d), lambda m: m.init_weights, decode_call),
        "text_encoder": (lambda d: _clip(configs["text_encoder"], d, False), _clip_init, clip_call),
        "text_encoder_2": (lambda d: _clip(configs["text_encoder_2"], d, True), _clip_init, clip_call),
        "controlnet_embedding": (
            lambda d: embedding(dtype=d),
            lambda m: init_of(m, jnp.zeros((1, 32, 32, 3), f32)),
            block_call("conditioning"),
        ),
        "transformer_1280": (
            lambda d: transformer(dtype=d),
            lambda m: init_of(m, jnp.zeros((1, 4, 4, 1280), f32), jnp.zeros((1, 77, 2048), f32)),
            block_call("hidden_states", "context"),
        ),
        "resnet_640_1280": (
            lambda d: FlaxResnetBlock2D(in_channels=640, out_channels=1280, dtype=d),
            lambda m: init_of(m, jnp.zeros((1, 4, 4, 640), f32), jnp.zeros((1, 1280), f32)),
            block_call("hidden_states", "temb"),
        ),
        "vae_mid_512": (
            lambda d: FlaxUNetMidBlock2D(in_channels=512, resnet_groups=32, num_attention_heads=None, dtype=d),
            lambda m: init_of(m, jnp.zeros((1, 4, 4, 512), f32)),
            block_call("hidden_states"),
        ),
        "clip_l_layer": (clip_layer(CLIP_L), lambda m: init_of(m, jnp.zeros((1, 77, 768), f32), None), layer_call),
        "clip_g_layer": (clip_layer(CLIP_G), lambda m: init_of(m, jnp.zeros((1, 77, 1280), f32), None), layer_call),
    }


def _full_size_trees() -> dict:
    """The old classes' parameter trees at SDXL's full size (shapes only), and the project's SDXLControlNet's."""
    import jax.numpy as jnp

    from pipeline.device.nets.controlnet import SDXLControlNet
    from tests.random_params import tree_shapes

    f32 = jnp.float32
    return {
        "unet_base": tree_shapes(_shapes(_unet(SDXL_UNET, f32).init_weights)),
        "unet_refiner": tree_shapes(_shapes(_unet(SDXL_REFINER_UNET, f32).init_weights)),
        "unet_inpainting": tree_shapes(_shapes(_unet(SDXL_INPAINT_UNET, f32).init_weights)),
        "vae": tree_shapes(_shapes(_vae(SDXL_VAE, f32).init_weights)),
        "clip_l": tree_shapes(_shapes(_clip_init(_clip(CLIP_L, f32, False)))),
        "clip_g": tree_shapes(_shapes(_clip_init(_clip(CLIP_G, f32, True)))),
        "controlnet": tree_shapes(_shapes(SDXLControlNet().init_weights)),
    }


def _outputs(build, call, params, inputs: dict, dtype_name: str) -> dict[str, np.ndarray]:
    """One case's outputs in `dtype_name` (module dtype, parameters and float inputs cast to it), as float32 arrays."""
    import jax
    import jax.numpy as jnp

    dtype = getattr(jnp, dtype_name)
    floats = {k: jnp.asarray(v, dtype) if v.dtype == np.float32 else v for k, v in inputs.items()}
    outputs = jax.jit(functools.partial(call, build(dtype)))(_cast(params, dtype), floats)
    return {name: np.asarray(value.astype(jnp.float32)) for name, value in outputs.items()}


def main() -> None:
    import diffusers
    import jax
    import jax.numpy as jnp
    import transformers

    from tests.random_params import random_params, tree_shapes

    configs = _configs()
    inputs = _inputs(configs, np.random.default_rng(SEED))
    arrays, trees = {}, {}
    for case, (build, init, call) in _cases(configs).items():
        shapes = _shapes(init(build(jnp.float32)))
        trees[case] = tree_shapes(shapes)
        params = random_params(shapes, SEED)
        for name, value in inputs[case].items():
            arrays[f"{case}/input/{name}"] = value
        for dtype_name in DTYPES:
            outputs = _outputs(build, call, params, inputs[case], dtype_name)
            arrays.update({f"{case}/{dtype_name}/{name}": value for name, value in outputs.items()})
        print(case, ", ".join(f"{k}: {v.shape}" for k, v in outputs.items()), flush=True)
    np.savez_compressed(OUT.with_suffix(".npz"), **arrays)
    manifest = {
        "what": "diffusers' and transformers' Flax classes (jax.jit of their apply) on tests/random_params.py "
        "parameters: the reference for pipeline/device/nets/ (tests/engine/test_networks.py)",
        "seed": SEED,
        "configs": {
            **configs,
            "unet_refiner": TINY_REFINER_UNET,
            "controlnet_embedding": CONTROLNET_EMBEDDING,
            "sdxl_unet": SDXL_UNET,
            "sdxl_refiner_unet": SDXL_REFINER_UNET,
            "sdxl_inpaint_unet": SDXL_INPAINT_UNET,
            "sdxl_vae": SDXL_VAE,
            "clip_l": CLIP_L,
            "clip_g": CLIP_G,
        },
        "trees": trees,
        "full_size_trees": _full_size_trees(),
        "versions": {
            "jax": jax.__version__,
            "diffusers": diffusers.__version__,
            "transformers": transformers.__version__,
        },
    }
    OUT.with_suffix(".json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {OUT.name}.npz and .json")


def outputs_here(out: Path, dtype_name: str) -> None:
    """`--here OUT [DTYPE]`: the old classes' outputs in DTYPE (float32 unless named) for the committed fixture's
    inputs and configs, computed on this host, into OUT (.npz, the fixture's `case/DTYPE/name` keys). XLA:CPU's bits
    depend on the host's CPU (its kernels and vector widths: an AMD EPYC with AVX-512 differs from the fixture's host
    in the last bits of all float32 cases but one, under any `--xla_cpu_max_isa`), so where this host's bits differ
    from the committed ones, the test asks the old classes again here (tests/engine/test_networks.py runs this in
    the reference venv)."""
    import jax.numpy as jnp

    from tests.random_params import random_params

    manifest = json.loads(OUT.with_suffix(".json").read_text())
    committed = np.load(OUT.with_suffix(".npz"))
    arrays = {}
    for case, (build, init, call) in _cases(manifest["configs"]).items():
        params = random_params(_shapes(init(build(jnp.float32))), manifest["seed"])
        prefix = f"{case}/input/"
        inputs = {key[len(prefix) :]: committed[key] for key in committed.files if key.startswith(prefix)}
        outputs = _outputs(build, call, params, inputs, dtype_name)
        arrays.update({f"{case}/{dtype_name}/{name}": value for name, value in outputs.items()})
    np.savez(out, **arrays)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--here"]:
        outputs_here(Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "float32")
    else:
        main()
