"""LoRA files (pipeline/checkpoint/lora.py): formats map onto the checkpoint as diffusers maps them, factors and scales
are PEFT's, refusals are one sentence each (fixtures from scripts/make_lora_fixtures.py; no torch here)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from conftest import FIXTURES, REPO
from safetensors import safe_open
from safetensors.numpy import save_file

from pipeline.checkpoint.lora import COMPONENTS, LoraFileError, load_lora, load_lora_dir, lora_targets, read_header
from pipeline.contract.parameters import hashes_field as lora_hashes_field

LORA_DIR = FIXTURES / "lora"
MANIFEST = json.loads((FIXTURES / "lora-expected.json").read_text())
ACCEPTED = sorted(MANIFEST["formats"])
#: Each refused fixture and what its one sentence must say.
REFUSALS = {
    "loha": "LyCORIS LoHa",
    "lokr": "LyCORIS LoKr",
    "dora": "DoRA",
    "sd15": "is not for this checkpoint (its metadata says sd_v1)",
    "sdxl_size": "changes a 640→640 layer, but this checkpoint's is 64→64",
    "truncated": "truncated or corrupt",
    "corrupt": "is not a readable safetensors file",
}


@pytest.fixture(scope="module")
def tiny_pt():
    from pipeline.checkpoint.loading import load_model

    return load_model(str(FIXTURES / "tiny-pt"), dtype="float32", conversion_cache=False)


@pytest.fixture(scope="module")
def targets(tiny_pt):
    config = json.loads((FIXTURES / "tiny-pt" / "unet" / "config.json").read_text())
    return lora_targets(config, {c: tiny_pt.params[c] for c in COMPONENTS})


@pytest.fixture(scope="module")
def loras(targets):
    return {name: load_lora(LORA_DIR / f"{name}.safetensors", targets) for name in ACCEPTED}


def peft_names(targets) -> dict[tuple, str]:
    """kernel -> diffusers' module name ("unet.down_blocks.1.…"), the names the fixture manifest lists."""
    return {leaf: name for name, leaf in targets.peft.items()}


def test_every_format_maps_onto_the_layers_diffusers_maps_it_to(loras, targets):
    """Both kohya spellings (SGM and diffusers), PEFT and LoCon: the same layers diffusers' load_lora_weights
    wrapped (recorded by the fixture script from the PyTorch pipeline), no more, no less."""
    names = peft_names(targets)
    assert set(MANIFEST["refused"]) == set(REFUSALS)
    for name, lora in loras.items():
        assert lora.format == MANIFEST["formats"][name], name
        assert sorted(names[leaf] for leaf in lora.layers) == MANIFEST["modules"][name], name
    assert loras["kohya_sgm"].components == ("unet", "text_encoder", "text_encoder_2")
    assert loras["kohya_diffusers"].components == ("unet", "text_encoder")
    assert loras["peft"].components == ("unet", "text_encoder_2")
    assert loras["locon"].components == ("unet",)
    conv = {leaf[-2]: lora_layer.down.shape for leaf, lora_layer in loras["locon"].layers.items()}
    assert {"conv1", "conv2", "conv_shortcut", "time_emb_proj", "conv"} <= set(conv)  # 3x3, 1x1, linear, samplers


def test_factors_and_scales_give_pefts_change_to_every_layer(loras, targets):
    """Σ weight · scale · down @ up, brought back to PyTorch's layout, has the statistics of PEFT's own
    get_delta_weight sum for every layer and case: right layer, right scale (alpha/rank, missing alpha = rank,
    alpha_pattern), right layout (a layout-sensitive probe), text-encoder and UNet weights apart."""
    names = peft_names(targets)
    arrays = np.load(FIXTURES / "lora-expected.npz")
    rows = {name: i for i, name in enumerate(MANIFEST["delta_modules"])}
    for case in MANIFEST["cases"][1:]:
        expected = arrays[f"delta/{case['name']}"]  # [modules, 3]
        deltas: dict[tuple, np.ndarray] = {}
        for lora_name, weight in case["loras"].items():
            for leaf, layer in loras[lora_name].layers.items():
                w = weight[leaf[0]] if isinstance(weight, dict) else weight
                flax = (w * layer.scale * (layer.down.astype(np.float64) @ layer.up)).reshape(targets.shapes[leaf])
                deltas[leaf] = deltas.get(leaf, 0) + flax
        got = np.zeros_like(expected)
        for leaf, flax in deltas.items():
            got[rows[names[leaf]]] = stats(to_pytorch_layout(flax))
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=1e-6, err_msg=case["name"])


