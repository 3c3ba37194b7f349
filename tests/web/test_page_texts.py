"""What the page says (web/page/layout.py's configuration, web/page/texts.py): the header for visitors, the model's own
texts, the count of images and sizes, the CPU note, the gallery's grid. Pages are built, not launched: only their
configuration is read."""

from __future__ import annotations

import contextlib
import json

import jax
from conftest import TEST_SIZE, TEST_STEPS, TINY_PT

from pipeline.config import SDXL_BASE
from pipeline.generator import Generator
from web.page import texts as page_texts
from web.page.layout import build_page


@contextlib.contextmanager
def page_config(engine, **build_kwargs):
    """The configuration (what /config serves) of a page built around `engine`; the page is closed after."""
    page = build_page(engine, **build_kwargs)
    try:
        yield page.demo.get_config_file()
    finally:
        page.close()


def config_text(config: dict) -> str:
    """The configuration as text; gr.State's props hold a function (its `delete_callback`), which Gradio's own
    encoder skips when it serves /config."""
    return json.dumps(config, ensure_ascii=False, default=repr)


def by_id(config: dict) -> dict:
    return {c["props"].get("elem_id"): c["props"].get("value") for c in config["components"]}


def test_page_texts_for_visitors(engine):
    """No sampler jargon and no lone JAX link in the header, sizes counted as sizes, a short CPU note."""
    with page_config(engine, examples=[]) as config:
        texts = by_id(config)
    header = texts["header"]
    assert "spacing" not in header and "CFG" not in header and "[JAX]" not in header
    assert "Euler, leading spacing, CFG" in texts["server-settings"]  # in the advanced settings instead
    assert page_texts.header_links("tiny") == ""
    assert page_texts.model_texts(SDXL_BASE, on_cpu=True)["notice"] == (
        "Running on a CPU: each request takes many minutes."
    )

    two = Generator.from_pretrained(  # the same 1:1 ratio twice is two sizes, not "other aspect ratios"
        "tiny", sizes=[(64, 64), (128, 128)], height=64, width=64, steps=2, dtype="float32", devices=jax.devices()[:1]
    )  # nothing compiled: the page only reads the configuration
    with page_config(two, examples=[]) as config:
        header = by_id(config)["header"]
    assert "(or 1 other size)" in header and "aspect ratio" not in header


def test_page_texts_follow_the_model_and_the_count():
    """A 1-device generator for the tiny model: '1 image', no SDXL 1.0 licence text, no model card link."""
    one = Generator.from_pretrained(
        "tiny", height=TEST_SIZE, width=TEST_SIZE, steps=TEST_STEPS, dtype="float32", devices=jax.devices()[:1]
    )  # nothing compiled: the page only reads the configuration
    with page_config(one) as config:
        texts = config_text(config)
    assert "Running on 1 × cpu · 1 image of 64×64 px" in texts and "1 images" not in texts
    assert "tiny random-weight test model" in texts
    assert "RAIL" not in texts and "Stable Diffusion XL 1.0](" not in texts and page_texts.MODEL_CARD_URL not in texts
    assert "a number typed outside is set to the nearest limit" in texts  # guidance is clamped in the browser
    assert "Denoising steps, 1 to 100;" in texts and texts.count("set to the nearest limit") >= 2  # steps too


def test_real_model_on_cpu_is_said_plainly(tiny_dir):
    model_texts = page_texts.model_texts
    texts = model_texts(SDXL_BASE, on_cpu=True)  # visitors: short, nothing to install (that is in the log)
    assert texts["notice"] == page_texts.CPU_VISITOR_NOTICE and "jax[" not in texts["notice"]
    assert "jax[cuda12]" in page_texts.CPU_NOTICE  # said in the log, to whoever runs the server
    assert model_texts(SDXL_BASE, on_cpu=False)["notice"] == ""
    assert model_texts("tiny", on_cpu=True)["notice"] == ""
    assert model_texts(str(tiny_dir), on_cpu=True) == model_texts("tiny", on_cpu=True)  # tiny by its path
    assert model_texts(str(TINY_PT), on_cpu=True)["notice"] == ""  # the PyTorch fixture: 0.3-1 s requests here
    assert page_texts.model_card_url("acme/my-sdxl") == "https://huggingface.co/acme/my-sdxl"
    assert "acme/my-sdxl" in page_texts.header_links("acme/my-sdxl")


def test_the_cpu_note_follows_the_model_size():
    """A page in front of an engine service knows its model by name only ('tiny-pt': no folder to read): the CPU note
    follows the engine's UNet size (issue 48: tests/fixtures/tiny-pt's page said "each request takes many minutes")."""
    from pipeline.service.info import engine_info
    from web.engines.pool import EnginePool
    from web.engines.remote import RemoteEngines

    one = Generator.from_pretrained(
        str(TINY_PT), height=TEST_SIZE, width=TEST_SIZE, steps=TEST_STEPS, dtype="float32", devices=jax.devices()[:1]
    )  # nothing compiled: the page only reads the configuration
    info = engine_info(one)
    assert info["model"] == "tiny-pt" and not info["test_model"]  # not made by make-tiny: named, not "tiny"
    assert 0 < info["unet_parameters"] == one.unet_parameters < page_texts.CPU_SLOW_UNET_PARAMETERS
    remote = RemoteEngines(EnginePool(["http://127.0.0.1:9"]), info)  # nothing contacted: the page reads `info`
    assert remote.unet_parameters == info["unet_parameters"]
    with page_config(remote, examples=[]) as config:
        assert page_texts.CPU_VISITOR_NOTICE not in config_text(config)
    sdxl = 2_567_463_684  # SDXL base's UNet
    model_texts = page_texts.model_texts
    assert model_texts("tiny-pt", on_cpu=True, unet_parameters=sdxl)["notice"] == page_texts.CPU_VISITOR_NOTICE
    assert model_texts("tiny-pt", on_cpu=False, unet_parameters=sdxl)["notice"] == ""
    assert model_texts(SDXL_BASE, on_cpu=True, unet_parameters=info["unet_parameters"])["notice"] == ""


def test_gallery_columns_fit_the_count():
    assert [page_texts.gallery_columns(n) for n in (1, 2, 4, 8, 16, 32)] == [1, 2, 2, 4, 4, 8]
