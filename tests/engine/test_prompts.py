"""A1111's emphasis syntax and SDXL textual-inversion embeddings: parsed as A1111 parses them, computed as A1111's
"Original" emphasis and diffusers' `load_textual_inversion` compute them (tests/fixtures/prompts-expected.*, made
by scripts/make_prompt_fixtures.py from the PyTorch pipeline), and a prompt without either gives exactly the
plain computation."""

from __future__ import annotations

import functools
import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FIXTURES, generate

from pipeline.host.planning.emphasis import parse_emphasis
from pipeline.host.planning.tokens import CHUNK, EXTRA_BASE, ExtraRows, PromptReader, extra_capacity, tokenize

MANIFEST = json.loads((FIXTURES / "prompts-expected.json").read_text())
ARRAYS = np.load(FIXTURES / "prompts-expected.npz")
EMBEDDINGS = FIXTURES / "embeddings"
NAME = MANIFEST["embedding"]["name"]


def as_pairs(prompt):
    return [("BREAK", None) if s.is_break else (s.text, round(s.weight, 6)) for s in parse_emphasis(prompt)]


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("normal text", [("normal text", 1.0)]),
        ("an (important) word", [("an ", 1.0), ("important", 1.1), (" word", 1.0)]),
        ("(unbalanced", [("unbalanced", 1.1)]),
        ("\\(literal\\]", [("(literal]", 1.0)]),
        ("(unnecessary)(parens)", [("unnecessaryparens", 1.1)]),
        (
            "a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).",
            [
                ("a ", 1.0),
                ("house", 1.573),
                (" ", 1.1),
                ("on", 1.0),
                (" a ", 1.1),
                ("hill", 0.55),
                (", sun, ", 1.1),
                ("sky", 1.4641),
                (".", 1.1),
            ],
        ),
        ("stray) and ]", [("stray) and ]", 1.0)]),
        ("[x:1.5)", [("x:1.5)", round(1 / 1.1, 6))]),
        ("a BREAK b", [("a", 1.0), ("BREAK", None), ("b", 1.0)]),
        ("a BREAKb", [("a BREAKb", 1.0)]),
        ("", [("", 1.0)]),
    ],
)
def test_parse_is_a1111s(prompt, expected):
    """A1111's own doctests, unbalanced brackets and BREAK, read as A1111 reads them (no error)."""
    assert as_pairs(prompt) == expected


def test_fixture_segments_are_the_parse(tokenizers):
    for case in MANIFEST["cases"]:
        texts = ((case["prompt"], case["segments"]), (case["negative_prompt"], case["negative_segments"]))
        for text, segments in texts:
            want = [("BREAK", None) if s is None else (s[0], round(s[1], 6)) for s in segments]
            assert [pair for pair in as_pairs(text) if pair[0]] == want  # empty runs tokenize to nothing


@pytest.fixture(scope="module")
def tiny_pt():
    from pipeline.checkpoint.loading import load_model

    return load_model(str(FIXTURES / "tiny-pt"), dtype="float32", conversion_cache=False)


@pytest.fixture(scope="module")
def tokenizers(tiny_pt):
    return tiny_pt.networks.tokenizer, tiny_pt.networks.tokenizer_2


@pytest.fixture(scope="module")
def embeddings(tiny_pt):
    from pipeline.checkpoint.embeddings import load_embeddings_dir
    from pipeline.generator import text_widths

    return load_embeddings_dir(EMBEDDINGS, text_widths(tiny_pt.params)).offered


def test_plain_prompts_read_as_before(tokenizers, embeddings):
    reader = PromptReader(tokenizers, "original", embeddings)
    for text in ("a cozy cabin in a snowy forest, warm light", "", "word " * 200):
        rows = reader.read(text, 3, ExtraRows())
        ids, windows = tokenize(tokenizers, text, 3)
        assert np.array_equal(rows.ids, ids) and rows.windows == windows
        assert np.all(rows.weights == 1)


def test_break_weights_and_embeddings_are_placed(tokenizers, embeddings):
    reader, extra = PromptReader(tokenizers, "original", embeddings), ExtraRows()
    rows = reader.read(f"a (photo:1.5) BREAK of ({NAME}:1.2) x", 2, extra)
    assert rows.windows == 2 and extra.names == (NAME,)
    second = rows.ids[0, 77:]  # [77]: begin, "of", the 2 vectors, "x", end
    of = tokenizers[0].ids("of")
    assert second[1 : 1 + len(of)].tolist() == of
    start = 1 + len(of)
    assert second[start : start + 2].tolist() == [EXTRA_BASE, EXTRA_BASE + 1]
    assert rows.weights[0, 77 + start : 77 + start + 2].tolist() == pytest.approx([1.2, 1.2])
    assert rows.weights[0, :77].max() == pytest.approx(1.5)
    # An embedding that would cross the 75-token edge starts the next window (A1111's rule).
    rows = reader.read("x " * (CHUNK - 1) + NAME, 2, ExtraRows())
    assert rows.windows == 2 and rows.ids[0, 78] == EXTRA_BASE
    # Off: brackets are plain text, weights all 1.
    off = PromptReader(tokenizers, "off", embeddings).read("a (red:1.3) car", 1, ExtraRows())
    assert np.all(off.weights == 1) and np.array_equal(off.ids, tokenize(tokenizers, "a (red:1.3) car")[0])


