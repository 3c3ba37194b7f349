"""PyTorch-format checkpoints load without torch and give what the libraries' torch-based conversion gives.

The fixture tests/fixtures/tiny-pt was written by diffusers' and transformers' PyTorch classes
(scripts/make_torch_fixtures.py, run with torch once); these tests never import torch.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import FIXTURES
from flax.traverse_util import flatten_dict
from safetensors import safe_open
from safetensors.numpy import save_file

from pipeline.checkpoint.convert import CheckpointError, pytorch_weight_files
from pipeline.checkpoint.loading import load_model, resolve_model

CHECKPOINT = FIXTURES / "tiny-pt"
COMPONENTS = ("text_encoder", "text_encoder_2", "unet", "vae")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test converts into its own cache root (never the user's)."""
    monkeypatch.setenv("SDXL_JAX_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def converted():
    """The fixture loaded in float32 without the cache: the conversion itself."""
    return load_model(str(CHECKPOINT), dtype="float32", conversion_cache=False)


def flat(tree) -> dict[str, np.ndarray]:
    return {"/".join(key): np.asarray(value) for key, value in flatten_dict(tree).items()}


def read_file(path: Path) -> dict[str, np.ndarray]:
    with safe_open(str(path), framework="np") as reader:
        names = reader.keys()
        return {name: reader.get_tensor(name) for name in names}


def copy_checkpoint(tmp_path: Path, *writable: str) -> Path:
    """A copy of the fixture whose `writable` components are real copies and the rest links (cheap)."""
    target = tmp_path / "ckpt"
    target.mkdir()
    for entry in CHECKPOINT.iterdir():
        if entry.name in writable:
            shutil.copytree(entry, target / entry.name)
        else:
            (target / entry.name).symlink_to(entry)
    return target


def test_params_equal_the_libraries_from_pt_conversion_without_torch(converted):
    expected = json.loads((FIXTURES / "tiny-pt-from-pt.json").read_text())
    assert converted.origins == {name: "converted" for name in COMPONENTS}
    for component in COMPONENTS:
        got = flat(converted.params[component])
        assert sorted(got) == sorted(expected[component]), component
        for name, leaf in expected[component].items():
            array = got[name]
            assert array.dtype == np.float32 and list(array.shape) == leaf["shape"], name
            assert hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest() == leaf["sha256"], name
    assert "torch" not in sys.modules
    # The scheduler config comes from scheduler/scheduler_config.json, as on the Flax path.
    assert converted.networks.scheduler_config["timestep_spacing"] == "leading"
    assert "scheduler" not in converted.params  # no scheduler state: the samplers compute their own schedules


def test_engine_matches_pytorch_pipeline_images(converted):
    """diffusers' PyTorch StableDiffusionXLPipeline, same latents: within 1 level (Flax uses tanh-approximate GELU)."""
    from reference import run_local

    from pipeline.device.modules import Modules
    from pipeline.host.planning.sampler_plan import SamplerConfig
    from pipeline.host.planning.tokens import tokenize

    manifest = json.loads((FIXTURES / "tiny-pt-expected.json").read_text())
    arrays = np.load(FIXTURES / "tiny-pt-expected.npz")
    cases = [c for c in manifest["cases"] if c["timestep_spacing"] == "leading" and c["sampler"] == "euler"]
    assert {c["steps"] for c in cases} == {2} and len({c["guidance_scale"] for c in cases}) == 1
    modules = Modules.of(converted.networks)
    tokenizers = (converted.networks.tokenizer, converted.networks.tokenizer_2)
    prompt_ids = np.stack([tokenize(tokenizers, c["prompt"])[0] for c in cases])  # [2, 2, 77]
    negative_ids = np.stack([tokenize(tokenizers, c["negative_prompt"] or "")[0] for c in cases])  # [2, 2, 77]
    has_negative = np.array([c["negative_prompt"] is not None for c in cases])  # [2]
    guidance = np.array([c["guidance_scale"] for c in cases], np.float32)  # [2]
    latents = np.repeat(arrays["latents"], len(cases), axis=0)  # [2, 4, 8, 8]
    plan = SamplerConfig.from_scheduler_config(manifest["scheduler"]).plan(2, "Euler")
    images = run_local(modules, converted.params, prompt_ids, negative_ids, has_negative, guidance, latents, plan)
    for case, image in zip(cases, images, strict=True):
        got = image.astype(np.int16)
        expected = np.round(arrays[case["name"]][0] * 255)
        assert np.abs(got - expected).max() <= 1, case["name"]
        assert np.mean(got != expected) < 0.02, case["name"]
    assert not np.array_equal(images[0], images[1])  # the negative prompt mattered


def test_fp16_variant_and_sharded_files(converted):
    shards = pytorch_weight_files(CHECKPOINT / "unet", "unet")
    assert len(shards) == 3 and all(f.name.startswith("diffusion_pytorch_model-0000") for f in shards)
    assert (
        pytorch_weight_files(CHECKPOINT / "unet", "unet", "fp16")[0].name == "diffusion_pytorch_model.fp16.safetensors"
    )
    half = load_model(str(CHECKPOINT), dtype="float32", variant="fp16", conversion_cache=False)
    file_values = read_file(CHECKPOINT / "vae" / "diffusion_pytorch_model.fp16.safetensors")
    assert file_values["decoder.conv_in.bias"].dtype == np.float16
    np.testing.assert_array_equal(
        flat(half.params["vae"])["decoder/conv_in/bias"], file_values["decoder.conv_in.bias"].astype(np.float32)
    )
    for component in COMPONENTS:
        got, full = flat(half.params[component]), flat(converted.params[component])
        for name, value in full.items():
            np.testing.assert_allclose(got[name], value, rtol=2e-3, atol=1e-4, err_msg=name)
    for origin in ("converted", "conversion cache"):  # bfloat16 weights through the cache too
        bf16 = load_model(str(CHECKPOINT), dtype="bfloat16", variant="fp16")
        assert set(bf16.origins.values()) == {origin}
        assert {str(leaf.dtype) for leaf in jax.tree_util.tree_leaves(bf16.params["unet"])} == {"bfloat16"}


def test_unet_file_swaps_the_weights(converted, tmp_path):
    """--unet FILE: a whole-UNet safetensors (SDXL-Lightning's format) replaces the checkpoint's UNet."""
    tensors = {}
    for shard in pytorch_weight_files(CHECKPOINT / "unet", "unet"):
        tensors.update({name: value * np.float32(1.5) for name, value in read_file(shard).items()})
    unet_file = tmp_path / "other_unet.safetensors"
    save_file(tensors, str(unet_file))
    swapped = load_model(str(CHECKPOINT), dtype="float32", unet=str(unet_file), conversion_cache=False)
    assert swapped.origins["unet"] == "converted"
    got = flat(swapped.params["unet"])
    np.testing.assert_array_equal(got["conv_in/kernel"], tensors["conv_in.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(got["conv_in/bias"], tensors["conv_in.bias"])
    np.testing.assert_array_equal(got["conv_in/bias"], flat(converted.params["unet"])["conv_in/bias"] * 1.5)
    np.testing.assert_array_equal(
        flat(swapped.params["vae"])["decoder/conv_in/bias"], flat(converted.params["vae"])["decoder/conv_in/bias"]
    )
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(str(CHECKPOINT), dtype="float32", unet=str(tmp_path / "missing.safetensors"))


def test_unet_file_on_a_flax_checkpoint_keeps_its_other_weights(tiny_dir):
    unet_file = CHECKPOINT / "unet" / "diffusion_pytorch_model.fp16.safetensors"
    swapped = load_model(str(tiny_dir), dtype="float32", unet=str(unet_file), conversion_cache=False)
    assert swapped.origins == {"unet": "converted", "vae": "flax", "text_encoder": "flax", "text_encoder_2": "flax"}
    reference = load_model(str(tiny_dir), dtype="float32")
    for component in ("text_encoder", "text_encoder_2", "vae"):
        for name, value in flat(reference.params[component]).items():
            np.testing.assert_array_equal(flat(swapped.params[component])[name], value, err_msg=name)
    bias = read_file(unet_file)["conv_in.bias"].astype(np.float32)
    np.testing.assert_array_equal(flat(swapped.params["unet"])["conv_in/bias"], bias)


def test_cache_hits_second_load_and_damaged_entries_are_rebuilt(converted, tmp_path):
    first = load_model(str(CHECKPOINT), dtype="float32")
    second = load_model(str(CHECKPOINT), dtype="float32")
    assert set(first.origins.values()) == {"converted"}
    assert set(second.origins.values()) == {"conversion cache"}
    for component in COMPONENTS:
        for name, value in flat(converted.params[component]).items():
            np.testing.assert_array_equal(flat(second.params[component])[name], value, err_msg=name)
    entries = sorted((tmp_path / "cache" / "converted").iterdir())
    assert len(entries) == 4 and all((e / "manifest.json").is_file() for e in entries)
    # One entry damaged in place (same size, other bytes), one left without its manifest (a crash mid-write).
    damaged = entries[0] / "params.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-16:] = bytes(16) if any(data[-16:]) else b"\x01" * 16
    damaged.write_bytes(bytes(data))
    (entries[1] / "manifest.json").unlink()
    third = load_model(str(CHECKPOINT), dtype="float32")
    assert sorted(third.origins.values()).count("converted") == 2
    for component in COMPONENTS:
        for name, value in flat(converted.params[component]).items():
            np.testing.assert_array_equal(flat(third.params[component])[name], value, err_msg=name)
    assert all((e / "manifest.json").is_file() for e in entries)  # rebuilt in place


def test_old_vae_attention_names_and_text_position_ids(converted, tmp_path):
    """Older checkpoints: VAE attention as query/key/value/proj_attn, CLIP with a position_ids buffer."""
    ckpt = copy_checkpoint(tmp_path, "vae", "text_encoder")
    vae_file = ckpt / "vae" / "diffusion_pytorch_model.safetensors"
    old = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}
    renamed = {}
    for name, value in read_file(vae_file).items():
        for new, legacy in old.items():
            name = name.replace(f".{new}.", f".{legacy}.")
        renamed[name] = value
    assert any(".proj_attn." in name for name in renamed)
    save_file(renamed, str(vae_file))
    text_file = ckpt / "text_encoder" / "model.safetensors"
    text = read_file(text_file)
    text["text_model.embeddings.position_ids"] = np.arange(77, dtype=np.int64)[None]
    save_file(text, str(text_file))
    loaded = load_model(str(ckpt), dtype="float32", conversion_cache=False)
    for component in ("vae", "text_encoder"):
        for name, value in flat(converted.params[component]).items():
            np.testing.assert_array_equal(flat(loaded.params[component])[name], value, err_msg=name)


def _rewrite(file: Path, change) -> None:
    tensors = read_file(file)
    change(tensors)
    save_file(tensors, str(file))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop("decoder.conv_in.bias"), "vae weights lack decoder/conv_in/bias"),
        (lambda t: t.update({"decoder.extra_head.weight": np.zeros((2, 2), np.float32)}), "decoder.extra_head.weight"),
        (lambda t: t.update({"decoder.conv_in.bias": np.zeros((7,), np.float32)}), "shape (7,)"),
    ],
    ids=["missing", "unmappable", "shape"],
)
def test_bad_weights_fail_in_one_line_naming_the_first_key(tmp_path, change, message):
    ckpt = copy_checkpoint(tmp_path, "vae")
    _rewrite(ckpt / "vae" / "diffusion_pytorch_model.safetensors", change)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        load_model(str(ckpt), dtype="float32", conversion_cache=False)
    assert "\n" not in str(error.value)


