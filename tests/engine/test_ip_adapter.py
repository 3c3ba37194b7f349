"""Image prompts (IP-Adapter, issue 66): CLIP's preprocessing, the image encoder and both projections against
transformers and diffusers, the files as h94 publishes them (.safetensors and .bin alike), the one-sentence
refusals, and the engine's pictures against diffusers' PyTorch SDXL pipeline with `load_ip_adapter` (tests/fixtures/
ip-adapter-expected.*, scripts/make_ip_adapter_fixtures.py; no request compiles)."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil

import jax
import numpy as np
import pytest
from conftest import FIXTURES, TEST_SIZE, TINY_PT, needs_chromium, served_programs_only
from PIL import Image
from safetensors.numpy import load_file, save_file

from pipeline.checkpoint.ip_adapter_loading import load_image_encoder, load_ip_adapter, load_ip_adapters
from pipeline.contract.errors import CheckpointError, InvalidInput
from pipeline.contract.image_prompts import clip_pixels, windows
from pipeline.contract.parameters import parse_infotext, read_control_entry
from pipeline.contract.request import RequestRules, parse_request
from pipeline.device.nets.image_projection import image_projection
from pipeline.device.nets.unet import UNetConfig

ADAPTERS = FIXTURES / "ip-adapter"
PLAIN, PLUS = ADAPTERS / "ip-adapter_tiny.safetensors", ADAPTERS / "ip-adapter-plus_tiny.safetensors"
PICTURES = {"a": FIXTURES / "ip-adapter-image-a.png", "b": FIXTURES / "ip-adapter-image-b.png"}
MANIFEST = json.loads((FIXTURES / "ip-adapter-expected.json").read_text())
ARRAYS = np.load(FIXTURES / "ip-adapter-expected.npz")
CASES = {case["name"]: case for case in MANIFEST["cases"]}
UNET = UNetConfig.from_dict(json.loads((TINY_PT / "unet" / "config.json").read_text()))
OFFERED = RequestRules(sizes=((64, 64),), ip_adapters=("ip-adapter_tiny", "ip-adapter-plus_tiny"), ip_slots=2)


def _rgb(name: str) -> np.ndarray:
    return np.asarray(Image.open(PICTURES[name]).convert("RGB"))


@pytest.mark.parametrize("name", ["a", "b"])
def test_clip_pixels_are_clip_image_processors(name):
    """Shortest side to 32 (PIL bicubic), the centre crop, [0, 1], normalised: CLIPImageProcessor's pixels of a
    picture taller than wide and one wider than tall."""
    np.testing.assert_allclose(clip_pixels(_rgb(name), 32), ARRAYS[f"preprocess_{name}"][0], atol=1e-6)


def test_the_encoder_and_both_projections_are_transformers_and_diffusers():
    """The image encoder (transformers' CLIPVisionModelWithProjection safetensors, converted without torch): the
    projected embedding and the penultimate hidden states; the plain projection and the Plus resampler, read from
    h94's files, give diffusers' tokens for them and for the unconditional inputs (zeros; the encoded zero image)."""
    encoder = load_image_encoder(ADAPTERS / "image_encoder", "float32", use_cache=False)
    pixels = np.concatenate([ARRAYS["preprocess_a"], np.zeros_like(ARRAYS["preprocess_a"])])
    encoded = jax.jit(encoder.module.apply)({"params": encoder.params}, pixels)
    np.testing.assert_allclose(encoded.image_embeds[:1], ARRAYS["encoder_embeds_a"], atol=2e-5)
    np.testing.assert_allclose(encoded.hidden_states[-2][:1], ARRAYS["encoder_penultimate_a"], atol=2e-5)
    np.testing.assert_allclose(encoded.hidden_states[-2][1:], ARRAYS["encoder_penultimate_zero"], atol=2e-5)
    for path, reads, tokens in (
        (PLAIN, (ARRAYS["encoder_embeds_a"], np.zeros_like(ARRAYS["encoder_embeds_a"])), "plain"),
        (PLUS, (ARRAYS["encoder_penultimate_a"], ARRAYS["encoder_penultimate_zero"]), "plus"),
    ):
        adapter = load_ip_adapter(str(path), UNET, "float32")
        module = image_projection(adapter.projection)
        for read, expected in zip(reads, (f"proj_{tokens}_a", f"proj_{tokens}_uncond"), strict=True):
            got = module.apply({"params": adapter.params["image_proj"]}, read)
            np.testing.assert_allclose(got, ARRAYS[expected], atol=2e-5, err_msg=expected)


def test_a_bin_file_is_its_safetensors(tmp_path):
    """h94's .bin (torch.save of {image_proj, ip_adapter}) is read without torch into the same weights."""
    shutil.copytree(ADAPTERS / "image_encoder", tmp_path / "image_encoder")
    shutil.copy(ADAPTERS / "ip-adapter_tiny.bin", tmp_path / "tiny.bin")
    from_bin = load_ip_adapter(f"bin={tmp_path / 'tiny.bin'}", UNET, "float32")
    from_safetensors = load_ip_adapter(str(PLAIN), UNET, "float32")
    assert from_bin.name == "bin" and from_safetensors.name == "ip-adapter_tiny"
    for got, expected in zip(jax.tree.leaves(from_bin.params), jax.tree.leaves(from_safetensors.params), strict=True):
        np.testing.assert_array_equal(got, expected)


def _planted(tmp_path, name: str, change) -> str:
    """The plain fixture adapter with `change(tensors)` applied, beside the fixture's encoder."""
    if not (tmp_path / "image_encoder").exists():
        shutil.copytree(ADAPTERS / "image_encoder", tmp_path / "image_encoder")
    tensors = dict(load_file(str(PLAIN)))
    change(tensors)
    save_file(tensors, str(tmp_path / f"{name}.safetensors"))
    return str(tmp_path / f"{name}.safetensors")


def _sd15(tensors):  # 16 cross-attentions reading 768-wide tokens, as SD 1.5's adapters
    for key in [key for key in tensors if key.startswith("ip_adapter.")]:
        del tensors[key]
    for k in range(1, 32, 2):
        tensors[f"ip_adapter.{k}.to_k_ip.weight"] = np.zeros((64, 768), np.float16)
        tensors[f"ip_adapter.{k}.to_v_ip.weight"] = np.zeros((64, 768), np.float16)


def _faceid(tensors):  # FaceID's projection: an MLP of insightface's embedding
    tensors["image_proj.proj.0.weight"] = tensors.pop("image_proj.proj.weight")


def _vith(tensors):  # a projection reading 1024-wide embeddings (ViT-H's) beside a 48-wide encoder
    tensors["image_proj.proj.weight"] = np.zeros((384, 1024), np.float16)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_sd15, "it has 16 cross-attention layers, SDXL's UNet 17: an SD 1.5 adapter."),
        (_faceid, "it is a FaceID adapter, which needs insightface's face embedding"),
        (_vith, "it needs ViT-H image embeddings and the encoder beside it gives a 48-wide"),
    ],
)
def test_a_file_that_cannot_serve_is_refused_in_one_sentence(tmp_path, change, message):
    with pytest.raises(CheckpointError) as caught:
        load_ip_adapters([_planted(tmp_path, "planted", change)], UNET, "float32")
    text = str(caught.value)
    assert text.startswith("IP-Adapter 'planted' was not loaded: ") and message in text, text
    assert "\n" not in text and "Traceback" not in text


