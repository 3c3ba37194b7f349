"""What a compiled program costs (XLA's memory and cost analyses) and the hardware it is measured against: the
bench's (`python -m bench tpu`, the FLOP counts) and the TPU tests', not the server's.

    compiled = programs.lower(key).compile()  # e.g. a TPU topology on this host (pipeline/host/compiling/aot.py)
    cost = compiled_cost(compiled)             # HBM per chip, FLOPs and bytes of the compiled program
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

import jax

#: Topologies the report knows (any name libtpu accepts works): chips' kind and HBM per chip.
GiB = 2**30
HBM_PER_CHIP = {"TPU v5 lite": 16 * GiB, "TPU v6 lite": 32 * GiB}
#: Peak dense bf16 FLOP/s and HBM bandwidth (bytes/s) per chip (Google Cloud's TPU pages).
PEAK_FLOPS = {"TPU v5 lite": 197e12, "TPU v6 lite": 918e12}
HBM_BANDWIDTH = {"TPU v5 lite": 819e9, "TPU v6 lite": 1640e9}


def libtpu_available() -> bool:
    """Whether libtpu (the TPU compiler) is installed: TPU programs can be compiled on this host."""
    try:
        metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        return False
    return True


@dataclass(frozen=True)
class CompiledCost:
    """Per chip: memory of a compiled program (XLA's memory analysis) and its cost (XLA's cost analysis)."""

    hbm_bytes: dict[str, int]  # arguments, temporaries, outputs, code
    flops: float  # of the compiled (fused, partitioned) program, per chip; fused kernels' own FLOPs are not counted
    bytes_accessed: float  # HBM traffic XLA expects, per chip

    @property
    def hbm_total(self) -> int:
        """Arguments + temporaries + outputs + code, less outputs that alias arguments (none in served programs)."""
        return sum(self.hbm_bytes.values())

    def roofline_s(self, device_kind: str) -> float | None:
        """max(FLOPs / peak, bytes / bandwidth) on `device_kind`: a lower bound on its run time; None if unknown."""
        if device_kind not in PEAK_FLOPS:
            return None
        return max(self.flops / PEAK_FLOPS[device_kind], self.bytes_accessed / HBM_BANDWIDTH[device_kind])


def compiled_cost(compiled: jax.stages.Compiled) -> CompiledCost:
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):  # older JAX: one dict per computation
        cost = cost[0]
    cost = cost or {}
    hbm = {
        "arguments": int(getattr(memory, "argument_size_in_bytes", 0)),
        "temporaries": int(getattr(memory, "temp_size_in_bytes", 0)),
        "outputs": int(getattr(memory, "output_size_in_bytes", 0)) - int(getattr(memory, "alias_size_in_bytes", 0)),
        "code": int(getattr(memory, "generated_code_size_in_bytes", 0)),
    }
    return CompiledCost(hbm, float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)))
