"""Settings back from an image: this app's PNG/JPEG, an A1111 PNG and JPEG, a ComfyUI PNG, and files without any."""

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from pipeline.contract import image_files as image_io
from pipeline.contract.errors import InvalidInput
from pipeline.contract.parameters import describe, parse_infotext
from pipeline.contract.sampler_names import SAMPLER_NAMES
from web.page.png_info import COMFY_ONLY, NO_PARAMETERS, NOT_AN_IMAGE, form_values, read_form_values, read_infotext

#: What A1111 1.10 writes for an SDXL txt2img with hires fix, two LoRAs and two embeddings (multi-line prompt).
A1111_TEXT = (
    "masterpiece, best quality, a (red fox:1.2) sitting in a snowy forest at dawn, <lora:add_detail:0.6>\n"
    "detailed fur, volumetric light, <lora:film_grain:0.3>\n"
    "Negative prompt: lowres, bad anatomy, (worst quality:1.4), text, watermark, EasyNegative\n"
    "badhandv4\n"
    "Steps: 30, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 6.5, Seed: 3141592653, Size: 832x1216, "
    "Model hash: 31e35c80fc, Model: sd_xl_base_1.0, VAE hash: 235745af8d, VAE: sdxl_vae.safetensors, "
    "Denoising strength: 0.35, Clip skip: 2, Hires upscale: 1.5, Hires steps: 12, Hires upscaler: 4x-UltraSharp, "
    'Lora hashes: "add_detail: 7c6bad76eb54, film_grain: 0f3c2d1a9b77", '
    'TI hashes: "EasyNegative: c74b4e810b03, badhandv4: 5e40d722fc3d", Emphasis: Original, Version: v1.10.1'
)
#: ComfyUI's graph chunks (abridged, real keys) beside A1111-style `parameters` from an image-saver node.
COMFY_PROMPT = {"3": {"class_type": "KSampler", "inputs": {"seed": 42, "steps": 25, "cfg": 7.0}}}
COMFY_WORKFLOW = {"last_node_id": 9, "nodes": [{"id": 3, "type": "KSampler"}], "version": 0.4}
COMFY_TEXT = (
    "cinematic photo of a lighthouse in a storm\n"
    "Negative prompt: blurry, cartoon\n"
    "Steps: 25, Sampler: dpmpp_2m karras, CFG scale: 7.0, Seed: 42, Size: 1024x1024, Model hash: 31e35c80fc, "
    "Model: sd_xl_base_1.0, Version: ComfyUI"
)


def _pixels(height=32, width=48):
    return np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _png(path, chunks: dict) -> str:
    info = PngImagePlugin.PngInfo()
    for key, value in chunks.items():
        info.add_text(key, value)
    Image.fromarray(_pixels()).save(path, format="PNG", pnginfo=info)
    return str(path)


def _own_image(tmp_path, saver, **overrides):
    settings = dict(
        prompt="a lighthouse, oil painting, dramatic light",
        negative_prompt="blurry, text",
        seed=1234567,
        steps=25,
        guidance_scale=5.5,
        height=768,
        width=1344,
        model="/srv/models/my-sdxl",  # a local path: written by its directory name only
        dtype="bfloat16",
        sampler="DPM++ 2M Karras",
    )
    settings.update(overrides)
    image = image_io.to_pil(_pixels()[None], [describe(**settings)])[0]
    return saver(image, tmp_path / f"own{'.png' if saver is image_io.save_png else '.jpg'}")


@pytest.mark.parametrize("saver", [image_io.save_png, image_io.save_jpeg], ids=["png", "jpeg"])
def test_this_apps_own_images_fill_the_form(tmp_path, saver):
    values = read_form_values(_own_image(tmp_path, saver), SAMPLER_NAMES)
    assert values.prompt == "a lighthouse, oil painting, dramatic light"
    assert values.negative_prompt == "blurry, text"
    assert (values.steps, values.sampler, values.guidance_scale, values.seed) == (25, "DPM++ 2M Karras", 5.5, 1234567)
    assert (values.width, values.height) == (1344, 768)
    assert values.extra == {"Model": "my-sdxl", "Dtype": "bfloat16"}
    assert values.notes == ()