def stats(delta: np.ndarray) -> np.ndarray:
    """(Σ D, Σ D², Σ D · cos(o + 2i + 3h + 5w)) of a PyTorch-layout change, as the fixture script computes them."""
    grids = np.meshgrid(*(np.arange(n) for n in delta.shape), indexing="ij")
    probe = np.cos(sum(f * g for f, g in zip((1, 2, 3, 5), grids, strict=False)))
    return np.array([delta.sum(), (delta**2).sum(), (delta * probe).sum()])


def to_pytorch_layout(flax: np.ndarray) -> np.ndarray:
    return flax.T if flax.ndim == 2 else flax.transpose(3, 2, 0, 1)  # [in, out] / [kh, kw, in, out] -> [out, in, ...]


def test_scales_follow_alpha_metadata_and_rank(loras, targets):
    """kohya: alpha 4 at rank 8 = 0.5, no alpha = rank (1.0); PEFT: lora_alpha / r per component (8/4 UNet, 2/4
    TE2), and its alpha_pattern's module 2/4."""
    assert {layer.scale for layer in loras["kohya_sgm"].layers.values()} == {0.5}
    assert {layer.scale for layer in loras["kohya_diffusers"].layers.values()} == {1.0}
    assert loras["kohya_sgm"].ranks == (8,) and loras["kohya_diffusers"].ranks == (4,)
    names = peft_names(targets)
    scales = {names[leaf]: layer.scale for leaf, layer in loras["peft"].layers.items()}
    pattern = "unet.mid_block.attentions.0.transformer_blocks.0.attn2.to_k"
    assert scales.pop(pattern) == 0.5
    assert {s for n, s in scales.items() if n.startswith("unet.")} == {2.0}
    assert {s for n, s in scales.items() if n.startswith("text_encoder_2.")} == {0.5}


def test_half_precision_factors_are_read_exactly(loras, targets):
    """bf16 (ml_dtypes) and fp16 values reach float32 unchanged, transposed into the Flax layout."""
    leaf = ("unet", "down_blocks_1", "attentions_0", "transformer_blocks_0", "attn1", "to_q", "kernel")
    for name, module in (
        ("kohya_diffusers", "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q"),
        ("kohya_sgm", "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q"),
    ):
        with safe_open(str(LORA_DIR / f"{name}.safetensors"), framework="np") as reader:
            down, up = reader.get_tensor(f"{module}.lora_down.weight"), reader.get_tensor(f"{module}.lora_up.weight")
        assert down.dtype == (ml_dtypes.bfloat16 if name == "kohya_diffusers" else np.float16)
        layer = loras[name].layers[leaf]
        np.testing.assert_array_equal(layer.down, down.astype(np.float32).T)
        np.testing.assert_array_equal(layer.up, up.astype(np.float32).T)
        assert layer.module == module


