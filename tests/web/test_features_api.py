"""LoRAs, a picture to start from and the speed levers through the page's API (issues 27, 28, 29), end to end: the
feature engine (tiny-pt on 2 devices, the fixture LoRAs, the levers) served by Gradio, called with gradio_client.

Each feature gives, through /generate_png, the very pixels the engine gives in Python for the same request, says
itself in the status line and in the images' parameters, compiles nothing, and each bad value is one sentence: the
one pipeline.contract.request gives.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import FEATURE_DEVICES, FIXTURES, LORA_NAMES, page_client, served
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from PIL import Image

from pipeline.contract.errors import InvalidInput
from pipeline.contract.image_files import read_parameters
from pipeline.contract.request import parse_request

PICTURE, MASK = FIXTURES / "image-input.png", FIXTURES / "image-mask.png"
PROMPT = "a cozy cabin in a snowy forest"


def answer(stream):
    """An endpoint's answer: the last of what it yields (previews come first)."""
    return list(stream)[-1]


@pytest.fixture(scope="module")
def page(feature_engine):
    with served(feature_engine) as page:
        yield page


@pytest.fixture(scope="module")
def client(page, tmp_path_factory):
    return page_client(page, tmp_path_factory)


def pixels_of(gallery) -> np.ndarray:
    return np.stack([np.asarray(Image.open(item["image"]).convert("RGB")) for item in gallery])  # [B, H, W, 3]


def in_python(engine, prompt: str = PROMPT, **fields) -> np.ndarray:
    """The same request through the engine's Python entry point: its images, uint8 [B, H, W, 3]."""
    result = engine.generate(engine.request(prompt, **fields))
    return np.stack([np.asarray(image) for image in result.images])


def test_loras_tags_and_field_through_the_api(client, feature_engine):
    before = feature_engine.compile_count
    prompt = f"{PROMPT} <lora:kohya_sgm:0.8>"
    gallery, seed, status = client.predict(
        prompt=prompt,
        seed=7,
        randomize_seed=False,
        steps=3,
        loras=[["peft", 0.5, 1.2], ["", 1]],
        api_name="/generate_png",
    )
    assert seed == 7 and len(gallery) == FEATURE_DEVICES
    assert status.endswith("· seed 7 · LoRA kohya_sgm 0.8, peft 0.5/1.2"), status
    text = read_parameters(gallery[0]["image"])
    assert text.startswith(f"{PROMPT} <lora:kohya_sgm:0.8> <lora:peft:0.5:1.2>\n")
    assert 'Lora hashes: "kohya_sgm: ' in text and ", peft: " in text
    expected = in_python(feature_engine, prompt, seed=7, steps=3, loras=[["peft", 0.5, 1.2]])
    np.testing.assert_array_equal(pixels_of(gallery), expected)
    plain, _, _ = client.predict(prompt=PROMPT, seed=7, randomize_seed=False, steps=3, api_name="/generate_png")
    assert not np.array_equal(pixels_of(plain), expected)
    assert feature_engine.compile_count == before


def test_picture_mask_and_strength_through_the_api(client, feature_engine):
    before = feature_engine.compile_count
    common = {"prompt": PROMPT, "seed": 7, "randomize_seed": False, "steps": 4, "api_name": "/generate_png"}
    gallery, _, status = client.predict(
        init_image=handle_file(PICTURE), mask_image=handle_file(MASK), strength=0.6, **common
    )
    assert "· inpainted, strength 0.6" in status and "· 2 steps, Euler ·" in status, status  # int(4 × 0.6) = 2
    assert "Denoising strength: 0.6" in read_parameters(gallery[0]["image"])
    expected = in_python(feature_engine, seed=7, steps=4, init_image=PICTURE, mask_image=MASK, strength=0.6)
    np.testing.assert_array_equal(pixels_of(gallery), expected)
    whole, _, status = client.predict(init_image=handle_file(PICTURE), strength=0.75, **common)
    assert "· from a picture, strength 0.75" in status and "· 3 steps, Euler ·" in status, status
    np.testing.assert_array_equal(pixels_of(whole), in_python(feature_engine, seed=7, steps=4, init_image=PICTURE))
    assert not np.array_equal(pixels_of(whole), expected)
    assert feature_engine.compile_count == before


