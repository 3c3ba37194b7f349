"""Global arrays: host arrays in, the whole batch out, on one process or several.

Every process holds the whole batch on its host (the same request), fills only the shards on its own devices, and
gathers the result back with a collective every process enters.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

_gathers = itertools.count()  # every process gathers in the same order, so the n-th barrier is the same everywhere
#: Seconds a process waits for the others at a gather's barrier (set by cluster start-up from --cluster-timeout).
barrier_timeout_s = 300.0


def global_batch(arrays: Sequence[np.ndarray], sharding: jax.sharding.Sharding) -> tuple[jax.Array, ...]:
    """Host arrays holding the whole batch (the same on every process) -> global arrays split over `sharding`.

    Each process fills only the shards on its own devices; `device_put` would need every device to be local.
    """
    if jax.process_count() == 1:
        return tuple(jax.device_put(tuple(arrays), sharding))
    return tuple(jax.make_array_from_callback(a.shape, sharding, lambda index, a=a: a[index]) for a in arrays)


def to_host(array: jax.Array) -> np.ndarray:
    """The whole of a (possibly multi-process) array on this host; every process must call it (a collective)."""
    if array.is_fully_addressable:
        return np.asarray(array)
    # Meet first: gloo gives a late peer only 30 s to join a collective, and one process may still be compiling
    # (the generate program itself has no cross-process collective, so processes drift apart until here).
    client = coordinator_client()
    client.wait_at_barrier(f"sdxl/gather/{next(_gathers)}", int(barrier_timeout_s * 1000))
    return multihost_utils.process_allgather(array, tiled=True)


def coordinator_client():
    """The coordinator's key-value client of this process's `jax.distributed` run.

    JAX exposes it only as `jax._src.distributed.global_state.client` (its own multihost_utils use it too); this is
    the one place the project reaches into `jax._src` for it.
    """
    return jax._src.distributed.global_state.client