def test_refused_files_leave_the_rest(tiny_pt, caplog):
    from pipeline.checkpoint.embeddings import load_embeddings_dir
    from pipeline.generator import text_widths

    with caplog.at_level(logging.WARNING, logger="pipeline.checkpoint.embeddings"):
        files = load_embeddings_dir(EMBEDDINGS, text_widths(tiny_pt.params))
    assert [e.name for e in files.offered] == [NAME] and files.refused == ("broken", "sd15emb")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert any("sd15emb.safetensors is an SD 1.5" in line for line in lines)
    assert any("broken.safetensors could not be read" in line for line in lines)


def old_encode(modules, params, prompt_ids, negative_ids, has_negative, windows):
    """The encode body before emphasis and embeddings existed (K windows, CFG), kept to prove nothing changed."""
    from pipeline.device.text import WINDOW, encode_each

    both_ids = jnp.concatenate([negative_ids, prompt_ids], axis=0)
    rows, count = both_ids.shape[0], both_ids.shape[-1] // WINDOW
    per_window = both_ids.reshape(rows, 2, count, WINDOW).transpose(0, 2, 1, 3).reshape(rows * count, 2, WINDOW)
    (hidden_1, hidden_2), pooled = encode_each(modules.text_encoder, modules.text_encoder_2, params, per_window)
    hidden = jnp.concatenate([hidden_1, hidden_2], axis=-1)  # [N, 77, D1 + D2]
    hidden = hidden.reshape(rows, count * WINDOW, hidden.shape[-1])
    pooled = pooled.reshape(rows, count, -1)[:, 0]
    keep = jnp.concatenate([has_negative, jnp.ones_like(has_negative)])
    hidden = jnp.where(keep[:, None, None], hidden, 0)
    pooled = jnp.where(keep[:, None], pooled, 0)
    return hidden, pooled, (jnp.concatenate([windows[:, 0], windows[:, 1]]) * WINDOW).astype(jnp.int32)


@pytest.mark.parametrize("emphasis", ["original", "no-norm"])
def test_a_prompt_without_brackets_encodes_exactly_as_before(tiny_pt, tokenizers, embeddings, emphasis):
    """Same ids, weights 1, no embedding: the new encode body gives the old one's hidden states bit for bit (so
    today's pixels: the steps after it are unchanged)."""
    from pipeline.device.modules import Modules
    from pipeline.device.text import encode_local
    from pipeline.generator import text_widths

    modules, reader = Modules.of(tiny_pt.networks), PromptReader(tokenizers, emphasis, embeddings)
    extra = ExtraRows()
    text = reader.read("a cozy cabin in a snowy forest, warm light", 1, extra)
    negative = reader.read("blurry, low quality", 1, extra)
    ids, negative_ids = text.ids[None], negative.ids[None]  # [1, 2, 77]
    flags, windows = np.array([True]), np.ones((1, 2), np.int32)
    new = jax.jit(functools.partial(encode_local, modules, cfg=True, normalize=emphasis == "original"))(
        tiny_pt.params,
        ids,
        negative_ids,
        flags,
        windows,
        text.weights[None],
        negative.weights[None],
        *extra.tables(extra_capacity(1), text_widths(tiny_pt.params)),
        np.int32(0),  # clip_skip 0, traced
    )
    old = jax.jit(functools.partial(old_encode, modules))(tiny_pt.params, ids, negative_ids, flags, windows)
    for got, want in zip(new, old, strict=True):
        assert np.array_equal(np.asarray(got), np.asarray(want))