def test_outpaint_and_only_masked_through_the_api(client, feature_engine):
    """Outpainting and inpaint only masked (issue 69) through gradio_client: the Python entry point's pixels, their
    `parameters`, no compile; a canvas that leaves the picture no room is the request's one sentence."""
    before = feature_engine.compile_count
    common = {"prompt": PROMPT, "seed": 7, "randomize_seed": False, "steps": 4, "api_name": "/generate_png"}
    grown, _, _ = client.predict(init_image=handle_file(PICTURE), outpaint="left=16 right=16", strength=1, **common)
    assert "Mask blur: 4, Outpaint: left=16 right=16" in read_parameters(grown[0]["image"])
    fields = {"seed": 7, "steps": 4, "init_image": PICTURE}
    np.testing.assert_array_equal(
        pixels_of(grown), in_python(feature_engine, outpaint="left=16 right=16", strength=1, **fields)
    )
    masked, _, _ = client.predict(
        init_image=handle_file(PICTURE), mask_image=handle_file(MASK), inpaint_area="only_masked", **common
    )
    assert "Inpaint area: Only masked, Masked area padding: 32" in read_parameters(masked[0]["image"])
    np.testing.assert_array_equal(
        pixels_of(masked), in_python(feature_engine, mask_image=MASK, inpaint_area="Only masked", **fields)
    )
    with pytest.raises(AppError, match=r"Outpainting left=40 right=40 leaves no room for the picture in 64×64"):
        client.predict(init_image=handle_file(PICTURE), outpaint="left=40 right=40", **common)
    assert feature_engine.compile_count == before


def test_speed_levers_through_the_api(client, feature_engine):
    before = feature_engine.compile_count
    gallery, _, status = client.predict(
        prompt=PROMPT, seed=7, randomize_seed=False, steps=4, cfg_end=0.5, deepcache=2, api_name="/generate_png"
    )
    assert status.endswith("· seed 7 · CFG end 0.5 · DeepCache 2"), status
    assert read_parameters(gallery[0]["image"]).endswith("CFG end: 0.5, DeepCache: 2")
    np.testing.assert_array_equal(
        pixels_of(gallery), in_python(feature_engine, seed=7, steps=4, cfg_end=0.5, deepcache=2)
    )
    assert feature_engine.compile_count == before


def test_zero_compiles_through_gradio_client_over_a_mix(client, feature_engine):
    """Every feature at once and in turn, on /generate (JPEG): the start-up programs serve them all."""
    before = feature_engine.compile_count
    mixes = [
        {"loras": [["locon", -0.7], ["kohya_diffusers", 1.1]], "cfg_end": 0.25, "deepcache": 3, "sampler": "Euler a"},
        {
            "init_image": handle_file(PICTURE),
            "mask_image": handle_file(MASK),
            "strength": 1,
            "loras": [["peft", 1]],
            "deepcache": 2,
            "sampler": "DPM++ 2M Karras",
        },
        {"init_image": handle_file(PICTURE), "strength": 0.5, "cfg_end": 0.5, "sampler": "DPM++ 2M", "clip_skip": 1},
        {"prompt": "a fox <lora:kohya_sgm:0.6:1.3>", "init_image": handle_file(PICTURE), "strength": 0.9},
        {},
    ]
    for mix in mixes:
        fields = {"prompt": PROMPT, "seed": 3, "randomize_seed": False, "steps": 4, **mix}
        gallery, _, status = client.predict(**fields, api_name="/generate")
        assert len(gallery) == FEATURE_DEVICES and status.startswith(f"{FEATURE_DEVICES} images in "), status
    assert feature_engine.compile_count == before


# ---- bad values: one sentence each, pipeline.contract.request's ------------------------------------------------------


