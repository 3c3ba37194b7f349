"""Presets (assets/presets.json): every recipe of the issue, checked when read, resolved with flags winning, and the
same settings through the CLI's and the app's command lines (no JAX)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pipeline.config import SDXL_BASE, EngineConfig, engine_config, preset_settings
from pipeline.contract.errors import InvalidInput
from pipeline.contract.presets import PRESET_NAMES, get_preset, load_presets
from pipeline.contract.request import RequestRules


def test_presets_file_holds_every_recipe_of_the_issue():
    presets = load_presets()
    assert tuple(presets) == PRESET_NAMES
    lightning = presets["lightning-4step"]
    assert (lightning.model, lightning.steps, lightning.sampler, lightning.timestep_spacing, lightning.cfg) == (
        SDXL_BASE,
        4,
        "euler",
        "trailing",
        False,
    )
    assert lightning.unet == "ByteDance/SDXL-Lightning:sdxl_lightning_4step_unet.safetensors"
    turbo = presets["turbo"]
    assert (turbo.sampler, turbo.timestep_spacing, turbo.cfg, turbo.height, turbo.width) == (
        "euler_ancestral",
        "trailing",
        False,
        512,
        512,
    )
    assert presets["sdxl-base"].cfg and presets["sdxl-base"].steps == 25 and presets["sdxl-base"].unet is None


def test_preset_resolution_tiny_gets_sampler_settings_only_and_flags_win():
    lightning = get_preset("lightning-8step")
    own = preset_settings(lightning)
    assert own["unet"].endswith("sdxl_lightning_8step_unet.safetensors")
    assert (own["height"], own["width"], own["variant"]) == (1024, 1024, None)
    tiny = preset_settings(lightning, model="tiny", steps=None)
    assert tiny == {
        "model": "tiny",
        "steps": 8,
        "sampler": "euler",
        "timestep_spacing": "trailing",
        "cfg": False,
        "guidance_scale": 0.0,
        "preset": "lightning-8step",
    }
    assert preset_settings(lightning, model="tiny", steps=3, sampler="euler_ancestral")["steps"] == 3
    with pytest.raises(InvalidInput, match="Unknown preset 'lightning-3step'; choose one of: sdxl-base"):
        get_preset("lightning-3step")


def test_malformed_presets_file_fails_in_one_line(tmp_path):
    path = tmp_path / "presets.json"
    path.write_text(json.dumps({"fast": {"description": "x"}}))
    with pytest.raises(InvalidInput, match=r"Preset 'fast' .* is malformed \(cfg, guidance_scale"):
        load_presets(path)
    entry = {**dataclasses.asdict(get_preset("turbo")), "timestep_spacing": "karras"}
    entry.pop("name")
    path.write_text(json.dumps({"fast": entry}))
    with pytest.raises(InvalidInput, match="Unsupported timestep spacing 'karras'"):
        load_presets(path)


def test_cli_and_app_flags_apply_a_preset():
    from pipeline.__main__ import build_parser
    from web.options import parse_args

    def cli(*flags) -> EngineConfig:
        return engine_config(build_parser().parse_args(["generate", "--prompt", "p", "--out", "o", *flags]))

    two = cli("--preset", "lightning-2step")
    assert two == EngineConfig(
        model=SDXL_BASE,
        unet="ByteDance/SDXL-Lightning:sdxl_lightning_2step_unet.safetensors",
        steps=2,
        sampler=two.sampler,
        timestep_spacing="trailing",
        cfg=False,
        guidance_scale=0.0,
        preset="lightning-2step",
        height=1024,
        width=1024,
    )
    assert RequestRules.of(two).sampler == "Euler"  # what a request gets (the config keeps the preset's id)
    on_tiny = cli("--preset", "turbo", "--model", "tiny", "--guidance-scale", "2")
    assert (on_tiny.steps, on_tiny.height, RequestRules.of(on_tiny).sampler, on_tiny.guidance_scale) == (
        1,
        128,
        "Euler a",
        2.0,
    )
    assert on_tiny.unet is None and on_tiny.variant is None
    plain = cli("--model", "tiny", "--no-cfg", "--timestep-spacing", "linspace", "--steps-offset", "0")
    assert (plain.cfg, plain.timestep_spacing, plain.steps_offset, plain.steps) == (False, "linspace", 0, 4)
    assert plain.sampler is None and plain.preset is None  # the checkpoint's own scheduler class

    config = parse_args(["--preset", "turbo"]).config
    assert (config.model, config.variant, config.sizes, config.height, config.steps, config.cfg) == (
        "stabilityai/sdxl-turbo",
        "fp16",
        (),
        512,
        1,
        False,
    )
    config = parse_args(["--preset", "lightning-4step", "--model", "tiny", "--sampler", "euler_ancestral"]).config
    assert (config.unet, config.steps, config.sampler, config.cfg, config.height) == (None, 4, "Euler a", False, 128)
    assert len(config.sizes) == 3  # the tiny model's offered sizes, as without a preset


def test_a_guidance_free_preset_on_the_cli_names_the_guidance_it_ignores(tiny_dir):
    """`--preset turbo --guidance-scale 7`: the request records guidance as ignored, which the CLI warns about."""
    from pipeline.__main__ import _check, build_parser
    from pipeline.contract.fields import FIELD

    flags = ["--preset", "turbo", "--model", str(tiny_dir), "--guidance-scale", "7", "--negative-prompt", "blurry"]
    args = build_parser().parse_args(["generate", "--prompt", "p", "--out", "o", *flags])
    _, request, _ = _check(args)
    assert {FIELD[name].flag for name in request.ignored} == {"--guidance-scale", "--negative-prompt"}
    _, plain, _ = _check(
        build_parser().parse_args(["generate", "--prompt", "p", "--out", "o", "--model", str(tiny_dir)])
    )
    assert plain.ignored == ()
