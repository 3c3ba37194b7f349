"""The tiny random SDXL checkpoint: on-disk layout, SDXL geometry, tokenizer, determinism, cache, and one real run."""

from __future__ import annotations

import hashlib
import json
import pathlib
import threading

import numpy as np
import pytest
from conftest import FIXTURES

from pipeline.checkpoint import tiny

COMPONENT_WEIGHTS = {
    "text_encoder": "flax_model.msgpack",
    "text_encoder_2": "flax_model.msgpack",
    "unet": "diffusion_flax_model.msgpack",
    "vae": "diffusion_flax_model.msgpack",
}
COMPONENTS = (*COMPONENT_WEIGHTS, "tokenizer", "tokenizer_2", "scheduler")
FIFTEEN_WORD_PROMPT = "a cinematic photo of a red fox in a snowy forest at sunset highly detailed"


@pytest.fixture(scope="session")
def fresh_tiny_dir(tmp_path_factory) -> pathlib.Path:
    """A checkpoint built by make_tiny for this run (not the shared cache), seed 0."""
    return tiny.make_tiny(tmp_path_factory.mktemp("tiny") / "checkpoint", seed=0)


@pytest.fixture(scope="session")
def read_back(fresh_tiny_dir) -> dict:
    """What diffusers' FlaxStableDiffusionXLPipeline read from this checkpoint when it loaded it as an application
    loads the real SDXL Flax checkpoint: recorded in the reference venv (scripts/make_reference_fixtures.py), from
    these very weights."""
    record = json.loads((FIXTURES / "flax-pipeline-expected.json").read_text())
    for name, weights_file in COMPONENT_WEIGHTS.items():
        digest = hashlib.sha256((fresh_tiny_dir / name / weights_file).read_bytes()).hexdigest()
        assert digest == record["checkpoint_weights_sha256"][name], (
            f"make_tiny's {name} weights are not those the fixture was made from: rerun "
            "scripts/make_reference_fixtures.py in the reference venv"
        )
    return record["read_back"]


@pytest.fixture(scope="session")
def networks(fresh_tiny_dir):
    """The project's loader's view of the same checkpoint: configs, tokenizers, scheduler config."""
    from pipeline.checkpoint.networks import build_networks

    return build_networks(fresh_tiny_dir, "float32")


def _weight_bytes(directory: pathlib.Path) -> dict[str, bytes]:
    return {name: (directory / name / file).read_bytes() for name, file in COMPONENT_WEIGHTS.items()}


def test_layout_matches_diffusers_flax_sdxl(fresh_tiny_dir):
    model_index = json.loads((fresh_tiny_dir / "model_index.json").read_text())
    assert model_index["_class_name"] == "FlaxStableDiffusionXLPipeline"
    assert set(COMPONENTS) <= set(model_index)
    assert model_index["text_encoder"] == ["transformers", "FlaxCLIPTextModel"]
    assert model_index["text_encoder_2"] == ["transformers", "FlaxCLIPTextModelWithProjection"]
    assert model_index["scheduler"] == ["diffusers", "FlaxEulerDiscreteScheduler"]
    for name in COMPONENTS:
        assert (fresh_tiny_dir / name).is_dir(), name
    for name, weights_file in COMPONENT_WEIGHTS.items():
        assert (fresh_tiny_dir / name / "config.json").is_file()
        assert (fresh_tiny_dir / name / weights_file).stat().st_size > 0
    for name in ("tokenizer", "tokenizer_2"):
        assert (fresh_tiny_dir / name / "vocab.json").is_file()
        assert (fresh_tiny_dir / name / "merges.txt").read_text().startswith("#version: 0.2\n")
    assert (fresh_tiny_dir / tiny.COMPLETE_MARKER).is_file()
    assert not [p for p in fresh_tiny_dir.parent.iterdir() if p.name.startswith(".")], "staging dir left behind"


