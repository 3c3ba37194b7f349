"""Tests for pipeline.contract.styles and the shipped assets (styles.json, examples.json)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contract.styles import (
    DEFAULT_STYLE,
    DEFAULT_STYLES_PATH,
    EXAMPLES_PATH,
    PLACEHOLDER,
    STYLE_NAMES,
    Style,
    StyleFileError,
    apply_style,
    load_examples,
    load_styles,
)

FAST = settings(max_examples=200, deadline=None)
STYLES = load_styles()


def test_shipped_styles_match_the_spec():
    assert tuple(STYLES) == STYLE_NAMES
    assert next(iter(STYLES)) == DEFAULT_STYLE == "No style"
    assert STYLES["No style"] == Style("No style", "{prompt}", "")
    assert STYLES["Cinematic"].prompt == (
        "cinematic still {prompt} . emotional, harmonious, vignette, highly detailed, high budget, bokeh, "
        "cinemascope, moody, epic, gorgeous, film grain, grainy"
    )
    assert STYLES["Cinematic"].negative_prompt == (
        "anime, cartoon, graphic, text, painting, crayon, graphite, abstract, glitch, deformed, mutated, ugly, "
        "disfigured"
    )
    assert STYLES["Photographic"].prompt == (
        "cinematic photo {prompt} . 35mm photograph, film, bokeh, professional, 4k, highly detailed"
    )
    assert STYLES["Photographic"].negative_prompt == (
        "drawing, painting, crayon, sketch, graphite, impressionist, noisy, blurry, soft, deformed, ugly"
    )
    for style in STYLES.values():
        assert style.prompt.count(PLACEHOLDER) == 1
        assert style.name == " ".join(style.name.split())
        assert "  " not in style.prompt and "  " not in style.negative_prompt
        if style.name != DEFAULT_STYLE:
            assert style.negative_prompt


def test_load_styles_returns_a_fresh_ordered_copy():
    first = load_styles()
    first.pop("Cinematic")
    assert "Cinematic" in load_styles()
    assert list(load_styles(DEFAULT_STYLES_PATH)) == list(STYLE_NAMES)


def test_apply_style_examples():
    assert apply_style(STYLES["No style"], "a dog", "") == ("a dog", "")
    assert apply_style(STYLES["No style"], "a dog", "cats") == ("a dog", "cats")
    prompt, negative = apply_style(STYLES["Pixel art"], "a {dog} {prompt} {0}", "blur")
    assert prompt == "pixel-art a {dog} {prompt} {0} . low-res, blocky, pixel art style, 8-bit graphics"
    assert negative == "sloppy, messy, blurry, noisy, highly detailed, ultra textured, photo, realistic, blur"


@FAST
@given(st.sampled_from(STYLE_NAMES), st.text(max_size=200), st.text(max_size=200))
def test_apply_style_never_raises_and_keeps_the_prompt(name, prompt, negative):
    style = STYLES[name]
    styled, styled_negative = apply_style(style, prompt, negative)
    assert prompt in styled
    before, _, after = style.prompt.partition(PLACEHOLDER)
    assert styled == before + prompt + after
    assert not styled_negative.startswith(", ") and not styled_negative.endswith(", ")
    if negative.strip():
        assert negative.strip() in styled_negative
    if style.negative_prompt:
        assert styled_negative.startswith(style.negative_prompt)


@FAST
@given(st.text(max_size=100), st.text(max_size=100))
def test_apply_style_with_arbitrary_template_text(prefix, suffix):
    style = Style("X", prefix.replace(PLACEHOLDER, "") + PLACEHOLDER + suffix.replace(PLACEHOLDER, ""), "")
    styled, _ = apply_style(style, "{prompt}{}{0}", "")
    assert "{prompt}{}{0}" in styled


def write(tmp_path, data) -> str:
    path = tmp_path / "styles.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


NO_STYLE = {"name": "No style", "prompt": "{prompt}", "negative_prompt": ""}


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ({"name": "x"}, "non-empty JSON list"),
        ([], "non-empty JSON list"),
        ([NO_STYLE, "Cinematic"], "must be an object"),
        ([NO_STYLE, {"name": "A", "prompt": "{prompt}"}], "missing negative_prompt"),
        ([NO_STYLE, {"name": "A", "prompt": "{prompt}", "negative_prompt": "", "x": 1}], "unknown keys: x"),
        ([NO_STYLE, {"name": "A", "prompt": "no placeholder", "negative_prompt": ""}], "exactly once"),
        ([NO_STYLE, {"name": "A", "prompt": "{prompt} {prompt}", "negative_prompt": ""}], "exactly once"),
        ([NO_STYLE, {"name": "A", "prompt": "{prompt}", "negative_prompt": "{prompt}"}], "must not contain"),
        ([NO_STYLE, {"name": "A", "prompt": "{prompt}", "negative_prompt": 3}], "must all be strings"),
        ([NO_STYLE, NO_STYLE], "duplicate style name 'No style'"),
        ([NO_STYLE, {"name": " ", "prompt": "{prompt}", "negative_prompt": ""}], "name must be non-empty"),
        ([{"name": "A", "prompt": "{prompt}", "negative_prompt": ""}, NO_STYLE], "first style must be 'No style'"),
        ([{"name": "No style", "prompt": "x {prompt}", "negative_prompt": ""}], "'No style' must be"),
    ],
)
def test_load_styles_rejects_bad_files(tmp_path, data, fragment):
    path = write(tmp_path, data)
    with pytest.raises(StyleFileError) as info:
        load_styles(path)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


def test_load_styles_missing_file(tmp_path):
    with pytest.raises(StyleFileError, match="Cannot read styles file"):
        load_styles(tmp_path / "nope.json")


def test_load_styles_custom_file(tmp_path):
    path = write(tmp_path, [NO_STYLE, {"name": "Sketch", "prompt": "sketch of {prompt}", "negative_prompt": "color"}])
    styles = load_styles(path)
    assert list(styles) == ["No style", "Sketch"]
    assert apply_style(styles["Sketch"], "a cat", "") == ("sketch of a cat", "color")


def test_examples_file():
    raw = json.loads(EXAMPLES_PATH.read_text(encoding="utf-8"))
    examples = load_examples()
    assert examples == raw
    assert len(examples) == 5
    assert "A serious capybara at work, wearing a suit" in examples
    assert all(isinstance(item, str) and item == item.strip() and len(item) < 200 for item in examples)
    assert len(set(examples)) == 5


def test_load_examples_rejects_bad_file(tmp_path):
    path = tmp_path / "examples.json"
    path.write_text(json.dumps(["ok", ""]), encoding="utf-8")
    with pytest.raises(StyleFileError, match="non-empty strings"):
        load_examples(path)