@pytest.fixture(scope="module")
def not_a_picture(tmp_path_factory):
    path = tmp_path_factory.mktemp("upload") / "notes.png"
    path.write_text("these are notes, not a picture")
    return path


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt": "a cabin <lora:nope:1>"},
        {"loras": [["kohya_sgm", 50]]},
        {"loras": [["dora", 1]]},
        {"prompt": "a cabin <lora:peft:1>", "loras": [["peft", 0.5]]},
        {"loras": "peft"},
        {"init_image": PICTURE, "strength": 0},
        {"init_image": PICTURE, "strength": 1.5},
        {"init_image": PICTURE, "strength": 0.3, "steps": 2},
        {"mask_image": MASK},
        {"init_image": "NOT_A_PICTURE"},
        {"init_image": PICTURE, "mask_image": "NOT_A_PICTURE"},
        {"cfg_end": 0},
        {"deepcache": 9},
    ],
    ids=[
        "unknown-lora",
        "weight",
        "refused-file",
        "twice",
        "loras-not-a-list",
        "strength-0",
        "strength-1.5",
        "no-step-left",
        "mask-alone",
        "image-not-a-picture",
        "mask-not-a-picture",
        "cfg-end-0",
        "deepcache-9",
    ],
)
def test_bad_feature_values_are_one_sentence(client, feature_engine, not_a_picture, fields):
    local = {k: not_a_picture if v == "NOT_A_PICTURE" else v for k, v in fields.items()}
    with pytest.raises(InvalidInput) as info:
        parse_request(**{"prompt": PROMPT, "rules": feature_engine.rules, **local})
    message = str(info.value)
    assert "\n" not in message and message.endswith(".")
    sent = {k: handle_file(v) if k.endswith("_image") else v for k, v in local.items()}
    with pytest.raises(AppError) as error:
        client.predict(**{"prompt": PROMPT, **sent}, api_name="/generate")
    assert str(error.value) == message
    gallery, _, _ = client.predict(prompt=PROMPT, steps=2, api_name="/generate")  # the next request still works
    assert len(gallery) == FEATURE_DEVICES


# ---- the page's controls -----------------------------------------------------------------------------------------


def test_page_offers_the_pickers_sliders_and_picture_controls(page, feature_engine):
    config = httpx.get(page.local_url.rstrip("/") + "/config").json()
    by_id = {c["props"].get("elem_id"): c for c in config["components"] if c["props"].get("elem_id")}
    for elem_id in (
        "lora-picker",
        "cfg-end",
        "deepcache",
        "picture-settings",
        "init-image",
        "mask-editor",
        "strength",
        "vary-subtle",
        "vary-strong",
    ):
        assert elem_id in by_id, elem_id
    for slot in range(1, 5):
        choices = [choice[1] for choice in by_id[f"lora-{slot}"]["props"]["choices"]]
        assert choices == ["", *LORA_NAMES]
        weight = by_id[f"lora-weight-{slot}"]["props"]
        assert (weight["minimum"], weight["maximum"], weight["value"]) == (-2, 2, 1)
    assert by_id["lora-picker"]["props"]["visible"] is True
    assert (by_id["deepcache"]["props"]["minimum"], by_id["deepcache"]["props"]["value"]) == (1, 1)
    assert by_id["cfg-end"]["props"]["value"] == 1 and by_id["strength"]["props"]["value"] == 0.75
    assert "kohya_sgm" in json.dumps(config)
    embeddings = by_id["embeddings"]["props"]  # the embedding fixtures (--embeddings-dir), listed by name
    assert embeddings["visible"] is True and "`zqxtoken`" in embeddings["value"]


# ---- the page's picture handlers, called as Gradio calls them ------------------------------------------------------


