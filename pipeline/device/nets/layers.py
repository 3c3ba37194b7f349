"""flax.linen's layers as the networks use them, reading their weights without flax's per-trace shape check.

    Dense, Conv, GroupNorm, LayerNorm, Embed   # nn.Dense, ... with the same fields, names, numerics and trees

Why: when a module is applied, flax's `param` traces each existing weight's initializer again (`jax.eval_shape` of
`init_fn(key(0), ...)`) to check the weight's shape against the module's config. SDXL's UNet reads about 1,700
weights, the tiny one 691, and that check was half the time of tracing a step program: 40 s against 20 s for the
tiny engine's 11 text, step and decode programs, on this project's 2-core VM. Every program is traced at start-up
(once per program, size and variant), so start-up pays it for each. The check is done once here instead: at load,
`checkpoint/loading.py` compares every weight with the module's `init_weights` shapes and names the first that
does not fit. A weight that does not exist yet (`init`, `init_weights`) is still created by flax's own `param`.
"""

from __future__ import annotations

import flax.linen as nn


class StoredWeights:
    """Mixin for a flax layer: `param` returns a weight that is already in the "params" collection as it is stored,
    through flax's public `variable` (same name reservation, same unboxing), without re-tracing its initializer."""

    @nn.nowrap
    def param(self, name, init_fn, *init_args, unbox: bool = True, **init_kwargs):
        if self.scope is not None and self.scope.has_variable("params", name):
            return self.variable("params", name, unbox=unbox).value
        return super().param(name, init_fn, *init_args, unbox=unbox, **init_kwargs)


class Dense(StoredWeights, nn.Dense):
    pass


class Conv(StoredWeights, nn.Conv):
    pass


class GroupNorm(StoredWeights, nn.GroupNorm):
    pass


class LayerNorm(StoredWeights, nn.LayerNorm):
    pass


class Embed(StoredWeights, nn.Embed):
    pass
