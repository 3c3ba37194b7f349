"""Live previews: the traced latent->RGB program agrees with the numpy reference and with ComfyUI's SDXL factors."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pipeline.device.preview import SDXL_LATENT_RGB, SDXL_LATENT_RGB_BIAS, latents_to_rgb, latents_to_rgb_numpy


def _latents(batch, height, width, seed=0):
    # Scaled like real predicted clean latents (SDXL's are roughly within ±4) so that clamping is exercised too.
    return (np.random.default_rng(seed).standard_normal((batch, 4, height, width)) * 2).astype(np.float32)


@pytest.mark.parametrize("scale", [1, 2])
def test_traced_and_numpy_previews_agree(scale):
    latents = _latents(3, 16, 24)
    traced = np.asarray(jax.jit(latents_to_rgb, static_argnums=1)(latents, scale))
    reference = latents_to_rgb_numpy(latents, scale)
    assert traced.dtype == reference.dtype == np.uint8
    assert traced.shape == reference.shape == (3, 16 * scale, 24 * scale, 3)
    difference = np.abs(traced.astype(int) - reference.astype(int))
    assert difference.max() <= 1  # a float32 sum may land on the other side of a .5 once in a while
    assert (difference == 0).mean() > 0.999
    assert 0 < (reference == 255).mean() < 0.5 and 0 < (reference == 0).mean() < 0.5  # clamping was exercised


def test_projection_is_comfyuis_sdxl_one():
    """Zero latents show the bias; one unit in channel c adds factors row c; ±10 clamps to 255 / 0."""
    zero = np.zeros((1, 4, 1, 1), np.float32)
    bias = np.asarray(SDXL_LATENT_RGB_BIAS)
    assert latents_to_rgb_numpy(zero)[0, 0, 0].tolist() == np.round((bias + 1) * 127.5).astype(int).tolist()
    assert latents_to_rgb_numpy(zero)[0, 0, 0].tolist() == [141, 125, 127]
    for channel in range(4):
        unit = zero.copy()
        unit[0, channel] = 1.0
        expected = np.round((np.clip(bias + np.asarray(SDXL_LATENT_RGB[channel]), -1, 1) + 1) * 127.5)
        assert np.asarray(latents_to_rgb(unit))[0, 0, 0].tolist() == expected.astype(int).tolist()
    bright = zero.copy()
    bright[0, 0] = 10.0  # channel 0 raises R, G and B
    assert np.asarray(latents_to_rgb(bright))[0, 0, 0].tolist() == [255, 255, 255]
    assert np.asarray(latents_to_rgb(-bright))[0, 0, 0].tolist() == [0, 0, 0]


def test_preview_program_keeps_the_batch_split():
    """One image per device in, one preview per device out: only uint8 pixels need to come back."""
    devices = np.array(jax.devices()[:8])
    sharding = NamedSharding(Mesh(devices, ("batch",)), PartitionSpec("batch"))
    latents = jax.device_put(_latents(8, 8, 8, seed=1), sharding)
    pixels = jax.jit(latents_to_rgb, out_shardings=sharding)(latents)
    assert pixels.dtype == np.uint8 and pixels.shape == (8, 8, 8, 3)
    assert pixels.sharding.is_equivalent_to(sharding, 4)
    np.testing.assert_allclose(np.asarray(pixels), latents_to_rgb_numpy(np.asarray(latents)), atol=1)


def test_numpy_reference_refuses_other_shapes():
    with pytest.raises(ValueError, match=r"\[B, 4, h, w\]"):
        latents_to_rgb_numpy(np.zeros((1, 3, 4, 4), np.float32))


def test_engine_reports_previews_every_two_steps_without_changing_the_images(engine):
    """The served loop: a preview after steps 2, 4, 6 of 8 (not after the last: the answer comes next), one per
    image at latent size; the images are the same as without a listener, and nothing compiles."""
    from pipeline.host.compiling.compile_cache import CompileCounter

    request = engine.request("a lighthouse at dusk", seed=7, steps=8)
    seen = []
    compiles = CompileCounter.compiles()
    shown = engine.generate(request, on_preview=lambda done, total, pixels: seen.append((done, total, pixels)))
    plain = engine.generate(request)
    assert CompileCounter.compiles() == compiles
    assert [(done, total) for done, total, _ in seen] == [(2, 8), (4, 8), (6, 8)]
    height, width = request.size
    for _, _, pixels in seen:
        assert pixels.dtype == np.uint8 and pixels.shape == (engine.num_images, height // 8, width // 8, 3)
    assert not np.array_equal(seen[0][2], seen[-1][2])  # the picture forms
    assert np.array_equal(shown.images, plain.images)
