"""XLA compiler options for the served programs (`--xla-option NAME=VALUE`): typed, checked, handed to each compile.

Why per compile and not XLA_FLAGS: the options are part of the engine's config, so they join every program's
fingerprint (the executable store and precompiled directories keep them apart), and one process can compile the
same program with and without them (`python -m bench step-profile --levers` times each set on the same weights).
XLA_FLAGS, read once when the backend starts, still works as it always did and is hashed with the executables.

    options = compiler_options(config.xla_options)   # {"xla_gpu_dot_merger_threshold_mb": 0}
    lowered.compile(options or None)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ...contract.errors import InvalidInput


def typed(value: str) -> bool | int | float | str:
    """A text value as XLA's compile options take it: true/false as a bool, a whole number as an int, a number as
    a float, else the text (XLA refuses "false" for a bool field and "0" in text is taken for an int field)."""
    text = value.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def compiler_options(pairs: tuple[tuple[str, str], ...]) -> dict[str, bool | int | float | str]:
    """`EngineConfig.xla_options` as `Lowered.compile`'s compiler_options (empty: none)."""
    return {name: typed(value) for name, value in pairs}


def check(pairs: tuple[tuple[str, str], ...], device=None) -> None:
    """Compile a one-line program with the options on `device`'s backend, so that a name or value XLA refuses is one
    sentence at start-up, before any weights load, and not a traceback at the first program's compile."""
    if not pairs:
        return
    device = device or jax.local_devices()[0]
    scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device))
    lowered = jax.jit(lambda x: x + 1).trace(scalar).lower()
    for name, value in pairs:
        try:
            lowered.compile({name: typed(value)})
        except jax.errors.JaxRuntimeError as exc:
            reason = str(exc).split(":", 1)[-1].strip().splitlines()[0] if str(exc) else type(exc).__name__
            raise InvalidInput(f"XLA refused --xla-option {name}={value}: {reason}") from None
