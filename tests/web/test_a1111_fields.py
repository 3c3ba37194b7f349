"""A1111 payloads onto the field table, without a server: sd-webui-controlnet's units become `controlnets` where the
server offers ControlNets, and are ignored (and said so) where it does not."""

from __future__ import annotations

import pytest

from pipeline.contract.errors import InvalidInput
from pipeline.contract.request import RequestRules
from web.apis.a1111_fields import a1111_request
from web.apis.guard import json_object

UNIT = {
    "enabled": True,
    "image": "aGVsbG8=",
    "module": "canny",
    "model": "canny-tiny [abc123]",
    "weight": 0.8,
    "guidance_start": 0.25,
    "guidance_end": 0.75,
    "threshold_a": 50,
    "threshold_b": 150,
}
PAYLOAD = {
    "prompt": "a house",
    "alwayson_scripts": {"controlnet": {"args": [UNIT, {"enabled": False}]}, "adetailer": {"args": []}},
}


def test_controlnet_units_are_run_where_the_server_offers_controlnets():
    asked = a1111_request(PAYLOAD, RequestRules(sizes=((64, 64),), controlnets=("canny-tiny",)), picture=False)
    assert asked.given["controlnets"] == [
        {
            "name": "canny-tiny",
            "image": "aGVsbG8=",
            "weight": 0.8,
            "start": 0.25,
            "end": 0.75,
            "preprocessor": "canny",
            "low": 50,
            "high": 150,
        }
    ]
    assert asked.ignored_scripts == ("adetailer",)


def test_controlnet_units_are_ignored_and_said_so_without_controlnets():
    asked = a1111_request(PAYLOAD, RequestRules(sizes=((64, 64),)), picture=False)
    assert "controlnets" not in asked.given and asked.ignored_scripts == ("adetailer", "controlnet")


def test_a_broken_controlnet_args_is_one_sentence():
    broken = {"prompt": "x", "alwayson_scripts": {"controlnet": {"args": "not a list"}}}
    with pytest.raises(InvalidInput, match="must be a list"):
        a1111_request(broken, RequestRules(sizes=((64, 64),), controlnets=("canny-tiny",)), picture=False)


@pytest.mark.parametrize("styles", [["../../etc/passwd"], ["Cinematic", "nope"], "Cinematic"])
def test_a_style_this_server_does_not_offer_is_refused_in_the_tables_words(styles):
    from pipeline.contract.fields import check_style

    rules = RequestRules(sizes=((64, 64),))
    with pytest.raises(InvalidInput) as refused:
        a1111_request({"prompt": "x", "styles": styles}, rules, picture=False)
    if isinstance(styles, list):  # what the page and gradio_client answer for the same name
        with pytest.raises(InvalidInput) as table:
            check_style(styles[-1], rules.styles)
        assert str(refused.value) == str(table.value)
    else:
        assert "styles must be a list" in str(refused.value)
    assert a1111_request({"prompt": "x", "styles": ["Cinematic"]}, rules, picture=False).given["style"] == "Cinematic"
    assert "style" not in a1111_request({"prompt": "x", "styles": []}, rules, picture=False).given


def test_samplers_and_schedulers_not_offered_are_refused_in_the_tables_words():
    from pipeline.contract.fields import FIELD

    rules = RequestRules(sizes=((64, 64),))
    for payload, row, value in (
        ({"sampler_name": "Heun++"}, "sampler", "Heun++"),
        ({"scheduler": "lunar"}, "schedule_type", "lunar"),
    ):
        with pytest.raises(InvalidInput) as refused:
            a1111_request({"prompt": "x", **payload}, rules, picture=False)
        assert str(refused.value) == str(FIELD[row].refusal(value))


def test_clip_skip_reads_a1111s_numbering_from_pngs_and_the_api():
    """A1111's "Clip skip: N" (PNG Info) and `override_settings.CLIP_stop_at_last_layers` N are clip_skip N - 2;
    A1111's 1 and 2 are both SDXL's own layer (0); the table's own `clip_skip` wins over A1111's setting."""
    from pipeline.contract.parameters import parse_infotext
    from web.page.form import image_settings
    from web.page.png_info import form_values

    rules = RequestRules(sizes=((64, 64),))
    text = "a cat\nSteps: 3, Sampler: Euler, CFG scale: 5, Seed: 1, Size: 64x64, Clip skip: {}"
    for written, read in ((4, 2), (1, 0), (2, 0)):
        assert image_settings(form_values(parse_infotext(text.format(written))))[0]["clip_skip"] == read
    assert image_settings(form_values(parse_infotext(text.replace(", Clip skip: {}", ""))))[0]["clip_skip"] == 0
    for settings, want in (({"CLIP_stop_at_last_layers": 3}, 1), ({"CLIP_stop_at_last_layers": 1}, 0)):
        asked = a1111_request({"prompt": "x", "override_settings": settings}, rules, picture=False)
        assert asked.given["clip_skip"] == want
    own = {"prompt": "x", "clip_skip": 2, "override_settings": {"CLIP_stop_at_last_layers": 3}}
    assert a1111_request(own, rules, picture=False).given["clip_skip"] == 2
    with pytest.raises(InvalidInput, match=r"^CLIP_stop_at_last_layers must be a whole number from 1 to 12"):
        a1111_request({"prompt": "x", "override_settings": {"CLIP_stop_at_last_layers": 13}}, rules, picture=False)


