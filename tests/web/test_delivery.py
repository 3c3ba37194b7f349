"""The serving path at full size (issue 19): fast gallery files, lossless PNGs one click away, overlap, no paths.

One page around the session's `ui_engine` (tiny model, 4 steps, progress on), called with gradio_client and driven by
Debian's Chromium. Screenshot: artifacts/browser/png-downloads.png.
"""

from __future__ import annotations

import json
import pathlib
import struct
import threading
import time

import httpx
import numpy as np
import pytest
from conftest import ARTIFACTS, UI_STEPS, generate, needs_chromium
from gradio_client import Client
from gradio_client.exceptions import AppError
from gradio_client.utils import Status
from PIL import Image

from pipeline.config import SDXL_BASE
from pipeline.contract import image_files as image_io
from pipeline.contract import parameters
from web.page.layout import GENERATE_CONCURRENCY
from web.page.texts import model_texts
from web.serving.outbox import Outbox

TIMEOUT_MS = 180_000
PROMPT = "a lighthouse on a cliff at dawn, naïve watercolour ☀"


# ---- files and metadata -------------------------------------------------------------------------------------------


def exif_entry_type(jpeg: pathlib.Path, tag: int) -> int:
    """The TIFF field type of `tag` in the JPEG's Exif sub-IFD (7 = UNDEFINED, what piexif and A1111 expect)."""
    with Image.open(jpeg) as image:
        tiff = image.info["exif"][6:]  # after b"Exif\0\0"
    order = {b"MM": ">", b"II": "<"}[tiff[:2]]

    def entries(offset: int):
        (count,) = struct.unpack(order + "H", tiff[offset : offset + 2])
        for i in range(count):
            yield struct.unpack(order + "HHII", tiff[offset + 2 + 12 * i : offset + 14 + 12 * i])

    (ifd0,) = struct.unpack(order + "I", tiff[4:8])
    sub = next(value for t, _, _, value in entries(ifd0) if t == image_io.EXIF_IFD)
    return next(kind for t, kind, _, _ in entries(sub) if t == tag)


def test_jpeg_carries_parameters_as_a1111_writes_them(tmp_path):
    text = f"{PROMPT}\nNegative prompt: blurry\nSteps: 4, Sampler: Euler, Seed: 7, Model: tiny"
    pixels = np.random.default_rng(0).integers(0, 256, (2, 64, 96, 3), dtype=np.uint8)
    images = image_io.to_pil(pixels, [text, "second"])
    paths = image_io.save_images(images, tmp_path, "x", "jpeg")
    assert [p.name for p in paths] == ["x-00.jpg", "x-01.jpg"]
    with Image.open(paths[0]) as image:
        assert image.format == "JPEG" and image.size == (96, 64)
        comment = image.getexif().get_ifd(image_io.EXIF_IFD)[image_io.USER_COMMENT]
    assert comment == b"UNICODE\0" + text.encode("utf-16-be")  # piexif's UserComment.dump(text, "unicode")
    assert exif_entry_type(paths[0], image_io.USER_COMMENT) == 7
    assert image_io.read_parameters(paths[0]) == text and image_io.read_parameters(paths[1]) == "second"
    png = image_io.save_png(images[0], tmp_path / "x.png")
    assert image_io.read_parameters(png) == text
    np.testing.assert_array_equal(np.asarray(Image.open(png)), pixels[0])  # lossless


