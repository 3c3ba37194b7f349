"""Throughput mode (`--images-per-device N`, issue 46) through every entry point, on the session's `batched_engine`
(2 devices × 2 images, compiled once): the page's `/generate`, A1111's `batch_size`, OpenAI's `n`, the engine service's
wire, the CLI, and a precompiled directory made for another N. Each serves N × devices images per engine call with
consecutive seeds, and no request compiles anything. (The pixels equal one image per device's within 1 level:
tests/engine/test_generator.py.)"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import (
    BATCHED_DEVICES,
    IMAGES_PER_DEVICE,
    TEST_SIZE,
    TEST_STEPS,
    engine_service,
    generate,
    run_python,
    served,
    xla_flags,
)
from PIL import Image

from pipeline.contract.image_files import read_parameters

IMAGES = BATCHED_DEVICES * IMAGES_PER_DEVICE  # 4 per engine call
KEY = "throughput-key"


@pytest.fixture(scope="module")
def app(batched_engine):
    """The page with the A1111 and OpenAI APIs around `batched_engine`, launched once for this file."""
    from web.apis import ApiAccess

    with served(batched_engine, apis=ApiAccess(keys=(KEY,))) as page:
        yield page


@pytest.fixture(scope="module")
def url(app) -> str:
    return app.local_url.rstrip("/")


@pytest.fixture
def calls(batched_engine, monkeypatch) -> list[int]:
    """The engine calls a test makes (the seed of each); the test also checks that none compiled anything."""
    seen: list[int] = []
    generate_once = batched_engine.generate
    before = batched_engine.compile_count

    def counted(request, *args, **kwargs):
        seen.append(request.seed)
        return generate_once(request, *args, **kwargs)

    monkeypatch.setattr(batched_engine, "generate", counted)
    yield seen
    assert batched_engine.compile_count == before


def seeds_of(pngs: list[bytes]) -> list[int]:
    """Each image's seed, read from its `parameters` text."""
    seeds = []
    for data in pngs:
        text = Image.open(io.BytesIO(data)).info["parameters"]
        seeds.append(int(text.split("Seed: ", 1)[1].split(",", 1)[0]))
    return seeds


def test_the_page_shows_every_image_of_a_call(app, tmp_path, calls):
    """gradio_client's `/generate`, as the page runs it: N × devices images, captions' seeds consecutive, the status
    line counting them, and the header saying how many a request makes."""
    from gradio_client import Client

    client = Client(app.local_url, verbose=False, download_files=str(tmp_path))
    gallery, seed, status = client.predict(prompt="a lighthouse", seed=70, randomize_seed=False, api_name="/generate")
    assert seed == 70 and len(gallery) == IMAGES and calls == [70]
    assert [item["caption"] for item in gallery] == [f"seed {70 + i} · {TEST_SIZE}×{TEST_SIZE}" for i in range(IMAGES)]
    assert all(f"Seed: {70 + i}," in read_parameters(Path(item["image"])) for i, item in enumerate(gallery))
    assert status.startswith(f"{IMAGES} images in ")
    header = next(block.value for block in app.demo.blocks.values() if getattr(block, "elem_id", "") == "header")
    assert f"{BATCHED_DEVICES} × cpu · {IMAGES} images of {TEST_SIZE}×{TEST_SIZE} px" in header


@pytest.mark.parametrize(("batch_size", "n_iter", "engine_calls"), [(4, 1, 1), (3, 1, 1), (5, 1, 2), (2, 2, 1)])
def test_a1111_batch_size_is_one_call_per_n_times_devices_images(url, calls, batch_size, n_iter, engine_calls):
    """batch_size × n_iter images: one engine call per 4 (N × devices), the last one's extra images dropped, seeds
    consecutive across calls."""
    answer = httpx.post(
        f"{url}/sdapi/v1/txt2img",
        json={"prompt": "a red kite", "seed": 40, "steps": TEST_STEPS, "batch_size": batch_size, "n_iter": n_iter},
        timeout=600,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    count = batch_size * n_iter
    pngs = [base64.b64decode(image) for image in body["images"]]
    assert len(pngs) == count and len(calls) == engine_calls and calls == [40 + IMAGES * i for i in range(engine_calls)]
    assert json.loads(body["info"])["all_seeds"] == seeds_of(pngs) == list(range(40, 40 + count))


def test_openai_n_is_one_call_per_n_times_devices_images(url, calls):
    answer = httpx.post(
        f"{url}/v1/images/generations",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"prompt": "a red kite", "n": 5, "seed": 90},
        timeout=600,
    )
    assert answer.status_code == 200, answer.text
    pngs = [base64.b64decode(item["b64_json"]) for item in answer.json()["data"]]
    assert calls == [90, 90 + IMAGES] and seeds_of(pngs) == list(range(90, 95))


