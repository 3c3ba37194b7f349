"""One XLA compile per program per host: processes that start at once with the same programs take turns.

Several processes on one host often start together with the same programs: the engine services behind one page (one
per GPU, or two on a CPU host), a new pod beside the one it replaces on a shared volume. Each traced and compiled
every program itself, so N processes spent N times the CPU on XLA's compiles (on shared cores, N times the wall time
too). JAX's persistent cache only helps a process that asks after another one has finished.

Here a process takes a host-wide file lock per program in the cache's folder around its compile: the first one there
compiles and writes the cache entry; one that arrives meanwhile waits for it, then reads that entry, a cache hit of a
fraction of a second. Tracing and lowering still run in every process, side by side.

The lock's name is the program's fingerprint (`aot.fingerprint`: what it is compiled from) with the device count,
the library versions and the XLA flags: equal names mean the same program, so the waiting one hits the cache. Nothing
depends on it for correctness: should two names meet for different programs, the second compiles as it would have,
only later. A compile holds no other lock and needs no other process, so turns cannot deadlock.

Off when JAX's persistent cache is off (nothing to wait for), and for a cluster's processes: each compiles its part
of one program over all of them, under a cache key of its own (on one host, two processes' keys for the same program
differed), and JAX writes entries from process 0 only, so there is no entry for the others to wait for.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import jax

from . import aot
from .programs import ProgramKey, ServedPrograms

TURNS = "compiling"  # the turns' folder, beside the cache's entries


def turn_path(programs: ServedPrograms, key: ProgramKey) -> Path | None:
    """The lock file of `key`'s compile on this host (None: no turns: the cache is off, or a cluster's process)."""
    if not jax.config.jax_enable_compilation_cache or not jax.config.jax_compilation_cache_dir:
        return None
    if jax.process_count() > 1:  # a cluster's processes: no entry to wait for (the module docstring)
        return None
    identity = {"program": aot.fingerprint(programs, key), **aot.build_environment()}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    return Path(jax.config.jax_compilation_cache_dir) / TURNS / f"{key.kind}-{digest}.lock"


@contextlib.contextmanager
def compile_turn(programs: ServedPrograms, key: ProgramKey) -> Iterator[list[float]]:
    """Compile `key`'s program in the body once this process's turn has come; yields [seconds waited for it]."""
    waited = [0.0]
    path = turn_path(programs, key)
    with contextlib.ExitStack() as stack:
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                started = time.perf_counter()
                stack.enter_context(host_lock(path))
                waited[0] = time.perf_counter() - started
            except OSError:  # a read-only cache folder: compile without a turn, as before
                pass
        yield waited


@contextlib.contextmanager
def host_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if absent) against every process on this host."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
