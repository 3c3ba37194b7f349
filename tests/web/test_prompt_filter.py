"""The optional deny-list for prompts (web/page/prompt_filter.py, `--prompt-filter FILE`): whole words, any case, from
a file; the request contract applies it (tests/engine/test_request.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from web.page.prompt_filter import PromptFilter

FAST = settings(max_examples=200, deadline=None)


def test_prompt_filter_word_boundaries_and_case():
    prompt_filter = PromptFilter(["ass", "Bad Word", "c++"])
    assert prompt_filter.blocks("ASS")
    assert prompt_filter.blocks("what an ass.")
    assert not prompt_filter.blocks("a class of glass and assets")
    assert prompt_filter.blocks("a BAD   word here")
    assert not prompt_filter.blocks("badword")
    assert prompt_filter.blocks("I like c++ code")
    assert not prompt_filter.blocks("")
    prompt_filter.check("a classic glass")  # no raise


def test_prompt_filter_from_file(tmp_path):
    path = tmp_path / "blocked.txt"
    path.write_text("\ufeff# a comment line\n\n  Spam  \n#eggs\nham sandwich\n", encoding="utf-8")
    prompt_filter = PromptFilter.from_file(path)
    assert prompt_filter.words == ("ham sandwich", "spam")
    assert len(prompt_filter) == 2
    assert prompt_filter.blocks("spam")
    assert not prompt_filter.blocks("eggs")
    assert not prompt_filter.blocks("# a comment line")
    assert prompt_filter.blocks("one Ham\tSandwich please")
    assert not prompt_filter.blocks("ham")


def test_empty_prompt_filter_blocks_nothing():
    assert not PromptFilter([]).blocks("anything at all")
    assert not PromptFilter(["", "   "]).blocks("anything at all")


def test_example_block_list_ships_and_loads():
    from pipeline.contract.styles import ASSETS_DIR

    path = ASSETS_DIR / "blocked_words.example.txt"
    assert path.read_text(encoding="utf-8").startswith("#")
    prompt_filter = PromptFilter.from_file(path)
    assert len(prompt_filter) >= 1
    assert not prompt_filter.blocks("A serious capybara at work, wearing a suit")


@FAST
@given(st.text(max_size=100), st.text(alphabet=st.characters(max_codepoint=127), max_size=60))
def test_prompt_filter_total_and_case_insensitive(text, ascii_text):
    prompt_filter = PromptFilter(["spam", "lorem ipsum"])
    assert isinstance(prompt_filter.blocks(text), bool)
    assert prompt_filter.blocks(ascii_text) == prompt_filter.blocks(ascii_text.upper())
    assert prompt_filter.blocks(f"{ascii_text} SPAM") is True
