"""Loading failures give one clear line that names the problem and what to do."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.checkpoint.loading import ModelLoadError, load_model, resolve_model
from pipeline.config import SDXL_BASE


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


def test_hub_id_without_network(monkeypatch, tmp_path):
    import huggingface_hub.constants

    # As this machine (no route to the Hub), without waiting for connection retries, and never a 7 GB download.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError) as error:
        load_model(SDXL_BASE, dtype="bfloat16")
    message = str(error.value)
    assert "Could not download" in message and "refs/pr/95" in message and "\n" not in message
