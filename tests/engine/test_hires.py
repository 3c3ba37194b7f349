"""The hires fix (A1111's txt2img second pass): A1111's step rule, torch's latent upscale modes, the pixel upscalers
as image to image from PIL's resize, fresh per-image noise, progress/previews/Stop over both passes, zero compiles,
the parameters text and its reading back, the A1111 API's fields, the CLI's flags and the refusals.

One engine for all of it: tiny-pt on 2 devices at 64x64, 3 steps, hires scales 1.5 and 2 (96 and 128 px).
Fixture: scripts/make_upscale_fixtures.py (tests/fixtures/upscale_modes.npz, torch's interpolate).
"""

from __future__ import annotations

import dataclasses
import io

import jax
import numpy as np
import pytest
from conftest import FEATURE_DEVICES, FIXTURES, TEST_SIZE, TINY_PT
from PIL import Image

from pipeline.contract.errors import InvalidInput
from pipeline.contract.hires import LATENT_UPSCALERS, UPSCALERS, hires_size, parse_scales, second_pass_steps
from pipeline.contract.request import RequestRules, parse_request
from pipeline.contract.stopping import Stopped
from pipeline.device.upscale import upscale_local
from pipeline.host.planning.hires_plan import HIRES_SEED_MASK, hires_plan
from pipeline.host.planning.sampler_plan import SamplerConfig
from web.page.png_info import form_values, parse_infotext

SCALES = (1.5, 2.0)
UPSCALE = np.load(FIXTURES / "upscale_modes.npz")


@pytest.fixture(scope="module")
def hires_engine():
    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(TINY_PT),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=3,
        dtype="float32",
        speed_levers=False,
        prompt_windows=1,
        devices=jax.devices()[:FEATURE_DEVICES],
        hires_scales=SCALES,
    )
    generator.warmup()
    return generator


def a1111_rule(steps: int, hires_steps: int, denoise: float) -> tuple[int, int]:
    """A1111's `setup_img2img_steps(p, steps=hires_steps or steps)` as written there: the schedule's steps and how
    many of its sigmas' intervals `sigmas[steps - t_enc - 1:]` leaves to run."""
    requested = hires_steps or steps
    schedule = int(requested / min(denoise, 0.999)) if denoise > 0 else 0
    t_enc = requested - 1
    sigmas = list(range(schedule + 1))  # a schedule of `schedule` steps has schedule + 1 sigmas
    return schedule, len(sigmas[schedule - t_enc - 1 :]) - 1


@pytest.mark.parametrize(
    "steps, hires_steps, denoise",
    [
        (20, 0, 0.55),
        (20, 10, 0.55),
        (4, 0, 1.0),
        (30, 15, 0.3),
        (25, 0, 0.7),
        (3, 2, 0.5),
        (8, 0, 0.01),
        (50, 100, 0.999),
    ],
)
def test_step_rule_is_a1111s(steps, hires_steps, denoise):
    assert second_pass_steps(steps, hires_steps, denoise) == a1111_rule(steps, hires_steps, denoise)
    schedule, run = second_pass_steps(steps, hires_steps, denoise)
    config = SamplerConfig()
    second = hires_plan(
        (96, 96), "Latent", steps, hires_steps, denoise, lambda n, first: config.plan(n, "euler", None, first)
    )
    full = config.plan(schedule, "euler")
    assert (second.schedule, second.plan.steps) == (schedule, run)
    np.testing.assert_array_equal(second.plan.sigmas, full.sigmas[schedule - run :])  # the last `run` steps run
    assert second.plan.init_sigma == pytest.approx(float(full.sigmas[schedule - run]))  # fresh noise at that sigma