def test_geometry_copies_sdxl(fresh_tiny_dir, read_back, networks):
    from flax.serialization import msgpack_restore

    def config(name: str) -> dict:
        return json.loads((fresh_tiny_dir / name / "config.json").read_text())

    geometry = tiny.GEOMETRY
    vae = config("vae")
    assert read_back["vae_scale_factor"] == networks.vae_scale_factor == 8 == geometry.vae_scale_factor
    assert vae["latent_channels"] == 4 and vae["scaling_factor"] == pytest.approx(0.13025)
    assert config("unet")["sample_size"] * networks.vae_scale_factor == 128

    te1, te2 = config("text_encoder"), config("text_encoder_2")
    assert (te1["hidden_act"], te2["hidden_act"]) == ("quick_gelu", "gelu")
    assert read_back["text_projection"] == {"text_encoder": False, "text_encoder_2": True}
    for name, projected in (("text_encoder", False), ("text_encoder_2", True)):
        weights = msgpack_restore((fresh_tiny_dir / name / COMPONENT_WEIGHTS[name]).read_bytes())
        assert ("text_projection" in weights) is projected, name
    for name, pad in (("tokenizer", "<|endoftext|>"), ("tokenizer_2", "!")):
        seen = read_back["tokenizers"][name]
        saved = json.loads((fresh_tiny_dir / name / "tokenizer_config.json").read_text())
        assert seen["model_max_length"] == saved["model_max_length"] == 77
        assert seen["pad_token"] == saved["pad_token"] == pad
        assert seen["length"] == te1["vocab_size"] == te2["vocab_size"]
    first = read_back["tokenizers"]["tokenizer"]
    assert first["eos_token_id"] == first["length"] - 1  # Flax CLIP pools at argmax(input_ids)
    assert networks.tokenizer.eos_token_id == first["eos_token_id"]

    unet = config("unet")
    assert tuple(unet["down_block_types"]) == ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D")
    assert tuple(unet["up_block_types"]) == ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D")
    assert unet["addition_embed_type"] == "text_time" and unet["use_linear_projection"]
    assert unet["projection_class_embeddings_input_dim"] == te2["projection_dim"] + 6 * unet["addition_time_embed_dim"]
    assert unet["cross_attention_dim"] == te1["hidden_size"] + te2["hidden_size"]
    assert len(vae["block_out_channels"]) == 4

    scheduler = networks.scheduler_config
    assert read_back["scheduler_class"] == "FlaxEulerDiscreteScheduler"
    assert (scheduler["num_train_timesteps"], scheduler["beta_schedule"], scheduler["timestep_spacing"]) == (
        1000,
        "scaled_linear",
        "leading",
    )
    assert (scheduler["beta_start"], scheduler["beta_end"], scheduler["prediction_type"]) == (0.00085, 0.012, "epsilon")

    assert read_back["weight_dtypes"] == ["float32"]


def test_tokenizer_round_trip_and_window(read_back, networks):
    from pipeline.host.planning.tokens import tokenize

    prompt = "a portrait of a wizard playing a xylophone in anime style"  # "xylophone" is not in the corpus
    for name in ("tokenizer", "tokenizer_2"):
        seen = read_back["tokenizers"][name]
        ids = seen["round_trip_ids"]
        assert ids[0] == seen["bos_token_id"] and ids[-1] == seen["eos_token_id"]
        assert seen["round_trip_decoded"] == prompt
    tokenizers = (networks.tokenizer, networks.tokenizer_2)
    for row, name in zip(tokenize(tokenizers, prompt)[0], ("tokenizer", "tokenizer_2"), strict=True):
        ids = read_back["tokenizers"][name]["round_trip_ids"]
        assert row[: len(ids)].tolist() == ids  # the project's tokenizers read it as the reference's did
    assert len(FIFTEEN_WORD_PROMPT.split()) == 15
    assert read_back["tokenizers"]["tokenizer"]["fifteen_words_tokens"] < 40

    assert read_back["prepare_inputs_prompt"] == FIFTEEN_WORD_PROMPT
    with np.load(FIXTURES / "flax-pipeline-expected.npz") as arrays:
        ids = arrays["prepare_inputs_ids"]
    assert ids.shape == (1, 2, 77)
    # The engine's first window is exactly diffusers' prepare_inputs (pipeline/host/planning/tokens.py).
    np.testing.assert_array_equal(tokenize(tokenizers, FIFTEEN_WORD_PROMPT)[0], ids[0])


def test_hundred_word_prompt_overflows_77_tokens(read_back, networks):
    from pipeline.host.planning.tokens import tokenize

    words = (FIFTEEN_WORD_PROMPT.split() * 7)[:100]
    assert read_back["tokenizers"]["tokenizer"]["hundred_words_tokens"] > 77
    assert tokenize((networks.tokenizer, networks.tokenizer_2), " ".join(words), chunks=2)[1] == 2  # a second window


def test_same_seed_same_bytes_and_other_seed_differs(fresh_tiny_dir, tmp_path):
    again = tiny.make_tiny(tmp_path / "again", seed=0)
    assert _weight_bytes(again) == _weight_bytes(fresh_tiny_dir)
    for name in ("model_index.json", "tokenizer/vocab.json", "tokenizer/merges.txt", "unet/config.json"):
        assert (again / name).read_bytes() == (fresh_tiny_dir / name).read_bytes()
    other = tiny.make_tiny(tmp_path / "other", seed=1)
    assert all(a != b for a, b in zip(_weight_bytes(other).values(), _weight_bytes(again).values(), strict=True))