@pytest.mark.parametrize(
    ("ip_images", "message"),
    [
        (
            [{"image": "bm90IGFuIGltYWdl"}],
            "Unknown IP-Adapter None; choose one of: ip-adapter_tiny, ip-adapter-plus_tiny.",
        ),
        ([{"adapter": "ip-adapter_tiny"}], "An image prompt needs an image."),
        ([{"adapter": "nope", "image": "x"}], "Unknown IP-Adapter 'nope'; choose one of"),
        ([{"adapter": "ip-adapter_tiny", "image": "bm90IGFuIGltYWdl"}], "image prompt"),
        ([{"adapter": "ip-adapter_tiny", "image": PICTURES["a"].read_bytes(), "scale": 3}], "scale must be a number"),
        ([{"adapter": "ip-adapter_tiny", "image": PICTURES["a"].read_bytes()}] * 3, "At most 2 image prompts"),
        ("a picture", "ip_images must be a list"),
    ],
)
def test_a_bad_image_prompt_is_one_sentence(ip_images, message):
    with pytest.raises(InvalidInput) as caught:
        parse_request("a cat", rules=OFFERED, ip_images=ip_images)
    assert message in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_no_adapter_and_the_combinations_not_served_are_refused():
    picture = PICTURES["a"].read_bytes()
    with pytest.raises(InvalidInput, match="This server has no IP-Adapter"):
        parse_request("a cat", rules=RequestRules(sizes=((64, 64),)), ip_images=[{"image": picture}])
    with pytest.raises(InvalidInput, match="do not combine with PAG"):
        rules = RequestRules(sizes=((64, 64),), ip_adapters=("x",), pag=True)
        parse_request("a cat", rules=rules, ip_images=[{"image": picture}], pag_scale=3)


