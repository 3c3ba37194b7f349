"""--cross-attention-cache (issue 46's lever): the text's cross-attention keys and values, projected once per request
by the UNet's own `to_k` / `to_v` (pipeline/device/cross_kv.py) instead of at every step.

The same pixels as an engine that projects them every step, on each path a base step takes: a plain request, guidance
ending part way (the table is made again for the conditional half), DeepCache's shallow steps, a prompt read in three
windows, a ControlNet (its own attention layers, named like the UNet's, keep projecting the text), a LoRA that
changes `attn2.to_k` (the table comes from the merged kernels), the hires fix's second pass; no request compiles;
the settings it refuses; on by default on CPU devices only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import CONTROLNETS, FEATURE_DEVICES, FIXTURES, TEST_SIZE, TINY_PT, served_programs_only

from bench.cpu.program_times import ProgramTimer
from pipeline.config import EngineConfig
from pipeline.contract.errors import InvalidInput
from pipeline.device import attention
from pipeline.host.compiling.programs import ProgramKey, program_keys
from pipeline.host.text_cache import TextCache

#: Both engines' settings: a ControlNet, the LoRA fixtures, the speed levers (the default), three text windows (the
#: default). Beside the ControlNet and the hires scale, these are `feature_engine`'s, so the cached engine's other
#: programs are that engine's, and JAX's cache compiles them once for both (two windows made programs of their own).
SETTINGS = dict(
    height=TEST_SIZE,
    width=TEST_SIZE,
    steps=3,
    dtype="float32",
    embeddings_dir=str(FIXTURES / "embeddings"),
    previews=False,
    controlnets=(str(CONTROLNETS[0]),),
    controlnet_units=1,
    hires_scales=(2.0,),
)
UNIT = {"name": "controlnet-a", "image": FIXTURES / "controlnet-map-a.png", "weight": 1.2}
#: (prompt, request fields) per path a base step takes.
CASES = {
    "plain": ("a red fox in the snow", {}),
    "guidance ends": ("a red fox in the snow", {"cfg_end": 0.25, "guidance_scale": 9.0, "steps": 4}),
    "deepcache": ("a red fox in the snow", {"deepcache": 2}),
    "long prompt": (" ".join(["a red fox in the snow, watercolor"] * 12), {}),  # over 75 tokens: 3 windows
    "controlnet": ("a red fox in the snow", {"controlnets": [UNIT]}),
    "lora": ("a red fox in the snow <lora:kohya_sgm:0.8>", {}),
    "hires fix": (
        "a red fox in the snow",
        {"hires_scale": 2.0, "hires_steps": 2, "hires_denoise": 0.5, "cfg_end": 0.5},
    ),  # a second pass at 128², its own table
}


@pytest.fixture(scope="module")
def twins(lora_dir):
    """(with the cache, without it), on the same weights, each compiling only what the comparisons run.

    Not warmed up: these settings serve 43 programs (two text lengths, a ControlNet, the hires fix's 128² programs and
    six latent upscalers), about 20 of which no case runs, a CPU minute and a half to compile. What the warm-up would
    guarantee is checked per request instead (conftest's `served_programs_only`); the cached engine does the rest of
    a warm-up here: the LoRA merge's buffers and one request (the encoders, its table and the plain step, and the
    host's small programs a first request builds)."""
    from pipeline.generator import Generator

    devices = jax.devices()[:FEATURE_DEVICES]
    cached = Generator.from_pretrained(
        str(TINY_PT), devices=devices, lora_dir=str(lora_dir), cross_attention_cache=True, **SETTINGS
    )
    cached.loras.prepare()
    cached.generate(cached.request("warm-up"))
    plain = Generator.from_pretrained(
        str(TINY_PT), devices=devices, lora_dir=str(lora_dir), cross_attention_cache=False, **SETTINGS
    )
    return cached, plain


def _pixels(generator, prompt: str, fields: dict) -> np.ndarray:
    result = generator.generate(generator.request(prompt, negative_prompt="blurry", seed=11, **fields))
    return np.stack([np.asarray(image, np.int16) for image in result.images])


@pytest.mark.parametrize("case", list(CASES))
def test_same_pixels_as_projecting_at_every_step(twins, case):
    cached, plain = twins
    prompt, fields = CASES[case]
    with served_programs_only(cached):  # the table's programs too
        with_cache = _pixels(cached, prompt, fields)
    without = _pixels(plain, prompt, fields)
    assert np.abs(with_cache - without).max() <= 1, case  # the same products: equal here, at most 1 level anywhere
    if case == "hires fix":  # the second pass ran, at twice the size
        assert with_cache.shape[1:3] == (2 * TEST_SIZE, 2 * TEST_SIZE)
    elif case != "plain":  # each case takes its own path: its pixels are not the plain request's
        same = {name: value for name, value in fields.items() if name in ("guidance_scale", "steps")}
        assert np.abs(with_cache - _pixels(cached, CASES["plain"][0], same)).max() > 2, case


def test_a_kept_text_keeps_its_tables(twins, monkeypatch):
    """--text-cache keeps the tables with the text: a repeated text (another seed, guidance ending) runs neither the
    encoders nor `cross_kv`, and its pixels are those of the engine that projects the text at every step."""
    cached, plain = twins
    monkeypatch.setattr(cached, "text_cache", TextCache())
    fields = {"cfg_end": 0.5, "guidance_scale": 7.0, "seed": 12}  # both tables: with guidance, then without
    runs = []
    for _ in range(2):
        with ProgramTimer(cached.programs) as timer:
            runs.append(cached.generate(cached.request("a heron at dawn", negative_prompt="blurry", **fields)))
        runs[-1] = (runs[-1], [label for label in timer.labels if label.split()[0] in ("encode", "cross_kv")])
    (first, ran), (again, ran_again) = runs
    assert ran == ["encode cfg", "cross_kv cfg", "cross_kv no-cfg"] and ran_again == []
    without = plain.generate(plain.request("a heron at dawn", negative_prompt="blurry", **fields))
    for result in (first, again):
        assert np.abs(np.stack(result.images).astype(int) - np.stack(without.images).astype(int)).max() <= 1


def test_the_warm_up_compiles_a_table_per_guidance_mode_and_text_length(twins):
    cached, plain = twins
    tables = [key for key in cached.program_keys() if key.kind == "cross_kv"]
    assert sorted(key.label for key in tables) == [
        "cross_kv cfg",
        "cross_kv cfg 3 windows",
        "cross_kv no-cfg",
        "cross_kv no-cfg 3 windows",
    ]
    assert not [key for key in plain.program_keys() if key.kind == "cross_kv"]
    assert cached.programs.cross_attention_cache and not plain.programs.cross_attention_cache
    assert [key.kind for key in program_keys([(64, 64)], cfg=True, cross_kv=True)][:2] == ["encode", "cross_kv"]


def test_the_table_is_every_cross_attention_layer_of_the_unet(twins):
    """One (keys, values) pair per transformer layer (the tiny UNet's 17), [cB, K*77, C] each, and the UNet reading
    it gives what it gives projecting the text itself."""
    cached, _ = twins
    programs = cached.programs
    key = ProgramKey("cross_kv", cfg=True)
    hidden = jnp.asarray(np.random.default_rng(0).standard_normal((2 * cached.num_images, 77, 96)), jnp.float32)
    table = programs.compile(key)(programs.weights(key, cached._params), hidden)
    assert len(table) == 17 and all(path.endswith("/attn2") for path in table)
    widths = {k.shape[-1] for k, v in table.values()} | {v.shape[-1] for k, v in table.values()}
    assert widths == {64} and {k.shape[:2] for k, _ in table.values()} == {(2 * cached.num_images, 77)}

    unet, params = programs.modules.unet, jax.device_get(cached._params["unet"])
    rows = {path: tuple(np.asarray(x)[:2] for x in pair) for path, pair in table.items()}  # the first device's
    sample = jnp.asarray(np.random.default_rng(1).standard_normal((2, 4, 8, 8)), jnp.float32)
    added = {"text_embeds": jnp.zeros((2, 64)), "time_ids": jnp.asarray([[64, 64, 0, 0, 64, 64]] * 2, jnp.float32)}

    @jax.jit  # one program per table (or none), as the engine runs the UNet; eager, it was ~280 op-by-op compiles
    def noise(params, table):
        with attention.attention_hook("xla"), attention.text_keys_values(table):
            return unet.apply(
                {"params": params},
                sample,
                jnp.full((2,), 501.0),
                encoder_hidden_states=hidden[:2],
                added_cond_kwargs=added,
            ).sample

    projecting = np.asarray(noise(params, None))
    assert np.abs(np.asarray(noise(params, rows)) - projecting).max() < 1e-5
    wrong = {path: (k * 0, v * 0) for path, (k, v) in rows.items()}  # and it is read: zero keys and values change it
    assert np.abs(np.asarray(noise(params, wrong)) - projecting).max() > 1e-3


def test_flag_environment_and_refusals(monkeypatch):
    from web.options import parse_args

    assert parse_args(["--model", "tiny"]).config.cross_attention_cache is None  # the platform decides
    assert parse_args(["--model", "tiny", "--cross-attention-cache"]).config.cross_attention_cache is True
    assert parse_args(["--model", "tiny", "--no-cross-attention-cache"]).config.cross_attention_cache is False
    with pytest.raises(SystemExit):  # both: the parser's one-line error
        parse_args(["--model", "tiny", "--cross-attention-cache", "--no-cross-attention-cache"])
    monkeypatch.setenv("SDXL_CROSS_ATTENTION_CACHE", "1")
    assert parse_args(["--model", "tiny"]).config.cross_attention_cache is True
    monkeypatch.delenv("SDXL_CROSS_ATTENTION_CACHE")
    monkeypatch.setenv("SDXL_NO_CROSS_ATTENTION_CACHE", "1")
    assert parse_args(["--model", "tiny"]).config.cross_attention_cache is False
    for other in ({"quantize": "int8"}, {"attention": "diffusers"}):
        with pytest.raises(InvalidInput, match="^--cross-attention-cache needs a float UNet") as refused:
            EngineConfig(model="tiny", cross_attention_cache=True, **other)
        assert "\n" not in str(refused.value)


def test_on_by_default_on_cpu_devices_only():
    """Unset, the cache is on where the devices are CPU cores (a step program there pays the text's keys and values
    at every call, where diffusers' one program makes them once: bench/HISTORY.md) and off on TPU and GPU, where it
    is not timed yet; never where it cannot run; a setting given is kept."""
    from pipeline.generator import for_platform

    unset = EngineConfig(model="tiny")
    assert for_platform(unset, "cpu").cross_attention_cache is True
    assert [for_platform(unset, platform).cross_attention_cache for platform in ("tpu", "gpu")] == [False, False]
    assert for_platform(EngineConfig(model="tiny", quantize="int8"), "cpu").cross_attention_cache is False
    assert (
        for_platform(EngineConfig(model="tiny", attention="diffusers", prompt_windows=1), "cpu").cross_attention_cache
        is False
    )
    assert for_platform(EngineConfig(model="tiny", cross_attention_cache=False), "cpu").cross_attention_cache is False
    assert for_platform(EngineConfig(model="tiny", cross_attention_cache=True), "tpu").cross_attention_cache is True
