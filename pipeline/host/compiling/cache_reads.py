"""The bytes behind a hit of JAX's persistent compilation cache, so that a program the cache served is stored whole
(host/compiling/executable_store.py) without being compiled again.

XLA:CPU serializes an executable it loaded from the persistent cache without its kernels: the copy loads, then fails
when it runs ("Function ... not found"). The cache entry itself holds the executable as it was serialized right after
its compile, kernels included. `cache_read_bytes()` notes those bytes for each cache hit of the calling thread (JAX's
cache read is wrapped: the executable is read as JAX reads it, then its entry once more for its bytes), and
`serialize_with_bytes` writes a `Compiled` the way `jax.experimental.serialize_executable.serialize` does, with those
bytes as its executable's; `deserialize_and_load` reads it back as any other.

Both lean on JAX internals (`jax._src.compilation_cache.get_executable_and_time`, the serializer's pickler). Where
those change, a hit records nothing, and the program is left out of the store (said in one line) rather than stored
without its kernels: it is then traced and read from JAX's cache again at the next start.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator

import jax
from jax._src import compilation_cache
from jax._src.lib import _jax
from jax._src.lib import xla_client as xc
from jax.experimental import serialize_executable

_local = threading.local()  # .reads: the list this thread's hits go to (absent: not recording)
_install_lock = threading.Lock()
_installed = False


def _install() -> None:
    """Wrap JAX's cache read once per process; the wrapper only records on a thread inside `cache_read_bytes()`."""
    global _installed
    with _install_lock:
        if _installed:
            return
        read = compilation_cache.get_executable_and_time

        def recording_read(cache_key, compile_options, backend, *args, **kwargs):  # jax 0.11 added an argument
            executable, compile_time = read(cache_key, compile_options, backend, *args, **kwargs)
            reads = getattr(_local, "reads", None)
            if executable is not None and reads is not None:
                reads.append(_entry_bytes(cache_key, backend))
            return executable, compile_time

        compilation_cache.get_executable_and_time = recording_read
        _installed = True


def _entry_bytes(cache_key: str, backend) -> bytes | None:
    """The serialized executable of cache entry `cache_key` (None when it cannot be read back)."""
    try:
        entry = compilation_cache._get_cache(backend).get(cache_key)
        return compilation_cache.extract_executable_and_time(compilation_cache.decompress_executable(entry))[0]
    except Exception:  # a cache that changed under us: the program is not stored
        return None


@contextlib.contextmanager
def cache_read_bytes() -> Iterator[list[bytes | None]]:
    """Inside, each of this thread's persistent-cache hits appends its executable's serialized bytes to the list
    yielded (None for an entry that could not be read back)."""
    _install()
    reads: list[bytes | None] = []
    outer = getattr(_local, "reads", None)
    _local.reads = reads
    try:
        yield reads
    finally:
        _local.reads = outer


def serialize_with_bytes(compiled: jax.stages.Compiled, executable_bytes: bytes) -> tuple[bytes, object, object]:
    """`serialize_executable.serialize(compiled)`, with `executable_bytes` (its persistent-cache entry's, from
    `cache_read_bytes`) as its executable: (payload, argument tree, result tree). Raises as `serialize` does for a
    program that cannot be written (a host callback, a closed-over constant)."""
    unloaded = getattr(compiled._executable, "_unloaded_executable", None)
    if unloaded is None:
        raise ValueError("Compilation does not support serialization")
    if getattr(unloaded, "mut", None) and unloaded.mut.in_mut:
        raise ValueError("can't serialize with a closed-over mutable array ref")
    if compiled._params.const_args:
        raise NotImplementedError("serialize_executables with const_args")
    args_info_flat, in_tree = jax.tree_util.tree_flatten(compiled.args_info)
    with io.BytesIO() as file:
        pickler = _CachedBytesPickler(file, executable_bytes)
        pickler.dump((unloaded, args_info_flat, compiled._no_kwargs))
        if pickler.replaced != 1:
            raise ValueError(f"expected one executable in the program, found {pickler.replaced}")
        return file.getvalue(), in_tree, compiled.out_tree


class _CachedBytesPickler(serialize_executable._JaxPjrtPickler):
    """JAX's pickler for executables, writing the given bytes for the (one) executable it meets."""

    def __init__(self, file, executable_bytes: bytes) -> None:
        super().__init__(file)
        self.executable_bytes = executable_bytes
        self.replaced = 0

    def persistent_id(self, obj):
        if isinstance(obj, xc.LoadedExecutable | _jax.Executable):
            self.replaced += 1
            return ("exec", self.executable_bytes)
        return super().persistent_id(obj)
