"""The tiny random SDXL checkpoint: on-disk layout, SDXL geometry, tokenizer, determinism, cache, and one real run."""

from __future__ import annotations

import json
import pathlib
import threading

import pytest

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
def loaded(fresh_tiny_dir):
    """(pipeline, params) exactly as an application would load the real SDXL Flax checkpoint."""
    from diffusers import FlaxStableDiffusionXLPipeline

    return FlaxStableDiffusionXLPipeline.from_pretrained(fresh_tiny_dir, split_head_dim=True)


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


def test_geometry_copies_sdxl(loaded):
    import jax
    import numpy as np

    pipe, params = loaded
    geometry = tiny.GEOMETRY
    assert pipe.vae_scale_factor == 8 == geometry.vae_scale_factor
    assert pipe.vae.config.latent_channels == 4 and pipe.vae.config.scaling_factor == pytest.approx(0.13025)
    assert pipe.unet.config.sample_size * pipe.vae_scale_factor == 128

    te1, te2 = pipe.text_encoder.config, pipe.text_encoder_2.config
    assert (te1.hidden_act, te2.hidden_act) == ("quick_gelu", "gelu")
    assert "text_projection" in params["text_encoder_2"]
    assert "text_projection" not in params["text_encoder"]
    for tokenizer, pad in ((pipe.tokenizer, "<|endoftext|>"), (pipe.tokenizer_2, "!")):
        assert tokenizer.model_max_length == 77
        assert tokenizer.pad_token == pad
        assert len(tokenizer) == te1.vocab_size == te2.vocab_size
    assert pipe.tokenizer.eos_token_id == len(pipe.tokenizer) - 1  # Flax CLIP pools at argmax(input_ids)

    unet = pipe.unet.config
    assert tuple(unet.down_block_types) == ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D")
    assert tuple(unet.up_block_types) == ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D")
    assert unet.addition_embed_type == "text_time" and unet.use_linear_projection
    assert unet.projection_class_embeddings_input_dim == te2.projection_dim + 6 * unet.addition_time_embed_dim
    assert unet.cross_attention_dim == te1.hidden_size + te2.hidden_size
    assert len(pipe.vae.config.block_out_channels) == 4

    scheduler = pipe.scheduler.config
    assert type(pipe.scheduler).__name__ == "FlaxEulerDiscreteScheduler"
    assert (scheduler.num_train_timesteps, scheduler.beta_schedule, scheduler.timestep_spacing) == (
        1000,
        "scaled_linear",
        "leading",
    )
    assert (scheduler.beta_start, scheduler.beta_end, scheduler.prediction_type) == (0.00085, 0.012, "epsilon")

    weights = {k: v for k, v in params.items() if k != "scheduler"}
    assert {np.asarray(leaf).dtype for leaf in jax.tree_util.tree_leaves(weights)} == {np.dtype("float32")}


def test_tokenizer_round_trip_and_window(loaded):
    pipe, _ = loaded
    prompt = "a portrait of a wizard playing a xylophone in anime style"  # "xylophone" is not in the corpus
    for tokenizer in (pipe.tokenizer, pipe.tokenizer_2):
        ids = tokenizer(prompt).input_ids
        assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == prompt
    assert len(FIFTEEN_WORD_PROMPT.split()) == 15
    assert len(pipe.tokenizer(FIFTEEN_WORD_PROMPT).input_ids) < 40

    ids = pipe.prepare_inputs(FIFTEEN_WORD_PROMPT)
    assert ids.shape == (1, 2, 77)


def test_hundred_word_prompt_overflows_77_tokens(loaded):
    pipe, _ = loaded
    words = (FIFTEEN_WORD_PROMPT.split() * 7)[:100]
    assert len(pipe.tokenizer(" ".join(words)).input_ids) > 77


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


def test_default_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("SDXL_JAX_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tiny.default_cache_dir() == tmp_path / "sdxl-jax"
    monkeypatch.setenv("SDXL_JAX_CACHE", str(tmp_path / "explicit"))
    assert tiny.default_cache_dir() == tmp_path / "explicit"


@pytest.mark.long  # 80 s of pmap compiles; CI's bench guard runs the same pipeline (`bench --only reference`)
def test_reference_pipeline_runs_on_all_devices(loaded):
    import jax
    import numpy as np
    from flax.jax_utils import replicate

    pipe, params = loaded
    devices = jax.local_device_count()
    assert devices == 8  # tests/conftest.py forces 8 host devices
    prompt_ids = replicate(pipe.prepare_inputs(FIFTEEN_WORD_PROMPT))  # (8, 1, 2, 77)
    rng = jax.random.split(jax.random.PRNGKey(0), devices)
    images = pipe(prompt_ids, replicate(params), rng, num_inference_steps=2, height=64, width=64, jit=True).images
    images = np.asarray(images)
    assert images.shape == (devices, 1, 64, 64, 3)
    assert np.isfinite(images).all() and images.std() > 0
    assert not np.array_equal(images[0], images[1])  # each device used its own seed