def test_the_engine_service_sends_every_image(batched_engine, calls):
    """`python -m pipeline serve`'s HTTP service around the engine (in this process) and a page's client of it:
    the info says 4 images per request, and the wire carries all four with their seeds and pixels."""
    from pipeline.contract.request import parse_request

    with engine_service(batched_engine) as remote:
        assert remote.num_images == IMAGES
        request = parse_request("a red kite", seed=15, rules=batched_engine.rules)
        sent = remote.generate(request)
        assert sent.seeds == list(range(15, 15 + IMAGES)) and len(sent.images) == IMAGES
        here = generate(batched_engine, "a red kite", seed=15)
        for theirs, ours in zip(sent.images, here.images, strict=True):
            np.testing.assert_array_equal(np.asarray(theirs.convert("RGB")), np.asarray(ours))
        assert calls == [15, 15]


def test_the_cli_writes_n_times_devices_files(tiny_dir, tmp_path, batched_engine):
    """`python -m pipeline generate --cpu-devices 2 --images-per-device 2`: four PNGs, seeds consecutive, nothing
    compiled after its warm-up, the pixels of the engine with the same settings (within 1 level)."""
    done = run_python(
        "-m",
        "pipeline",
        "generate",
        "--model",
        str(tiny_dir),
        "--cpu-devices",
        str(BATCHED_DEVICES),
        "--images-per-device",
        str(IMAGES_PER_DEVICE),
        "--height",
        str(TEST_SIZE),
        "--width",
        str(TEST_SIZE),
        "--steps",
        str(TEST_STEPS),
        "--dtype",
        "float32",
        "--prompt-windows",
        "1",
        "--no-speed-levers",
        "--steps-per-call",
        "4",
        "--prompt",
        "a tiny robot",
        "--seed",
        "77",
        "--out",
        str(tmp_path),
        "--json",
        env={"XLA_FLAGS": xla_flags()},  # no device count: --cpu-devices says it
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["devices"] == f"{BATCHED_DEVICES} × cpu" and summary["seeds"] == list(range(77, 77 + IMAGES))
    paths = [Path(path) for path in summary["images"]]
    assert len(paths) == IMAGES and sorted(paths) == sorted(tmp_path.glob("*.png"))
    assert summary["compiles_after_warmup"] == 0
    here = generate(batched_engine, "a tiny robot", seed=77)
    for path, ours, seed in zip(paths, here.images, here.seeds, strict=True):
        with Image.open(path) as image:
            assert f"Seed: {seed}," in image.info["parameters"]
            difference = np.abs(np.asarray(image.convert("RGB"), int) - np.asarray(ours, int))
        assert difference.max() <= 1


def test_programs_precompiled_for_another_n_are_compiled_with_one_reason(batched_engine, tmp_path):
    """A server at N = 2 given a directory precompiled for N = 1 loads none of it and says why in its one line;
    at the same N the directory is read as usual (here it holds no program)."""
    from pipeline.host.compiling.aot import MANIFEST, NOT_IN_MANIFEST, load_precompiled, manifest_header, write_manifest

    programs, keys = batched_engine.programs, batched_engine.program_keys()
    header = manifest_header(programs, topology="cpu", settings={})
    assert header["images_per_device"] == IMAGES_PER_DEVICE
    write_manifest(tmp_path, header, [])
    report = load_precompiled(programs, keys, tmp_path)
    assert not report.loaded and set(report.compile.values()) == {NOT_IN_MANIFEST}
    why = f"built for --images-per-device 1, this server has {IMAGES_PER_DEVICE}"
    write_manifest(tmp_path, {**header, "images_per_device": 1}, [])
    report = load_precompiled(programs, keys, tmp_path)
    assert not report.loaded and set(report.compile.values()) == {why} and why in report.summary(tmp_path)
    older = json.loads((tmp_path / MANIFEST).read_text())  # written before the field: its settings say the batch
    del older["images_per_device"]
    (tmp_path / MANIFEST).write_text(json.dumps({**older, "settings": {"per_device_batch": 1}}))
    assert set(load_precompiled(programs, keys, tmp_path).compile.values()) == {why}
