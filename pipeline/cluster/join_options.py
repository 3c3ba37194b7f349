"""How this process joins a multi-process run: the multi-host flags, checked (declared in pipeline/options.py)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..contract.errors import InvalidInput


@dataclass(frozen=True)
class ClusterOptions:
    """How this process joins a multi-process run (all None/False: a single process, no jax.distributed)."""

    coordinator_address: str | None = None  # HOST:PORT where process 0 serves the coordinator
    num_processes: int | None = None  # processes in the run (hosts of the slice)
    process_id: int | None = None  # this process, 0 .. num_processes - 1; 0 is the leader
    auto: bool = False  # --distributed: let JAX read the cluster from its environment (TPU metadata, SLURM, MPI)
    timeout_s: float = 300.0  # deadline for the slice to assemble and for each request on it
    heartbeat_s: float = 30.0  # a follower silent this long is taken for dead

    @property
    def explicit(self) -> bool:
        return self.coordinator_address is not None


def options_from_args(args: argparse.Namespace) -> ClusterOptions:
    """Check the multi-host flags (all three explicit ones, or none of them); pipeline/options.py defines them."""
    explicit = (args.coordinator_address, args.num_processes, args.process_id)
    if any(v is not None for v in explicit) and any(v is None for v in explicit):
        raise InvalidInput("--coordinator-address, --num-processes and --process-id go together; give all three.")
    if args.coordinator_address is not None:
        host, _, port = str(args.coordinator_address).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidInput(f"--coordinator-address must be HOST:PORT; got {args.coordinator_address!r}.")
        if int(args.num_processes) < 1 or not 0 <= int(args.process_id) < int(args.num_processes):
            raise InvalidInput(
                f"--process-id must be in 0..{int(args.num_processes) - 1} and --num-processes at least 1; "
                f"got {args.process_id} of {args.num_processes}."
            )
    if args.cluster_timeout <= 0 or args.heartbeat_timeout <= 0:
        raise InvalidInput("--cluster-timeout and --heartbeat-timeout must be positive.")
    return ClusterOptions(
        coordinator_address=args.coordinator_address,
        num_processes=None if args.num_processes is None else int(args.num_processes),
        process_id=None if args.process_id is None else int(args.process_id),
        auto=bool(args.distributed),
        timeout_s=float(args.cluster_timeout),
        heartbeat_s=float(args.heartbeat_timeout),
    )
