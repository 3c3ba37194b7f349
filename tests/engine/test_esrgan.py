"""ESRGAN upscalers (RRDBNet): both PyTorch layouts and both file kinds converted and run as torch runs them, the
unsafe and unknown files refused in one sentence, and the tiled run against the whole-image one.

Fixtures: scripts/make_esrgan_fixtures.py (tests/fixtures/esrgan/: tiny seeded models, torch's outputs).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FEATURE_DEVICES, FIXTURES, TEST_SIZE, TINY_PT
from safetensors.numpy import save_file

from pipeline.checkpoint.upscaler_loading import load_upscaler, load_upscaler_dir, read_tensors
from pipeline.contract.errors import InvalidInput
from pipeline.contract.hires import UPSCALERS
from pipeline.contract.request import parse_request

ESRGAN = FIXTURES / "esrgan"
EXPECTED = np.load(ESRGAN / "expected.npz")
MODELS = {  # file: (scale, RRDBs, pixel-unshuffle, upsamples)
    "tiny-x4.safetensors": (4, 2, 1, 2),
    "tiny-x2.pth": (2, 1, 2, 2),
    "tiny-old-x4.pth": (4, 1, 1, 2),
    "tiny-old-x2.safetensors": (2, 1, 1, 1),
}


@pytest.mark.parametrize("file", sorted(MODELS))
def test_conversion_runs_as_torch(file):
    """Each layout and file kind: the shapes read from the file, and the output torch gave (float32 rounding)."""
    weights = load_upscaler(ESRGAN / file)
    scale, blocks, unshuffle, upsamples = MODELS[file]
    module = weights.module
    assert (weights.name, weights.scale) == (file.rsplit(".", 1)[0], scale)
    assert (module.blocks, module.features, module.growth, module.unshuffle, module.upsamples) == (
        blocks,
        8,
        4,
        unshuffle,
        upsamples,
    )
    image = EXPECTED[f"in_{weights.name}"].transpose(0, 2, 3, 1)  # torch's NCHW -> NHWC
    out = np.asarray(jax.jit(module.apply)({"params": weights.params}, jnp.asarray(image))).transpose(0, 3, 1, 2)
    expected = EXPECTED[f"out_{weights.name}"]
    assert out.shape == expected.shape
    np.testing.assert_allclose(out, expected, atol=1e-6, rtol=0)  # outputs are ~0.1: float32 sums of ~200 terms


def _torch_zip(path, payload: bytes) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("evil/data.pkl", payload)


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def test_pth_that_would_run_code_is_refused(tmp_path):
    path = tmp_path / "evil.pth"
    _torch_zip(path, pickle.dumps({"conv_first.weight": _RunsCode()}, protocol=2))
    with pytest.raises(
        InvalidInput,
        match=r"^Upscaler evil.pth: it names (posix|os|nt)\.system, which a file of "
        r"weights has no need of; it was not loaded\.$",
    ):
        load_upscaler(path)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_bytes(b"\x80\x02not a zip"), "legacy"),
        (lambda p: _torch_zip(p, b"garbage"), "cannot be read"),
        (lambda p: zipfile.ZipFile(p, "w").close(), "no single <name>/data.pkl"),
        (lambda p: _torch_zip(p, pickle.dumps({"a": 1}, protocol=2)), "no state dict of tensors"),
    ],
)
def test_bad_pth_is_one_sentence(tmp_path, make, message):
    path = tmp_path / "bad.pth"
    make(path)
    with pytest.raises(InvalidInput, match=message) as caught:
        load_upscaler(path)
    assert str(caught.value).startswith("Upscaler bad.pth") and "\n" not in str(caught.value)


def test_torch_legacy_format_is_refused():
    with pytest.raises(InvalidInput, match="legacy"):
        load_upscaler(ESRGAN / "legacy.pth")


def test_other_networks_and_damaged_models_are_refused(tmp_path):
    tensors = read_tensors(ESRGAN / "tiny-x4.safetensors")
    cases = {
        "unet.safetensors": ({"down.0.weight": np.zeros((4, 4), np.float32)}, "neither conv_first nor model.0"),
        "short.safetensors": ({k: v for k, v in tensors.items() if k != "conv_hr.bias"}, "lacks 1 of"),
        "wrong.safetensors": (
            {**tensors, "conv_body.weight": np.zeros((8, 8, 1, 1), np.float32)},
            "conv_body.weight (8, 8, 1, 1) has no place",
        ),
        "extra.safetensors": ({**tensors, "conv_extra.weight": np.zeros((8, 8, 3, 3), np.float32)}, "conv_extra"),
    }
    for name, (content, message) in cases.items():
        save_file(content, str(tmp_path / name))
        with pytest.raises(InvalidInput, match=re.escape(message)):
            load_upscaler(tmp_path / name)
    lines: list[str] = []
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "good.safetensors").write_bytes((ESRGAN / "tiny-x4.safetensors").read_bytes())
    found = load_upscaler_dir(tmp_path, lines.append)
    assert list(found) == ["good"]  # the four bad files each logged in one line and skipped; .txt not looked at
    assert len(lines) == len(cases) and all("\n" not in line and line.endswith("Skipped.") for line in lines)


def _picture(height: int, width: int, seed: int = 0) -> np.ndarray:
    """float32 [h, w, 3] in [0, 1]: a smooth picture (6×6 random colours, bicubic-upsampled) as a photo is."""
    from PIL import Image

    colours = (np.random.default_rng(seed).random((6, 6, 3)) * 255).astype(np.uint8)
    return np.asarray(Image.fromarray(colours).resize((width, height), Image.Resampling.BICUBIC), np.float32) / 255


def test_tiles_blend_to_the_whole_pictures_output():
    """Tiles of 24 px overlapping by 8 on a 40² picture (starts 0 and 16; ×4: 160² out) against one whole-picture run.

    Away from the overlap the tiled output is the whole run's to float32 rounding: the tiling adds nothing there.
    In the overlap each tile saw zero padding beyond its edge where the whole run saw the picture; the feather
    leaves out each tile's outer quarter of the overlap and cross-fades the rest, so what is left stays under one
    uint8 level (measured: 0.00069 of 1, 0.18 of a level, for this model and picture; a linear cross-fade over the
    whole overlap, A1111's, gave 0.0022 on the same): no visible seam. The bound is in the overlap, not everywhere:
    the seams differ from the whole run where nothing else does, as any tiling with an overlap smaller than the
    network's receptive field must.
    """
    from pipeline.host.upscale_tiles import TiledUpscaler, tile_starts

    weights = load_upscaler(ESRGAN / "tiny-old-x4.pth")
    image = _picture(40, 40)
    whole = np.asarray(jax.jit(weights.module.apply)({"params": weights.params}, jnp.asarray(image[None])))[0]
    whole = np.clip(whole, 0, 1)
    upscaler = TiledUpscaler(weights.module, weights.params, tile=24, overlap=8)
    tiled = upscaler.upscale_float(image)
    assert tiled.shape == whole.shape == (160, 160, 3) and tile_starts(40, 24, 8) == [0, 16]
    error = np.abs(tiled - whole).max(axis=-1)
    overlap = np.zeros(error.shape, bool)  # input 16..24 -> output 64..96, along either axis
    overlap[64:96, :] = overlap[:, 64:96] = True
    assert error[~overlap].max() < 1e-6
    assert error[overlap].max() < 1 / 255


def test_one_program_for_every_picture_size():
    """After `compile()`, pictures smaller than a tile (mirrored out), uneven and larger than one tile compile
    nothing; the uint8 output has scale × the input's sides."""
    from pipeline.host.compiling.compile_cache import CompileCounter
    from pipeline.host.upscale_tiles import TiledUpscaler

    weights = load_upscaler(ESRGAN / "tiny-x2.pth")  # pixel-unshuffle 2: tiles must be even, pictures need not be
    upscaler = TiledUpscaler(weights.module, weights.params, tile=16, overlap=4, batch=2)
    upscaler.compile()
    before = CompileCounter.compiles()
    for height, width in ((9, 13), (16, 16), (21, 40)):
        image = (_picture(height, width, seed=height) * 255).astype(np.uint8)
        out = upscaler.upscale(image)
        assert out.shape == (2 * height, 2 * width, 3) and out.dtype == np.uint8
    assert CompileCounter.compiles() == before


@pytest.fixture(scope="module")
def esrgan_engine(tmp_path_factory):
    """tiny-pt on 2 devices at 64 px, hires scale 2 (test_hires.py's engine, one scale), with --upscaler-dir holding a
    ×2 and a ×4 model and one broken file."""

    from pipeline.generator import Generator

    directory = tmp_path_factory.mktemp("upscalers")
    for name in ("tiny-x2.pth", "tiny-x4.safetensors"):
        (directory / name).write_bytes((ESRGAN / name).read_bytes())
    (directory / "broken.pth").write_bytes(b"not a torch file")
    generator = Generator.from_pretrained(
        str(TINY_PT),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=3,
        dtype="float32",
        speed_levers=False,
        prompt_windows=1,
        devices=jax.devices()[:FEATURE_DEVICES],
        hires_scales=(2.0,),
        upscaler_dir=str(directory),
    )
    generator.warmup()
    return generator


def test_esrgan_hires_fix_compiles_nothing_and_reads_back(esrgan_engine):
    """Both models run as hires upscalers (the ×2 lands on 128 px; the ×4 makes 256 px, then Lanczos to 128) with no
    compile; each picture differs from Lanczos's (the model ran); `Hires upscaler: <name>` is written and read."""
    from web.page.png_info import parse_infotext

    assert esrgan_engine.rules.hires_upscalers == (*UPSCALERS, "tiny-x2", "tiny-x4")  # broken.pth logged, left out
    before = esrgan_engine.compile_count
    pictures = {}
    for upscaler in ("tiny-x2", "tiny-x4", "Lanczos"):
        result = esrgan_engine.generate(
            esrgan_engine.request(
                "a red fox", seed=5, hires_scale=2.0, hires_steps=2, hires_denoise=0.5, hires_upscaler=upscaler
            )
        )
        assert result.images[0].size == (128, 128)
        assert parse_infotext(result.parameters[0]).settings["Hires upscaler"] == upscaler
        pictures[upscaler] = np.asarray(result.images[0], np.int16)
    assert esrgan_engine.compile_count == before  # nothing compiles per request
    assert all(np.abs(pictures[name] - pictures["Lanczos"]).max() > 0 for name in ("tiny-x2", "tiny-x4"))


def test_esrgan_resize_is_the_model_then_lanczos(esrgan_engine):
    """The pixel step alone: each image through the model (tiled), then PIL's Lanczos to the hires size when the
    model's scale is not the one asked for (A1111's rule), split back over the batch."""
    from PIL import Image

    from pipeline.device.sharding import global_batch, to_host

    images = (np.stack([_picture(64, 64, seed=i) for i in range(esrgan_engine.num_images)]) * 255).astype(np.uint8)
    pixels = global_batch((images,), esrgan_engine.placement.batch_sharding)[0]
    for name, scale in (("tiny-x2", 2), ("tiny-x4", 4)):
        model = esrgan_engine.upscalers[name]
        out = to_host(esrgan_engine.placement.resize(pixels, size=(128, 128), method="LANCZOS", model=model))
        for image, got in zip(images, out, strict=True):
            upscaled = model.upscale(image)
            assert upscaled.shape == (64 * scale, 64 * scale, 3)
            expected = (
                upscaled
                if scale == 2
                else np.asarray(Image.fromarray(upscaled).resize((128, 128), resample=Image.Resampling.LANCZOS))
            )
            np.testing.assert_array_equal(got, expected)


def test_unknown_upscaler_names_the_offered_ones(esrgan_engine):
    with pytest.raises(
        InvalidInput,
        match=r"^Unknown hires upscaler 'broken'; choose one of: Latent, .*Nearest, "
        r"tiny-x2, tiny-x4\.$",
    ):
        esrgan_engine.request("a fox", hires_scale=2.0, hires_upscaler="broken")
    assert esrgan_engine.request("a fox", hires_scale=2.0, hires_upscaler="TINY-X4").hires_upscaler == "tiny-x4"


def test_cli_takes_an_upscaler_dir_model(tmp_path):
    """`generate --upscaler-dir DIR --hires-upscaler NAME`: the name is checked against DIR's model files before the
    model loads; another name is refused in one sentence naming the offered ones."""
    from pipeline.__main__ import _check, build_parser

    (tmp_path / "4x-Tiny.safetensors").write_bytes((ESRGAN / "tiny-x4.safetensors").read_bytes())
    argv = [
        "generate",
        "--model",
        "tiny",
        "--prompt",
        "a fox",
        "--hires-scale",
        "2",
        "--upscaler-dir",
        str(tmp_path),
        "--hires-upscaler",
        "4x-tiny",
        "--out",
        str(tmp_path),
    ]
    config, request, _ = _check(build_parser().parse_args(argv))
    assert config.upscaler_dir == str(tmp_path) and request.hires_upscaler == "4x-Tiny"
    with pytest.raises(InvalidInput, match=r"Unknown hires upscaler '4x-other'; .*Nearest, 4x-Tiny\.$"):
        _check(build_parser().parse_args([*argv[:-3], "4x-other", *argv[-2:]]))


def test_a_name_the_engine_could_not_read_is_refused(esrgan_engine):
    """A request checked against a folder's file names (the CLI checks before loading) that names a file the engine
    left out gets one sentence, not Lanczos in its place."""
    rules = dataclasses.replace(esrgan_engine.rules, hires_upscalers=(*esrgan_engine.rules.hires_upscalers, "broken"))
    request = parse_request("a fox", rules=rules, hires_scale=2.0, hires_upscaler="broken")
    with pytest.raises(
        InvalidInput,
        match=r"^The hires upscaler broken is not offered by this server: its file could "
        r"not be read \(the server's log says why\)\.$",
    ):
        esrgan_engine.generate(request)


def test_the_page_offers_the_servers_upscaler_models(esrgan_engine):
    """The Second pass section's Upscaler dropdown lists the engine's models after A1111's own, as the request's check
    accepts them."""
    import gradio as gr

    from web.page.layout import hires_panel

    with gr.Blocks():
        controls = hires_panel(esrgan_engine.rules)
    offered = [value for _, value in controls["hires_upscaler"].choices]
    assert offered == [*UPSCALERS, "tiny-x2", "tiny-x4"]
