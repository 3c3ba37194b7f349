"""Which compiled programs a request runs, and (blocking on each) how long each takes: a request's profile.

    with ProgramTimer(generator.programs, block=True) as timer:
        generator.generate(request)
    timer.calls        # [(label, seconds), ...] in the order the request ran them ("encode cfg", "step_full ...")

Blocking before and after each call serialises what the host loop otherwise overlaps (a step is queued while the
one before runs), so the times add up to a little more than the request; without `block` only the labels are
recorded and the request runs as it always does.
"""

from __future__ import annotations

import time

import jax


class ProgramTimer:
    """Wraps `programs.compile` (pipeline/host/compiling/programs.ServedPrograms) for the duration of a `with` block."""

    def __init__(self, programs, *, block: bool = False):
        self.programs = programs
        self.block = block
        self.calls: list[tuple[str, float]] = []  # (program label, seconds; 0.0 without `block`)

    def __enter__(self) -> ProgramTimer:
        compile_program = self.programs.compile

        def recording(key):
            program = compile_program(key)

            def run(*args, **kwargs):
                if not self.block:
                    self.calls.append((key.label, 0.0))
                    return program(*args, **kwargs)
                jax.block_until_ready(args)
                started = time.perf_counter()
                out = jax.block_until_ready(program(*args, **kwargs))
                self.calls.append((key.label, time.perf_counter() - started))
                return out

            return run

        self.programs.compile = recording  # the instance's attribute hides the class's method until __exit__
        return self

    def __exit__(self, *exc) -> None:
        del self.programs.compile

    @property
    def labels(self) -> list[str]:
        return [label for label, _ in self.calls]

    def per_program(self, requests: int = 1) -> dict[str, float]:
        """Seconds per request spent in each program (all its calls), in the order first run."""
        total: dict[str, float] = {}
        for label, seconds in self.calls:
            total[label] = total.get(label, 0.0) + seconds / requests
        return total
