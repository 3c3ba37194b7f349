"""The guidance-free program (`--no-cfg`, the few-step presets) from the app's own start-up path: compiled once and
never again whatever a request asks; the page hides guidance and the negative prompt, the API says they are ignored."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TEST_SIZE, TEST_STEPS, generate

from pipeline.contract.styles import DEFAULT_STYLE
from web.page.texts import NO_CFG_NOTE

PROMPT = "a red fox in fresh snow"


def _pixels(result) -> np.ndarray:
    return np.stack([np.asarray(image) for image in result.images]).astype(np.int16)  # [B, H, W, 3]


@pytest.fixture(scope="module")
def lightning(tiny_dir):
    """The app's own start-up path with `--preset lightning-4step` on the tiny checkpoint (its sampler settings)."""
    import app
    from web.options import parse_args

    args = parse_args(
        [
            "--model",
            str(tiny_dir),
            "--preset",
            "lightning-4step",
            "--dtype",
            "float32",
            "--height",
            str(TEST_SIZE),
            "--width",
            str(TEST_SIZE),
            "--steps",
            str(TEST_STEPS),
            "--no-progress",
        ]
    )
    return app.start_cluster_and_engine(args)[1]  # (the cluster of one, the engine)


def test_guidance_free_program_compiles_once_and_never_again(lightning):
    assert lightning.sampler.cfg is False and lightning.sampler.timestep_spacing == "trailing"
    keys = lightning.program_keys()
    assert all(key.cfg is False for key in keys if key.cfg is not None)  # only guidance-free programs are served
    assert all(lightning.programs.is_compiled(key) for key in keys)
    startup = lightning.startup_programs  # each served program compiled, or loaded whole from this host's store
    assert len(startup.builds) == len(keys) and lightning.compile_count + startup.count("executables") >= len(keys)
    before = lightning.compile_count
    first = generate(lightning, PROMPT, seed=3, guidance_scale=0.0)
    for i, guidance in enumerate((1.0, 7.5, 20.0)):
        negative = "ugly " * i
        result = generate(lightning, f"{PROMPT} {i}", negative_prompt=negative, seed=100 + i, guidance_scale=guidance)
        assert result.negative_prompt == "" and "CFG scale: 0," in result.parameters[0]
    again = generate(lightning, PROMPT, negative_prompt="anything", seed=3, guidance_scale=12.0)
    assert np.array_equal(_pixels(first), _pixels(again))  # negative prompt and guidance are ignored
    assert lightning.compile_count == before
    text = first.parameters[0]
    assert "Steps: 2, Sampler: Euler," in text and text.endswith("Timestep spacing: trailing")


def test_page_hides_guidance_and_negative_prompt_and_api_says_they_are_ignored(lightning):
    from web.page.handlers import Handlers
    from web.page.layout import build_page
    from web.serving.outbox import Outbox
    from web.serving.temp_files import RunFiles

    page = build_page(lightning, examples=[], progress=False)
    try:
        config = page.demo.get_config_file()
        labels = {c["props"].get("label"): c["props"] for c in config["components"] if "label" in c["props"]}
        assert labels["Guidance scale"]["visible"] is False and labels["Negative prompt"]["visible"] is False
        assert labels["Style"]["visible"] is not False
        description = next(d["api_description"] for d in config["dependencies"] if d["api_name"] == "generate")
        assert NO_CFG_NOTE in description
        texts = {c["props"].get("elem_id"): c["props"].get("value") for c in config["components"]}
        assert "preset lightning-4step: Euler, trailing spacing, no CFG" in texts["server-settings"]  # advanced
        assert "spacing" not in texts["header"] and "CFG" not in texts["header"]  # no jargon for visitors
    finally:
        page.close()
    # The API still takes both (named, optional); its status line says they were ignored.
    files, outbox = RunFiles(), Outbox()
    try:
        endpoint = Handlers(lightning, None, files=files, outbox=outbox, progress=False).endpoint()

        def generate_fn(*args):  # the endpoint streams its previews first: the answer is what it yields last
            return list(endpoint(*args))[-1]

        gallery, seed, status = generate_fn(PROMPT, "blurry", DEFAULT_STYLE, 7.0, 5, False)
        assert len(gallery) == lightning.num_images and seed == 5 and NO_CFG_NOTE in status
        # gradio_client sends the page's defaults unasked: no note for them, only for values that differ. The page's
        # default guidance is the server's (the preset's, 0 here: lightning.rules.guidance_scale).
        page_default = lightning.rules.guidance_scale
        assert NO_CFG_NOTE not in generate_fn(PROMPT, "", DEFAULT_STYLE, page_default, 5, False)[2]
        assert NO_CFG_NOTE in generate_fn(PROMPT, "", DEFAULT_STYLE, 1.0, 5, False)[2]
    finally:
        outbox.close()
        files.cleanup()