def test_own_labels_with_v_prediction_spacing_and_unet(tmp_path):
    path = _own_image(
        tmp_path, image_io.save_png, sampler="Euler a, v-prediction", spacing="trailing", unet="repo/x:unet.safetensors"
    )
    values = read_form_values(path, SAMPLER_NAMES)
    assert values.sampler == "Euler a"  # the label's ", v-prediction" is the server's, not a separate pair
    assert values.extra == {
        "Model": "my-sdxl",
        "UNet": "unet.safetensors",
        "Dtype": "bfloat16",
        "Timestep spacing": "trailing",
    }


def test_a1111_png_every_pair_typed(tmp_path):
    path = _png(tmp_path / "a1111.png", {"parameters": A1111_TEXT})
    values = read_form_values(path, SAMPLER_NAMES)
    assert values.prompt == (
        "masterpiece, best quality, a (red fox:1.2) sitting in a snowy forest at dawn, <lora:add_detail:0.6>\n"
        "detailed fur, volumetric light, <lora:film_grain:0.3>"
    )
    negative = "lowres, bad anatomy, (worst quality:1.4), text, watermark, EasyNegative\nbadhandv4"
    assert values.negative_prompt == negative
    assert values.steps == 30 and values.guidance_scale == 6.5 and values.seed == 3141592653
    assert values.sampler == "DPM++ 2M Karras"  # "DPM++ 2M" + "Schedule type: Karras"
    assert (values.width, values.height) == (832, 1216)
    assert values.extra == {
        "Model hash": "31e35c80fc",
        "Model": "sd_xl_base_1.0",
        "VAE hash": "235745af8d",
        "VAE": "sdxl_vae.safetensors",
        "Denoising strength": 0.35,
        "Clip skip": 2,
        "Hires upscale": 1.5,
        "Hires steps": 12,
        "Hires upscaler": "4x-UltraSharp",
        "Lora hashes": {"add_detail": "7c6bad76eb54", "film_grain": "0f3c2d1a9b77"},
        "TI hashes": {"EasyNegative": "c74b4e810b03", "badhandv4": "5e40d722fc3d"},
        "Emphasis": "Original",
        "Version": "v1.10.1",
    }
    assert values.notes == ()


def test_a1111_jpeg_exif_unicode_and_ascii(tmp_path):
    """A1111 writes JPEG/WebP parameters in EXIF UserComment as piexif's "UNICODE" (UTF-16 BE); ASCII also reads."""
    image = Image.fromarray(_pixels())
    image.info[image_io.PARAMETERS_KEY] = A1111_TEXT
    jpeg = image_io.save_jpeg(image, tmp_path / "a1111.jpg")
    assert read_infotext(jpeg) == A1111_TEXT
    webp = tmp_path / "a1111.webp"
    Image.fromarray(_pixels()).save(webp, format="WEBP", exif=image_io.exif_with_parameters(A1111_TEXT))
    assert read_form_values(webp, SAMPLER_NAMES).seed == 3141592653
    ascii_jpeg = tmp_path / "ascii.jpg"
    Image.fromarray(_pixels()).save(ascii_jpeg, format="JPEG", exif=_exif_comment(b"ASCII\0\0\0" + COMFY_TEXT.encode()))
    assert read_form_values(ascii_jpeg, SAMPLER_NAMES).seed == 42


def test_utf16_little_endian_comment_is_read(tmp_path):
    """Some writers put little-endian UTF-16 after the "UNICODE" prefix; it must not come back as CJK noise."""
    path = tmp_path / "le.jpg"
    text = COMFY_TEXT.replace("lighthouse", "phare ☂ à Brest")
    Image.fromarray(_pixels()).save(path, format="JPEG", exif=_exif_comment(b"UNICODE\0" + text.encode("utf-16-le")))
    assert read_infotext(path) == text


