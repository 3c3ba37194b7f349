"""The engine computes what diffusers' own FlaxStableDiffusionXLPipeline computes, given the same noise.

The pipeline's images are a fixture (tests/fixtures/flax-pipeline-expected.*, scripts/make_reference_fixtures.py):
diffusers' last Flax release lives in the reference venv, not in the app's (requirements-reference.txt).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from conftest import FIXTURES, TEST_SIZE, TEST_STEPS, generate

from pipeline.device.denoise import initial_latents

#: Largest difference allowed, in 8-bit levels (the engine rounds to uint8 on device; the reference returns floats).
MAX_LEVELS = 1
EXPECTED = FIXTURES / "flax-pipeline-expected"


@pytest.fixture(scope="module")
def reference(tiny_dir):
    """The fixture's record and arrays, once its weights are known to be the tiny checkpoint's."""
    record = json.loads(EXPECTED.with_suffix(".json").read_text())
    request = record["request"]
    assert (request["height"], request["width"], request["steps"]) == (TEST_SIZE, TEST_SIZE, TEST_STEPS)
    for name, digest in record["checkpoint_weights_sha256"].items():
        weights = next(path for path in (tiny_dir / name).iterdir() if path.suffix == ".msgpack")
        assert hashlib.sha256(weights.read_bytes()).hexdigest() == digest, (
            f"the tiny checkpoint's {name} weights are not those the fixture was made from: rerun "
            "scripts/make_reference_fixtures.py in the reference venv"
        )
    with np.load(EXPECTED.with_suffix(".npz")) as arrays:
        return record, dict(arrays)


@pytest.mark.parametrize("negative_prompt", ["", "blurry, low quality"])
def test_engine_matches_reference_pipeline(engine, reference, negative_prompt):
    record, arrays = reference
    request = record["request"]
    prompt, seed, guidance = "a cozy cabin in a snowy forest, warm light", 1234, 6.5
    assert (request["prompt"], request["seeds"][0], request["guidance_scale"]) == (prompt, seed, guidance)
    if negative_prompt:
        assert request["negative_prompt"] == negative_prompt
    result = generate(engine, prompt, negative_prompt=negative_prompt, seed=seed, guidance_scale=guidance)
    n = engine.num_images
    assert list(result.seeds) == request["seeds"] and n == len(request["seeds"])

    # The engine's noise for these seeds is what the reference was handed as its initial latents.
    latents = np.asarray(initial_latents(np.asarray(result.seeds, np.uint32), TEST_SIZE, TEST_SIZE, 8))
    np.testing.assert_array_equal(latents, arrays["latents"])
    expected = arrays["images_negative" if negative_prompt else "images_no_negative"].astype(np.float32)
    assert expected.shape == (n, TEST_SIZE, TEST_SIZE, 3)

    got = np.stack([np.asarray(image) for image in result.images]).astype(np.float32)
    assert np.abs(got - expected).max() <= MAX_LEVELS
    assert np.mean(got != expected) < 0.01  # all but a few rounding-boundary pixels are identical
