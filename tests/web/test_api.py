"""The page's API end to end: a real tiny model on 8 virtual CPU devices, served by Gradio, called with gradio_client.

One module-scoped page (around the session's compiled engine) serves every test; a second one with a queue of size 1
checks that a full queue turns requests away with a busy message while the rest still succeed. The page serves no file
beyond Gradio's own and assets/.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import httpx
import numpy as np
import pytest
from conftest import REPO, page_client, served
from gradio_client import Client
from gradio_client.exceptions import AppError
from gradio_client.utils import QueueError
from PIL import Image

from pipeline.contract.errors import InvalidInput
from pipeline.contract.image_files import read_parameters
from pipeline.contract.request import parse_request
from pipeline.contract.styles import apply_style, load_examples, load_styles
from web.page.texts import GENERATION_FAILED

PROMPT = "a lighthouse on a cliff at dawn"


@pytest.fixture(scope="module")
def generator(engine):
    """The session's warmed-up tiny generator (64x64, 2 steps, 8 devices): compiled once for every test module."""
    return engine


@pytest.fixture(scope="module")
def page(generator):
    with served(generator, queue_size=20) as page:
        yield page


@pytest.fixture(scope="module")
def client(page, tmp_path_factory):
    return page_client(page, tmp_path_factory)


def images_of(gallery) -> list[pathlib.Path]:
    return [pathlib.Path(item["image"]) for item in gallery]


def parameters_of(path: pathlib.Path) -> str:
    """The `parameters` of a gallery image: /generate answers JPEGs carrying it in EXIF UserComment (as A1111)."""
    with Image.open(path) as image:
        assert image.format == "JPEG"
    return read_parameters(path)


def pixels_of(path: pathlib.Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def expected_error(**kwargs) -> str:
    """The one sentence pipeline.contract.request gives for these inputs: the API must return exactly that."""
    with pytest.raises(InvalidInput) as info:
        parse_request(**{"prompt": PROMPT, **kwargs})
    return str(info.value)


def test_generate_with_prompt_only(client, generator):
    gallery, seed, status = client.predict(prompt=PROMPT, api_name="/generate")
    paths = images_of(gallery)
    assert len(paths) == generator.num_images == 8
    assert isinstance(seed, int) and 0 <= seed <= 2**32 - 1
    assert status.startswith("8 images in ") and status.endswith(f"· seed {seed}")
    for i, path in enumerate(paths):
        text = parameters_of(path)  # downloaded through the API: Gradio kept the JPEG's EXIF
        assert text.startswith(PROMPT)
        assert f"Seed: {(seed + i) % 2**32}," in text
        assert "Size: 64x64" in text
        assert pixels_of(path).shape == (64, 64, 3)
    assert [item["caption"] for item in gallery] == [f"seed {(seed + i) % 2**32} · 64×64" for i in range(8)]


def test_same_seed_gives_identical_pixels(client):
    kwargs = {"prompt": PROMPT, "seed": 1234, "randomize_seed": False, "api_name": "/generate"}
    first, seed_a, _ = client.predict(**kwargs)
    second, seed_b, status = client.predict(**kwargs)
    assert seed_a == seed_b == 1234
    assert status.endswith("· seed 1234")
    for a, b in zip(images_of(first), images_of(second), strict=True):
        np.testing.assert_array_equal(pixels_of(a), pixels_of(b))
    # Different devices draw different noise: the eight images are not copies of each other.
    assert not np.array_equal(pixels_of(images_of(first)[0]), pixels_of(images_of(first)[1]))


def test_style_is_applied_and_recorded_in_png(client):
    style = load_styles()["Cinematic"]
    styled, styled_negative = apply_style(style, PROMPT, "blurry")
    gallery, _, _ = client.predict(
        prompt=PROMPT, negative_prompt="blurry", style="Cinematic", guidance_scale=7.5, api_name="/generate"
    )
    text = parameters_of(images_of(gallery)[0])
    assert text.startswith(" ".join(styled.split()))
    assert f"Negative prompt: {' '.join(styled_negative.split())}" in text
    assert "CFG scale: 7.5" in text


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prompt": ""},
        {"prompt": "   \n\t "},
        {"guidance_scale": 1e9},
        {"seed": -1, "randomize_seed": False},
        {"style": "Not a style"},
    ],
    ids=["empty-prompt", "blank-prompt", "huge-guidance", "negative-seed", "unknown-style"],
)
def test_bad_input_gives_one_readable_sentence(client, kwargs):
    message = expected_error(**kwargs)
    with pytest.raises(AppError) as info:
        client.predict(**{"prompt": PROMPT, **kwargs}, api_name="/generate")
    assert str(info.value) == message
    assert "\n" not in message and "Traceback" not in message


def test_next_request_works_after_errors(client):
    with pytest.raises(AppError, match="Please enter a prompt."):
        client.predict(prompt="", api_name="/generate")
    gallery, _, _ = client.predict(prompt=PROMPT, api_name="/generate")
    assert len(gallery) == 8