@pytest.mark.parametrize("name", sorted(key for key in UPSCALE.files if key.startswith("out_")))
def test_latent_upscale_modes_match_torch(name):
    _, source, target, mode = name.split("_", 3)
    height, width = map(int, target.split("x"))
    by_mode = {f"{m}{'-aa' if aa else ''}": (m, aa) for m, aa in LATENT_UPSCALERS.values()}
    interpolate, antialias = by_mode[mode]
    got = jax.jit(lambda x: upscale_local(x, height=height, width=width, mode=interpolate, antialias=antialias))(
        UPSCALE[f"in_{source}"]
    )
    np.testing.assert_allclose(np.asarray(got), UPSCALE[name], atol=1e-5, rtol=0)


def test_every_a1111_latent_mode_is_covered_by_the_fixture():
    modes = {f"{m}{'-aa' if aa else ''}" for m, aa in LATENT_UPSCALERS.values()}
    assert modes == {key.rsplit("_", 1)[1] for key in UPSCALE.files if key.startswith("out_")}


def test_every_upscaler_runs_both_passes_without_compiling(hires_engine):
    before = hires_engine.compile_count
    for upscaler in UPSCALERS:
        for scale in SCALES:
            steps, shown = [], []
            result = hires_engine.generate(
                hires_engine.request(
                    "a red fox", seed=5, hires_scale=scale, hires_upscaler=upscaler, hires_steps=2, hires_denoise=0.5
                ),
                on_step=lambda done, total, log=steps: log.append((done, total)),
                on_preview=lambda done, total, pixels, log=shown: log.append((done, pixels.shape[1])),
            )
            side = hires_size((TEST_SIZE, TEST_SIZE), scale, hires_engine.latent_multiple)[0]
            assert result.images[0].size == (side, side) and result.steps == 3 + 2
            assert steps == [(done, 5) for done in range(1, 6)]  # progress counts both passes as one request
            assert shown == [(2, TEST_SIZE // 8), (4, side // 8)]  # a preview of each pass
    assert hires_engine.compile_count == before  # nothing compiles per request


def test_hires_sizes_are_each_size_times_each_scale(hires_engine):
    assert hires_engine.hires_sizes == {((64, 64), 1.5): (96, 96), ((64, 64), 2.0): (128, 128)}
    upscales = {(key.height, key.source, key.mode) for key in hires_engine.program_keys() if key.kind == "upscale"}
    assert upscales == {(side, (64, 64), mode) for side in (96, 128) for mode in LATENT_UPSCALERS}
    assert {(key.height, key.width) for key in hires_engine.program_keys() if key.kind == "step"} == {
        (64, 64),
        (96, 96),
        (128, 128),
    }  # each hires size's second pass, compiled at start-up
    assert hires_size((1024, 1344), 1.5, 32) == (1536, 2016) and hires_size((1024, 1344), 1.5, 64) == (1536, 1984)
    assert hires_size((72, 100), 1.3, 32) == (64, 128)  # A1111 truncates, then down to the multiple


def test_lanczos_is_pils_resize_then_image_to_image(hires_engine):
    """The pixel path: the first pass (a plain request's picture), PIL's Lanczos to 128 px, then image to image
    with A1111's rule (2 of 4 steps: denoise 0.5) and the second pass's seed: the same pixels."""
    hires = hires_engine.generate(
        hires_engine.request(
            "a red fox",
            seed=9,
            hires_scale=2.0,
            hires_upscaler="Lanczos",
            hires_steps=2,
            hires_denoise=0.5,
            sampler="Euler",
        )
    )
    first = hires_engine.generate(hires_engine.request("a red fox", seed=9, sampler="Euler")).images[0]
    resized = first.resize((128, 128), resample=Image.Resampling.LANCZOS)
    rules = dataclasses.replace(hires_engine.rules, sizes=(*hires_engine.rules.sizes, (128, 128)))
    picture = io.BytesIO()
    resized.save(picture, format="PNG")
    again = hires_engine.generate(
        parse_request(
            "a red fox",
            seed=9 ^ HIRES_SEED_MASK,
            size=(128, 128),
            steps=4,
            strength=0.5,
            sampler="Euler",
            init_image=picture.getvalue(),
            rules=rules,
        )
    )
    np.testing.assert_array_equal(np.asarray(hires.images[0]), np.asarray(again.images[0]))


def test_second_pass_noise_is_each_images_own(hires_engine):
    """Image 1 of seed s is image 0 of seed s + 1 (both passes): the pixels do not depend on the device count."""
    fields = {"hires_scale": 1.5, "hires_upscaler": "Latent (bicubic)", "hires_denoise": 0.6}
    pair = hires_engine.generate(hires_engine.request("a cat", seed=20, **fields)).images
    alone = hires_engine.generate(hires_engine.request("a cat", seed=21, **fields)).images
    np.testing.assert_array_equal(np.asarray(pair[1]), np.asarray(alone[0]))
    plain = hires_engine.generate(hires_engine.request("a cat", seed=20, hires_scale=1.5, hires_denoise=0.6)).images
    assert not np.array_equal(np.asarray(plain[0]), np.asarray(pair[0]))  # the upscaler matters


def test_stop_in_the_second_pass(hires_engine):
    request = hires_engine.request("a cat", seed=1, hires_scale=2.0, hires_steps=3)
    done = []
    with pytest.raises(Stopped) as stopped:
        hires_engine.generate(request, on_step=lambda d, t: done.append(d), should_stop=lambda: len(done) >= 4)
    assert stopped.value.total == 6 and 4 <= stopped.value.done < 6


def test_parameters_are_a1111s_and_png_info_reads_them_back(hires_engine):
    from web.page.form import image_settings

    result = hires_engine.generate(
        hires_engine.request(
            "a cat", seed=2, hires_scale=1.5, hires_steps=2, hires_denoise=0.4, hires_upscaler="Nearest"
        )
    )
    written = parse_infotext(result.parameters[0]).settings
    assert (
        written["Hires upscale"],
        written["Hires steps"],
        written["Denoising strength"],
        written["Hires upscaler"],
        written["Size"],
    ) == ("1.5", "2", "0.4", "Nearest", "64x64")
    settings, _ = image_settings(form_values(parse_infotext(result.parameters[0])))
    assert (
        settings["hires_scale"],
        settings["hires_steps"],
        settings["hires_denoise"],
        settings["hires_upscaler"],
    ) == (1.5, 2, 0.4, "Nearest")
    assert "strength" not in settings  # A1111's Denoising strength was the hires fix's
    plain = hires_engine.generate(hires_engine.request("a cat", seed=2)).parameters[0]
    assert not any(key.startswith("Hires") or key == "Denoising strength" for key in parse_infotext(plain).settings)
    settings, _ = image_settings(form_values(parse_infotext(plain)))
    assert settings["hires_scale"] == 1.0 and settings["hires_denoise"] == 0.55


def test_status_line_says_the_images_size_and_both_passes_steps():
    """Issue 68: a ×2 request of 4 steps said "128×128 · 8 steps" for 256² images. The status line says the images'
    size, the first pass's, and each pass's steps (the scale is not said twice); a plain request is as before. The
    history's entry says the steps alike."""
    from types import SimpleNamespace

    from web.history.tab import _details
    from web.page.form import request_settings
    from web.page.handlers import status_line

    rules = RequestRules(sizes=((128, 128),), hires_scales=(2.0,))
    request = parse_request("x", seed=5, steps=4, hires_scale=2, rules=rules)
    line = status_line(8, 1.0, request, 8, "Euler", (256, 256))
    assert line == "8 images in 1.0 s · 256×256 (hires ×2 from 128×128) · 4 + 4 steps, Euler · seed 5", line
    fewer = parse_request("x", seed=5, steps=4, hires_scale=2, hires_steps=3, hires_denoise=0.5, rules=rules)
    assert "· 4 + 3 steps, Euler ·" in status_line(8, 1.0, fewer, 7, "Euler", (256, 256))
    plain = parse_request("x", seed=5, steps=4, rules=rules)
    assert status_line(1, 1.0, plain, 4, "Euler", (128, 128)) == "1 image in 1.0 s · 128×128 · 4 steps, Euler · seed 5"
    details = _details(request_settings(request, SimpleNamespace(sampler="Euler")), None).splitlines()
    assert details[-2].startswith("- 128×128 · 4 + 4 steps, Euler ·") and details[-1] == "- hires × 2", details


def test_the_page_and_the_api_say_the_final_size_and_name_fields_their_way(hires_engine):
    """The page's Generate and the API's /generate_png around the engine: the captions and the status line say the
    images' size (128², drawn at 64²) and both passes' steps while `parameters` says A1111's keys (the first pass's
    Size and Steps, the hires ones); a refusal names the field by the page's label on the page ("Upscale by") and
    by its name on the API ("hires_scale")."""
    import gradio as gr

    from pipeline.contract import image_files
    from web.page.layout import build_page

    page = build_page(hires_engine)
    try:
        events = {fn.api_name: fn.fn for fn in page.demo.fns.values()}
        quiet = {"progress": lambda *a, **k: None}
        with pytest.raises(gr.Error) as on_page:
            list(events["page_generate"]("a cat", hires_scale=3, **quiet))
        assert on_page.value.message == "Upscale by 3 is not offered by this server; choose 1 (off) or one of: 1.5, 2."
        with pytest.raises(gr.Error) as on_api:
            events["generate_png"]("a cat", hires_scale=3, **quiet)
        assert on_api.value.message.startswith("hires_scale 3 is not offered by this server;")
        with pytest.raises(gr.Error) as on_page:
            list(events["page_generate"]("a cat", hires_scale=2, hires_steps=200, **quiet))
        assert on_page.value.message.startswith("Hires steps must be a whole number")  # every field by its label
        gallery, seed, status = events["generate_png"](
            "a cat", seed=4, randomize_seed=False, hires_scale=2, hires_steps=2, **quiet
        )
        assert [caption for _, caption in gallery] == ["seed 4 · 128×128", "seed 5 · 128×128"]
        assert " · 128×128 (hires ×2 from 64×64) · 3 + 2 steps, " in status, status
        assert Image.open(gallery[0][0]).size == (128, 128)
        written = parse_infotext(image_files.read_parameters(gallery[0][0])).settings
        assert (
            written["Size"],
            written["Steps"],
            written["Hires upscale"],
            written["Hires steps"],
            written["Hires upscaler"],
            written["Denoising strength"],
        ) == ("64x64", "3", "2", "2", "Latent", "0.55")
    finally:
        page.close()


def test_refusals_are_one_sentence():
    rules = RequestRules(sizes=((64, 64),), hires_scales=SCALES)
    cases = [
        (RequestRules(sizes=((64, 64),)), {"hires_scale": 2}, "no hires fix"),
        (rules, {"hires_scale": 3}, "not offered by this server"),
        (rules, {"hires_scale": 2, "hires_upscaler": "R-ESRGAN 4x+"}, "Unknown hires upscaler"),
        (rules, {"hires_scale": 2, "hires_denoise": 0}, "hires_denoise must be"),
        (rules, {"hires_scale": 2, "init_image": Image.new("RGB", (64, 64))}, "text to image"),
    ]
    for given_rules, fields, words in cases:
        with pytest.raises(InvalidInput, match=words) as refused:
            parse_request("x", rules=given_rules, **fields)
        assert "\n" not in str(refused.value)
    for text in ("2,x", "1", "5"):
        with pytest.raises(InvalidInput):
            parse_scales(text)
    assert parse_scales("1.5, 2,2") == (1.5, 2.0)


def test_a1111_fields_cli_flags_and_page_follow_the_table(tmp_path):
    import gradio as gr

    from pipeline.__main__ import _check, build_parser
    from web.apis.a1111_fields import a1111_request
    from web.page.layout import hires_panel

    rules = RequestRules(sizes=((64, 64),), hires_scales=SCALES)
    payload = {
        "prompt": "x",
        "enable_hr": True,
        "hr_scale": 1.5,
        "hr_second_pass_steps": 6,
        "denoising_strength": 0.3,
        "hr_upscaler": "Latent (nearest-exact)",
    }
    given = a1111_request(payload, rules, picture=False).given
    assert (given["hires_scale"], given["hires_steps"], given["hires_denoise"], given["hires_upscaler"]) == (
        1.5,
        6,
        0.3,
        "Latent (nearest-exact)",
    ) and "strength" not in given
    assert a1111_request({"prompt": "x", "enable_hr": True}, rules, picture=False).given["hires_scale"] == 2.0
    assert "hires_scale" not in a1111_request({**payload, "enable_hr": False}, rules, picture=False).given
    argv = [
        "generate",
        "--model",
        "tiny",
        "--prompt",
        "a fox",
        "--hires-scale",
        "2",
        "--hires-steps",
        "3",
        "--hires-denoise",
        "0.4",
        "--hires-upscaler",
        "Lanczos",
        "--out",
        str(tmp_path),
    ]
    config, request, _ = _check(build_parser().parse_args(argv))
    assert config.hires_scales == (2.0,)  # the CLI compiles the scale its request asks for
    assert (request.hires_scale, request.hires_steps, request.hires_denoise, request.hires_upscaler) == (
        2.0,
        3,
        0.4,
        "Lanczos",
    )
    with gr.Blocks():
        shown = hires_panel(rules)
        hidden = hires_panel(RequestRules(sizes=((64, 64),)))
    assert set(shown) == {"hires_scale", "hires_steps", "hires_denoise", "hires_upscaler"} == set(hidden)
    assert section(shown["hires_scale"]).visible and all(control.visible for control in shown.values())


def test_upscale_by_offers_the_servers_scales_only():
    """Issue 68: "Upscale by" ran 1 to 4 while the server compiled 1.5 and 2. It offers Off and the compiled scales;
    without any, Off alone (fixed) and how to offer them (--hires-scales), the other controls hidden; PNG Info fills
    a scale the server has and says why it leaves one it has not."""
    import gradio as gr

    from web.page.form import Form, image_settings
    from web.page.layout import hires_panel

    with gr.Blocks():
        shown = hires_panel(RequestRules(sizes=((64, 64),), hires_scales=SCALES))
        without = hires_panel(RequestRules(sizes=((64, 64),)))
    scale = shown["hires_scale"]
    assert [value for _, value in scale.choices] == [1.0, 1.5, 2.0] and scale.value == 1.0 and scale.interactive
    assert scale.api_info()["enum"] == [1.0, 1.5, 2.0]  # the API's description: the same values, as numbers
    off = without["hires_scale"]
    assert [value for _, value in off.choices] == [1.0] and not off.interactive and "--hires-scales" in off.info
    assert section(off).visible and not any(without[name].visible for name in without if name != "hires_scale")
    form = Form(controls=shown, lora_rows=(), styles=(), sizes=((64, 64),), loras=(), hires_scales=SCALES)
    for written, filled in (("1.5", 1.5), ("2.5", None)):
        text = (
            "a cat\nSteps: 3, Sampler: Euler, Seed: 1, Size: 64x64, Denoising strength: 0.5, Hires upscale: " + written
        )
        updates, notes = form.fill(image_settings(form_values(parse_infotext(text)))[0])
        update = dict(zip(map(id, form.fields), updates, strict=True))[id(scale)]
        assert update.get("value") == filled, update
        assert notes == (
            []
            if filled
            else ["Hires upscale 2.5 is not offered here (Upscale by: 1 or 1.5, 2), so Upscale by was left as it is."]
        )


def section(component):
    """The Accordion a control sits in."""
    import gradio as gr

    while not isinstance(component, gr.Accordion):
        component = component.parent
    return component
