"""The project's CLIP BPE (pipeline/checkpoint/clip_tokenizer.py) gives the ids transformers 4.57's CLIPTokenizer
gave, the tokenizer every reference here ran: tests/fixtures/clip-tokens-expected.json
(scripts/make_tokenizer_fixtures.py), hand-picked and random prompts for both of tiny-pt's tokenizers."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.checkpoint.clip_tokenizer import ClipTokenizer, clean_text
from tests.conftest import FIXTURES

EXPECTED = json.loads((FIXTURES / "clip-tokens-expected.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["tokenizer", "tokenizer_2"])
def test_ids_equal_transformers_slow_clip_tokenizer(name):
    tokenizer = ClipTokenizer.from_directory(FIXTURES / "tiny-pt" / name)
    expected = EXPECTED["tokenizers"][name]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (
        expected["bos"],
        expected["eos"],
        expected["pad"],
    )
    assert tokenizer.pad_token == expected["pad_token"] and len(tokenizer) == expected["length"]
    assert tokenizer.model_max_length == expected["model_max_length"]
    wrong = [
        (prompt, ids, tokenizer.ids(prompt))
        for prompt, ids in zip(EXPECTED["prompts"], expected["ids"], strict=True)
        if tokenizer.ids(prompt) != ids
    ]
    assert not wrong, f"{len(wrong)} of {len(EXPECTED['prompts'])} prompts differ, first: {wrong[0]}"


def test_second_tokenizer_reads_its_pad_token_alone():
    """SDXL's CLIP-G tokenizer pads with "!", an added token: "!!" is two of it, where CLIP-L merges the pair."""
    first, second = (ClipTokenizer.from_directory(FIXTURES / "tiny-pt" / name) for name in ("tokenizer", "tokenizer_2"))
    assert second.ids("!!") == [second.pad_token_id] * 2
    assert first.ids("!!") != second.ids("!!")


def test_cleaning_matches_clip_basic_tokenizer_settings():
    assert clean_text("  Café\tCRÈME\n東京 x\u200by ") == "café crème 東 京 xy"


def test_missing_special_token_is_one_sentence(tmp_path):
    source = FIXTURES / "tiny-pt" / "tokenizer"
    for file in ("vocab.json", "merges.txt"):
        (tmp_path / file).write_bytes((source / file).read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<|nothere|>"}))
    with pytest.raises(ValueError, match=re.escape("special token '<|nothere|>' is not in its vocabulary")):
        ClipTokenizer.from_directory(tmp_path)
