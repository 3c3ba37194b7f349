"""ESRGAN upscalers (RRDBNet): both PyTorch layouts and both file kinds converted and run as torch runs them, the
unsafe and unknown files refused in one sentence, and the tiled run against the whole-image one.

Fixtures: scripts/make_esrgan_fixtures.py (tests/fixtures/esrgan/: tiny seeded models, torch's outputs).
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FIXTURES
from safetensors.numpy import save_file

from pipeline.checkpoint.upscaler_loading import load_upscaler, load_upscaler_dir, read_tensors
from pipeline.contract.errors import InvalidInput

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
        blocks, 8, 4, unshuffle, upsamples)  # fmt: skip
    image = EXPECTED[f"in_{weights.name}"].transpose(0, 2, 3, 1)  # torch's NCHW -> NHWC
    out = np.asarray(module.apply({"params": weights.params}, jnp.asarray(image))).transpose(0, 3, 1, 2)
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
    with pytest.raises(InvalidInput, match=r"^Upscaler evil.pth: it names (posix|os|nt)\.system, which a file of "
                                           r"weights has no need of; it was not loaded\.$"):  # fmt: skip
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
        "wrong.safetensors": ({**tensors, "conv_body.weight": np.zeros((8, 8, 1, 1), np.float32)},
                              "conv_body.weight (8, 8, 1, 1) has no place"),
        "extra.safetensors": ({**tensors, "conv_extra.weight": np.zeros((8, 8, 3, 3), np.float32)}, "conv_extra"),
    }  # fmt: skip
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
    whole = np.clip(np.asarray(weights.module.apply({"params": weights.params}, jnp.asarray(image[None])))[0], 0, 1)
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
    from pipeline.host.compile_cache import CompileCounter
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
