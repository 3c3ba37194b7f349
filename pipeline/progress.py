"""Live progress from inside the compiled denoising loop: one host callback per step, one report per step.

The loop calls `StepReporter.on_step(index, latents)` while it is traced; that adds a `jax.debug.callback` to the
program, so whether progress exists at all is static (part of the program key): a generator built without it
compiles exactly the program it had before. Inside `jit(shard_map(...))` every device runs the callback, and on an
accelerator the host sees them whenever the runtime delivers them, so the host side dedupes: per call it reports
each step once, only forward, and only to the listener of the call that is running (`begin` ... `end`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import jax
import numpy as np

#: What a listener receives after each denoising step: (steps done, total steps).
Listener = Callable[[int, int], None]


class StepReporter:
    """Thread-safe bridge from the device loop's callbacks to the listener of the current call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._call = 0  # id of the call in flight; 0 = none
        self._listener: Listener | None = None
        self._total = 0
        self._done = 0  # highest step reported in this call

    # ---- traced side ---------------------------------------------------------------------------------------------

    def on_step(self, index, latents) -> None:
        """Called inside the loop body (traced): report step index + 1 once this step's latents exist.

        Passing one latent value makes the callback depend on the step's result, so XLA cannot run it early.
        """
        jax.debug.callback(self._from_device, index, latents.reshape(-1)[0])

    # ---- host side -----------------------------------------------------------------------------------------------

    def begin(self, total: int, listener: Listener | None) -> int:
        """Start a call of `total` steps; returns its id for `end`."""
        with self._lock:
            self._call += 1
            self._listener, self._total, self._done = listener, total, 0
            return self._call

    def end(self, call: int) -> None:
        """Stop reporting for `call`; callbacks that still arrive (from any device) are dropped."""
        with self._lock:
            if self._call == call:
                self._listener = None

    def _from_device(self, index, _value) -> None:
        step = int(np.asarray(index)) + 1
        with self._lock:
            listener, total = self._listener, self._total
            if listener is None or step <= self._done:
                return  # no call listening, or another device already reported this step
            self._done = step
        try:
            listener(step, total)
        except Exception:  # a listener must never break the device loop
            import logging

            logging.getLogger(__name__).exception("progress listener failed at step %d", step)
