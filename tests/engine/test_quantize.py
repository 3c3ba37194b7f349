"""`--quantize int8` (pipeline/device/quantize.py): the UNet's Dense and Conv layers int8 x int8 through qwix.

On the tiny random-weight checkpoint (64 px, 2 steps, float32, 8 devices) against the unquantized engine: the
weights placed are int8, the programs run int8 dots and convolutions, no request compiles anything (the levers'
programs included), and the pictures stay near the unquantized ones. Measured at these settings over 16 images:
mean 3.9 and max 43 levels of 255 from float32 (bf16 vs float32, for scale: mean 1.6, max 17). The bound below
leaves room for other seeds; it would catch a broken scale (noise or a flat image: tens of levels on average).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import TEST_SIZE, TEST_STEPS, generate

from pipeline.config import EngineConfig
from pipeline.contract.errors import InvalidInput

#: Mean |int8 - unquantized| over the pictures, in 8-bit levels.
MEAN_LEVELS = 10.0


@pytest.fixture(scope="module")
def int8_engine(tiny_dir):
    from pipeline.generator import Generator

    # One text window and no previews: half the programs to compile (the levers' stay: their requests run below).
    generator = Generator.from_pretrained(
        str(tiny_dir),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=TEST_STEPS,
        dtype="float32",
        quantize="int8",
        prompt_windows=1,
        previews=False,
    )
    generator.warmup()
    return generator


def test_int8_weights_are_placed_and_run_int8(int8_engine):
    from pipeline.host.compiling.programs import ProgramKey

    leaves = jax.tree_util.tree_leaves(int8_engine._params["unet"])
    int8_bytes = sum(leaf.nbytes for leaf in leaves if leaf.dtype == np.int8)
    assert int8_bytes > 0.9 * sum(leaf.nbytes for leaf in leaves)  # kernels int8; biases, norms, scales float
    text = int8_engine.programs.lower(ProgramKey("step_full", TEST_SIZE, TEST_SIZE, True)).as_text()
    assert "xi8>" in text and ("dot_general" in text and "convolution" in text)


def test_int8_pictures_near_unquantized_and_no_compiles(int8_engine, engine):
    before = int8_engine.compile_count
    for fields in ({"seed": 5}, {"seed": 6, "deepcache": 2, "cfg_end": 0.5}):
        mine = generate(int8_engine, "a lighthouse on a cliff at sunset", **fields)
        theirs = generate(engine, "a lighthouse on a cliff at sunset", **fields)
        a = np.stack([np.asarray(image, np.int16) for image in mine.images])
        b = np.stack([np.asarray(image, np.int16) for image in theirs.images])
        difference = np.abs(a - b)
        assert 0 < difference.mean() <= MEAN_LEVELS, (fields, difference.mean(), difference.max())
    assert int8_engine.compile_count == before


def test_quantize_settings_are_one_sentence():
    with pytest.raises(InvalidInput, match="Unknown quantize mode 'int4'"):
        EngineConfig(quantize="int4")
    with pytest.raises(InvalidInput, match="does not combine with LoRAs"):
        EngineConfig(quantize="int8", lora_dir="/somewhere")
    from pipeline.generator import for_platform

    with pytest.raises(InvalidInput, match="runs on TPU and CPU only"):  # XLA:GPU cannot compile its int8 convs
        for_platform(EngineConfig(quantize="int8"), "cuda")
    assert for_platform(EngineConfig(quantize="int8"), "tpu").quantize == "int8"
