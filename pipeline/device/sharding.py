"""Where arrays live: one 1-D mesh over every device, named `data`; host arrays in, the whole batch out.

Parameters are replicated (each device holds a full copy, placed once at start-up); batch arrays are split over
`data` so each device denoises its own images. This is what `flax.jax_utils.replicate` + `pmap` did in the seed
documents, in the `jax.sharding` form current JAX recommends. Under `jax.distributed` the mesh spans the devices of
every process as it is: every process holds the whole batch on its host (the same request), `global_batch` fills
only the shards on its own devices, `to_host` gathers the result back with a collective every process enters, and
`replicate_tree` still works because every process places the same weights.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA_AXIS = "data"


def data_mesh(devices: list | None = None) -> Mesh:
    """A 1-D mesh over `devices` (default: all of them)."""
    devices = jax.devices() if devices is None else devices
    return Mesh(np.asarray(devices), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    """Sharding of arrays every device holds in full (weights, scalars)."""
    return NamedSharding(mesh, P())


def batch_sharded(mesh: Mesh) -> NamedSharding:
    """Sharding of arrays whose leading (batch) axis is split over the devices."""
    return NamedSharding(mesh, P(DATA_AXIS))


def replicate_tree(tree, mesh: Mesh):
    """Place a pytree of host arrays on every device of `mesh`, once (on several processes: each passes the same)."""
    return jax.device_put(tree, replicated(mesh))


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
