"""Joining a multi-process run: the multi-host options, `jax.distributed.initialize()` under our own deadline."""

from __future__ import annotations

import logging
import os
import sys
import time

import jax

from ..contract.errors import InvalidInput
from ..device import sharding
from . import output
from .faults import Deadline
from .join_options import ClusterOptions
from .protocol import Cluster

logger = logging.getLogger(__name__)


def detected_cluster() -> str | None:
    """Name of a multi-process environment JAX would initialise from, read cheaply from env vars (else None).

    Cloud TPU VMs created with `gcloud` carry their worker list in metadata, not the environment: pass
    --distributed there (it is one flag on every worker).
    """
    hosts = os.environ.get("TPU_PROCESS_ADDRESSES") or os.environ.get("TPU_WORKER_HOSTNAMES")
    if hosts and len(hosts.split(",")) > 1:
        return "TPU slice (TPU_WORKER_HOSTNAMES)"
    if "SLURM_JOB_ID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
        return "SLURM"
    if "OMPI_MCA_orte_hnp_uri" in os.environ and int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
        return "Open MPI"
    return None


def start(options: ClusterOptions) -> Cluster:
    """Join the run `options` (or the environment) describe; a single process when neither asks for more.

    Must run before anything initialises a JAX backend (jax.devices(), device_put, any computation).
    """
    detected = detected_cluster()
    if not (options.explicit or options.auto or detected):
        return Cluster(options)
    sharding.barrier_timeout_s = options.timeout_s
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU runs (tests); TPU/GPU use their own
    output.drop_gloo_lines()
    where = options.coordinator_address or detected or "the environment"
    logger.info("joining a multi-process run (%s)", where)
    timeout = options.timeout_s
    started = time.perf_counter()
    with Deadline(
        timeout,
        lambda: (
            f"not every process joined within {timeout:g} s (coordinator {where}); "
            "check that the same command runs on every host and that the coordinator port is reachable."
        ),
    ):
        try:
            jax.distributed.initialize(
                coordinator_address=options.coordinator_address,
                num_processes=options.num_processes,
                process_id=options.process_id,
                # JAX's own limits sit behind ours, so our one-line messages win the race against its abort.
                initialization_timeout=int(timeout) + 30,
                heartbeat_timeout_seconds=int(3 * options.heartbeat_s) + 10,
                shutdown_timeout_seconds=int(timeout),
            )
        except (RuntimeError, ValueError) as exc:
            raise InvalidInput(f"could not join the multi-process run: {str(exc).splitlines()[0]}") from None
    cluster = Cluster(options)
    # Printed, not logged: the CLI logs warnings only, and this line tells each host's operator the slice is up.
    print(
        f"{cluster.describe()} joined in {time.perf_counter() - started:.1f} s: "
        f"{jax.device_count()} devices in all, {jax.local_device_count()} here",
        file=sys.stderr,
        flush=True,
    )
    return cluster
