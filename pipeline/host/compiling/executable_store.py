"""This host's own executables: every served program a start-up compiled, serialized next to JAX's persistent
compilation cache, so the next start (a restarted pod or container on the same volume) loads it whole: nothing
traced, lowered or compiled.

JAX's persistent cache skips XLA's compile only: a program is still traced to a jaxpr and lowered to StableHLO
before the cache is asked (its key hashes the lowered module), and that Python work is most of a warm start. An
executable here is found by its program's fingerprint (`aot.fingerprint`: model configs, weight shapes and dtypes,
size, batch, CFG, attention core, prompt windows, levers, previews, LoRA layout, the programs' source files), in a
folder per platform, device kind and count, library versions (jax, jaxlib, libtpu, flax)
and XLA flags. The folder is a precompiled directory (`manifest.json` plus one file per program): `aot.py` writes
and reads both, so `--precompiled` can even point at it.

    <compilation cache>/host-<CPU signature>/executables/<platform>-<devices>-<hash>/manifest.json, *.jaxexe

A program the persistent cache served is stored from the bytes of its cache entry, not compiled again: XLA:CPU
writes an executable it loaded from the cache without its kernels ("Function ... not found" when the copy runs),
while the entry holds it as serialized right after its compile (host/compiling/cache_reads.py; no TPU or GPU here to
show whether they differ, so every platform does it). So a start with a warm cache and no executables yet (a first start
after an upgrade) compiles nothing, and a cold start fills both from one compile. A program whose serialization
fails (a host callback, a closed-over constant) is compiled at every start, as JAX's cache would; an unreadable
file is named in one line and compiled; executables of other code are dropped when the store is next written. Not
kept on a run of several processes (each holds part of the devices).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import jax

from . import aot
from .cache_reads import cache_read_bytes
from .compile_cache import CompileCounter, compilation_cache_dir
from .compile_turns import compile_turn, host_lock
from .programs import ProgramKey, ServedPrograms

logger = logging.getLogger(__name__)

STORE = "executables"
#: Where an executable came from, in the start-up log's words.
STORED, PRECOMPILED, COMPILED, CACHED = "executables", "precompiled", "compiled", "compilation cache"


@dataclass(frozen=True)
class ProgramBuild:
    """How one served program got its executable at start-up, with the time of each phase."""

    label: str
    source: str  # STORED, PRECOMPILED, COMPILED or CACHED
    trace_s: float = 0.0  # tracing to a jaxpr and lowering to StableHLO (0: loaded whole)
    compile_s: float = 0.0  # XLA's compile, or reading the executable from JAX's persistent cache
    wait_s: float = 0.0  # waiting for another process on this host compiling the same program (compile_turns.py)

    def line(self) -> str:
        """e.g. "step_full 128x128 cfg: traced and lowered in 1.9 s, from JAX's compilation cache in 0.1 s"."""
        how = "compiled" if self.source == COMPILED else "from JAX's compilation cache"
        waited = f" after {self.wait_s:.1f} s waiting for another process compiling it" if self.wait_s >= 0.1 else ""
        return f"{self.label}: traced and lowered in {self.trace_s:.1f} s, {how} in {self.compile_s:.1f} s{waited}"


@dataclass(frozen=True)
class StartupPrograms:
    """Every served program's build at start-up, and the executable store's part in it."""

    builds: tuple[ProgramBuild, ...]
    load_s: float  # reading this host's stored executables
    store_s: float  # serializing and writing the newly compiled ones
    stored: int  # executables written
    directory: Path | None  # the store (None: off)

    def count(self, source: str) -> int:
        return sum(1 for build in self.builds if build.source == source)

    @property
    def traced(self) -> int:
        """Programs traced and lowered in this process (compiled, or fetched from JAX's persistent cache)."""
        return self.count(COMPILED) + self.count(CACHED)

    @property
    def trace_s(self) -> float:
        return sum(build.trace_s for build in self.builds)

    @property
    def compile_s(self) -> float:
        return sum(build.compile_s for build in self.builds)

    @property
    def wait_s(self) -> float:
        """Waiting for other processes on this host compiling the same programs (compile_turns.py)."""
        return sum(build.wait_s for build in self.builds)

    def summary(self) -> str:
        """One line: how many programs came from where, and the seconds of each phase."""
        parts = [f"{self.count(STORED)} loaded from this host's executables in {self.load_s:.1f} s"]
        parts.append(f"{self.traced} traced and lowered in {self.trace_s:.1f} s")
        parts.append(
            f"{self.count(COMPILED)} compiled and {self.count(CACHED)} from JAX's compilation cache "
            f"in {self.compile_s:.1f} s"
        )
        if self.wait_s >= 0.1:
            parts.append(f"{self.wait_s:.1f} s waiting for other processes on this host compiling the same programs")
        if self.count(PRECOMPILED):
            parts.append(f"{self.count(PRECOMPILED)} precompiled")
        if self.stored:
            parts.append(f"{self.stored} executables stored in {self.store_s:.1f} s")
        elif self.directory is None:
            parts.append("executable store off")
        return f"programs ({len(self.builds)}): " + "; ".join(parts)

    def joined(self, other: StartupPrograms) -> StartupPrograms:
        """This build and `other`'s as one (--merge-requests: the smaller calls' programs beside the N-image ones;
        each kept in its own store, this one's directory named)."""
        return StartupPrograms(
            builds=self.builds + other.builds,
            load_s=self.load_s + other.load_s,
            store_s=self.store_s + other.store_s,
            stored=self.stored + other.stored,
            directory=self.directory,
        )

    def timings(self) -> dict[str, float]:
        return {
            "trace_s": self.trace_s,
            "xla_compile_s": self.compile_s,
            "executables_load_s": self.load_s,
            "executables_store_s": self.store_s,
            "compile_wait_s": self.wait_s,
        }

    def counts(self) -> dict[str, int]:
        """Programs per source: traced (compiled + cached), compiled, cached, loaded, precompiled; stored."""
        return {
            "traced": self.traced,
            "compiled": self.count(COMPILED),
            "cached": self.count(CACHED),
            "loaded": self.count(STORED),
            "precompiled": self.count(PRECOMPILED),
            "stored": self.stored,
        }


def store_directory(programs: ServedPrograms) -> Path | None:
    """This host's store for `programs`' devices, images per device and libraries (None on several processes): two
    servers on one host that make another number of images per device each keep their own (one store would drop the
    other's executables at every start: `aot.manifest_mismatch`)."""
    if jax.process_count() > 1:
        return None
    first = next(iter(programs.mesh.devices.flat))
    count, per_device = int(programs.mesh.devices.size), aot.images_per_device(programs)
    identity = {
        "format": aot.FORMAT,
        "platform": first.platform,
        "device_kind": first.device_kind,
        "devices": count,
        "images_per_device": per_device,
        **aot.build_environment(),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return compilation_cache_dir() / STORE / f"{first.platform}-{count}x{per_device}-{digest}"


def build_served(programs: ServedPrograms, keys: list[ProgramKey], *, store: bool) -> StartupPrograms:
    """Give every program of `keys` its executable: already installed (`--precompiled`), loaded from this host's
    store (`store`), else traced, lowered and compiled (XLA's part from JAX's persistent cache when it has it, and
    one process on this host at a time per program: compile_turns.py); then
    store what was compiled or read from JAX's cache. Each traced program ("program k of N: ...", while they compile)
    and the total are logged in one line each."""
    builds = [ProgramBuild(key.label, PRECOMPILED) for key in keys if programs.is_compiled(key)]
    pending = [key for key in keys if not programs.is_compiled(key)]
    directory = store_directory(programs) if store else None
    load_s = 0.0
    if directory is not None and pending:
        if (directory / aot.MANIFEST).is_file():
            report = aot.load_precompiled(programs, pending, directory, what="executables")
            load_s = report.seconds
            builds += [ProgramBuild(label, STORED) for label in report.loaded]
            pending = [key for key in pending if not programs.is_compiled(key)]
        else:
            logger.info("executables: none stored yet in %s", directory)
    compiled = {}  # what goes to the store: {key: (executable, its cache entry's bytes or None: serialize it)}
    for number, key in enumerate(pending, 1):
        started = time.perf_counter()
        lowered = programs.lower(key)
        traced_at = time.perf_counter()
        hits = CompileCounter.cache_hits()
        with compile_turn(programs, key) as waited:  # another process here compiling it: wait, then read its entry
            compiling_at = time.perf_counter()
            with cache_read_bytes() if directory is not None else contextlib.nullcontext([]) as reads:
                executable = programs.compile_lowered(lowered)
        build = ProgramBuild(
            key.label,
            CACHED if CompileCounter.cache_hits() > hits else COMPILED,
            traced_at - started,
            time.perf_counter() - compiling_at,
            waited[0],
        )
        if directory is not None:
            if build.source == COMPILED:
                compiled[key] = (executable, None)
            elif len(reads) == 1 and reads[0] is not None:  # stored whole from the cache's bytes (the docstring)
                compiled[key] = (executable, reads[0])
            else:
                logger.info("executables: %s not kept (its compilation cache entry was not read back)", key.label)
        programs.install(key, executable)
        builds.append(build)
        logger.info("program %d of %d: %s", number, len(pending), build.line())
    stored, store_s = (0, 0.0)
    if directory is not None and compiled:
        stored, store_s = store_executables(programs, compiled, directory)
    order = {key.label: i for i, key in enumerate(keys)}
    builds.sort(key=lambda build: order[build.label])
    return StartupPrograms(tuple(builds), load_s, store_s, stored, directory)


def store_executables(programs: ServedPrograms, compiled: dict, directory: Path) -> tuple[int, float]:
    """Add `compiled` ({key: (executable, its persistent-cache entry's bytes or None)}) to the store in `directory`;
    (executables written, seconds).

    One writer at a time (a file lock: several servers may start at once on one host), the manifest replaced whole.
    Entries of other program sources are dropped, and files no entry names are removed. A program that cannot be
    serialized, or a store that cannot be written, is named in one line; the server starts all the same.
    """
    started = time.perf_counter()
    written = 0
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with host_lock(directory / ".lock"):
            entries = _current_entries(programs, directory)
            for key, (executable, cached_bytes) in compiled.items():
                try:
                    entry = aot.serialized_entry(programs, key, executable, directory, cached_bytes)
                except Exception as exc:  # a host callback, a constant: compiled at every start instead
                    logger.info("executables: %s not kept (%s: %s)", key.label, type(exc).__name__, str(exc)[:80])
                    continue
                entries[entry["fingerprint"]] = entry
                written += 1
            header = aot.manifest_header(programs, topology="this host", settings={})
            aot.write_manifest(directory, header, sorted(entries.values(), key=lambda entry: entry["file"]))
            listed = {entry["file"] for entry in entries.values()}
            for path in directory.glob("*.jaxexe"):  # other code's, or left by a manifest that could not be read
                if path.name not in listed:
                    path.unlink(missing_ok=True)
    except OSError as exc:  # a read-only or full volume: this start is served, the next one compiles again
        logger.warning("executables: not stored in %s (%s)", directory, exc)
        return 0, time.perf_counter() - started
    return written, time.perf_counter() - started


def _current_entries(programs: ServedPrograms, directory: Path) -> dict[str, dict]:
    """The store's entries, by fingerprint, that this code on these devices can still load."""
    try:
        manifest = aot.read_manifest(directory)
    except (OSError, ValueError):
        return {}
    if aot.manifest_mismatch(manifest, programs) is not None:
        return {}
    entries = [entry for entry in manifest.get("programs", []) if isinstance(entry, dict)]
    return {entry["fingerprint"]: entry for entry in entries if entry.get("sources") == aot.sources_hash()}