def test_truncated_file_and_single_file_checkpoint(tmp_path):
    ckpt = copy_checkpoint(tmp_path, "vae")
    vae_file = ckpt / "vae" / "diffusion_pytorch_model.safetensors"
    vae_file.write_bytes(vae_file.read_bytes()[: vae_file.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as error:
        load_model(str(ckpt), dtype="float32", conversion_cache=False)
    assert "\n" not in str(error.value)
    single = tmp_path / "sd_xl_base_1.0.safetensors"
    shutil.copy(CHECKPOINT / "vae" / "diffusion_pytorch_model.safetensors", single)
    with pytest.raises(CheckpointError, match="single-file checkpoint"):
        resolve_model(str(single))


def test_hub_id_without_network_says_so_in_one_line(monkeypatch, tmp_path):
    import huggingface_hub.constants

    from pipeline.checkpoint.loading import ModelLoadError

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    command = "hf download ByteDance/SDXL-Lightning sdxl_lightning_4step_unet.safetensors"
    with pytest.raises(ModelLoadError, match=f"^HF_HUB_OFFLINE is set and .* run `{command}`") as error:
        load_model(
            str(CHECKPOINT), dtype="float32", unet="ByteDance/SDXL-Lightning:sdxl_lightning_4step_unet.safetensors"
        )
    assert "\n" not in str(error.value)