def test_a_window_is_a_controlnet_units_steps():
    """start/end fractions -> the plan rows [first, stop) where the slot acts: a ControlNet unit's rule."""
    request = parse_request(
        "a cat",
        rules=OFFERED,
        ip_images=[
            {"adapter": "ip-adapter_tiny", "image": PICTURES["a"].read_bytes(), "start": 0.25, "end": 0.75},
            {"adapter": "ip-adapter_tiny", "image": PICTURES["b"].read_bytes()},
        ],
    )
    first, stop = windows(request.ip_images, 4)
    assert first.tolist() == [1, 0] and stop.tolist() == [3, 4]
    assert windows(request.ip_images[:1], 8)[0].tolist() == [2] and windows(request.ip_images[:1], 8)[1].tolist() == [6]


@pytest.fixture(scope="module")
def ip_engine():
    """tiny-pt (the references' checkpoint) on one device with both fixture adapters, two slots, no levers, one
    window, no previews: it compiles, on first use, only the programs its tests run."""
    from pipeline.generator import Generator

    return Generator.from_pretrained(
        str(TINY_PT),
        devices=jax.devices()[:1],
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=2,
        dtype="float32",
        prompt_windows=1,
        previews=False,
        speed_levers=False,
        ip_adapters=(str(PLAIN), str(PLUS)),
    )


def _fields(case: dict) -> dict:
    """The request fields of a reference case (scripts/make_ip_adapter_fixtures.py)."""
    fields = {
        "negative_prompt": case["negative_prompt"] or "",
        "guidance_scale": case["guidance_scale"],
        "seed": case["seed"],
        "steps": case["steps"],
        "sampler": "Euler",
    }
    if case["adapter"]:
        adapter = case["adapter"].removesuffix(".safetensors")
        window = case.get("window") or {"start": 0.0, "end": 1.0}
        fields["ip_images"] = [
            {
                "adapter": adapter,
                "image": (FIXTURES / image).read_bytes(),
                "scale": case["scale"],
                "start": window["start"],
                "end": window["end"],
            }
            for image in case["images"]
        ]
    return fields


