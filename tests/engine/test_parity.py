"""The engine computes what diffusers' own FlaxStableDiffusionXLPipeline computes, given the same noise."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import TEST_SIZE, TEST_STEPS, generate
from flax.jax_utils import replicate
from flax.training.common_utils import shard

from pipeline.device.denoise import initial_latents

#: Largest difference allowed, in 8-bit levels (the engine rounds to uint8 on device; the reference returns floats).
MAX_LEVELS = 1


@pytest.fixture(scope="module")
def reference(tiny_dir):
    from diffusers import FlaxStableDiffusionXLPipeline

    pipe, params = FlaxStableDiffusionXLPipeline.from_pretrained(str(tiny_dir), split_head_dim=True)
    return pipe, replicate(params)


@pytest.mark.parametrize("negative_prompt", ["", "blurry, low quality"])
def test_engine_matches_reference_pipeline(engine, reference, negative_prompt):
    pipe, p_params = reference
    prompt, seed, guidance = "a cozy cabin in a snowy forest, warm light", 1234, 6.5
    result = generate(engine, prompt, negative_prompt=negative_prompt, seed=seed, guidance_scale=guidance)
    n = engine.num_images

    # The engine's noise for these seeds, handed to the reference as its initial latents.
    latents = np.asarray(initial_latents(np.asarray(result.seeds, np.uint32), TEST_SIZE, TEST_SIZE, 8))
    prompt_ids = shard(np.asarray(pipe.prepare_inputs([prompt] * n)))
    negative_ids = shard(np.asarray(pipe.prepare_inputs([negative_prompt] * n))) if negative_prompt else None
    expected = pipe(
        prompt_ids,
        p_params,
        jax.random.split(jax.random.PRNGKey(0), n),
        num_inference_steps=TEST_STEPS,
        guidance_scale=guidance,
        height=TEST_SIZE,
        width=TEST_SIZE,
        latents=shard(latents),
        neg_prompt_ids=negative_ids,
        jit=True,
    ).images
    expected = np.round(np.asarray(expected).reshape(n, TEST_SIZE, TEST_SIZE, 3) * 255)

    got = np.stack([np.asarray(image) for image in result.images]).astype(np.float32)
    assert np.abs(got - expected).max() <= MAX_LEVELS
    assert np.mean(got != expected) < 0.01  # all but a few rounding-boundary pixels are identical
