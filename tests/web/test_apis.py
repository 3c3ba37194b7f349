"""The A1111, OpenAI Images and MCP APIs with the clients people use (webuiapi, openai, the mcp SDK) against one
launched page (the feature engine: 2 devices, 64 px, 3 steps, the fixture LoRAs), plus contract tests that read the
answers as Open WebUI, SillyTavern and LibreChat do. Every generation goes through the page's queue and handler: the
images equal the page's for the same seed and settings, and nothing compiles."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import threading
import time

import numpy as np
import pytest
import requests
from conftest import FIXTURES, TEST_SIZE, free_port, served
from PIL import Image

from bench.cpu.program_times import ProgramTimer

KEYS = ("key-one", "key-two")
SIZE = f"{TEST_SIZE}x{TEST_SIZE}"


@pytest.fixture(scope="module")
def app(feature_engine):
    """The page with every API on (MCP too; bearer keys for OpenAI and MCP), launched once for this file."""
    from web.apis import ApiAccess

    with served(feature_engine, apis=ApiAccess(keys=KEYS, mcp=True)) as page:
        yield page


@pytest.fixture(scope="module")
def url(app) -> str:
    return app.local_url.rstrip("/")


@pytest.fixture(scope="module")
def webui(url):
    import webuiapi

    host, port = url.removeprefix("http://").split(":")
    return webuiapi.WebUIApi(host=host, port=int(port), sampler="Euler", steps=3)


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def leftovers(app) -> list:
    folder = app.files.root / "api-inputs"
    return sorted(os.listdir(folder)) if folder.exists() else []


# ---- AUTOMATIC1111 ---------------------------------------------------------------------------------------------------


def test_webuiapi_txt2img_equals_the_page_with_consecutive_seeds_and_no_compile(app, webui, feature_engine, tmp_path):
    from gradio_client import Client

    before = feature_engine.compile_count
    result = webui.txt2img(
        prompt="a red kite <lora:peft:0.5>",
        negative_prompt="fog",
        seed=40,
        width=TEST_SIZE,
        height=TEST_SIZE,
        cfg_scale=4.0,
        batch_size=3,
        n_iter=1,
    )
    assert len(result.images) == 3  # 2 per engine call: two calls, the fourth image dropped
    assert result.info["all_seeds"] == [40, 41, 42] and result.info["seed"] == 40
    assert result.info["sd_model_name"] and result.info["steps"] == 3 and result.info["cfg_scale"] == 4.0
    assert result.info["sampler_name"] == "Euler" and (result.info["width"], result.info["height"]) == (64, 64)
    infotexts = result.info["infotexts"]
    assert "Seed: 42" in infotexts[2] and "Lora hashes" in infotexts[0]
    assert result.images[0].info["parameters"] == infotexts[0]  # the PNG carries its parameters chunk
    assert result.parameters["prompt"] == "a red kite <lora:peft:0.5>"
    client = Client(app.local_url, verbose=False, download_files=str(tmp_path))
    gallery, seed, _status = client.predict(
        prompt="a red kite <lora:peft:0.5>",
        negative_prompt="fog",
        seed=40,
        randomize_seed=False,
        guidance_scale=4.0,
        sampler="Euler",
        api_name="/generate_png",
    )
    assert seed == 40
    for ours, page in zip(result.images[:2], gallery, strict=True):
        assert np.array_equal(pixels(ours), pixels(Image.open(page["image"])))
    assert feature_engine.compile_count == before


def test_webuiapi_img2img_with_a_mask(webui, app):
    picture = Image.open(FIXTURES / "image-input.png")
    mask = Image.open(FIXTURES / "image-mask.png")
    result = webui.img2img(
        images=[picture],
        mask_image=mask,
        prompt="a garden",
        seed=3,
        width=TEST_SIZE,
        height=TEST_SIZE,
        denoising_strength=0.6,
    )
    assert len(result.images) == 1 and result.images[0].size == (TEST_SIZE, TEST_SIZE)
    assert "Denoising strength: 0.6" in result.info["infotexts"][0]
    assert leftovers(app) == []  # the request's pictures are gone with it


def test_webuiapi_lists_and_options(webui, feature_engine):
    options = webui.get_options()
    model = options["sd_model_checkpoint"]
    assert webui.util_get_model_names() == [model]
    webui.set_options({"sd_model_checkpoint": model, "samples_format": "jpg", "anything": [1, 2]})
    assert webui.get_options()["sd_model_checkpoint"] == model
    assert {"Euler", "Euler a"} <= set(webui.util_get_sampler_names())
    assert "automatic" in webui.util_get_scheduler_names()
    assert sorted(lora["name"] for lora in webui.get_loras()) == sorted(feature_engine.rules.loras)
    embeddings = webui.get_embeddings()  # the fixtures' SDXL embedding; the SD 1.5 and broken files are left out
    assert set(embeddings["loaded"]) == set(feature_engine.rules.embeddings) == {"zqxtoken"}
    assert webui.get_upscalers()[0]["name"] == "None" and webui.get_sd_vae() == []


def test_webuiapi_png_info(webui):
    made = webui.txt2img(prompt="a lighthouse", seed=9, width=TEST_SIZE, height=TEST_SIZE, batch_size=1)
    read = webui.png_info(made.image)
    assert read.info == made.info["infotexts"][0] and "Seed: 9" in read.info


def test_progress_with_preview_and_interrupt_only_the_callers_own(webui, url):
    done = {}

    def long_request():  # 32 engine calls of 100 steps: long enough to watch, stopped long before its end
        try:
            done["result"] = webui.txt2img(
                prompt="a long walk", seed=1, steps=100, width=TEST_SIZE, height=TEST_SIZE, batch_size=2, n_iter=32
            )
        except Exception as exc:  # noqa: BLE001
            done["error"] = exc

    thread = threading.Thread(target=long_request)
    thread.start()
    deadline = time.monotonic() + 300

    def progress_when(ready) -> dict:
        while not ready(progress := webui.get_progress()):
            assert time.monotonic() < deadline and thread.is_alive(), (progress, done)
            time.sleep(0.1)
        return progress

    progress = progress_when(lambda p: p["state"]["sampling_step"] >= 2 and p["current_image"])
    assert progress["state"]["sampling_steps"] == 100 and progress["state"]["job_count"] == 1
    Image.open(io.BytesIO(base64.b64decode(progress["current_image"]))).load()
    other = {"Authorization": f"Bearer {KEYS[0]}"}  # another caller: sees nothing of it, cannot stop it
    assert requests.get(f"{url}/sdapi/v1/progress", headers=other, timeout=30).json()["state"]["job_count"] == 0
    requests.post(f"{url}/sdapi/v1/interrupt", headers=other, timeout=30).raise_for_status()
    seen = progress["state"]["sampling_step"]
    progress_when(lambda p: p["state"]["sampling_step"] not in (0, seen))  # still running
    webui.interrupt()
    thread.join(120)
    result = done["result"]
    assert len(result.images) < 64 and "Stopped" in result.info["comments"]["interrupted"]


BAD = [
    ({"prompt": "x", "width": 65, "height": 64}, "Size 65x64 is not offered"),
    ({"prompt": "x", "sampler_name": "Heun++"}, "Unknown sampler 'Heun++'; choose one of: Euler"),
    ({"prompt": "x", "styles": ["../../etc/passwd"]}, "Unknown style '../../etc/passwd'; choose one of:"),
    ({"prompt": "x", "steps": "many"}, "Steps must be"),
    ({"prompt": "x", "batch_size": 80}, "batch_size must be"),
    ({"prompt": ""}, "Please enter a prompt."),
    ({"prompt": "x", "init_images": ["%%%"]}, "not valid base64"),
    ({"prompt": "x", "init_images": [base64.b64encode(b"not a picture").decode()]}, "image"),
    (
        {
            "prompt": "x",
            "init_images": [base64.b64encode(FIXTURES.joinpath("image-input.png").read_bytes()[:-400]).decode()],
        },
        "The image file is damaged or incomplete",
    ),
]


@pytest.mark.parametrize(("payload", "sentence"), BAD)
def test_bad_input_is_one_sentence_and_leaves_nothing(url, app, payload, sentence):
    endpoint = "img2img" if "init_images" in payload else "txt2img"
    answer = requests.post(
        f"{url}/sdapi/v1/{endpoint}", json={**payload, "width": payload.get("width", 64), "height": 64}, timeout=120
    )
    assert 400 <= answer.status_code < 500, answer.text
    detail = answer.json()["detail"]
    assert sentence in detail and "\n" not in detail and "Traceback" not in answer.text
    assert leftovers(app) == []


def test_a_huge_picture_and_a_wrong_body_are_refused(url, app):
    buffer = io.BytesIO()
    Image.new("1", (10_000, 6_000)).save(buffer, format="PNG")  # 60 MP: past the engine's decode limit
    huge = base64.b64encode(buffer.getvalue()).decode()
    answer = requests.post(f"{url}/sdapi/v1/img2img", json={"prompt": "x", "init_images": [huge]}, timeout=120)
    assert answer.status_code == 422 and "over the limit" in answer.json()["detail"]
    answer = requests.post(f"{url}/sdapi/v1/txt2img", data=b"[1, 2", timeout=30)
    assert answer.status_code == 422
    assert answer.json()["detail"] == "The request body is not valid JSON (line 1, column 6)."
    assert leftovers(app) == []


def test_a_full_queue_answers_503(url, app):
    queue = app.demo._queue
    size, queue.max_size = queue.max_size, 0
    try:
        answer = requests.post(f"{url}/sdapi/v1/txt2img", json={"prompt": "x", "width": 64, "height": 64}, timeout=60)
    finally:
        queue.max_size = size
    assert answer.status_code == 503 and "busy" in answer.json()["detail"]


def test_png_info_reads_a_truncated_png_as_the_page_does(webui, url):
    from web.page.png_info import read_infotext

    made = webui.txt2img(prompt="a cut kite", seed=11, width=TEST_SIZE, height=TEST_SIZE, batch_size=1)
    buffer = io.BytesIO()
    made.image.save(buffer, format="PNG", pnginfo=pnginfo(made.info["infotexts"][0]))
    cut = buffer.getvalue()[: len(buffer.getvalue()) // 2]  # the pixels cut short; the text chunk comes before
    answer = requests.post(f"{url}/sdapi/v1/png-info", json={"image": base64.b64encode(cut).decode()}, timeout=60)
    assert answer.status_code == 200 and answer.json()["info"] == made.info["infotexts"][0]
    page_file = io.BytesIO(cut)
    assert read_infotext(page_file) == answer.json()["info"]  # what the page's PNG Info fills in from that file
    refused = requests.post(f"{url}/sdapi/v1/png-info", json={"image": base64.b64encode(b"text").decode()}, timeout=60)
    from web.page.png_info import NOT_AN_IMAGE

    assert refused.status_code == 422 and refused.json()["detail"] == NOT_AN_IMAGE


def pnginfo(text: str):
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", text)
    return info


def test_one_sentence_for_one_mistake_on_every_api(url, app, openai_client, tmp_path):
    """The same bad sampler, unknown style and truncated picture get the same sentence from gradio_client (the
    page's handler), A1111 and OpenAI (OpenAI: 400, its own shape)."""
    import openai
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    cut = FIXTURES.joinpath("image-input.png").read_bytes()[:-400]
    (tmp_path / "cut.png").write_bytes(cut)
    client = Client(app.local_url, verbose=False, download_files=False)

    def page_says(**fields) -> str:
        with pytest.raises(AppError) as refused:
            client.predict(prompt="x", api_name="/generate_png", **fields)
        return str(refused.value)

    def a1111_says(endpoint: str = "txt2img", **payload) -> str:
        answer = requests.post(f"{url}/sdapi/v1/{endpoint}", json={"prompt": "x", **payload}, timeout=120)
        assert 400 <= answer.status_code < 500, answer.text
        return answer.json()["detail"]

    def openai_says(call, **fields) -> str:
        with pytest.raises(openai.BadRequestError) as refused:
            call(prompt="x", size=SIZE, **fields)
        assert refused.value.response.json()["error"]["type"] == "invalid_request_error"
        return refused.value.response.json()["error"]["message"]

    sampler = page_says(sampler="Heun++")
    assert sampler.startswith("Unknown sampler 'Heun++'")
    assert a1111_says(sampler_name="Heun++") == sampler
    assert openai_says(openai_client.images.generate, extra_body={"sampler": "Heun++"}) == sampler
    style = page_says(style="../../etc/passwd")
    assert style.startswith("Unknown style") and a1111_says(styles=["../../etc/passwd"]) == style
    damaged = page_says(init_image=handle_file(str(tmp_path / "cut.png")))
    assert damaged == "The image file is damaged or incomplete; its pixels could not be decoded."
    assert a1111_says("img2img", init_images=[base64.b64encode(cut).decode()]) == damaged
    assert openai_says(openai_client.images.edit, image=("cut.png", cut, "image/png")) == damaged
    assert leftovers(app) == []


# ---- OpenAI Images ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openai_client(url):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key=KEYS[1], max_retries=0, timeout=300)


def test_openai_generate_b64_and_url(openai_client, webui, feature_engine):
    made = openai_client.images.generate(
        prompt="a red kite",
        size=SIZE,
        n=3,
        response_format="b64_json",
        extra_body={"seed": 40, "guidance_scale": 4.0, "sampler": "Euler", "negative_prompt": "fog"},
    )
    assert len(made.data) == 3 and made.data[0].b64_json
    first = Image.open(io.BytesIO(base64.b64decode(made.data[0].b64_json)))
    assert "Seed: 40" in first.info["parameters"]
    same = webui.txt2img(prompt="a red kite", negative_prompt="fog", seed=40, width=64, height=64, cfg_scale=4.0)
    assert np.array_equal(pixels(first), pixels(same.image))  # one engine, one handler
    with ProgramTimer(feature_engine.programs) as timer:
        linked = openai_client.images.generate(prompt="a kite", size=SIZE, n=1, response_format="url")
    assert timer.labels and not [label for label in timer.labels if label.startswith("preview")]  # no previews
    link = linked.data[0].url
    assert len(link.rsplit("/", 1)[1]) >= 32  # an unguessable name
    fetched = requests.get(link, timeout=30)
    assert fetched.status_code == 200 and Image.open(io.BytesIO(fetched.content)).size == (64, 64)
    assert requests.get(link[:-8] + "AAAA.png", timeout=30).status_code == 404


def test_openai_edit_with_a_mask(openai_client, app):
    mask = Image.new("RGBA", (64, 64), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), (16, 16, 48, 48))  # transparent: redrawn
    buffer = io.BytesIO()
    mask.save(buffer, format="PNG")
    with open(FIXTURES / "image-input.png", "rb") as picture:
        edited = openai_client.images.edit(
            image=picture,
            mask=("mask.png", buffer.getvalue(), "image/png"),
            prompt="a pond",
            size=SIZE,
            response_format="b64_json",
        )
    assert Image.open(io.BytesIO(base64.b64decode(edited.data[0].b64_json))).size == (64, 64)
    assert leftovers(app) == []


