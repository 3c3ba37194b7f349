"""The Flax SDXL ControlNet (pipeline/device/nets/controlnet.py) and its torch-free loader (pipeline/checkpoint/
controlnet.py) against diffusers' PyTorch `ControlNetModel`: same residuals on the same inputs, every weight
accounted for, SD 1.5 and broken files refused in one sentence.

Fixtures: scripts/make_controlnet_fixtures.py (tiny ControlNets made with `ControlNetModel.from_unet` of tiny-pt's
UNet, every weight perturbed, fp16 files; residuals of PyTorch's module on fixed inputs).
"""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FIXTURES

from pipeline.checkpoint.controlnet_loading import load_controlnet, load_controlnets, split_spec
from pipeline.contract.errors import CheckpointError

ARRAYS = np.load(FIXTURES / "controlnet-expected.npz")
NETS = ("controlnet-a", "controlnet-b")


@pytest.fixture(scope="module")
def loaded():
    return {name: load_controlnet(str(FIXTURES / name), "float32", use_cache=False) for name in NETS}


@pytest.mark.parametrize("name", NETS)
def test_residuals_match_pytorch_controlnet(loaded, name):
    weights = loaded[name]
    inputs = {
        key[len("module_input_") :]: jnp.asarray(value)
        for key, value in ARRAYS.items()
        if key.startswith("module_input_")
    }
    # Jitted, as the engine runs it (eager, the module was ~200 op-by-op compiles per net).
    down, mid = jax.jit(lambda params, *args: weights.module.apply({"params": params}, *args))(
        weights.params,
        inputs["sample"],
        inputs["timesteps"],
        inputs["hidden"],
        inputs["text_embeds"],
        inputs["time_ids"],
        inputs["control"],
    )
    assert len(down) == weights.module.residual_count == 9
    for i, residual in enumerate(down):
        expected = ARRAYS[f"module_{name}_down_{i}"]  # [2, C, h, w]
        got = np.transpose(np.asarray(residual), (0, 3, 1, 2))
        assert np.abs(expected).max() > 0.05  # the perturbed zero convolutions do something
        np.testing.assert_allclose(got, expected, atol=1e-3, rtol=1e-3, err_msg=f"{name} down {i}")
    np.testing.assert_allclose(
        np.transpose(np.asarray(mid), (0, 3, 1, 2)), ARRAYS[f"module_{name}_mid"], atol=1e-3, rtol=1e-3
    )


def test_name_size_and_depth_from_the_folder(loaded):
    weights = loaded["controlnet-a"]
    assert weights.name == "controlnet-a" and weights.bytes > 0 and weights.parameter_count > 100_000
    assert weights.module.transformer_layers_per_block == (1, 1, 2)  # the UNet's depth, per block
    assert split_spec("canny=/x/y") == ("canny", "/x/y") and split_spec("diffusers/controlnet-canny-sdxl-1.0") == (
        "controlnet-canny-sdxl-1.0",
        "diffusers/controlnet-canny-sdxl-1.0",
    )


def _copy(tmp_path, name="net"):
    target = tmp_path / name
    shutil.copytree(FIXTURES / "controlnet-a", target)
    return target


def _rewrite_tensors(folder, edit):
    from safetensors.numpy import load_file, save_file

    file = folder / "diffusion_pytorch_model.fp16.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file))


def test_missing_and_unexpected_tensors_are_named(tmp_path):
    missing = _copy(tmp_path, "missing")
    _rewrite_tensors(missing, lambda t: t.pop("controlnet_down_blocks.4.weight"))
    with pytest.raises(CheckpointError, match="controlnet_down_blocks_4") as error:
        load_controlnet(str(missing), "float32", use_cache=False)
    assert "\n" not in str(error.value) and "'missing'" in str(error.value)
    extra = _copy(tmp_path, "extra")
    _rewrite_tensors(extra, lambda t: t.update({"controlnet_up_blocks.0.weight": np.zeros((2, 2), np.float16)}))
    with pytest.raises(CheckpointError, match=r"controlnet_up_blocks\.0\.weight"):
        load_controlnet(str(extra), "float32", use_cache=False)


def test_sd15_and_broken_controlnets_are_one_line_and_left_out(tmp_path, caplog):
    sd15 = _copy(tmp_path, "sd15")
    config = json.loads((sd15 / "config.json").read_text())
    config.update(addition_embed_type=None, cross_attention_dim=768)
    (sd15 / "config.json").write_text(json.dumps(config))
    broken = _copy(tmp_path, "broken")
    file = broken / "diffusion_pytorch_model.fp16.safetensors"
    file.write_bytes(file.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="not an SDXL ControlNet"):
        load_controlnet(str(sd15), "float32", use_cache=False)
    specs = [str(sd15), f"good={FIXTURES / 'controlnet-a'}", str(broken), str(tmp_path / "absent")]
    with caplog.at_level("INFO"):
        loaded = load_controlnets(specs, "float32", use_cache=False)
    assert [w.name for w in loaded] == ["good"]
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 3 and all("\n" not in e and "starts without it" in e for e in errors)
    assert any("'broken'" in e and "truncated" in e for e in errors)
    assert any("ControlNet 'good'" in r.getMessage() and "MiB" in r.getMessage() for r in caplog.records)
