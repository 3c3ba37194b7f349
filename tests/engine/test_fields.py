"""The checks of one request field each (pipeline/contract/fields.py): properties (hypothesis) plus one example per
user-facing message; and the modules the page imports stay free of JAX."""

from __future__ import annotations

import math
import sys
import unicodedata
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contract.errors import InvalidInput
from pipeline.contract.fields import FIELD, MAX_PROMPT_CHARS, check_shape, check_style, clean_text, resolve_seed
from pipeline.contract.styles import load_styles

check_guidance = FIELD["guidance_scale"].check
GUIDANCE_MIN, GUIDANCE_MAX = FIELD["guidance_scale"].low, FIELD["guidance_scale"].high
SEED_MAX = FIELD["seed"].high
FAST = settings(max_examples=200, deadline=None)
STYLES = load_styles()


def assert_one_line(error: InvalidInput) -> str:
    """Every message is a single readable sentence: no newline, ends with a full stop, bounded length."""
    message = str(error)
    assert "\n" not in message and "\r" not in message
    assert message.endswith(".")
    assert message[:1].isupper()
    assert len(message) < 400
    return message


# ---------------------------------------------------------------------------------------------------- clean_text


@FAST
@given(st.text(max_size=300), st.integers(min_value=1, max_value=300))
def test_clean_text_never_returns_controls_or_exceeds_cap(text, cap):
    try:
        cleaned = clean_text(text, max_chars=cap)
    except InvalidInput as error:
        assert "too long" in assert_one_line(error)
        return
    assert len(cleaned) <= cap
    assert cleaned == cleaned.strip()
    assert "  " not in cleaned
    for char in cleaned:
        assert unicodedata.category(char) not in {"Cc", "Cf", "Cs"}
        assert char == " " or not char.isspace()


@FAST
@given(st.text(alphabet=st.characters(categories=["L", "N", "P", "S"]), max_size=200))
def test_clean_text_keeps_ordinary_text(text):
    assert clean_text(text) == " ".join(text.split())


def test_clean_text_examples():
    assert clean_text(None) == ""
    assert clean_text("  a\tb\r\n\nc  ") == "a b c"
    assert clean_text("zero\u200bwidth\x00 bell\x07") == "zerowidth bell"
    assert clean_text("emoji 🐱 and accents é") == "emoji 🐱 and accents é"
    assert clean_text("a{b}c") == "a{b}c"


@pytest.mark.parametrize("value", [b"bytes", 12, 1.5, ["a"], {"a": 1}])
def test_clean_text_rejects_non_text(value):
    with pytest.raises(InvalidInput) as info:
        clean_text(value, field="negative prompt")
    message = assert_one_line(info.value)
    assert message.startswith("Negative prompt must be text")
    assert type(value).__name__ in message


def test_clean_text_too_long_message():
    with pytest.raises(InvalidInput) as info:
        clean_text("x" * 2345)
    assert str(info.value) == "Prompt is too long: 2,345 characters; the limit is 2,000."


def test_clean_text_counts_after_cleaning_and_rejects_huge_raw_input():
    assert clean_text("a" + " " * 5000 + "b") == "a b"
    with pytest.raises(InvalidInput, match="too long"):
        clean_text(" " * (MAX_PROMPT_CHARS * 10 + 1))


# ------------------------------------------------------------------------------------------------------ guidance


@FAST
@given(st.floats(min_value=GUIDANCE_MIN, max_value=GUIDANCE_MAX) | st.integers(0, 20))
def test_guidance_in_range_round_trips(value):
    result = check_guidance(value)
    assert isinstance(result, float)
    assert result == value


@FAST
@given(
    st.floats().filter(lambda x: not (GUIDANCE_MIN <= x <= GUIDANCE_MAX))
    | st.integers().filter(lambda x: not 0 <= x <= 20)
    | st.text(max_size=100)
    | st.booleans()
    | st.none()
    | st.binary(max_size=10)
    | st.lists(st.floats(0, 1), max_size=3)
)
def test_guidance_anything_else_is_rejected_with_one_line(value):
    with pytest.raises(InvalidInput) as info:
        check_guidance(value)
    message = assert_one_line(info.value)
    assert message.startswith("Guidance scale must be a number between 0 and 20; got ")
    assert len(message) < 120


