"""Where arrays live: one 1-D mesh over every device, named `data`.

Parameters are replicated (each device holds a full copy, placed once at start-up); batch arrays are split over
`data` so each device denoises its own images. This is what `flax.jax_utils.replicate` + `pmap` did in the seed
documents, in the `jax.sharding` form current JAX recommends. Under `jax.distributed` the mesh spans the devices of
every process as it is; batch inputs are then built with `cluster.arrays.global_batch` (each process fills its own
shards), and `replicate_tree` still works because every process places the same weights.
"""

from __future__ import annotations

import jax
import numpy as np
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