def test_openai_refusals(openai_client, url):
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.images.generate(prompt="a kite", size="1024x1024")
    assert "Size '1024x1024' is not offered by this server; choose one of: 64x64" in str(refused.value)
    answer = requests.post(f"{url}/v1/images/generations", json={"prompt": "x"}, timeout=30)
    assert answer.status_code == 401 and "API key" in answer.json()["error"]["message"]
    keyed = {"Authorization": f"Bearer {KEYS[0]}"}
    for payload in ({}, {"prompt": ""}, {"prompt": "x", "n": 0}, {"prompt": "x", "steps": 1000}):  # OpenAI: 400
        answer = requests.post(f"{url}/v1/images/generations", json=payload, headers=keyed, timeout=120)
        assert answer.status_code == 400, (payload, answer.text)
        assert answer.json()["error"]["type"] == "invalid_request_error" and answer.json()["error"]["message"]
    answer = requests.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEYS[0]}"}, timeout=30)
    assert answer.json()["data"][0]["object"] == "model"


# ---- MCP -------------------------------------------------------------------------------------------------------------


def test_mcp_tools_are_named_as_the_api_and_answer_images_without_server_paths(url, app, feature_engine):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def session_run():
        headers = {"Authorization": f"Bearer {KEYS[0]}"}
        async with (
            streamablehttp_client(f"{url}/gradio_api/mcp/", headers=headers) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            fields = {"prompt": "a kite", "seed": 5, "randomize_seed": False}
            made = await session.call_tool("generate", fields)
            lossless = await session.call_tool("generate_png", fields)
            refused = await session.call_tool("generate", {"prompt": ""})
            return tools, made, lossless, refused

    with ProgramTimer(feature_engine.programs) as timer:
        tools, made, lossless, refused = asyncio.run(session_run())
    assert timer.labels and not [label for label in timer.labels if label.startswith("preview")]  # none unasked
    endpoints = {fn.api_name for fn in app.demo.fns.values() if fn.api_visibility == "public"}
    assert set(tools) == endpoints and {"generate", "generate_png"} <= endpoints  # gradio_client's names
    assert "returns the images" in tools["generate"].description
    assert all(argument.get("description") for argument in tools["generate"].inputSchema["properties"].values())
    for answer, kind in ((made, "image/jpeg"), (lossless, "image/png")):
        assert not answer.isError, answer.content
        images = [item for item in answer.content if item.type == "image"]
        assert len(images) == feature_engine.num_images and {item.mimeType for item in images} == {kind}
        first = Image.open(io.BytesIO(base64.b64decode(images[0].data)))
        assert first.size == (TEST_SIZE, TEST_SIZE)
        texts = " ".join(item.text for item in answer.content if item.type == "text")
        assert "seed 5" in texts and "/tmp" not in texts and "gradio_api/file" not in texts
    assert "Seed: 5" in first.info["parameters"]  # the PNG as written, its parameters chunk kept
    said = " ".join(str(getattr(item, "text", "")) for item in refused.content)
    assert refused.isError and "Please enter a prompt." in said and "/tmp" not in said
    answer = requests.post(f"{url}/gradio_api/mcp/", json={}, timeout=30)
    assert answer.status_code == 401


def test_apis_left_off_say_so_at_start_up_and_to_each_request(feature_engine, caplog):
    """docs/deploy.md's CPU `docker run`: a reachable host, no login. The log says the page is open and the APIs off
    (and how to turn them on); each API's request gets that sentence in its own shape, not a bare 404."""
    import logging

    from web.apis import ApiAccess, attach_apis
    from web.apis.auth import APIS_OFF
    from web.page.layout import build_page

    page = build_page(feature_engine)
    try:
        with caplog.at_level(logging.INFO, logger="sdxl_jax.app"):
            extra = attach_apis(page, ApiAccess(host="0.0.0.0"))  # served on 127.0.0.1 here; the rules of 0.0.0.0
        logged = [record.getMessage() for record in caplog.records]
        assert APIS_OFF in logged and "--api (SDXL_API=1)" in APIS_OFF
        assert any("open on every interface without a login" in line for line in logged), logged
        page.launch(port=free_port(), prevent_thread_lock=True, quiet=True, **extra)
        base = page.local_url.rstrip("/")
        a1111 = requests.post(f"{base}/sdapi/v1/txt2img", json={"prompt": "x"}, timeout=30)
        assert a1111.status_code == 403 and a1111.json()["detail"] == APIS_OFF
        for method, path in (("POST", "/v1/images/generations"), ("GET", "/v1/models")):
            answer = requests.request(method, f"{base}{path}", json={"prompt": "x"}, timeout=30)
            assert answer.status_code == 403 and answer.json()["error"]["message"] == APIS_OFF
        assert requests.get(f"{base}/gradio_api/info", timeout=30).ok  # the page and its own API are served
    finally:
        page.close()


# ---- how other apps read the answers (contract tests) ----------------------------------------------------------------


def test_open_webui_reads_options_models_and_images(url):
    """Open WebUI (backend/open_webui/routers/images.py, its automatic1111 engine, read for this test): GET /options
    for `sd_model_checkpoint`, POST /options with the whole dict to switch it, /sd-models as {id: title, name:
    model_name}; txt2img with exactly {prompt, batch_size, width, height, steps, negative_prompt} (the size is its
    "Image Size" setting: one this server does not offer gets a 4xx naming those it does); each of `images` decoded
    as base64 with no comma (a raw PNG), `info` kept as it is."""
    options = requests.get(f"{url}/sdapi/v1/options", timeout=30).json()
    models = requests.get(f"{url}/sdapi/v1/sd-models", timeout=30).json()
    listed = [{"id": model["title"], "name": model["model_name"]} for model in models]
    assert options["sd_model_checkpoint"] in [model["id"] for model in listed]
    options["sd_model_checkpoint"] = listed[0]["id"]
    assert requests.post(f"{url}/sdapi/v1/options", json=options, timeout=30).status_code == 200
    data = {"prompt": "x", "batch_size": 1, "width": 64, "height": 64, "steps": 3, "negative_prompt": ""}
    res = requests.post(f"{url}/sdapi/v1/txt2img", json=data, timeout=300).json()
    assert isinstance(res["info"], str) and res["images"]
    for image in res["images"]:
        assert "," not in image  # Open WebUI reads a comma as a data URL's header
        Image.open(io.BytesIO(base64.b64decode(image))).load()
    refused = requests.post(f"{url}/sdapi/v1/txt2img", json={**data, "width": 512, "height": 512}, timeout=60)
    assert 400 <= refused.status_code < 500 and "64x64" in refused.json()["detail"]


def test_librechat_and_sillytavern_read_info_and_progress(url):
    """LibreChat's Stable Diffusion tool (api/app/clients/tools/structured/StableDiffusion.js, read for this test):
    it posts {prompt, negative_prompt, cfg_scale: 4.5, steps: 22, width: 1024, height: 1024} (here the test server's
    size), reads `images[0]` as base64 and `JSON.parse(info)`: height, width, seed, and the settings line of
    `infotexts[0]` (its last line). SillyTavern: GET /options as its ping, /progress `state.job_count`, `scheduler`
    among /schedulers names; a client's `alwayson_scripts` this server does not run are said in `info`. SillyTavern
    (src/endpoints/stable-diffusion.js, read for this test): after POST /options {sd_model_checkpoint} it polls
    /progress until `progress === 0.0 && job_count === 0`; it lists /upscalers and /latent-upscale-modes `name`s,
    /sd-vae `model_name`s, /samplers and /schedulers `name`s and /sd-models `title`s."""
    payload = {"prompt": "x", "negative_prompt": "y", "cfg_scale": 4.5, "steps": 22, "width": 64, "height": 64}
    answer = requests.post(f"{url}/sdapi/v1/txt2img", json=payload, timeout=300).json()
    Image.open(io.BytesIO(base64.b64decode(answer["images"][0].split(",", 1)[0]))).load()
    info = json.loads(answer["info"])
    assert (info["height"], info["width"]) == (64, 64) and isinstance(info["seed"], int)
    settings_line = info["infotexts"][0].split("\n").pop()
    assert settings_line.startswith("Steps: 22,") and "CFG scale: 4.5" in settings_line
    answer = requests.post(
        f"{url}/sdapi/v1/txt2img",
        json={
            "prompt": "x",
            "negative_prompt": "",
            "steps": 3,
            "sampler_index": "DPM++ 2M",
            "width": 64,
            "height": 64,
            "seed": -1,
            "alwayson_scripts": {"controlnet": {"args": []}},
        },
        timeout=300,
    ).json()
    info = json.loads(answer["info"])
    assert answer["images"][0] and isinstance(info["seed"], int) and "Sampler: DPM++ 2M" in info["infotexts"][0]
    assert "controlnet" in info["comments"]["alwayson_scripts"]
    assert requests.get(f"{url}/sdapi/v1/options", timeout=30).ok
    title = requests.get(f"{url}/sdapi/v1/sd-models", timeout=30).json()[0]["title"]
    assert requests.post(f"{url}/sdapi/v1/options", json={"sd_model_checkpoint": title}, timeout=30).ok
    progress = requests.get(f"{url}/sdapi/v1/progress", timeout=30).json()
    assert progress["progress"] == 0.0 and progress["state"]["job_count"] == 0  # SillyTavern's "model loaded"
    for listing, key in (
        ("upscalers", "name"),
        ("latent-upscale-modes", "name"),
        ("sd-vae", "model_name"),
        ("samplers", "name"),
    ):
        items = requests.get(f"{url}/sdapi/v1/{listing}", timeout=30).json()
        assert isinstance(items, list) and all(key in item for item in items), listing
    names = [item["name"] for item in requests.get(f"{url}/sdapi/v1/schedulers", timeout=30).json()]
    scheduled = requests.post(
        f"{url}/sdapi/v1/txt2img",
        json={"prompt": "x", "sampler_name": "DPM++ 2M", "scheduler": "karras", "width": 64, "height": 64},
        timeout=300,
    ).json()
    assert "karras" in names and "Karras" in json.loads(scheduled["info"])["infotexts"][0]


def test_the_handlers_errors_map_to_statuses():
    """The page's gr.Error as the A1111/OpenAI APIs answer it: a refused input 422; a stopping server, or no engine to
    run the request (a page in front of engine services), 503 (try again); anything else 500. The sentence kept."""
    from web.apis.queue_call import refusal

    lost = "The engine stopped mid-request (connection lost at step 8 / 20) and ...; please try again."
    for title, status in (("Invalid input", 422), ("Server stopping", 503), ("No engine", 503), (None, 500)):
        refused = refusal({"error": lost}, title)
        assert (refused.status, refused.message) == (status, lost)
    assert refusal({}, None).message == "Generation failed on the server; please try again."


def test_a1111_xyz_plot_script_answers_its_grid_then_each_cell_as_its_single_request(url, app, webui, feature_engine):
    before = feature_engine.compile_count
    plot = {"script_name": "X/Y/Z plot", "script_args": [4, "2, 3", [], "CFG Scale", "1, 4", [], 0, "", [], True]}
    asked = {"prompt": "a lighthouse", "seed": 5, "width": TEST_SIZE, "height": TEST_SIZE, "batch_size": 1}
    answer = requests.post(f"{url}/sdapi/v1/txt2img", json={**asked, **plot}, timeout=600).json()
    grid, *cells = [Image.open(io.BytesIO(base64.b64decode(image))) for image in answer["images"]]
    assert len(cells) == 4 and grid.width > 2 * TEST_SIZE and grid.height > 2 * TEST_SIZE
    infotexts = json.loads(answer["info"])["infotexts"]
    assert "Script: X/Y/Z plot, X Type: Steps, X Values: " in infotexts[0] and "Y Type: CFG Scale" in infotexts[0]
    single = webui.txt2img(**{**asked, "steps": 3, "cfg_scale": 4}).image  # the last cell: Steps 3, CFG Scale 4
    assert np.array_equal(pixels(cells[3]), pixels(single)) and "Steps: 3" in infotexts[4]
    too_many = {**plot, "script_args": [4, "1-20", [], 6, "1-15", []]}
    refused = requests.post(f"{url}/sdapi/v1/txt2img", json={**asked, **too_many}, timeout=60)
    assert refused.status_code == 422
    assert refused.json()["detail"] == "The X/Y/Z plot has 300 cells; this server makes at most 64 (--xyz-max-cells)."
    assert feature_engine.compile_count == before and leftovers(app) == []