def run_reader(tiny_pt, reader, prompt, negative, windows):
    """The engine's text reading and encode/step/decode bodies on the fixture's latents: uint8 [64, 64, 3] as int."""
    from reference import run_local

    from pipeline.device.modules import Modules
    from pipeline.generator import text_widths
    from pipeline.host.planning.sampler_plan import SamplerConfig

    extra = ExtraRows()
    text, neg = reader.read(prompt, windows, extra), reader.read(negative, windows, extra)
    k = 1 if max(text.windows, neg.windows) == 1 else windows
    cut = slice(0, 77 * k)
    args = (
        np.asarray([[neg.windows, text.windows]], np.int32),
        text.weights[None, :, cut],
        neg.weights[None, :, cut],
        *extra.tables(extra_capacity(k), text_widths(tiny_pt.params)),
    )
    scheduler = dict(tiny_pt.networks.scheduler_config)
    plan = SamplerConfig.from_scheduler_config(scheduler).plan(MANIFEST["steps"], "euler")
    return run_local(
        Modules.of(tiny_pt.networks),
        tiny_pt.params,
        text.ids[None, :, cut],
        neg.ids[None, :, cut],
        np.array([bool(negative)]),
        np.array([MANIFEST["guidance_scale"]], np.float32),
        ARRAYS["latents"],
        plan,
        text=args,
    )[0].astype(np.int16)


@pytest.mark.parametrize("name", ["weighted", "weighted_break", "embedding"])
def test_images_match_pytorch(tiny_pt, tokenizers, embeddings, name):
    """Within 1 level of diffusers' PyTorch pipeline given A1111's Original emphasis as prompt_embeds, and of
    `load_textual_inversion` in both encoders."""
    reader = PromptReader(tokenizers, "original", embeddings)
    if name == "embedding":
        case = MANIFEST["embedding"]
        prompt, negative = case["prompt"], case["negative_prompt"]
    else:
        case = next(c for c in MANIFEST["cases"] if c["name"] == name)
        prompt, negative = case["prompt"], case["negative_prompt"]
    image = run_reader(tiny_pt, reader, prompt, negative, 2)  # K = 2: the reference attends to every token
    expected = np.round(ARRAYS[name][0] * 255)
    assert np.abs(image - expected).max() <= 1, name
    assert np.mean(image != expected) < 0.02, name


def test_the_engine_reads_weights_and_embeddings_without_compiling(feature_engine):
    """Through the served programs: no compilation, the prompt written as typed, A1111's TI hashes."""
    from pipeline.checkpoint.embeddings import file_hash

    assert feature_engine.rules.embeddings == (NAME,)
    assert feature_engine.embedding_files.refused == ("broken", "sd15emb")  # each named in one line at start-up
    before = feature_engine.compile_count
    plain = generate(feature_engine, "a red fox", seed=3)
    prompt = f"a (red:1.3) fox, [{NAME}] BREAK ((grass))"
    weighted = generate(feature_engine, prompt, negative_prompt=f"({NAME}:0.8)", seed=3)
    assert feature_engine.compile_count == before
    text = weighted.parameters[0]
    assert text.startswith(prompt + "\n") and f"Negative prompt: ({NAME}:0.8)" in text
    assert f'TI hashes: "{NAME}: {file_hash(EMBEDDINGS / (NAME + ".safetensors"))[:12]}"' in text  # A1111 quotes
    assert "TI hashes" not in plain.parameters[0] and "Emphasis" not in text
    assert not np.array_equal(np.asarray(plain.images[0]), np.asarray(weighted.images[0]))


def test_original_rescales_each_window_and_no_norm_does_not():
    from pipeline.device.text import emphasized

    hidden = np.random.default_rng(0).standard_normal((2, 77, 8)).astype(np.float32) + 0.5  # [M, 77, D]
    weights = np.ones((2, 77), np.float32)
    weights[0, 3:6] = 1.3  # window 0 weighted, window 1 plain
    original = np.asarray(emphasized(hidden, weights, True))
    no_norm = np.asarray(emphasized(hidden, weights, False))
    np.testing.assert_allclose(no_norm[0], hidden[0] * weights[0][:, None], rtol=1e-6)
    np.testing.assert_allclose(original[0].mean(), hidden[0].mean(), rtol=1e-5)
    ratio = hidden[0].mean() / no_norm[0].mean()
    np.testing.assert_allclose(original[0], no_norm[0] * ratio, rtol=1e-5)
    assert np.array_equal(original[1], hidden[1]) and np.array_equal(no_norm[1], hidden[1])


def test_embeddings_past_the_windows_read_take_no_rows(tokenizers, embeddings):
    """Dropped windows give no embedding rows: the prompt and negative prompt always fit the static table."""
    reader, extra = PromptReader(tokenizers, "original", embeddings), ExtraRows()
    many = " ".join([NAME] * 200)  # 400 vectors: 5+ windows
    text, negative = reader.read(many, 1, extra), reader.read(many, 1, extra)
    assert text.overflow and negative.overflow and extra.size == 2  # one embedding, placed once
    assert text.ids[0, 1:76].max() == EXTRA_BASE + 1
    widths = tuple(v.shape[1] for v in embeddings[0].vectors)
    tables = extra.tables(extra_capacity(1), widths)
    assert tables[0].shape == (extra_capacity(1), widths[0])
    np.testing.assert_array_equal(tables[1][:2], embeddings[0].vectors[1])