@pytest.mark.parametrize("name", sorted(CASES))
def test_engine_pictures_equal_diffusers(ip_engine, name):
    """The engine within 2 levels of diffusers' SDXL pipeline with `load_ip_adapter`: the plain adapter at scales 0,
    0.6 and 1, two pictures on it, a step window (diffusers' scale switched per step), no CFG, the Plus adapter; scale
    0 within 1 level of no image prompt. The `parameters` text writes each as sd-webui-controlnet's unit; nothing
    unserved compiles."""
    case = CASES[name]
    with served_programs_only(ip_engine):
        result = ip_engine.generate(ip_engine.request(case["prompt"], **_fields(case)))
    got = np.asarray(result.images[0]).astype(np.int16)
    expected = np.round(ARRAYS[name][0] * 255)
    assert np.abs(got - expected).max() <= (1 if name in ("none", "plain_0") else 2), name
    none = np.round(ARRAYS["none"][0] * 255)
    assert name in ("none", "plain_0") or np.abs(got - none).max() > 4, name  # the image prompt acted
    settings = parse_infotext(result.parameters[0]).settings
    units = [read_control_entry(value) for key, value in settings.items() if key.startswith("ControlNet ")]
    assert len(units) == len(case["images"])
    if units:
        assert units[0]["name"] == case["adapter"].removesuffix(".safetensors") and units[0]["weight"] == case["scale"]
        assert units[0]["module"] == ("ip-adapter_clip_sdxl_plus_vith" if "plus" in name else "ip-adapter_clip_sdxl")


def test_the_page_offers_it_and_gradio_client_and_a1111_reach_the_engine(ip_engine, tmp_path):
    """The page shows its "Image prompt" section (two slots, the adapter to choose: two are loaded); a gradio_client
    call with `ip_images` and A1111's API with an sd-webui-controlnet IP-Adapter unit each give the engine's picture
    of the same request, and their PNGs say the unit as A1111 writes it."""
    import base64

    import httpx
    from conftest import served
    from gradio_client import Client

    from pipeline.contract import image_files
    from web.apis import ApiAccess

    case = CASES["plain_0.6"]
    fields = _fields(case)
    with served_programs_only(ip_engine):
        expected = np.asarray(ip_engine.generate(ip_engine.request(case["prompt"], **fields)).images[0])
    encoded = base64.b64encode(PICTURES["a"].read_bytes()).decode("ascii")
    with served(ip_engine, apis=ApiAccess()) as page:
        config = httpx.get(page.local_url.rstrip("/") + "/config").json()
        shown = {c["props"].get("elem_id"): c["props"].get("visible") for c in config["components"]}
        assert shown["image-prompt-settings"] is True and shown["ip-adapter-0"] is True and "ip-image-1" in shown
        client = Client(page.local_url, verbose=False, download_files=str(tmp_path))
        item = {"image": encoded, "adapter": "ip-adapter_tiny", "scale": 0.6}
        common = {key: value for key, value in fields.items() if key not in ("ip_images", "sampler")}
        with served_programs_only(ip_engine):
            gallery, _, _ = client.predict(
                case["prompt"],
                randomize_seed=False,
                sampler="Euler",
                ip_images=[item],
                api_name="/generate_png",
                **common,
            )
            payload = {
                "prompt": case["prompt"],
                "negative_prompt": case["negative_prompt"],
                "seed": case["seed"],
                "steps": case["steps"],
                "cfg_scale": case["guidance_scale"],
                "sampler_name": "Euler",
                "width": TEST_SIZE,
                "height": TEST_SIZE,
                "alwayson_scripts": {
                    "controlnet": {
                        "args": [
                            {
                                "module": "ip-adapter_clip_sdxl",
                                "model": "ip-adapter_tiny [abc]",
                                "weight": 0.6,
                                "image": encoded,
                            }
                        ]
                    }
                },
            }
            answer = httpx.post(page.local_url.rstrip("/") + "/sdapi/v1/txt2img", json=payload, timeout=600).json()
        picture = gallery[0]["image"]
        np.testing.assert_array_equal(np.asarray(Image.open(picture).convert("RGB")), expected)
        unit = read_control_entry(parse_infotext(image_files.read_parameters(picture)).settings["ControlNet 0"])
        assert unit == {
            "module": "ip-adapter_clip_sdxl",
            "name": "ip-adapter_tiny",
            "weight": 0.6,
            "start": 0.0,
            "end": 1.0,
        }
        a1111 = Image.open(io.BytesIO(base64.b64decode(answer["images"][0]))).convert("RGB")
        np.testing.assert_array_equal(np.asarray(a1111), expected)
        assert "ip-adapter_clip_sdxl" in json.loads(answer["info"])["infotexts"][0]