def test_guidance_messages():
    with pytest.raises(InvalidInput) as info:
        check_guidance("abc")
    assert str(info.value) == "Guidance scale must be a number between 0 and 20; got 'abc'."
    for bad in ("5", True, math.nan, math.inf, -0.1, 20.5):
        with pytest.raises(InvalidInput):
            check_guidance(bad)
    assert check_guidance(Fraction(15, 2)) == 7.5
    with pytest.raises(InvalidInput):
        check_guidance(10**400)  # too big for a float: still InvalidInput, not OverflowError


# --------------------------------------------------------------------------------------------------------- seeds


@FAST
@given(st.integers(min_value=0, max_value=SEED_MAX))
def test_any_seed_in_range_is_accepted(seed):
    assert resolve_seed(seed) == seed
    assert resolve_seed(float(seed)) == int(float(seed))
    assert resolve_seed(str(seed)) == seed


@FAST
@given(
    st.integers().filter(lambda x: not 0 <= x <= SEED_MAX)
    | st.floats().filter(lambda x: not (math.isfinite(x) and x.is_integer() and 0 <= x <= SEED_MAX))
    | st.text(max_size=60).filter(lambda s: s.strip() and not (s.strip().isascii() and s.strip().isdigit()))
    | st.booleans()
)
def test_bad_seeds_are_rejected(seed):
    with pytest.raises(InvalidInput) as info:
        resolve_seed(seed)
    message = assert_one_line(info.value)
    assert message.startswith(f"Seed must be a whole number from 0 to {SEED_MAX}; got ")


@pytest.mark.parametrize("seed", [None, "", "  "])
def test_an_empty_seed_is_said_to_be_empty(seed):
    """Issue 68: the page's emptied Seed box was refused with "...; got None."."""
    with pytest.raises(InvalidInput) as info:
        resolve_seed(seed)
    assert str(info.value) == f"Seed is empty; enter a whole number from 0 to {SEED_MAX}, or turn on Randomize seed."


@FAST
@given(st.one_of(st.none(), st.text(max_size=5), st.integers()))
def test_randomize_ignores_seed_and_stays_in_range(seed):
    value = resolve_seed(seed, randomize=True)
    assert isinstance(value, int) and 0 <= value <= SEED_MAX


def test_seed_examples():
    assert resolve_seed(SEED_MAX) == SEED_MAX
    assert resolve_seed(" 42 ") == 42
    assert resolve_seed(7.0) == 7
    with pytest.raises(InvalidInput) as info:
        resolve_seed(-1)
    assert str(info.value) == "Seed must be a whole number from 0 to 4294967295; got -1."
    for bad in (True, 1.5, "1e3", "-3", "٣", "²", SEED_MAX + 1, 2**64, math.nan):
        with pytest.raises(InvalidInput):
            resolve_seed(bad)
    old = sys.get_int_max_str_digits()
    with pytest.raises(InvalidInput) as info:
        resolve_seed(10 ** (old + 10))  # repr() of this int would raise ValueError; the message must not
    assert_one_line(info.value)
    assert len({resolve_seed(0, randomize=True) for _ in range(20)}) > 1


# ------------------------------------------------------------------------------------------------ style & shape


def test_check_style():
    assert check_style("Cinematic", STYLES) == "Cinematic"
    assert check_style(None, STYLES) == "No style"
    with pytest.raises(InvalidInput) as info:
        check_style("Foo", STYLES)
    assert str(info.value) == (
        "Unknown style 'Foo'; choose one of: No style, Cinematic, Photographic, Anime, Manga, Digital Art, "
        "Pixel art, Fantasy art, Neonpunk, 3D Model."
    )
    with pytest.raises(InvalidInput):
        check_style("cinematic", STYLES)  # names are exact, as the dropdown sends them


def test_messages_truncate_echoed_input():
    with pytest.raises(InvalidInput) as info:
        check_style("y" * 500 + "\nsecond line", STYLES)
    message = assert_one_line(info.value)
    assert "y" * 40 not in message and "y" * 39 + "…" in message


