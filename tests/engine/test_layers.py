"""pipeline/device/nets/layers.py: a stored weight is read as stored, without flax's per-trace shape check (which
re-traces the weight's initializer each time a program is traced: half of a step program's tracing), a missing weight
is still an error, and `init` still creates the weights."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import errors

from pipeline.device.nets import layers


def counting_init(calls: list):
    def init(key, shape, dtype=jnp.float32):
        calls.append(tuple(shape))
        return jnp.ones(shape, dtype)

    return init


@pytest.mark.parametrize("flax_class, ours", [(nn.Dense, layers.Dense), (nn.Conv, layers.Conv)])
def test_a_stored_weight_is_read_without_tracing_its_initializer(flax_class, ours):
    x = jnp.ones((1, 4, 4, 3))  # [B, H, W, C]
    arguments = (5,) if flax_class is nn.Dense else (5, (3, 3))
    for cls, traced_again in ((flax_class, True), (ours, False)):
        calls: list = []
        layer = cls(*arguments, kernel_init=counting_init(calls))
        params = layer.init(jax.random.key(0), x)
        assert calls == [params["params"]["kernel"].shape]  # init creates it
        calls.clear()
        out = jax.jit(layer.apply)(params, x)
        assert bool(calls) is traced_again, cls  # flax's own layer traces the initializer again; ours does not
    np.testing.assert_array_equal(out, jax.jit(flax_class(*arguments).apply)(params, x))


def test_a_missing_weight_is_still_an_error():
    layer = layers.Dense(5)
    params = layer.init(jax.random.key(0), jnp.ones((1, 3)))
    del params["params"]["bias"]
    with pytest.raises(errors.ScopeParamNotFoundError, match="bias"):
        layer.apply(params, jnp.ones((1, 3)))