def test_the_command_line_gives_each_image_its_settings():
    """--ip-image FILE (repeated) with the i-th --ip-image-adapter, --ip-scale, --ip-start, --ip-end."""
    from pipeline.__main__ import build_parser, image_prompt_units

    args = build_parser().parse_args(
        ["generate", "--prompt", "a cat", "--out", "x", "--ip-image", "a.png", "--ip-image", "b.png"]
        + ["--ip-scale", "0.8", "--ip-scale", "1.2", "--ip-start", "0.25", "--ip-image-adapter", "plus"]
    )
    units = image_prompt_units(args)
    assert [os.fspath(unit["image"]) for unit in units] == ["a.png", "b.png"]
    assert units[0] == {**units[0], "scale": 0.8, "start": 0.25, "adapter": "plus"}
    assert units[1]["scale"] == 1.2 and "start" not in units[1] and "adapter" not in units[1]


#: The status line holds an answer other than `before` (each answer rewrites it: its time, its seed).
NEW_ANSWER = """(before) => { const text = document.querySelector('#status').innerText;
    return text !== before && / images? in /.test(text); }"""


@pytest.mark.browser
@needs_chromium
def test_the_page_in_a_browser_sends_the_image_prompt(ip_engine, browser):
    """Chromium: open "Image prompt", upload a picture into its first slot, choose the adapter, set the weight,
    Generate: the request the page sends carries it (`ip_images`: the adapter, the weight, the picture) and the
    answer comes back, running only served programs."""
    from conftest import ARTIFACTS, TIMEOUT_MS, open_advanced, open_section, served, set_sliders

    with served(ip_engine) as app_page, served_programs_only(ip_engine):
        tab = browser.new_page(viewport={"width": 1280, "height": 1100})
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(app_page.local_url, timeout=TIMEOUT_MS)
        tab.locator("#prompt textarea").fill("a lighthouse on a cliff at dusk")
        open_advanced(tab)
        open_section(tab, "image-prompt-settings", "Image prompt", "#ip-image-0")
        tab.locator("#ip-image-0 input[type=file]").set_input_files(str(PICTURES["a"]))
        tab.locator("#ip-image-0 img").wait_for(timeout=TIMEOUT_MS)
        tab.locator("#ip-adapter-0 input").click()
        tab.get_by_role("option", name="ip-adapter-plus_tiny", exact=True).click()
        set_sliders(tab, {"ip-scale-0": 0.8})  # waits until the slider holds it (a click right after could send 0.6)
        status = tab.locator("#status").inner_text()
        with tab.expect_request(
            lambda r: "/queue/join" in r.url and "ip-adapter-plus_tiny" in (r.post_data or "")
        ) as sent:
            tab.locator("#generate").click()
        tab.wait_for_function(NEW_ANSWER, arg=status, timeout=TIMEOUT_MS)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / "image-prompt.png"), full_page=True)
        body = json.loads(sent.value.post_data)
        (prompt,) = next(
            value for value in body["data"] if isinstance(value, list) and value and "adapter" in str(value)
        )
        assert prompt["adapter"] == "ip-adapter-plus_tiny" and prompt["scale"] == 0.8 and prompt["start"] == 0
        assert Image.open(io.BytesIO(base64.b64decode(prompt["image"]))).size == Image.open(PICTURES["a"]).size
        assert "seed" in tab.locator("#status").inner_text() and not errors, errors
        tab.close()