def test_a_stroke_painted_in_the_editor_is_the_mask(page, feature_engine, tmp_path):
    """The editor's layer (a transparent PNG with a stroke) becomes the repaint mask: white where painted; the page
    then runs what the API runs with that mask. Nothing painted: the whole picture is redrawn (no mask)."""
    from web.page.handlers import painted_mask

    stroke = np.zeros((80, 96, 4), np.uint8)  # the picture's size (96x80), as the editor's layers are
    stroke[20:50, 30:70] = (255, 0, 255, 200)
    layer = tmp_path / "layer.png"
    Image.fromarray(stroke, "RGBA").save(layer)
    empty = tmp_path / "empty.png"
    Image.fromarray(np.zeros((80, 96, 4), np.uint8), "RGBA").save(empty)
    mask = painted_mask({"background": str(PICTURE), "layers": [{"path": str(layer)}, {"path": str(empty)}]})
    assert np.array_equal(np.asarray(mask) == 255, stroke[..., 3] > 0)
    assert painted_mask({"background": str(PICTURE), "layers": [{"path": str(empty)}]}) is None
    assert painted_mask({"background": str(PICTURE), "layers": []}) is None

    generate = page.handlers.endpoint("png")
    editor = {"background": {"path": str(PICTURE)}, "layers": [{"path": str(layer)}], "composite": None}
    before = feature_engine.compile_count
    picked = {"path": str(PICTURE)}
    gallery, seed, status = answer(
        generate(
            PROMPT,
            seed=7,
            randomize_seed=False,
            steps=4,
            init_image=picked,
            strength=0.5,
            picture=editor,
            progress=lambda *a, **k: None,
        )
    )
    assert "· inpainted, strength 0.5" in status, status
    expected = in_python(feature_engine, seed=7, steps=4, init_image=PICTURE, mask_image=mask, strength=0.5)
    np.testing.assert_array_equal(np.stack([np.asarray(Image.open(p)) for p, _ in gallery]), expected)
    unpainted = {**editor, "layers": [{"path": str(empty)}]}
    _, _, status = answer(
        generate(
            PROMPT,
            seed=7,
            randomize_seed=False,
            steps=4,
            init_image=picked,
            strength=0.5,
            picture=unpainted,
            progress=lambda *a, **k: None,
        )
    )
    assert "· from a picture, strength 0.5" in status, status
    assert feature_engine.compile_count == before


def test_vary_starts_from_the_selected_images_png(page, feature_engine):
    """Vary takes the session's clicked gallery image (its lossless PNG) as the picture, at 0.5 or 0.85, for its one
    generation (States: web/page/layout.py); without a selection it says so in one sentence, and so does "Use as
    picture"."""
    import gradio as gr

    handlers = page.handlers
    handlers.shown.select("", None)
    with pytest.raises(gr.Error) as error:
        handlers.vary(0.85)(None)
    assert error.value.message == "Click an image of the gallery first, then Vary."
    with pytest.raises(gr.Error) as error:
        handlers.keep_selected(None)
    assert error.value.message == 'Click an image of the gallery first, then "Use as picture".'
    gallery, _, _ = answer(
        handlers.endpoint()(PROMPT, seed=11, randomize_seed=False, steps=3, progress=lambda *a, **k: None)
    )
    chosen = gallery[1][0]
    handlers.shown.select("", Path(chosen).name)
    path, strength = handlers.vary(0.85)(None)
    assert strength == 0.85 and path.endswith(".png") and handlers.keep_selected(None) == path
    with Image.open(path) as png:
        assert png.info["parameters"].startswith(PROMPT) and "Seed: 12," in png.info["parameters"]  # image 1
        shown = np.asarray(png.convert("RGB"))
    np.testing.assert_array_equal(shown, in_python(feature_engine, seed=11, steps=3)[1])  # lossless: the very pixels
    # What Vary's generation sends: the States' picture and strength, no mask editor (its strokes are another's).
    varied = handlers.endpoint()(
        PROMPT,
        seed=11,
        randomize_seed=False,
        steps=4,
        init_image=path,
        strength=strength,
        progress=lambda *a, **k: None,
    )
    _, _, status = answer(varied)
    assert status.endswith("· from a picture, strength 0.85"), status