def test_conv_factors_take_the_flax_kernel_layout(loras, targets):
    """A 3x3 LoCon pair: down [r, in, 3, 3] -> [3·3·in, r] (Flax order kh, kw, in); up [out, r, 1, 1] -> [r, out]."""
    leaf = ("unet", "down_blocks_1", "resnets_0", "conv1", "kernel")
    module = "lora_unet_input_blocks_4_0_in_layers_2"
    with safe_open(str(LORA_DIR / "locon.safetensors"), framework="np") as reader:
        down = reader.get_tensor(f"{module}.lora_down.weight").astype(np.float32)  # [r, in, 3, 3]
        up = reader.get_tensor(f"{module}.lora_up.weight").astype(np.float32)  # [out, r, 1, 1]
    layer = loras["locon"].layers[leaf]
    kh, kw, fan_in, out = targets.shapes[leaf]
    assert down.shape == (4, fan_in, kh, kw) and up.shape == (out, 4, 1, 1)
    pytorch_delta = np.einsum("or,rihw->oihw", up[:, :, 0, 0], down)
    flax_delta = (layer.down @ layer.up).reshape(kh, kw, fan_in, out)
    np.testing.assert_allclose(flax_delta, pytorch_delta.transpose(2, 3, 1, 0), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refused_files_get_one_sentence_naming_them(targets, name):
    with pytest.raises(LoraFileError) as caught:
        load_lora(LORA_DIR / f"{name}.safetensors", targets)
    message = str(caught.value)
    assert message.startswith(f"{name}.safetensors ") and REFUSALS[name] in message, message
    assert "\n" not in message and message.endswith(".") and len(message) < 300, message


def test_the_directory_loads_the_good_files_and_lists_the_refused_ones(targets, caplog):
    """The app starts with the others: each accepted file logged with name, format, rank, what it touches, size,
    hash; each refused one logged as one line."""
    with caplog.at_level(logging.INFO, logger="pipeline.checkpoint.lora"):
        directory = load_lora_dir(LORA_DIR, targets)
    assert [lora.name for lora in directory.loras] == ACCEPTED
    assert sorted(line.split(" ", 1)[0] for line in directory.refused) == sorted(f"{n}.safetensors" for n in REFUSALS)
    logged = caplog.text
    for lora in directory.loras:
        assert lora.describe() in logged
    assert "kohya_sgm: kohya (SGM names), rank 8, UNet 192 + TE1 12 + TE2 12 layers, 0.7 MB, hash " in logged
    assert "locon: kohya (SGM names), rank 4, UNet 65 layers, " in logged
    for line in directory.refused:
        assert line in logged
    with pytest.raises(LoraFileError, match="does not exist"):
        load_lora_dir(LORA_DIR / "missing", targets)


def test_a1111_short_hash_is_the_sha256_of_the_data_after_the_header(loras, tmp_path, targets):
    """A1111 (extensions-builtin/Lora/network.py + modules/hashes.py `addnet_hash_safetensors`): sha256 of the file
    from 8 + header length on, first 12 hex characters; kohya's `sshs_model_hash` metadata wins when present."""
    for lora in loras.values():
        data = lora.path.read_bytes()
        start = 8 + int.from_bytes(data[:8], "little")
        assert lora.addnet_hash == hashlib.sha256(data[start:]).hexdigest()
        assert lora.short_hash == lora.addnet_hash[:12]
        assert read_header(lora.path).data_start == start
    # The metadata is outside the hashed bytes: rewriting it keeps the hash; kohya's stored hash is used as is.
    tensors = {k: np.asarray(v) for k, v in _read_all(LORA_DIR / "kohya_sgm.safetensors").items()}
    save_file(tensors, str(tmp_path / "renamed.safetensors"), metadata={"note": "edited"})
    assert load_lora(tmp_path / "renamed.safetensors", targets).addnet_hash == loras["kohya_sgm"].addnet_hash
    stored = "0123456789abcdef" * 4
    save_file(tensors, str(tmp_path / "stored.safetensors"), metadata={"sshs_model_hash": stored})
    assert load_lora(tmp_path / "stored.safetensors", targets).short_hash == "0123456789ab"
    used = [(lora.name, lora.short_hash) for lora in loras.values()] + [("a:b,c", "0123456789ab")]
    assert lora_hashes_field(used) == ", ".join(f"{n}: {h}" for n, h in used[:-1]) + ", abc: 0123456789ab"


def _read_all(path: Path) -> dict:
    with safe_open(str(path), framework="np") as reader:
        return {key: reader.get_tensor(key) for key in reader.keys()}  # noqa: SIM118 (safe_open is no dict)


# ---- refusals built here: one sentence each ------------------------------------------------------------------------

Q = "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q"
rng = np.random.default_rng(0)


def pair(rank=2, fan_in=64, out=64) -> dict:
    return {
        f"{Q}.lora_down.weight": rng.standard_normal((rank, fan_in), np.float32),
        f"{Q}.lora_up.weight": rng.standard_normal((out, rank), np.float32),
    }


BUILT = {
    "no_up": ({f"{Q}.lora_down.weight": np.ones((2, 64), np.float32)}, None, "has no up factor for " + Q),
    "nan": ({**pair(), f"{Q}.alpha": np.array(np.nan, np.float32)}, None, "NaN or infinite values in the alpha"),
    "rank_mismatch": (
        {f"{Q}.lora_down.weight": np.ones((2, 64), np.float32), f"{Q}.lora_up.weight": np.ones((64, 3), np.float32)},
        None,
        "not a LoRA pair",
    ),
    "conv_on_linear": (
        {
            f"{Q}.lora_down.weight": np.ones((2, 64, 3, 3), np.float32),
            f"{Q}.lora_up.weight": np.ones((64, 2, 1, 1), np.float32),
        },
        None,
        "3x3 conv factor for a linear layer",
    ),
    "flux": (
        {"lora_transformer_single_transformer_blocks_0_attn_to_q.lora_A.weight": np.ones((2, 8), np.float32)},
        None,
        "a LoRA for Flux, not for an SDXL checkpoint",
    ),
    "unknown": (
        {"model.diffusion_model.input_blocks.0.0.weight": np.ones((2, 2), np.float32)},
        None,
        "is not a LoRA file this app reads",
    ),
    "peft_dora": (
        {
            "unet.down_blocks.1.attentions.0.proj_in.lora_A.weight": np.ones((2, 64), np.float32),
            "unet.down_blocks.1.attentions.0.proj_in.lora_B.weight": np.ones((64, 2), np.float32),
        },
        {"lora_adapter_metadata": json.dumps({"unet.r": 2, "unet.use_dora": True})},
        "DoRA",
    ),
    "int_factors": (
        {f"{Q}.lora_down.weight": np.ones((2, 64), np.int32), f"{Q}.lora_up.weight": np.ones((64, 2), np.float32)},
        None,
        "not as floating point",
    ),
    "twice": (
        {**pair(), **{k.replace("input_blocks_4_1", "down_blocks_1_attentions_0"): v for k, v in pair().items()}},
        None,
        "changes one layer twice",
    ),
    "bad:name": (pair(), None, "has a name a prompt cannot refer to"),
}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_built_refusals(targets, tmp_path, name):
    tensors, metadata, expected = BUILT[name]
    path = tmp_path / f"{name}.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    with pytest.raises(LoraFileError) as caught:
        load_lora(path, targets)
    message = str(caught.value)
    assert message.startswith(f"{name}.safetensors ") and expected in message, message
    assert "\n" not in message and message.endswith("."), message


def test_alpha_missing_is_rank_and_linear_factors_may_be_1x1_convs(targets, tmp_path):
    """kohya writes 1x1 conv factors for some linear layers (SD 1.x proj_in): they apply as the linear pair."""
    tensors = pair(rank=3)
    tensors[f"{Q}.lora_down.weight"] = tensors[f"{Q}.lora_down.weight"][:, :, None, None]
    tensors[f"{Q}.lora_up.weight"] = tensors[f"{Q}.lora_up.weight"][:, :, None, None]
    save_file(tensors, str(tmp_path / "one.safetensors"))
    lora = load_lora(tmp_path / "one.safetensors", targets)
    ((leaf, layer),) = lora.layers.items()
    assert leaf[1:] == ("down_blocks_1", "attentions_0", "transformer_blocks_0", "attn1", "to_q", "kernel")
    assert layer.scale == 1.0 and layer.rank == 3 and lora.format == "kohya (SGM names)"
    np.testing.assert_array_equal(layer.down, tensors[f"{Q}.lora_down.weight"][:, :, 0, 0].T)


# ---- any SDXL-architecture checkpoint: SDXL base's own layout ------------------------------------------------------


def test_sdxl_base_kohya_names_map_from_its_config(targets):
    """SDXL base's UNet (assets/sdxl_unet_config.json, shapes traced, nothing allocated): every attention layer a
    typical kohya SDXL LoRA targets (722) has its SGM name, and known names land where diffusers puts them."""
    import jax

    from pipeline.device.nets.unet import UNet2DConditionModel, UNetConfig

    config = json.loads((REPO / "assets" / "sdxl_unet_config.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    unet = UNet2DConditionModel(UNetConfig.from_dict(config))
    shapes = jax.eval_shape(unet.init_weights, jax.random.PRNGKey(0))
    small = {c: targets_tree(targets, c) for c in ("text_encoder", "text_encoder_2")}
    sdxl = lora_targets(config, {"unet": shapes, **small})
    attention = [name for name, leaf in sdxl.kohya.items() if any(p.startswith("attentions_") for p in leaf)]
    sgm = [n for n in attention if n.startswith(("lora_unet_input_blocks", "lora_unet_middle", "lora_unet_output"))]
    assert len(sgm) == 722 and len(attention) == 2 * 722
    expected = {
        "lora_unet_input_blocks_8_1_transformer_blocks_9_attn2_to_k": (
            "down_blocks_2",
            "attentions_1",
            "transformer_blocks_9",
            "attn2",
            "to_k",
        ),
        "lora_unet_middle_block_1_transformer_blocks_0_ff_net_0_proj": (
            "mid_block",
            "attentions_0",
            "transformer_blocks_0",
            "ff",
            "net_0",
            "proj",
        ),
        "lora_unet_output_blocks_5_1_proj_out": ("up_blocks_1", "attentions_2", "proj_out"),
        "lora_unet_output_blocks_2_2_conv": ("up_blocks_0", "upsamplers_0", "conv"),
        "lora_unet_input_blocks_6_0_op": ("down_blocks_1", "downsamplers_0", "conv"),
        "lora_unet_output_blocks_8_0_skip_connection": ("up_blocks_2", "resnets_2", "conv_shortcut"),
        "lora_unet_input_blocks_7_0_emb_layers_1": ("down_blocks_2", "resnets_0", "time_emb_proj"),
    }
    for name, path in expected.items():
        assert sdxl.kohya[name] == ("unet", *path, "kernel"), name
    assert sdxl.shapes[sdxl.kohya["lora_unet_input_blocks_8_1_transformer_blocks_9_attn2_to_k"]] == (2048, 1280)


def targets_tree(targets, component: str) -> dict:
    """A component's kernels as a nested {name: shape} tree (all lora_targets reads of it)."""
    tree: dict = {}
    for leaf, shape in targets.shapes.items():
        if leaf[0] == component:
            node = tree
            for key in leaf[1:-1]:
                node = node.setdefault(key, {})
            node[leaf[-1]] = shape
    return tree