def test_comfyui_png_with_a1111_parameters(tmp_path):
    path = _png(
        tmp_path / "comfy.png",
        {"prompt": json.dumps(COMFY_PROMPT), "workflow": json.dumps(COMFY_WORKFLOW), "parameters": COMFY_TEXT},
    )
    values = read_form_values(path, SAMPLER_NAMES)
    assert values.prompt == "cinematic photo of a lighthouse in a storm"
    assert values.sampler == "DPM++ 2M Karras"  # ComfyUI's "dpmpp_2m" sampler with its "karras" scheduler
    assert (values.steps, values.guidance_scale, values.seed, values.width) == (25, 7.0, 42, 1024)
    assert values.extra["Version"] == "ComfyUI"


def test_samplers_not_offered_are_left_with_a_note():
    values = form_values(parse_infotext("a cat\nSteps: 20, Sampler: DPM++ SDE, CFG scale: 7, Seed: 5"), SAMPLER_NAMES)
    assert values.sampler is None and values.extra["Sampler"] == "DPM++ SDE"
    assert values.notes == ("Sampler 'DPM++ SDE' is not offered here, so the sampler was left as it is.",)
    assert values.width is None and values.height is None  # no Size: left as it is
    unmapped = form_values(parse_infotext("a cat\nSteps: 20, Sampler: DPM++ SDE, CFG scale: 7, Seed: 5"))
    assert unmapped.sampler == "DPM++ SDE"  # nothing to match against: passed on as written


def test_values_that_do_not_parse_become_notes():
    values = form_values(parse_infotext("x\nSteps: many, CFG scale: 7, Seed: 5, Size: big"), SAMPLER_NAMES)
    assert values.steps is None and values.seed == 5 and values.width is None
    assert values.notes == (
        "Steps 'many' is not a number, so it was left as it is.",
        "Size 'big' is not WIDTHxHEIGHT, so the size was left as it is.",
    )


def test_a_last_line_with_few_pairs_is_prompt():
    """A1111's rule: the settings line needs three pairs; fewer means the line belongs to the prompt."""
    info = parse_infotext("portrait of a knight\nstyle: baroque, mood: calm")
    assert info.prompt == "portrait of a knight\nstyle: baroque, mood: calm" and info.settings == {}
    assert parse_infotext("just a prompt") == parse_infotext("just a prompt\n")
    assert parse_infotext("just a prompt").prompt == "just a prompt"


def test_quoted_values_keep_commas_escapes_and_colons():
    info = parse_infotext(
        'p\nSteps: 2, ADetailer prompt: "a face, smiling \\"broadly\\"", Seed: 1, Model: a:b, Tags: "x, y"'
    )
    assert info.settings == {
        "Steps": "2",
        "ADetailer prompt": 'a face, smiling "broadly"',
        "Seed": "1",
        "Model": "a:b",
        "Tags": "x, y",
    }


def test_files_without_parameters_get_one_sentence(tmp_path):
    plain = tmp_path / "plain.png"
    Image.fromarray(_pixels()).save(plain)
    comfy = _png(tmp_path / "comfy-only.png", {"prompt": json.dumps(COMFY_PROMPT), "workflow": "{}"})
    text = tmp_path / "notes.png"
    text.write_text("not an image at all")
    for path, message in ((plain, NO_PARAMETERS), (comfy, COMFY_ONLY), (text, NOT_AN_IMAGE)):
        with pytest.raises(InvalidInput) as caught:
            read_form_values(path, SAMPLER_NAMES)
        assert str(caught.value) == message
        assert str(caught.value).count(".") == 1 and str(caught.value).endswith(".")  # one sentence


def _exif_comment(comment: bytes) -> bytes:
    """EXIF with one UserComment (as pipeline.images writes it, any prefix/encoding)."""
    sub_ifd = 8 + 2 + 12 + 4
    data = sub_ifd + 2 + 12 + 4
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8)
    tiff += struct.pack(">HHHII", 1, image_io.EXIF_IFD, 4, 1, sub_ifd) + struct.pack(">I", 0)
    tiff += struct.pack(">HHHII", 1, image_io.USER_COMMENT, 7, len(comment), data) + struct.pack(">I", 0)
    return b"Exif\x00\x00" + tiff + comment


