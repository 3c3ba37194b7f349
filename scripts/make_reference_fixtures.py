"""Regenerate tests/fixtures/flax-pipeline-expected.{npz,json}: what diffusers' own FlaxStableDiffusionXLPipeline
makes of the tiny checkpoint (tests/engine/test_parity.py compares the engine with it) and what it reads from it
(tests/engine/test_tiny.py checks the checkpoint's geometry and tokenizers against it).

Needs diffusers' last Flax release, so it runs in the reference venv (requirements-reference.txt), never in the
app's venv, CI or at run time; the checkpoint is the one the tests build (`tiny_checkpoint()`, seed 0):

    .venv/bin/python -m bench.reference_venv     # makes .venv-reference once
    .venv-reference/bin/python scripts/make_reference_fixtures.py \\
        "$(.venv/bin/python -c 'from pipeline.checkpoint.tiny import tiny_checkpoint; print(tiny_checkpoint())')"

What it writes (8 virtual CPU devices, float32, as the tests run):
- npz `latents`: float32 [8, 4, 8, 8], standard-normal noise of `jax.random.PRNGKey(seed)` for the seeds 1234..1241
  (the engine's `initial_latents` for a request of seed 1234: test_parity checks that it still draws exactly these);
  `images_negative`, `images_no_negative`: uint8 [8, 64, 64, 3], the pipeline's images from those latents (2 Euler
  steps, guidance 6.5, `round(x * 255)` of its float output), with the negative prompt and without one;
  `prepare_inputs_ids`: int32 [1, 2, 77], the pipeline's `prepare_inputs` of test_tiny's fifteen-word prompt.
- json: the versions that made it, the sha256 of each weights file of the checkpoint (a test on other weights says
  so), the requests, and what the pipeline read from the checkpoint (geometry, scheduler, tokenizers and their ids
  for the tests' prompts).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib import metadata
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # as tests/conftest.py
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
OUT = FIXTURES / "flax-pipeline-expected"
#: tests/conftest.py's TEST_SIZE and TEST_STEPS.
SIZE, STEPS = 64, 2
#: tests/engine/test_parity.py's request.
PROMPT, SEED, GUIDANCE = "a cozy cabin in a snowy forest, warm light", 1234, 6.5
NEGATIVE = "blurry, low quality"
IMAGES = 8
#: The weights files of the checkpoint, hashed into the json.
WEIGHTS = {
    "text_encoder": "flax_model.msgpack",
    "text_encoder_2": "flax_model.msgpack",
    "unet": "diffusion_flax_model.msgpack",
    "vae": "diffusion_flax_model.msgpack",
}
#: tests/engine/test_tiny.py's prompts.
ROUND_TRIP = "a portrait of a wizard playing a xylophone in anime style"
FIFTEEN_WORDS = "a cinematic photo of a red fox in a snowy forest at sunset highly detailed"
HUNDRED_WORDS = " ".join((FIFTEEN_WORDS.split() * 7)[:100])
VERSIONS = ("jax", "jaxlib", "flax", "diffusers", "transformers", "numpy")


def weights_sha256(checkpoint: Path) -> dict[str, str]:
    return {name: hashlib.sha256((checkpoint / name / file).read_bytes()).hexdigest() for name, file in WEIGHTS.items()}


def latents_for(seeds: list[int]) -> np.ndarray:
    """The engine's initial noise, written out: one standard-normal draw of PRNGKey(seed) per image."""
    import jax
    import jax.numpy as jnp

    keys = jax.vmap(jax.random.PRNGKey)(np.asarray(seeds, np.uint32))
    return np.asarray(jax.vmap(lambda key: jax.random.normal(key, (4, SIZE // 8, SIZE // 8), jnp.float32))(keys))


def images(pipe, p_params, latents: np.ndarray, negative: str) -> np.ndarray:
    """The pipeline's images for PROMPT from `latents`, as test_parity handed them before: uint8 [n, S, S, 3]."""
    import jax
    from flax.training.common_utils import shard

    n = len(latents)
    prompt_ids = shard(np.asarray(pipe.prepare_inputs([PROMPT] * n)))
    negative_ids = shard(np.asarray(pipe.prepare_inputs([negative] * n))) if negative else None
    out = pipe(
        prompt_ids,
        p_params,
        jax.random.split(jax.random.PRNGKey(0), n),
        num_inference_steps=STEPS,
        guidance_scale=GUIDANCE,
        height=SIZE,
        width=SIZE,
        latents=shard(latents),
        neg_prompt_ids=negative_ids,
        jit=True,
    ).images
    return np.round(np.asarray(out).reshape(n, SIZE, SIZE, 3) * 255).astype(np.uint8)


def read_back(pipe, params) -> dict:
    """What the pipeline read from the checkpoint: the facts tests/engine/test_tiny.py checks."""
    import jax

    tokenizers = {"tokenizer": pipe.tokenizer, "tokenizer_2": pipe.tokenizer_2}
    weights = {k: v for k, v in params.items() if k != "scheduler"}
    return {
        "vae_scale_factor": pipe.vae_scale_factor,
        "scheduler_class": type(pipe.scheduler).__name__,
        "text_projection": {name: "text_projection" in params[name] for name in ("text_encoder", "text_encoder_2")},
        "weight_dtypes": sorted({str(np.asarray(leaf).dtype) for leaf in jax.tree_util.tree_leaves(weights)}),
        "tokenizers": {
            name: {
                "model_max_length": tokenizer.model_max_length,
                "pad_token": tokenizer.pad_token,
                "length": len(tokenizer),
                "bos_token_id": tokenizer.bos_token_id,
                "eos_token_id": tokenizer.eos_token_id,
                "round_trip_ids": tokenizer(ROUND_TRIP).input_ids,
                "round_trip_decoded": tokenizer.decode(tokenizer(ROUND_TRIP).input_ids, skip_special_tokens=True),
                "fifteen_words_tokens": len(tokenizer(FIFTEEN_WORDS).input_ids),
                "hundred_words_tokens": len(tokenizer(HUNDRED_WORDS).input_ids),
            }
            for name, tokenizer in tokenizers.items()
        },
        "prepare_inputs_prompt": FIFTEEN_WORDS,  # its ids: the npz's `prepare_inputs_ids`
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not (Path(argv[0]) / "model_index.json").is_file():
        print("usage: make_reference_fixtures.py TINY_CHECKPOINT_DIR (see the docstring)", file=sys.stderr)
        return 2
    import jax
    from diffusers import FlaxStableDiffusionXLPipeline
    from flax.jax_utils import replicate

    checkpoint = Path(argv[0])
    assert jax.device_count() == IMAGES, f"{jax.device_count()} devices, not {IMAGES}: XLA_FLAGS is set elsewhere"
    pipe, params = FlaxStableDiffusionXLPipeline.from_pretrained(str(checkpoint), split_head_dim=True)
    p_params = replicate(params)
    seeds = [SEED + i for i in range(IMAGES)]  # the engine's seeds for one request of seed SEED
    latents = latents_for(seeds)
    np.savez_compressed(
        OUT.with_suffix(".npz"),
        latents=latents,
        images_negative=images(pipe, p_params, latents, NEGATIVE),
        images_no_negative=images(pipe, p_params, latents, ""),
        prepare_inputs_ids=np.asarray(pipe.prepare_inputs(FIFTEEN_WORDS), np.int32),
    )
    record = {
        "made_by": "scripts/make_reference_fixtures.py",
        "versions": {name: metadata.version(name) for name in VERSIONS},
        "checkpoint_weights_sha256": weights_sha256(checkpoint),
        "request": {
            "prompt": PROMPT,
            "negative_prompt": NEGATIVE,
            "seeds": seeds,
            "guidance_scale": GUIDANCE,
            "steps": STEPS,
            "height": SIZE,
            "width": SIZE,
            "dtype": "float32",
        },
        "read_back": read_back(pipe, params),
    }
    OUT.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    print(OUT.with_suffix(".npz"), OUT.with_suffix(".json"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
