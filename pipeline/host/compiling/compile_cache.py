"""Compilation bookkeeping: JAX's persistent compilation cache and a process-wide compile counter.

The cache lets a restarted server skip the minutes SDXL takes to compile; the counter lets tests and the
benchmark prove that no user input ever triggers a compilation after warm-up.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import threading
from pathlib import Path

import jax
from jax._src.dispatch import BACKEND_COMPILE_EVENT  # the event name JAX records for every XLA compilation
from jax.experimental.compilation_cache import compilation_cache

from ...checkpoint.cache import default_cache_root

CACHE_HITS_EVENT = "/jax/compilation_cache/cache_hits"


def host_cpu_signature() -> str:
    """A short hash of this host's CPU model and instruction-set features.

    XLA:CPU compiles for the host's features (AVX2, AVX-512, AMX...), and the pixels depend on them: the tiny
    model's images differ between `--xla_cpu_max_isa=AVX2` and AVX-512 on one machine. JAX's cache key names the
    platform and its version, not the CPU, so a cache shared between hosts (a home folder or a project folder
    that moves between machines) would hand one host's executables to another: other pixels than a fresh compile,
    or an illegal instruction. Keying the cache folder by this signature keeps each host to its own executables.
    """
    model = flags = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    identity = "|".join((platform.machine(), model or platform.processor(), flags))
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def compilation_cache_dir() -> Path:
    """Where compiled programs persist: one folder per host CPU (`host-<signature>`, see `host_cpu_signature`) in
    $JAX_COMPILATION_CACHE_DIR when set, else in <cache root>/jax-compilation-cache."""
    env = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    base = Path(env).expanduser() if env else default_cache_root() / "jax-compilation-cache"
    return base / f"host-{host_cpu_signature()}"


def configure_compilation_cache(enabled: bool = True) -> Path | None:
    """Turn JAX's persistent compilation cache on (every program, however fast it compiled) or off.

    Returns the cache directory, or None when off. Safe to call after JAX has compiled something: the cache is
    re-initialised so the setting takes effect for the next compilation.
    """
    if enabled:
        directory = compilation_cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_compilation_cache_dir", str(directory))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    else:
        directory = None
        jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    return directory


class CompileCounter:
    """Counts XLA compilations in this process, from JAX's own monitoring events.

    `compiles()` counts every program JAX had to build (JAX records its compile event whether the executable was
    compiled or loaded from the persistent cache); `cache_hits()` counts those the persistent cache served.
    """

    _lock = threading.Lock()
    _compiles = 0
    _cache_hits = 0
    _installed = False

    @classmethod
    def install(cls) -> None:
        with cls._lock:
            if cls._installed:
                return
            jax.monitoring.register_event_duration_secs_listener(cls._on_duration)
            jax.monitoring.register_event_listener(cls._on_event)
            cls._installed = True

    @classmethod
    def _on_duration(cls, event: str, duration: float, **_: object) -> None:
        if event == BACKEND_COMPILE_EVENT:
            with cls._lock:
                cls._compiles += 1

    @classmethod
    def _on_event(cls, event: str, **_: object) -> None:
        if event == CACHE_HITS_EVENT:
            with cls._lock:
                cls._cache_hits += 1

    @classmethod
    def compiles(cls) -> int:
        cls.install()
        return cls._compiles

    @classmethod
    def cache_hits(cls) -> int:
        cls.install()
        return cls._cache_hits
