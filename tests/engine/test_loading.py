"""Loading a checkpoint (pipeline/checkpoint/loading.py): failures give one clear line that names the problem and
what to do; a folder of fp16 PyTorch files only loads with --variant fp16."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES

from pipeline.checkpoint.loading import ModelLoadError, check_sdxl_directory, load_model, resolve_model
from pipeline.config import SDXL_BASE
from pipeline.contract.errors import CheckpointError

PT_FIXTURE = FIXTURES / "tiny-pt"


def test_missing_directory():
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model("./no/such/checkpoint")


def test_not_an_sdxl_checkpoint(tmp_path):
    (tmp_path / "model_index.json").write_text(
        json.dumps({"_class_name": "StableDiffusionPipeline", "unet": ["x", "y"]})
    )
    with pytest.raises(ModelLoadError, match="not an SDXL checkpoint") as error:
        resolve_model(str(tmp_path))
    assert "StableDiffusionPipeline" in str(error.value) and "\n" not in str(error.value)


def test_directory_without_model_index(tmp_path):
    with pytest.raises(ModelLoadError, match="no model_index.json"):
        resolve_model(str(tmp_path))


def test_checkpoint_without_flax_weights(tiny_dir, tmp_path):
    copy = shutil.copytree(tiny_dir, tmp_path / "pt-only")
    (copy / "unet" / "diffusion_flax_model.msgpack").unlink()
    with pytest.raises(ModelLoadError, match="no Flax weights for unet"):
        resolve_model(str(copy))


def _with_unet_config(tiny_dir, tmp_path, **changes) -> Path:
    """A copy of the tiny checkpoint whose unet/config.json has `changes`."""
    copy = shutil.copytree(tiny_dir, tmp_path / "changed")
    config_file = copy / "unet" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **changes}))
    return copy


def test_flax_weights_that_do_not_fit_the_config(tiny_dir, tmp_path):
    """Weights saved for another config are refused in one line naming a weight (not a shape error at compile)."""
    copy = _with_unet_config(tiny_dir, tmp_path, cross_attention_dim=64)  # the file's cross-attention keys read 96
    with pytest.raises(CheckpointError, match="does not fit its config.json") as error:
        load_model(str(copy), dtype="float32")
    message = str(error.value)
    assert "attn2" in message and "(96, " in message and "(64, " in message and "\n" not in message


def test_damaged_flax_weights(tiny_dir, tmp_path):
    copy = shutil.copytree(tiny_dir, tmp_path / "damaged")
    weights = copy / "vae" / "diffusion_flax_model.msgpack"
    weights.write_bytes(weights.read_bytes()[:1000])  # cut short, as an interrupted copy leaves it
    with pytest.raises(ModelLoadError, match="Could not load the checkpoint in") as error:
        load_model(str(copy), dtype="float32")
    assert "\n" not in str(error.value)


def test_config_that_is_not_sdxl(tiny_dir, tmp_path):
    copy = _with_unet_config(tiny_dir, tmp_path, addition_embed_type="text")
    with pytest.raises(CheckpointError, match="Could not read the configs or tokenizers") as error:
        load_model(str(copy), dtype="float32")
    assert "addition_embed_type 'text'" in str(error.value) and "\n" not in str(error.value)


def test_hub_id_without_network(monkeypatch, tmp_path):
    import huggingface_hub.constants

    # As this machine (no route to the Hub), without waiting for connection retries, and never a 7 GB download.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError) as error:
        load_model(SDXL_BASE, dtype="bfloat16")
    message = str(error.value)
    assert "Could not download" in message and "refs/pr/95" in message and "\n" not in message


# ---- a folder of fp16 files only (what `hf download --include "*.fp16.safetensors"` leaves) -------


def fp16_only(tmp_path: Path, keep_plain_index: bool) -> Path:
    """A copy of the PyTorch fixture as `hf download --include "*.fp16.safetensors" "*.json" "*.txt"`
    leaves it: fp16 weights only, and (with `*.json`) the plain UNet's shard index without its shards."""
    target = tmp_path / ("fp16-with-index" if keep_plain_index else "fp16")
    shutil.copytree(PT_FIXTURE, target)
    for file in target.rglob("*.safetensors"):
        if not file.name.endswith(".fp16.safetensors"):
            file.unlink()
    if not keep_plain_index:
        (target / "unet" / "diffusion_pytorch_model.safetensors.index.json").unlink()
    return target


@pytest.mark.parametrize("keep_plain_index", [False, True], ids=["fp16-only", "fp16-and-plain-index"])
def test_fp16_only_folder_loads_with_variant(tmp_path, monkeypatch, capfd, keep_plain_index):
    monkeypatch.setenv("SDXL_JAX_CACHE", str(tmp_path / "cache"))
    folder = fp16_only(tmp_path, keep_plain_index)
    loaded = load_model(str(folder), dtype="float32", variant="fp16", conversion_cache=False)
    assert loaded.origins == dict.fromkeys(("unet", "vae", "text_encoder", "text_encoder_2"), "converted")
    # The scheduler config is read as a file, not handed to a scheduler class: nothing warns about its fields.
    assert "were passed to" not in capfd.readouterr().err


def test_fp16_only_folder_without_variant_and_an_absent_variant_say_so(tmp_path):
    folder = fp16_only(tmp_path, keep_plain_index=True)
    with pytest.raises(CheckpointError, match=r"has only fp16 variant weights for unet, .*; pass --variant fp16\.$"):
        check_sdxl_directory(folder)
    with pytest.raises(CheckpointError, match=r"has no 'bf16' variant weights \(\*\.bf16\.safetensors\); variants"):
        check_sdxl_directory(PT_FIXTURE, "bf16")  # the mixed folder: no silent fall-back to the plain files
    check_sdxl_directory(PT_FIXTURE, "fp16")
    check_sdxl_directory(PT_FIXTURE)