def test_server_fault_is_reported_and_recovered(client, page, caplog):
    """Break the app's PNG directory (a real fault, nothing mocked): generic error, traceback logged, then recovery."""
    files = page.files
    shutil.rmtree(files.root)
    with caplog.at_level("ERROR", logger="sdxl_jax.app"), pytest.raises(AppError) as info:
        client.predict(prompt=PROMPT, api_name="/generate")
    assert str(info.value) == GENERATION_FAILED
    assert any(record.exc_info for record in caplog.records if record.name == "sdxl_jax.app")
    files.root.mkdir()
    gallery, _, _ = client.predict(prompt=PROMPT, api_name="/generate")
    assert len(gallery) == 8


def test_api_parameters_are_named_with_defaults(client):
    info = client.view_api(print_info=False, return_format="dict")
    params = info["named_endpoints"]["/generate"]["parameters"]
    names = [p["parameter_name"] for p in params]
    assert names == [
        "prompt",
        "negative_prompt",
        "style",
        "guidance_scale",
        "seed",
        "randomize_seed",
        "aspect_ratio",
        "steps",
        "sampler",
        "cfg_end",
        "deepcache",
        "loras",
        "init_image",
        "mask_image",
        "strength",
        "schedule_type",
        "controlnets",
        "ip_images",
        "refiner_switch",
        "aesthetic_score",
        "negative_aesthetic_score",
        "clip_skip",
        "hires_scale",
        "hires_steps",
        "hires_denoise",
        "hires_upscaler",
        "outpaint",
        "mask_blur",
        "inpaint_area",
        "only_masked_padding",
        "inpaint_overlay",
        "pag_scale",
        "pag_adaptive_scale",
        "freeu",
        "regions",
        "region_mask",
        "region_base",
        "previews",
    ]
    assert [p["parameter_has_default"] for p in params] == [False] + [True] * 37


def test_page_shows_device_line_and_allows_embedding(page, generator):
    response = httpx.get(page.local_url)
    assert response.status_code == 200
    assert f"Running on {generator.device_summary}" in response.text  # the page HTML embeds the config
    headers = {k.lower(): v for k, v in response.headers.items()}
    assert "x-frame-options" not in headers
    assert "frame-ancestors" not in headers.get("content-security-policy", "")
    config = httpx.get(page.local_url.rstrip("/") + "/config").json()
    texts = json.dumps(config, ensure_ascii=False)
    assert f"Running on {generator.device_summary}" in texts
    assert "Running on 8 × cpu" in texts
    for example in load_examples():
        assert example in texts
    # A page on another local origin (an embedding site) may call the app: CORS answers for that origin.
    origin = "http://127.0.0.1:1"
    preflight = httpx.options(
        page.local_url.rstrip("/") + "/gradio_api/queue/join",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
    )
    assert preflight.headers.get("access-control-allow-origin") == origin


def test_full_queue_turns_requests_away(generator, tmp_path):
    with served(generator, queue_size=1) as small:
        client = Client(small.local_url, verbose=False, download_files=str(tmp_path))
        jobs = [client.submit(prompt=f"{PROMPT} {i}", api_name="/generate") for i in range(5)]
        done, rejected = [], []
        for job in jobs:
            try:
                done.append(job.result(timeout=120))
            except QueueError as exc:  # gradio_client's answer to HTTP 503 from /queue/join
                rejected.append(exc)
        assert done, "at least one request must be served"
        assert rejected, "a queue of 1 must turn some of 5 simultaneous requests away"
        assert all("Queue is full" in str(exc) for exc in rejected), rejected
        assert all(len(result[0]) == 8 for result in done)


def test_long_prompt_warns_about_truncation(client):
    long_prompt = " ".join(f"word{i}" for i in range(120))
    gallery, _, status = client.predict(prompt=long_prompt, api_name="/generate")
    assert len(gallery) == 8
    assert "⚠️" in status.splitlines()[-1]


def test_prompt_filter_blocks_with_its_message(generator):
    import gradio as gr

    from web.page.handlers import Handlers
    from web.page.prompt_filter import PromptFilter
    from web.serving.outbox import Outbox
    from web.serving.temp_files import RunFiles

    files, outbox = RunFiles(), Outbox()
    try:
        handlers = Handlers(generator, None, files=files, outbox=outbox, prompt_filter=PromptFilter(["spam"]))
        generate = handlers.endpoint()
        with pytest.raises(gr.Error) as info:
            list(generate("Spam! and eggs"))  # the endpoint streams: its checks run when it is iterated
        assert info.value.message == PromptFilter.MESSAGE
    finally:
        outbox.close()
        files.cleanup()


# ---- no file served beyond Gradio's own and assets/ --------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/gradio_api/file=README.md",
        f"/gradio_api/file={REPO / 'app.py'}",
        "/gradio_api/file=/etc/passwd",
        "/gradio_api/file=../../../../etc/passwd",
        "/gradio_api/file=%2Fetc%2Fpasswd",
        "/file=/etc/passwd",
        "/README.md",
        "/app.py",
    ],
)
def test_files_outside_are_refused(page, path):
    response = httpx.get(page.local_url.rstrip("/") + path)
    assert response.status_code in (403, 404), (path, response.status_code)
    assert "root:" not in response.text and "import gradio" not in response.text


def test_page_and_api_are_served(page):
    base = page.local_url.rstrip("/")
    assert httpx.get(base + "/").status_code == 200
    assert httpx.get(base + "/gradio_api/info").status_code == 200