def test_make_tiny_replaces_existing_and_never_leaves_half_checkpoint(tmp_path, monkeypatch):
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "stale.txt").write_text("old")

    def crashing_build(directory, **_):
        (directory / "model_index.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny, "_build_into", crashing_build)
    with pytest.raises(RuntimeError, match="disk full"):
        tiny.make_tiny(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert sorted(p.name for p in target.iterdir()) == ["stale.txt"]

    monkeypatch.setattr(tiny, "_build_into", _fake_build)
    tiny.make_tiny(target)
    assert sorted(p.name for p in target.iterdir()) == sorted([tiny.COMPLETE_MARKER, "model_index.json"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def _fake_build(directory, **_):
    (directory / "model_index.json").write_text("{}")
    (directory / tiny.COMPLETE_MARKER).write_text("{}")


def test_tiny_checkpoint_cache_builds_once_and_survives_races(tmp_path, monkeypatch):
    builds = []

    def counting_build(directory, **kwargs):
        builds.append(directory)
        threading.Event().wait(0.2)  # widen the race window
        _fake_build(directory, **kwargs)

    monkeypatch.setattr(tiny, "_build_into", counting_build)
    monkeypatch.setenv("SDXL_JAX_CACHE", str(tmp_path / "cache"))
    results: list[pathlib.Path] = []
    threads = [threading.Thread(target=lambda: results.append(tiny.tiny_checkpoint())) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = tmp_path / "cache" / tiny.TINY_CHECKPOINT_NAME
    assert results == [expected] * 3
    assert (expected / tiny.COMPLETE_MARKER).is_file()
    assert sorted(p.name for p in expected.parent.iterdir()) == [tiny.TINY_CHECKPOINT_NAME]

    count = len(builds)
    assert tiny.tiny_checkpoint() == expected and len(builds) == count  # complete: reused, not rebuilt

    (expected / tiny.COMPLETE_MARKER).unlink()  # an incomplete leftover is rebuilt
    assert tiny.tiny_checkpoint(tmp_path / "cache") == expected and len(builds) == count + 1
    assert (expected / tiny.COMPLETE_MARKER).is_file()


def test_tiny_checkpoint_lives_in_the_cache_root(monkeypatch, tmp_path):
    """The tiny checkpoint sits in the project's one cache root (checkpoint/cache.py: $SDXL_JAX_CACHE, else
    $XDG_CACHE_HOME/sdxl-jax), the converted weights' and compiled programs' too."""
    monkeypatch.setattr(tiny, "_is_complete", lambda directory: True)  # as if built: where it is is the point
    monkeypatch.delenv("SDXL_JAX_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tiny.tiny_checkpoint() == tmp_path / "sdxl-jax" / tiny.TINY_CHECKPOINT_NAME
    monkeypatch.setenv("SDXL_JAX_CACHE", str(tmp_path / "explicit"))
    assert tiny.tiny_checkpoint().parent == tmp_path / "explicit"


@pytest.mark.long  # 80 s of pmap compiles; CI's bench guard runs the same pipeline (`bench --only reference`)
def test_reference_pipeline_runs_on_all_devices(fresh_tiny_dir, tmp_path):
    """diffusers' pipeline on this checkpoint in the reference venv's worker (bench/cpu/reference_worker.py), as the
    bench runs it: one image per device, each device its own seed."""
    import jax

    from bench.cpu.reference import ReferenceWorker

    devices = jax.local_device_count()
    assert devices == 8  # tests/conftest.py forces 8 host devices (the worker inherits XLA_FLAGS)
    spec = {"mode": "checkpoint", "path": str(fresh_tiny_dir), "dtype": "float32"}
    with ReferenceWorker(spec) as worker:
        assert worker.devices == devices
        answer = worker.call(
            prompt=FIFTEEN_WORD_PROMPT,
            negative_prompt="",
            seed=0,
            guidance_scale=7.5,
            steps=2,
            height=64,
            width=64,
            save=str(tmp_path / "images.npy"),
        )
    assert answer["images"] == devices and answer["wall_s"] > 0 and answer["cpu_s"] > 0
    images = np.load(tmp_path / "images.npy")  # the pipeline's float output, before PIL
    assert images.shape == (devices, 64, 64, 3)
    assert np.isfinite(images).all() and images.std() > 0
    assert not np.array_equal(images[0], images[1])  # each device used its own seed