# ---- on the page: a dropped image fills the form -------------------------------------------------------------------

from conftest import ARTIFACTS, TIMEOUT_MS, needs_chromium, open_advanced, served  # noqa: E402


@pytest.fixture(scope="module")
def png_info_page(ui_engine):
    with served(ui_engine) as page:
        yield page


def _values(page, updates) -> dict:
    """The form's updates as {field label: new value}, only the fields that change."""
    labels = [
        "prompt",
        "negative",
        "style",
        "guidance",
        "seed",
        "randomize",
        "aspect",
        "steps",
        "sampler",
        "cfg_end",
        "deepcache",
        *[f"lora{i}" for i in range(len(page.form.lora_rows))],
        "strength",
        "schedule_type",
        "refiner_switch",
        "aesthetic_score",
        "negative_aesthetic_score",
        "clip_skip",
        "hires_scale",
        "hires_steps",
        "hires_denoise",
        "hires_upscaler",
        "mask_blur",
        "inpaint_area",
        "only_masked_padding",
        "inpaint_overlay",
        "pag_scale",
        "pag_adaptive_scale",
        "freeu",
        "regions",
        "region_base",
        "file",
    ]
    return {label: update["value"] for label, update in zip(labels, updates, strict=True) if "value" in update}


def test_this_apps_png_fills_every_field_it_names(png_info_page, tmp_path):
    from gradio_client import Client

    client = Client(png_info_page.local_url, verbose=False, download_files=str(tmp_path))
    gallery, _, _ = client.predict(
        "a paper lantern at night",
        "smoke",
        seed=77,
        randomize_seed=False,
        steps=3,
        sampler="DPM++ 2M Karras",
        guidance_scale=6.5,
        aspect_ratio="224×128 (16:9)",
        api_name="/generate_png",
    )
    values = _values(png_info_page, png_info_page.form.from_image(gallery[0]["image"]))
    pickers = {f"lora{i}": "" if i % 2 == 0 else 1 for i in range(len(png_info_page.form.lora_rows))}  # cleared
    assert values == {
        "prompt": "a paper lantern at night",
        "negative": "smoke",
        "style": "No style",
        "guidance": 6.5,
        "seed": 77,
        "randomize": False,
        "aspect": "224×128 (16:9)",
        "steps": 3,
        "sampler": "DPM++ 2M Karras",
        "cfg_end": 1.0,
        "deepcache": 1,
        **pickers,
        "schedule_type": "Automatic",
        "clip_skip": 0,
        "mask_blur": 4,  # how a mask was used: absent, the defaults
        "inpaint_area": "Whole picture",
        "only_masked_padding": 32,
        "inpaint_overlay": "off",
        "regions": "",  # no regions written: none
        "region_base": 0.0,
        "file": None,
    }


def test_a_styled_image_gives_back_its_style_and_the_users_words(png_info_page, tmp_path):
    """The parameters hold the styled prompt (as A1111 writes it) and `Style: NAME`: read back, the box gets what the
    user typed and the style menu the style, so Generate makes the same prompt again (not styled twice)."""
    from gradio_client import Client

    client = Client(png_info_page.local_url, verbose=False, download_files=str(tmp_path))
    gallery, _, _ = client.predict(
        "a paper lantern", "smoke", style="Cinematic", seed=3, randomize_seed=False, steps=2, api_name="/generate_png"
    )
    written = image_io.read_parameters(gallery[0]["image"])
    assert written.startswith("cinematic still a paper lantern .") and "Style: Cinematic" in written
    values = _values(png_info_page, png_info_page.form.from_image(gallery[0]["image"]))
    assert (values["prompt"], values["negative"], values["style"]) == ("a paper lantern", "smoke", "Cinematic")


