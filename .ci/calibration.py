"""How fast this machine compiles and runs XLA programs, against the machine the CI budget was measured on.

The tests are compile-bound (bench/HISTORY.md, "What one run compiles"), and their CPU seconds follow the machine:
one suite took 2428-3050 CPU-s on the clean clones of 2026-12-06/07 and 4589 on the project's CI machine (its run
of c221efd), with every test the same. So the budget (.ci/cost.py) is stated for the machine it was measured on and
scaled by this: a fixed workload, one XLA program compiled from nothing and run ten times, in two processes at once
as pytest's two xdist workers run (where two vCPUs share a core, each runs slower when both are busy). Its mean CPU
seconds over REFERENCE_SECONDS is the factor. The workload never changes with the project: it uses JAX alone.

    python .ci/calibration.py          # prints this machine's CPU seconds and its factor
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

#: The workload's mean CPU seconds (compile + ten runs, two processes at once) on the machine the budget was set on,
#: the 2-core AMD EPYC of 2026-12-07 (host signature d9437029b203): 6.0 to 8.3 from one minute to the next, its
#: neighbours' load moving it as it moves the suite. The fast end, so that a slow moment here reads as a slower machine.
REFERENCE_SECONDS = 6.2
ROUNDS = 2
PROCESSES = 2


def workload() -> float:
    """Compile the fixed program (no compilation cache) and run it ten times; this process's CPU seconds for both."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def block(x, w1, w2, q):  # 48 conv / attention / norm rounds: a few hundred fusions, as a tiny UNet has
        dims = ("NHWC", "HWIO", "NHWC")
        for i in range(48):
            x = jax.nn.silu(jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dims) * (1 + i))
            b, h, w, c = x.shape
            t = x.reshape(b, h * w, c)  # [B, HW, C]
            x = (t + jax.nn.softmax(t @ q @ t.transpose(0, 2, 1) / 8.0, axis=-1) @ t).reshape(b, h, w, c)
            x = jax.lax.conv_general_dilated(x, w2, (1, 1), "SAME", dimension_numbers=dims)
            x = jax.nn.gelu(x) + jnp.mean(x, axis=(1, 2), keepdims=True)
        return x

    shapes = [(2, 16, 16, 64), (3, 3, 64, 64), (3, 3, 64, 64), (64, 64)]
    started = time.process_time()
    program = jax.jit(block).lower(*[jax.ShapeDtypeStruct(shape, jnp.bfloat16) for shape in shapes]).compile()
    rng = np.random.default_rng(0)
    values = [jnp.asarray(rng.standard_normal(shape) * 0.1, jnp.bfloat16) for shape in shapes]
    for _ in range(10):
        program(*values).block_until_ready()
    return time.process_time() - started


def machine_seconds() -> float:
    """The workload's mean CPU seconds: ROUNDS rounds of PROCESSES processes at once."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("JAX_", "XLA_"))}
    env.update(JAX_PLATFORMS="cpu", JAX_ENABLE_COMPILATION_CACHE="false")
    seconds = []
    for _ in range(ROUNDS):
        runs = [
            subprocess.Popen([sys.executable, __file__, "--workload"], env=env, stdout=subprocess.PIPE, text=True)
            for _ in range(PROCESSES)
        ]
        for run in runs:
            out, _ = run.communicate()
            if run.returncode != 0:
                raise RuntimeError(f"the calibration workload failed (exit {run.returncode})")
            seconds.append(float(out.split()[-1]))
    return statistics.mean(seconds)


def factor(seconds: float) -> float:
    """How much slower than the budget's machine this one is; never under 1 (a faster machine keeps the budget)."""
    return max(1.0, seconds / REFERENCE_SECONDS)


if __name__ == "__main__":
    if sys.argv[1:] == ["--workload"]:
        print(workload())
    else:
        measured = machine_seconds()
        print(f"{measured:.2f} CPU-s here, {REFERENCE_SECONDS} on the budget's machine: × {factor(measured):.2f}")