def test_models_are_named_without_server_paths(tmp_path):
    local = tmp_path / "my-finetune"
    local.mkdir()
    unet = tmp_path / "lightning_4step.safetensors"
    unet.write_bytes(b"")
    assert parameters.model_name(str(local)) == "my-finetune"
    assert parameters.model_name(f"{local}/") == "my-finetune"
    hub_id = "stabilityai/stable-diffusion-xl-base-1.0"
    assert parameters.model_name(hub_id) == hub_id
    assert parameters.model_name("tiny") == "tiny"
    assert parameters.unet_name(str(unet)) == "lightning_4step.safetensors"
    spec = "ByteDance/SDXL-Lightning:sdxl_lightning_4step_unet.safetensors"
    assert parameters.unet_name(spec) == "sdxl_lightning_4step_unet.safetensors"
    text = parameters.describe(
        prompt="a cat",
        negative_prompt="",
        seed=1,
        steps=4,
        guidance_scale=0,
        height=64,
        width=64,
        model=str(local),
        unet=str(unet),
        dtype="float32",
    )
    assert "Model: my-finetune, UNet: lightning_4step.safetensors, Dtype: float32" in text
    assert str(tmp_path) not in text
    texts = model_texts(str(local), on_cpu=False, unet=str(unet))
    assert texts["about"] == "Model: `my-finetune` · UNet: `lightning_4step.safetensors`"
    assert model_texts(SDXL_BASE, on_cpu=False, unet=spec)["about"] == ("UNet: `sdxl_lightning_4step_unet.safetensors`")


def test_outbox_writes_jpegs_now_and_finds_each_png_by_name(tmp_path):
    pixels = np.random.default_rng(1).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    images = image_io.to_pil(pixels, [f"image {i}" for i in range(3)])
    outbox = Outbox()
    try:
        delivery = outbox.deliver(images, tmp_path, "sdxl-5")
        assert [p.suffix for p in delivery.gallery] == [".jpg"] * 3
        assert all(p.is_file() for p in delivery.gallery)
        for i, jpeg in enumerate(delivery.gallery):
            copied = tmp_path / "elsewhere" / jpeg.name  # Gradio's cache keeps the name, not the directory
            png = outbox.png_for(copied).result(timeout=60)
            assert png == delivery.pngs[i].result() and png.suffix == ".png"
            assert image_io.read_parameters(png) == f"image {i}"
            np.testing.assert_array_equal(np.asarray(Image.open(png)), pixels[i])
        assert outbox.png_for(tmp_path / "sdxl-5-000000-00.jpg") is None  # another run's token: unknown
        assert outbox.png_for("../../etc/passwd") is None
        answered = outbox.deliver(images, tmp_path, "sdxl-6", image_format="png")
        assert [p.suffix for p in answered.gallery] == [".png"] * 3 and answered.pngs[2].result() == answered.gallery[2]
    finally:
        outbox.close()


# ---- through the API ----------------------------------------------------------------------------------------------


def test_generate_answers_jpegs_and_generate_png_lossless_pngs(ui_client, ui_engine):
    kwargs = {"prompt": PROMPT, "seed": 11, "randomize_seed": False}
    gallery, seed, status = ui_client.predict(**kwargs, api_name="/generate")
    pngs, png_seed, png_status = ui_client.predict(**kwargs, api_name="/generate_png")
    assert seed == png_seed == 11 and status.startswith("8 images in ") and png_status.startswith("8 images in ")
    expected = generate(ui_engine, PROMPT, seed=11)
    for i, (item, png_item) in enumerate(zip(gallery, pngs, strict=True)):
        jpeg, png = pathlib.Path(item["image"]), pathlib.Path(png_item["image"])
        with Image.open(jpeg) as image:
            assert image.format == "JPEG"
            shown = np.asarray(image.convert("RGB")).astype(np.int16)
        with Image.open(png) as image:
            assert image.format == "PNG"
            lossless = np.asarray(image.convert("RGB")).astype(np.int16)
        assert image_io.read_parameters(jpeg) == image_io.read_parameters(png) == expected.parameters[i]
        assert f"Seed: {11 + i}," in image_io.read_parameters(jpeg)
        np.testing.assert_array_equal(lossless, np.asarray(expected.images[i]))  # the engine's pixels, bit for bit
        assert np.abs(shown - lossless).mean() < 20  # JPEG q90 of random-weight noise: close, not equal
    info = ui_client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert [p["parameter_name"] for p in info["/generate_png"]["parameters"]] == [
        p["parameter_name"] for p in info["/generate"]["parameters"]
    ]