def test_a1111_and_comfyui_images_fill_what_is_offered_here(png_info_page, tmp_path):
    a1111 = _values(png_info_page, png_info_page.form.from_image(_png(tmp_path / "a.png", {"parameters": A1111_TEXT})))
    assert a1111["prompt"].startswith("masterpiece, best quality") and "<lora:add_detail:0.6>" in a1111["prompt"]
    assert a1111["negative"].startswith("lowres") and a1111["negative"].endswith("badhandv4")
    assert (a1111["steps"], a1111["sampler"], a1111["guidance"], a1111["seed"]) == (
        30,
        "DPM++ 2M Karras",
        6.5,
        3141592653,
    )
    assert "aspect" not in a1111  # 832x1216 is not offered by this server
    # its Denoising strength is its hires fix's (Hires upscale: 1.5), not a picture's: this server has no hires fix
    assert "strength" not in a1111 and not any(label.startswith("hires") for label in a1111)
    comfy = _png(tmp_path / "c.png", {"prompt": json.dumps(COMFY_PROMPT), "parameters": COMFY_TEXT})
    values = _values(png_info_page, png_info_page.form.from_image(comfy))
    assert (values["prompt"], values["seed"], values["sampler"]) == (
        "cinematic photo of a lighthouse in a storm",
        42,
        "DPM++ 2M Karras",
    )


def test_an_unknown_lora_in_the_prompt_is_said_when_filling(png_info_page, tmp_path, monkeypatch):
    """A1111's PNG whose prompt tags a LoRA this server lacks: said when the form is filled (Generate would refuse
    it), as a sampler or a size not offered is; the prompt keeps the tag."""
    import gradio as gr

    warnings = []
    monkeypatch.setattr(gr, "Warning", lambda message, *args, **kwargs: warnings.append(message))  # what the page shows
    image = _png(tmp_path / "a.png", {"parameters": A1111_TEXT})
    values = _values(png_info_page, png_info_page.form.from_image(image))
    assert "<lora:add_detail:0.6>" in values["prompt"]
    assert "The prompt's LoRA 'add_detail' is not offered here; remove its <lora:…> tag before Generate." in warnings
    assert any("832×1216 is not offered here" in w for w in warnings)  # the size, said the same way


def test_an_image_without_parameters_gets_one_sentence(png_info_page, tmp_path):
    import gradio as gr

    plain = tmp_path / "plain.jpg"
    Image.fromarray(_pixels()).save(plain)
    with pytest.raises(gr.Error) as caught:
        png_info_page.form.from_image(str(plain))
    assert caught.value.message == NO_PARAMETERS


@pytest.mark.browser
@needs_chromium
def test_dropping_an_image_on_the_page_fills_the_form(png_info_page, browser, tmp_path):
    import base64

    path = _png(tmp_path / "a1111.png", {"parameters": A1111_TEXT})
    page = browser.new_page(viewport={"width": 1200, "height": 1000})
    page.goto(png_info_page.local_url, timeout=TIMEOUT_MS)
    open_advanced(page)
    # Dropped onto the page (not on an input): assets/page.js hands it to the "Use an image's settings" button.
    data = base64.b64encode(Path(path).read_bytes()).decode()
    page.evaluate(
        """(data) => {
        const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
        const transfer = new DataTransfer();
        transfer.items.add(new File([bytes], "a1111.png", { type: "image/png" }));
        const target = document.querySelector("#status") || document.body;
        for (const type of ["dragover", "drop"]) {
            target.dispatchEvent(new DragEvent(type, { dataTransfer: transfer, bubbles: true, cancelable: true }));
        }
    }""",
        data,
    )
    page.wait_for_function(
        "() => document.querySelector('#prompt textarea').value.startsWith('masterpiece')", timeout=TIMEOUT_MS
    )
    assert page.locator("#steps input[type=number]").input_value() == "30"
    assert page.locator("#seed input").input_value() == "3141592653"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "png-info-dropped.png"))
    # A file without parameters: one sentence in a toast, the form unchanged.
    plain = tmp_path / "plain.png"
    Image.fromarray(_pixels()).save(plain)
    page.locator("#vary-row input[type=file]").set_input_files(str(plain))
    page.get_by_text(NO_PARAMETERS).wait_for(timeout=TIMEOUT_MS)
    assert page.locator("#prompt textarea").input_value().startswith("masterpiece")
    page.close()
