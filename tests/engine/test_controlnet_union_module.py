"""The Flax ControlNet Union (pipeline/device/nets/controlnet_union.py) and its loader against diffusers' PyTorch
`ControlNetUnionModel`: the union recognised by its config, every weight accounted for (task embedding, transformer,
channel projection, control-type add-embedding), the same residuals with one condition and with two.

Fixtures: scripts/make_controlnet_union_fixtures.py (a tiny union made from tiny-pt's UNet, every weight perturbed,
fp16 files; the PyTorch module's residuals on fixed inputs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FIXTURES

from pipeline.checkpoint.controlnet_loading import load_controlnet
from pipeline.contract.controlnet_units import CONTROL_TYPES
from pipeline.device.nets.controlnet_union import SDXLControlNetUnion

ARRAYS = np.load(FIXTURES / "controlnet-union-expected.npz")
SLOTS = 3  # more slots than conditions: the unused ones must change nothing
#: case -> (the ProMax types in use, their scales)
CASES = {
    "canny": ([CONTROL_TYPES["canny"]], [0.8]),
    "canny_tile": ([CONTROL_TYPES["canny"], CONTROL_TYPES["tile"]], [0.8, 0.6]),
}


@pytest.fixture(scope="module")
def union():
    return load_controlnet(str(FIXTURES / "controlnet-union"), "float32", use_cache=False)


def test_union_recognised_by_its_config(union):
    module = union.module
    assert isinstance(module, SDXLControlNetUnion)
    assert (module.num_control_type, module.num_trans_channel, module.num_trans_head) == (8, 32, 2)
    assert union.params["task_embedding"].shape == (8, 32)
    assert union.params["transformer_layes_0"]["attn"]["in_proj_weight"].shape == (96, 32)


@pytest.mark.parametrize("case", list(CASES))
def test_residuals_match_pytorch_union(union, case):
    types, scales = CASES[case]
    inputs = {k[len("module_input_") :]: jnp.asarray(v) for k, v in ARRAYS.items() if k.startswith("module_input_")}
    controls = jnp.concatenate([inputs["controls"], jnp.zeros((SLOTS - 2, *inputs["controls"].shape[1:]))])
    slot_types = jnp.asarray(types + [-1] * (SLOTS - len(types)), jnp.int32)
    slot_scales = jnp.asarray(scales + [0.0] * (SLOTS - len(scales)), jnp.float32)
    down, mid = jax.jit(lambda params, *args: union.module.apply({"params": params}, *args))(
        union.params,
        inputs["sample"],
        inputs["timesteps"],
        inputs["hidden"],
        inputs["text_embeds"],
        inputs["time_ids"],
        controls,
        slot_types,
        slot_scales,
    )
    assert len(down) == union.module.residual_count
    for i, residual in enumerate(down):
        expected = ARRAYS[f"module_{case}_down_{i}"]  # [2, C, h, w]
        assert np.abs(expected).max() > 0.05
        got = np.transpose(np.asarray(residual), (0, 3, 1, 2))
        np.testing.assert_allclose(got, expected, atol=1e-3, rtol=1e-3, err_msg=f"{case} down {i}")
    got = np.transpose(np.asarray(mid), (0, 3, 1, 2))
    np.testing.assert_allclose(got, ARRAYS[f"module_{case}_mid"], atol=1e-3, rtol=1e-3)