def test_concurrent_requests_get_their_own_images_progress_and_errors(ui_page, tmp_path):
    """Two requests in the generate event at once (one on the devices, one on the host): nothing crosses over."""
    clients = [Client(ui_page.local_url, verbose=False, download_files=str(tmp_path / str(i))) for i in range(3)]
    seeds = (101, 202)
    # The first request is on the devices when the second joins (two 4-step requests sent at once could run one after
    # the other on a loaded machine). Whether both were inside the event together is read on the server: a client
    # that fetches previews holds its status behind its downloads (seen: 2 s), so its view could miss it.
    steps = (30, UI_STEPS)
    peak = 0  # the most requests the handlers ran at once
    done = threading.Event()

    def sample_running() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, ui_page.handlers.running)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample_running, daemon=True)
    sampler.start()
    jobs = [
        clients[0].submit(
            prompt=f"{PROMPT} {seeds[0]}", seed=seeds[0], randomize_seed=False, steps=steps[0], api_name="/generate"
        )
    ]
    while jobs[0].status().code != Status.PROGRESS:
        assert not jobs[0].done(), "the first request ended before it was seen running"
        time.sleep(0.005)
    jobs.append(
        clients[1].submit(prompt=f"{PROMPT} {seeds[1]}", seed=seeds[1], randomize_seed=False, api_name="/generate")
    )
    bad = clients[2].submit(prompt="   ", api_name="/generate")
    seen: dict[int, list[int]] = {0: [], 1: []}
    while not all(job.done() for job in jobs):
        for i, job in enumerate(jobs):
            for unit in job.status().progress_data or []:
                if not seen[i] or seen[i][-1] != unit.index:
                    assert unit.length == steps[i]
                    seen[i].append(unit.index)
        time.sleep(0.005)
    done.set()
    sampler.join()
    for i, (job, s) in enumerate(zip(jobs, seeds, strict=True)):
        gallery, seed, status = job.result()
        assert seed == s and status.endswith(f"· seed {s}")
        texts = [image_io.read_parameters(item["image"]) for item in gallery]
        assert [t.splitlines()[0] for t in texts] == [f"{PROMPT} {s}"] * 8
        assert [f"Seed: {s + k}," in t for k, t in enumerate(texts)] == [True] * 8
        assert seen[i] == sorted(seen[i]) and set(seen[i]) <= set(range(1, steps[i] + 1)), seen
    assert seen[0] or seen[1], "no progress update arrived"
    with pytest.raises(AppError, match="^Please enter a prompt.$"):
        bad.result()
    assert peak == 2, "the second request waited for the first to finish: no overlap"
    generate = next(fn for fn in ui_page.demo.fns.values() if fn.api_name == "generate")
    assert generate.concurrency_limit == GENERATE_CONCURRENCY == 2


def test_no_output_names_the_server_checkpoint_path(ui_page, ui_client, ui_engine, tiny_dir):
    """PNG and JPEG metadata, the page, its config, the API's description and answers: the model by name only."""
    secret = str(pathlib.Path(tiny_dir).resolve())
    assert secret.startswith("/") and ui_engine.config.model in (secret, str(tiny_dir))
    name = pathlib.Path(secret).name
    seen = []
    for api_name in ("/generate", "/generate_png"):
        gallery, seed, status = ui_client.predict(prompt=PROMPT, api_name=api_name)
        texts = [image_io.read_parameters(item["image"]) for item in gallery]
        assert all(f"Model: {name}," in t for t in texts), texts[0]
        seen += [json.dumps([gallery, seed, status], ensure_ascii=False), *texts]
        for item in gallery:  # every byte of every file, metadata included
            seen.append(pathlib.Path(item["image"]).read_bytes().decode("latin-1"))
            for start in (0, 1):  # EXIF UserComment is UTF-16: read the bytes at both alignments
                seen.append(pathlib.Path(item["image"]).read_bytes()[start:].decode("utf-16-be", errors="ignore"))
    base = ui_page.local_url.rstrip("/")
    for path in ("/", "/config", "/gradio_api/info", "/gradio_api/openapi.json"):
        response = httpx.get(base + path)
        if response.status_code == 200:
            seen.append(response.text)
    assert len(seen) > 30
    for text in seen:
        assert secret not in text and str(tiny_dir) not in text
        assert str(pathlib.Path(secret).parent) not in text  # not even the folder the checkpoint lives in