@FAST
@given(st.text(max_size=200))
def test_echo_never_exceeds_forty_characters(text):
    with pytest.raises(InvalidInput) as info:
        check_guidance(text)
    message = assert_one_line(info.value)
    echoed = message.removeprefix("Guidance scale must be a number between 0 and 20; got ").removesuffix(".")
    assert len(echoed) <= 42  # 40 characters plus the quotes


def test_check_shape():
    check_shape(1024, 1024, [(1024, 1024)])
    check_shape(768, 1344, [(1024, 1024), (768, 1344)])
    with pytest.raises(InvalidInput) as info:
        check_shape(512, 512, [(1024, 1024)])
    assert str(info.value) == "This server compiled 1024×1024 only; got 512×512."
    with pytest.raises(InvalidInput) as info:
        check_shape(64, 128, [(64, 64), (96, 160)])  # sizes read width×height
    assert str(info.value) == "This server compiled 64×64 or 160×96 only; got 128×64."
    with pytest.raises(InvalidInput):
        check_shape("1024", 1024, [(1024, 1024)])
    with pytest.raises(InvalidInput):
        check_shape(True, 1, [(1, 1)])
    with pytest.raises(InvalidInput) as info:
        check_shape(64, 64, [])
    assert_one_line(info.value)


def test_modules_do_not_import_jax():
    """The UI imports these modules; they must not pull in JAX (checked on the source, independent of __init__)."""
    import ast
    import pathlib

    import pipeline.contract.errors
    import pipeline.contract.fields
    import pipeline.contract.request
    import pipeline.contract.styles
    import web.page.prompt_filter

    contract = pipeline.contract
    for module in (contract.errors, contract.fields, contract.request, contract.styles, web.page.prompt_filter):
        tree = ast.parse(pathlib.Path(module.__file__).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(name.split(".")[0] in {"jax", "jaxlib", "flax"} for name in names), module.__name__


def test_request_and_options_import_no_jax():
    """The app parses its options and checks requests before JAX (or Gradio) is imported: a Ctrl-C then is one line,
    and a bad flag costs no JAX start-up."""
    from conftest import run_python

    code = (
        "import sys, pipeline.contract.request, pipeline.options, pipeline.config, web.options, "
        "web.page.prompt_filter, web.serving.startup_guard; "
        "print(sorted(m for m in ('jax', 'jaxlib', 'flax', 'gradio') if m in sys.modules))"
    )
    done = run_python("-c", code, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------- page labels


def test_a_refusal_names_the_field_by_the_pages_label_or_by_its_api_name():
    """Issue 68: the page said "hires_scale 3 ..." where its control reads "Upscale by". Every plain field's refusal,
    and the request's own that name fields, keep their template: str() names a field as the APIs do, `named` as the
    page's controls do, and nothing else differs; user text is filled in, never read as a template."""
    from pipeline.contract.fields import PLAIN
    from pipeline.contract.request import RequestRules, parse_request

    for row in PLAIN:
        if row.control is None:
            continue
        refusal = row.refusal("no such" if row.kind == "choice" else -1e9)
        api, page = str(refusal), refusal.named({row.name: row.control.label})
        assert row.called in api and row.control.label in page, (api, page)
        assert api.replace(row.called, "", 1) == page.replace(row.control.label, "", 1)  # only the name differs
        assert refusal.named({}) == api
    tricky = FIELD["sampler"].refusal("{hires_scale} {0}")
    assert "'{hires_scale} {0}'" in tricky.named({"sampler": "Sampler"})
    with pytest.raises(InvalidInput) as refused:
        parse_request("x", hires_scale=3, rules=RequestRules(sizes=((64, 64),), hires_scales=(2.0,)))
    assert str(refused.value) == "hires_scale 3 is not offered by this server; choose 1 (off) or one of: 2."
    assert refused.value.named({"hires_scale": "Upscale by"}) == (
        "Upscale by 3 is not offered by this server; choose 1 (off) or one of: 2."
    )
    with pytest.raises(InvalidInput) as refused:
        parse_request("x", cfg_end=0.5, deepcache=2, rules=RequestRules(sizes=((64, 64),), levers=False))
    assert refused.value.named({"cfg_end": "Guidance for the first part of the steps", "deepcache": "DeepCache"}) == (
        "This server runs every step whole and guided (started with --no-speed-levers): Guidance for the first part "
        "of the steps and DeepCache must be 1."
    )
