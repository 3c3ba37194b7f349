"""Which devices a process runs on, set before JAX starts: one JAX device per CPU core, no probe for an absent TPU;
and quiet logs. Shared by the app, the CLI and the benchmark.

Kept free of JAX: `use_cpu_cores` must run before anything imports JAX, because XLA reads XLA_FLAGS once.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os

#: JAX plugins whose presence means JAX will pick an accelerator, not the CPU.
ACCELERATOR_PLUGINS = ("libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin")
_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
#: Device nodes a TPU VM has (v4/v5e/v6e: /dev/accel*; v5p and some images: /dev/vfio/N).
TPU_DEVICE_NODES = ("/dev/accel*", "/dev/vfio/[0-9]*")


def quiet_start() -> None:
    """Each line once: huggingface_hub's logger has its own handler and also propagates to the root logger's."""
    from huggingface_hub.utils import logging as hub_logging  # heavy: 60 ms; this module must stay light

    hub_logging.disable_propagation()


def accelerator_installed() -> bool:
    """True when a TPU/GPU plugin for JAX is installed or JAX_PLATFORMS names a non-CPU platform."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms.split(",")[0] != "cpu"
    return any(
        importlib.util.find_spec(name) is not None and (name != "libtpu" or tpu_device_present())
        for name in ACCELERATOR_PLUGINS
    )


def tpu_device_present() -> bool:
    """True when this host has a TPU device node (libtpu alone, e.g. for AOT compiles on a CPU host, is no TPU)."""
    return any(glob.glob(pattern) for pattern in TPU_DEVICE_NODES)


class CalmBackendProbe(logging.Filter):
    """JAX's INFO line for a platform it tried and did not find ("Unable to initialize backend 'tpu': INTERNAL:
    Failed to ... No jellyfish device found"), said as what it is: JAX looks for every platform a plugin is installed
    for (the Docker image has both libtpu and CUDA's) and uses the next; nothing failed, and a line that reads like
    an error sends a new user looking for one. JAX keeps the full text (`xla_bridge._backend_errors`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if record.levelno == logging.INFO and text.startswith("Unable to initialize backend '"):
            platform = text.removeprefix("Unable to initialize backend '").partition("'")[0]
            record.msg, record.args = (
                "no %s device on this host: JAX uses the next platform it has",
                (PLATFORM_NAMES.get(platform, platform),),
            )
        return True


#: How the calm line names a JAX platform's devices.
PLATFORM_NAMES = {"tpu": "TPU", "cuda": "NVIDIA GPU", "rocm": "AMD GPU"}


def calm_backend_probe() -> None:
    """Install `CalmBackendProbe` on JAX's backend logger (once; before JAX picks its devices)."""
    probe = logging.getLogger("jax._src.xla_bridge")
    if not any(isinstance(f, CalmBackendProbe) for f in probe.filters):
        probe.addFilter(CalmBackendProbe())


def skip_absent_tpu() -> bool:
    """With libtpu installed on a host without a TPU (a dev venv that compiles for TPU topologies), run JAX on the CPU.

    Otherwise every process first probes for the TPU (1-3 s and ~6 lines of libtpu errors). Sets JAX_PLATFORMS=cpu
    only when unset; the topology API (`pipeline.aot`) works with it set. Returns True when it set it. Before JAX.
    Where JAX still probes (a GPU plugin beside libtpu), its line about the TPU it did not find reads calmly
    (`calm_backend_probe`).
    """
    calm_backend_probe()
    if os.environ.get("JAX_PLATFORMS") or tpu_device_present() or importlib.util.find_spec("libtpu") is None:
        return False
    if any(importlib.util.find_spec(name) is not None for name in ACCELERATOR_PLUGINS if name != "libtpu"):
        return False  # a GPU plugin: let JAX pick it
    os.environ["JAX_PLATFORMS"] = "cpu"
    return True


def use_cpu_cores(count: int | None = None) -> int:
    """On a CPU-only machine, split the CPU into `count` JAX devices (default: one per core); returns the count set.

    One request then makes one image per core, as it makes one per chip on a TPU, and it costs no more time per image
    (bench/HISTORY.md, "CPU devices", has the measurement). Leaves XLA_FLAGS alone when it already sets a device
    count, and does nothing when an accelerator is installed or `count` is 0 (libtpu without a TPU device is no
    accelerator: JAX is then told to use the CPU, see `skip_absent_tpu`). Must run before JAX is imported.
    """
    skip_absent_tpu()
    if count == 0 or accelerator_installed() or _DEVICE_COUNT_FLAG in os.environ.get("XLA_FLAGS", ""):
        return 0
    count = count or os.cpu_count() or 1
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_COUNT_FLAG}={count}".strip()
    logging.getLogger(__name__).info("CPU only: %d JAX devices, one image per core and request", count)
    return count
