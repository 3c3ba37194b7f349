"""--text-cache (pipeline/host/text_cache.py): a request whose texts a recent request encoded runs no text program,
and its pixels are those of a request that ran them; anything that changes what the text programs read (a text, an
emphasis, clip skip, an embedding, a LoRA's weight) runs them again; the cache's order and its setting.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import generate

from bench.cpu.program_times import ProgramTimer
from pipeline.config import EngineConfig
from pipeline.contract.errors import InvalidInput
from pipeline.host.text_cache import TextCache
from web.options import parse_args

#: The text programs a guided request runs for a text met in no recent request: the encoders, then the text's
#: cross-attention table (--cross-attention-cache, the default on these CPU devices).
NEW_TEXT = ["encode cfg", "cross_kv cfg"]


def _run(engine, prompt: str, **fields) -> tuple[np.ndarray, list[str]]:
    """(the images as int16 [B, H, W, 3], the text programs the request ran), compiling nothing."""
    before = engine.compile_count
    with ProgramTimer(engine.programs) as timer:
        result = generate(engine, prompt, **fields)
    assert engine.compile_count == before
    texts = [label for label in timer.labels if label.split()[0] in ("encode", "refiner_encode", "cross_kv")]
    return np.stack([np.asarray(image, np.int16) for image in result.images]), texts


@pytest.fixture
def fresh(engine, monkeypatch):
    """The session's engine with an empty text cache of the default size."""
    monkeypatch.setattr(engine, "text_cache", TextCache())
    return engine


def test_a_repeated_text_runs_no_text_program_and_gives_the_same_pixels(fresh, monkeypatch):
    fields = dict(negative_prompt="blurry, low contrast", seed=21)
    first, ran = _run(fresh, "a stone bridge over a stream", **fields)
    assert ran == NEW_TEXT
    again, ran = _run(fresh, "a stone bridge over a stream", **fields)
    assert ran == [] and np.array_equal(first, again)
    # What the text does not decide keeps the kept text: another seed, sampler, guidance and step count.
    other, ran = _run(
        fresh,
        "a stone bridge over a stream",
        negative_prompt="blurry, low contrast",
        seed=5,
        sampler="Euler a",
        guidance_scale=9.0,
        steps=3,
    )
    assert ran == [] and (fresh.text_cache.hits, fresh.text_cache.misses) == (2, 1)
    monkeypatch.setattr(fresh, "text_cache", TextCache(0))  # nothing kept: the same request encodes its text
    uncached, ran = _run(
        fresh,
        "a stone bridge over a stream",
        negative_prompt="blurry, low contrast",
        seed=5,
        sampler="Euler a",
        guidance_scale=9.0,
        steps=3,
    )
    assert ran == NEW_TEXT and np.array_equal(other, uncached)


@pytest.mark.parametrize(
    "change",
    [
        {"prompt": "a stone bridge over a river"},
        {"negative_prompt": "blurry"},
        {"negative_prompt": ""},  # no negative prompt: zero embeddings, not the empty text's
        {"prompt": "a (stone:1.3) bridge over a stream"},  # emphasis: the same ids, other weights
        {"clip_skip": 1},
    ],
)
def test_what_the_text_programs_read_makes_another_entry(fresh, change):
    base = {"prompt": "a stone bridge over a stream", "negative_prompt": "blurry, low contrast", "seed": 8}
    _run(fresh, **base)
    asked = {**base, **change}
    changed, ran = _run(fresh, **asked)
    assert ran == NEW_TEXT, change
    fresh.text_cache = TextCache(0)
    assert np.array_equal(changed, _run(fresh, **asked)[0]), change  # as a request that encodes it anyway


#: One prompt as is, with an embedding of tests/fixtures/embeddings, and with a LoRA at three weight pairs.
PROMPTS = [
    "a lantern",
    "a lantern, zqxtoken",
    "a lantern <lora:kohya_sgm:0.8>",
    "a lantern <lora:kohya_sgm:0.8:0.5>",
    "a lantern <lora:kohya_sgm:0.5:0.8>",
]


def test_embeddings_and_lora_weights_are_part_of_the_text(feature_engine, monkeypatch):
    """An embedding's vectors and a LoRA's text-encoder weight change what the encoders make from the same prompt;
    a LoRA's UNet weight changes the UNet only, yet is part of the key (its kernels make the cross-attention table)."""
    monkeypatch.setattr(feature_engine, "text_cache", TextCache(len(PROMPTS)))
    seen = {}
    for prompt in PROMPTS:
        images, ran = _run(feature_engine, prompt, seed=3)
        assert ran == NEW_TEXT, prompt  # each a new entry
        seen[prompt] = images
    for prompt in PROMPTS:  # each kept, and handed back for its own request only
        images, ran = _run(feature_engine, prompt, seed=3)
        assert ran == [] and np.array_equal(images, seen[prompt]), prompt
    assert np.abs(seen["a lantern <lora:kohya_sgm:0.8>"] - seen["a lantern"]).max() > 2  # the LoRA acted


def test_the_least_recently_used_text_goes_first():
    cache = TextCache(2)
    a, b, c = cache.outputs("a"), cache.outputs("b"), cache.outputs("c")  # "a" dropped for "c"
    a["encode"], b["encode"], c["encode"] = 1, 2, 3
    assert cache.outputs("b") == {"encode": 2}  # b is now the most recent
    assert cache.outputs("a") == {}  # a again: a new entry, dropping c
    assert cache.outputs("b") == {"encode": 2} and cache.outputs("c") == {} and len(cache) == 2
    cache.forget("b")
    assert len(cache) == 1 and cache.outputs("b") == {}
    assert TextCache(0).outputs("a") is None  # nothing kept: every request runs its text programs


def test_the_setting():
    assert EngineConfig().text_cache == 4 and parse_args(["--text-cache", "0"]).config.text_cache == 0
    for wrong in (-1, 65, True, 2.5):
        with pytest.raises(InvalidInput, match="Text cache must be 0 to 64"):
            EngineConfig(text_cache=wrong)
