"""The `parameters` text's one writer and one reader (pipeline/contract/parameters.py): what one writes the other
reads back, A1111's order of the keys, the ControlNet entries, and the status line's words. No JAX: the page and
the engine share this module."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from pipeline.contract import image_files as image_io
from pipeline.contract.parameters import (
    control_entry,
    describe,
    hashes_field,
    parse_infotext,
    read_control_entry,
    status_parts,
    text_settings,
    typed,
    written_settings,
)
from pipeline.contract.request import RequestRules, parse_request
from web.page.png_info import read_form_values


def _png(size: int = 64) -> bytes:
    out = io.BytesIO()
    Image.fromarray((np.arange(size * size * 3) % 251).astype(np.uint8).reshape(size, size, 3)).save(out, "PNG")
    return out.getvalue()


RULES = RequestRules(sizes=((64, 64),), loras=("add:detail",), controlnets=("cn-a", "cn-b"))
UNITS = [
    {"name": "cn-a", "image": _png(), "weight": 0.9, "start": 0.25, "preprocessor": "canny", "low": 90, "high": 210},
    {"name": "cn-b", "image": _png(), "weight": 1.2},
]


def _text(request, **extra) -> str:
    settings = written_settings(
        request.plain_values(),
        style=request.style,
        has_picture=request.init_image is not None,
        controlnets=request.controlnets,
        **extra,
    )
    return describe(
        prompt=request.styled_prompt,
        negative_prompt=request.styled_negative_prompt,
        seed=request.seed,
        steps=request.steps,
        guidance_scale=request.guidance_scale,
        height=64,
        width=64,
        model="tiny",
        dtype="float32",
        extra=settings,
    )


def test_what_the_writer_writes_the_reader_reads_back_in_a1111s_order():
    request = parse_request(
        "a red fox,\nsnow",
        "blurry: low",
        style="Cinematic",
        seed=7,
        steps=9,
        cfg_end=0.5,
        init_image=_png(),
        strength=0.6,
        controlnets=UNITS,
        rules=RULES,
    )
    text = _text(
        request,
        lora_hashes=hashes_field([("add:detail", "0123456789ab")]),
        text=text_settings([("emb,1", "fedcba987654")], "no-norm", emphasized=True),
    )
    info = parse_infotext(text)
    assert (info.prompt, info.negative_prompt) == (request.styled_prompt, request.styled_negative_prompt)
    assert list(info.settings) == [
        "Steps",
        "Sampler",
        "CFG scale",
        "Seed",
        "Size",
        "Model",
        "Dtype",  # A1111's basics, then this app's
        "Style",
        "Denoising strength",
        "Lora hashes",
        "TI hashes",
        "Emphasis",
        "CFG end",
        "ControlNet 0",
        "ControlNet 1",
    ]
    assert info.settings["Style"] == "Cinematic" and info.settings["Emphasis"] == "No norm"
    assert typed("Lora hashes", info.settings["Lora hashes"]) == {"adddetail": "0123456789ab"}  # ':' ',' dropped
    assert typed("TI hashes", info.settings["TI hashes"]) == {"emb1": "fedcba987654"}
    assert typed("Denoising strength", info.settings["Denoising strength"]) == 0.6
    assert typed("Size", info.settings["Size"]) == (64, 64) and typed("Seed", info.settings["Seed"]) == 7
    assert typed("ControlNet 0", info.settings["ControlNet 0"]) == {
        "module": "canny",
        "name": "cn-a",
        "weight": 0.9,
        "start": 0.25,
        "end": 1.0,
        "low": 90.0,
        "high": 210.0,
    }
    # a request at every default writes A1111's basics only; no picture, no picture's fields
    plain = parse_request("a cat", rules=RULES)
    assert list(parse_infotext(_text(plain)).settings) == [
        "Steps",
        "Sampler",
        "CFG scale",
        "Seed",
        "Size",
        "Model",
        "Dtype",
    ]


def test_emphasis_is_written_only_away_from_a1111s_default_and_only_when_a_text_has_a_bracket():
    assert text_settings([], "original", emphasized=True) == {}
    assert text_settings([], "off", emphasized=False) == {}
    assert text_settings([], "off", emphasized=True) == {"Emphasis": "None"}


def test_a_controlnet_entry_reads_back_and_a1111s_extra_keys_are_skipped():
    request = parse_request("x", controlnets=UNITS, rules=RULES)
    for index, unit in enumerate(request.controlnets):
        key, text = control_entry(unit, index)
        assert key == f"ControlNet {index}"
        read = read_control_entry(text)
        assert (read["name"], read["module"], read["weight"], read["start"], read["end"]) == (
            unit.name,
            unit.module,
            unit.weight,
            unit.start,
            unit.end,
        )
        assert ("low" in read) == (unit.module == "canny")
    a1111 = (
        "Module: canny, Model: diffusers_xl_canny_full [2b69fca4], Weight: 1, Resize Mode: Crop and Resize, "
        "Processor Res: 512, Threshold A: 100, Threshold B: 200, Guidance Start: 0, Guidance End: 1"
    )
    assert read_control_entry(a1111) == {
        "module": "canny",
        "name": "diffusers_xl_canny_full [2b69fca4]",
        "weight": 1.0,
        "low": 100.0,
        "high": 200.0,
        "start": 0.0,
        "end": 1.0,
    }


def test_png_info_reads_controlnet_entries_with_the_one_reader(tmp_path):
    """PNG Info's values come from parameters.py's reader: a ControlNet entry arrives as the unit's fields."""
    request = parse_request("a fox", controlnets=UNITS[:1], rules=RULES)
    image = image_io.to_pil(np.zeros((1, 8, 8, 3), np.uint8), [_text(request)])[0]
    values = read_form_values(image_io.save_png(image, tmp_path / "a.png"))
    assert values.prompt == "a fox" and values.extra["ControlNet 0"] == read_control_entry(
        control_entry(request.controlnets[0], 0)[1]
    )


def test_the_status_line_and_a_history_entry_share_one_renderer():
    request = parse_request("x", steps=9, cfg_end=0.5, deepcache=2, init_image=_png(), strength=0.6, rules=RULES)
    assert request.status_text() == " · CFG end 0.5 · DeepCache 2 · from a picture, strength 0.6"
    assert status_parts(request.plain_values(), None) == ["CFG end 0.5", "DeepCache 2"]
    assert status_parts({"cfg_end": None, "strength": 0.6}, "inpainted") == ["inpainted, strength 0.6"]