# ---- in a browser -------------------------------------------------------------------------------------------------


@pytest.mark.browser
@needs_chromium
def test_page_shows_jpegs_and_offers_each_png_with_parameters(ui_page, browser, tiny_dir):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(ui_page.local_url, timeout=TIMEOUT_MS)
    assert page.locator("#pngs").count() == 0 or not page.locator("#pngs").is_visible()
    page.locator("#prompt textarea").fill(PROMPT)
    page.locator("#generate").click()
    page.locator("#status").get_by_text("8 images in").wait_for(timeout=TIMEOUT_MS)  # the answer, not a preview
    page.wait_for_function(
        "() => { const imgs = [...document.querySelectorAll('#gallery img')];"
        " return imgs.length === 8 && imgs.every(i => i.complete && i.naturalWidth > 0); }",
        timeout=TIMEOUT_MS,
    )
    sources = page.eval_on_selector_all("#gallery img", "imgs => imgs.map(i => i.src)")
    assert all(src.split("?")[0].endswith(".jpg") for src in sources), sources
    shown = httpx.get(sources[0])
    assert shown.content[:3] == b"\xff\xd8\xff" and len(shown.content) < 400_000  # a JPEG, as served
    jpeg = ARTIFACTS.parent / "shown.jpg"
    jpeg.write_bytes(shown.content)
    parameters = image_io.read_parameters(jpeg)
    assert parameters.startswith(PROMPT) and "Seed: " in parameters
    # The lossless PNGs appear below the gallery, one download link per image.
    links = page.locator("#pngs a[download]")
    page.wait_for_function("document.querySelectorAll('#pngs a[download]').length === 8", timeout=TIMEOUT_MS)
    names = [links.nth(i).get_attribute("download") for i in range(8)]
    assert all(n.endswith(".png") for n in names) and len(set(names)) == 8, names
    page.screenshot(path=str(ARTIFACTS / "png-downloads.png"), full_page=True)
    with page.expect_download(timeout=60_000) as download_info:
        links.first.click()
    saved = ARTIFACTS.parent / "downloaded.png"
    download_info.value.save_as(saved)
    with Image.open(saved) as image:
        assert image.format == "PNG" and image.size == Image.open(jpeg).size
    assert image_io.read_parameters(saved) == parameters  # the same image, lossless, the same parameters
    html = page.content()
    assert str(tiny_dir) not in html
    assert not errors, errors
    page.close()


def test_background_pngs_never_hold_the_next_answer(tmp_path):
    """PNGs are written by the outbox's pool: deliver returns once the JPEGs exist, whatever the pool is doing."""
    pixels = np.random.default_rng(2).integers(0, 256, (4, 512, 512, 3), dtype=np.uint8)
    images = image_io.to_pil(pixels, ["p"] * 4)
    outbox = Outbox()
    gate = threading.Event()
    try:
        blockers = [outbox._pool.submit(gate.wait, 60) for _ in range(8)]  # every PNG worker busy until released
        delivery = outbox.deliver(images, tmp_path, "busy")
        assert all(p.is_file() for p in delivery.gallery)  # answered while no PNG could start
        assert not any(f.done() for f in delivery.pngs)
        gate.set()
        assert all(f.result(timeout=60).is_file() for f in delivery.pngs)
        assert all(b.result() for b in blockers)
    finally:
        gate.set()
        outbox.close()
