"""Shared helpers of the benchmark parts: summary statistics, progress lines, machine facts, random requests."""

from __future__ import annotations

import glob
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

#: Packages whose versions go into results.json, so figures can be compared across upgrades.
#: (diffusers is the reference venv's, not this one's: results.json has its versions under "reference_packages".)
PACKAGES = ("jax", "jaxlib", "flax", "gradio", "gradio_client", "huggingface-hub", "numpy", "pillow")

#: Words random prompts are drawn from; lengths vary so some prompts overflow CLIP's 77 tokens.
_WORD_LINES = (
    "a photo of cat dog astronaut horse castle forest river city night neon sunset portrait painting oil watercolor",
    "dramatic lighting cinematic wide angle close-up highly detailed 4k misty mountains lake boat robot dragon",
    "garden flowers snow desert ocean waves lighthouse cabin warm cozy futuristic ancient ruins golden hour",
)
WORDS = tuple(word for line in _WORD_LINES for word in line.split())
NEGATIVE_WORDS = ("blurry", "low quality", "deformed", "ugly", "watermark", "text", "cropped", "noisy", "oversaturated")

Progress = Callable[[str], None]


def progress(message: str) -> None:
    """Print one progress line at once (the bench runs for minutes; the user should see where it is)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass(frozen=True)
class Stats:
    """Summary of repeated measurements (seconds unless said otherwise)."""

    n: int  # number of measurements
    median: float  # the figure the tables quote
    p95: float  # 95th percentile (nearest rank); equals max for small n
    min: float  # fastest
    max: float  # slowest

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        """Summarise `values` (NaNs everywhere when there are none, e.g. every request failed)."""
        if not values:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan)
        ordered = sorted(values)
        rank = max(0, min(len(ordered) - 1, -(-95 * len(ordered) // 100) - 1))  # nearest-rank percentile
        return cls(len(ordered), statistics.median(ordered), ordered[rank], ordered[0], ordered[-1])

    def range_text(self, scale: float = 1.0, digits: int = 3) -> str:
        """'median (min–max)' for tables."""
        return f"{self.median * scale:.{digits}f} ({self.min * scale:.{digits}f}–{self.max * scale:.{digits}f})"


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    """Seconds `fn()` took (wall clock) and its result."""
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def interleaved_seconds(generator, requests: dict, runs: int) -> tuple[dict, int]:
    """Each of `requests` (label -> request) once untimed, then `runs` rounds of all of them in turn: the seconds of
    each label's calls, and the programs compiled while they ran (0: nothing compiles per request). Interleaving
    keeps a loaded machine's drift out of the ratios between labels."""
    for request in requests.values():  # one untimed call each
        generator.generate(request)
    before = generator.compile_count
    seconds: dict = {label: [] for label in requests}
    for _ in range(runs):
        for label, request in requests.items():
            started = time.perf_counter()
            generator.generate(request)
            seconds[label].append(time.perf_counter() - started)
    return seconds, generator.compile_count - before


def free_port() -> int:
    """A TCP port free right now on localhost, for an in-process Gradio server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def package_versions() -> dict[str, str]:
    """Installed versions of the packages that decide performance."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def machine_info() -> dict[str, object]:
    """Where the figures were measured: host, CPU count, load, JAX devices."""
    import os

    import jax

    devices = jax.devices()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "uname": " ".join(platform.uname()),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": load,
        "python": sys.version.split()[0],
        "jax_backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax_platforms": os.environ.get("JAX_PLATFORMS", ""),
        "packages": package_versions(),
    }


def random_prompt(rng: random.Random) -> str:
    """A random prompt of 1 to 90 words (the long ones overflow CLIP's 77-token window)."""
    return " ".join(rng.choice(WORDS) for _ in range(rng.choice((1, 3, 8, 15, 30, 90))))


def random_negative(rng: random.Random) -> str:
    """A random negative prompt, empty a third of the time (the engine's traced "no negative" flag)."""
    return "" if rng.random() < 1 / 3 else ", ".join(rng.sample(NEGATIVE_WORDS, rng.randint(1, 4)))


def random_request(rng: random.Random, style_names: Sequence[str]) -> dict[str, object]:
    """Random `/generate` arguments: prompt, negative prompt, style, guidance (0–20 in 0.5 steps) and seed."""
    return {
        "prompt": random_prompt(rng),
        "negative_prompt": random_negative(rng),
        "style": rng.choice(list(style_names)),
        "guidance_scale": rng.randint(0, 40) / 2,
        "seed": rng.randrange(2**32),
        "randomize_seed": rng.random() < 0.5,
    }


def configure_platform(cpu_devices: int) -> None:
    """Set XLA_FLAGS / JAX_PLATFORMS (only where unset) before JAX is imported; see the module docstring."""
    if "XLA_FLAGS" not in os.environ and cpu_devices > 0:
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={cpu_devices}"
    accelerators = glob.glob("/dev/accel*") + glob.glob("/dev/vfio/[0-9]*") + glob.glob("/dev/nvidia[0-9]*")
    if "JAX_PLATFORMS" not in os.environ and not accelerators:
        os.environ["JAX_PLATFORMS"] = "cpu"


def stop_process(process: subprocess.Popen, timeout_s: float = 60) -> None:
    """End an app the bench started the way Ctrl-C would (SIGTERM), killing it if it does not exit in time."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()


def import_failure(python: str, code: str, what: str) -> str | None:
    """None when `python` runs `code` (its imports); else one sentence naming `python`, `what` it cannot import and
    its error's last line: a peer's python is checked in a few seconds before anything heavy starts."""
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} could not run: {type(exc).__name__}"
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return f"{python} cannot import {what} ({lines[-1] if lines else f'exit {done.returncode}'})"