def test_upscaler_lists_are_what_the_servers_hires_fix_offers_in_a1111s_shapes():
    from pipeline.contract.hires import LATENT_UPSCALERS
    from web.apis.a1111 import latent_upscale_items, upscaler_items

    none = {"name": "None", "model_name": None, "model_path": None, "model_url": None, "scale": 4}
    plain = RequestRules(sizes=((64, 64),))
    assert upscaler_items(plain) == [none] and latent_upscale_items(plain) == []  # no hires fix: nothing to pick
    hires = RequestRules(sizes=((64, 64),), hires_scales=(2.0,))
    assert [item["name"] for item in upscaler_items(hires)] == ["None", "Lanczos", "Nearest"]
    assert latent_upscale_items(hires) == [{"name": name} for name in LATENT_UPSCALERS]
    assert latent_upscale_items(hires)[:2] == [{"name": "Latent"}, {"name": "Latent (antialiased)"}]
    # an upscaler the engine adds (an ESRGAN file, by its name) is listed after A1111's own, with no path
    extra = RequestRules(
        sizes=((64, 64),), hires_scales=(2.0,), hires_upscalers=(*hires.hires_upscalers, "4x-tiny-esrgan")
    )
    assert upscaler_items(extra)[-1] == {
        "name": "4x-tiny-esrgan",
        "model_name": "4x-tiny-esrgan",
        "model_path": None,
        "model_url": None,
        "scale": 4,
    }
    assert latent_upscale_items(extra) == latent_upscale_items(hires)


def test_a_remote_engines_upscalers_come_from_its_info():
    from web.apis.a1111 import upscaler_items
    from web.engines.pool import EnginePool
    from web.engines.remote import RemoteEngines

    info = {
        "model": "m",
        "steps": 3,
        "sizes": [[64, 64]],
        "guidance_scale": 5.0,
        "cfg": True,
        "levers": True,
        "loras": [],
        "hires_scales": [2.0],
        "num_images": 2,
        "device_kind": "cpu",
        "device_summary": "2 × cpu",
        "sampler_settings": {"label": "Euler", "timestep_spacing": "leading", "cfg": True},
    }
    older = RemoteEngines(EnginePool(["http://127.0.0.1:9"]), info)  # nothing contacted
    assert [item["name"] for item in upscaler_items(older.rules)] == ["None", "Lanczos", "Nearest"]
    newer = RemoteEngines(EnginePool(["http://127.0.0.1:9"]), {**info, "hires_upscalers": ["Latent", "Lanczos", "x"]})
    assert [item["name"] for item in upscaler_items(newer.rules)] == ["None", "Lanczos", "x"]


def test_hr_upscaler_none_is_a1111s_lanczos_resize():
    rules = RequestRules(sizes=((64, 64),), hires_scales=(2.0,))
    given = a1111_request({"prompt": "x", "enable_hr": True, "hr_upscaler": "None"}, rules, picture=False).given
    assert given["hires_upscaler"] == "Lanczos"
    given = a1111_request({"prompt": "x", "enable_hr": True, "hr_upscaler": None}, rules, picture=False).given
    assert given["hires_upscaler"] == "Latent"


@pytest.mark.parametrize(
    ("body", "sentence"),
    [
        (b'{"prompt": "a cat",}', "The request body is not valid JSON (line 1, column 20)."),
        (b"[1, 2", "The request body is not valid JSON (line 1, column 6)."),
        (b"\xff\xfe{", "The request body is not valid JSON."),
        (b"  ", "The request body is empty; send a JSON object."),
        (b'["a cat"]', "The request body must be a JSON object ({...}); got a JSON array."),
        (b'"a cat"', "The request body must be a JSON object ({...}); got a JSON string."),
    ],
)
def test_a_body_that_is_not_a_json_object_is_said_as_what_it_is(body, sentence):
    """Issue 68: broken JSON was called "not a JSON object"; both APIs' bodies (A1111's and OpenAI's) read it here."""
    with pytest.raises(InvalidInput) as info:
        json_object(body)
    assert str(info.value) == sentence
    assert json_object(b'{"prompt": "a cat"}') == {"prompt": "a cat"}


def test_a1111s_inpaint_area_and_mask_blur_map_onto_the_tables_fields():
    """`inpaint_full_res` (true or 1: "Only masked"), its padding and `mask_blur` become the table's fields, when
    sent; `inpainting_fill` has no counterpart and changes nothing."""
    rules = RequestRules(sizes=((64, 64),))
    asked = a1111_request(
        {"prompt": "a", "inpaint_full_res": 1, "inpaint_full_res_padding": 16, "mask_blur": 8, "inpainting_fill": 0},
        rules,
        picture=True,
    )
    assert {key: asked.given[key] for key in ("inpaint_area", "only_masked_padding", "mask_blur")} == {
        "inpaint_area": "Only masked",
        "only_masked_padding": 16,
        "mask_blur": 8,
    }
    assert "inpainting_fill" not in asked.given
    whole = a1111_request({"prompt": "a", "inpaint_full_res": False}, rules, picture=True).given
    assert whole["inpaint_area"] == "Whole picture" and "only_masked_padding" not in whole
    assert "inpaint_area" not in a1111_request({"prompt": "a"}, rules, picture=True).given
