"""Part 2: process start -> first image, with an empty and then a warm persistent compilation cache.

Each measurement is a fresh `python -m pipeline generate --json` subprocess (what a restarted server does), timed
from outside; the CLI reports its own phases (load, cast, replicate, compile, first run), and the rest of the
process wall time is interpreter start-up, imports and exit. The same pair is measured for the web app:
`python app.py` until it prints its URL (loaded, compiled, warmed up and serving).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .common import Progress, free_port, progress, stop_process

TARGET_RATIO = 0.4
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class StartupRun:
    """One process: its phases, seconds."""

    cache: str  # "cold" (empty compilation cache directory) or "warm" (the same directory, filled by the cold run)
    process_wall_s: float  # whole subprocess, measured from outside (includes one more call and writing PNGs)
    imports_s: float  # wall minus the CLI's own process_s: interpreter start, imports (JAX, diffusers), exit
    load_s: float  # reading the checkpoint
    cast_s: float  # casting weights on the host
    replicate_s: float  # placing the weights on every device
    compile_s: float  # compiling the program (or fetching it from the persistent cache)
    first_run_s: float  # the first generation
    first_image_s: float  # process start -> first image: imports + load + cast + replicate + compile + first run


@dataclass(frozen=True)
class StartupResult:
    """Cold vs warm start-up."""

    cold: StartupRun  # empty compilation cache
    warm: StartupRun  # the cache the cold run filled
    ratio: float  # warm.first_image_s / cold.first_image_s (lower is better)
    target_ratio: float  # the goal: ratio <= this
    meets_target: bool  # ratio <= target_ratio
    cache_entries: int  # files the cold run wrote into the cache directory
    app_cold_ready_s: float  # `python app.py` -> "Running on <url>" with an empty compilation cache
    app_warm_ready_s: float  # the same with the cache the app's cold run filled


def cli_command(model: str, height: int, width: int, steps: int, dtype: str, out: Path) -> list[str]:
    """The CLI call a user would make to get one image per device."""
    return [
        sys.executable, "-m", "pipeline", "generate", "--model", model, "--prompt", "a lighthouse at dawn",
        "--height", str(height), "--width", str(width), "--steps", str(steps), "--dtype", dtype,
        "--out", str(out), "--json",
    ]  # fmt: skip


def start_once(command: list[str], cache_dir: Path, cache: str, timeout_s: float) -> StartupRun:
    """Run the CLI in a subprocess with `cache_dir` as the compilation cache and split its wall time into phases."""
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache_dir)}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"start-up run failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    t = summary["timings"]
    imports = wall - summary["process_s"]
    phases = [t["load_s"], t["cast_s"], t["replicate_s"], t["compile_s"], t["first_run_s"]]
    return StartupRun(cache, wall, imports, *phases, first_image_s=imports + sum(phases))


def app_ready(
    args: list[str], cache_dir: Path, timeout_s: float, extra_env: dict[str, str] | None = None
) -> tuple[float, list[str]]:
    """Seconds from starting `python app.py ARGS` to its "Running on" line, and the lines it printed until then;
    the app is then stopped with SIGTERM."""
    command = [sys.executable, "app.py", "--port", str(free_port()), *args]
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache_dir), "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("Running on"):
                return time.perf_counter() - started, lines
            if time.perf_counter() - started > timeout_s:
                break
        raise RuntimeError(f"app did not start (exit code {process.poll()}): {''.join(lines[-20:])}")
    finally:
        stop_process(process)


def app_ready_once(model: str, height: int, width: int, steps: int, dtype: str, cache_dir: Path,
                   timeout_s: float) -> float:  # fmt: skip
    """`app_ready` for one model and shape."""
    args = [
        "--model", model, "--height", str(height), "--width", str(width), "--steps", str(steps), "--dtype", dtype,
    ]  # fmt: skip
    return app_ready(args, cache_dir, timeout_s)[0]


def startup(model: str, height: int, width: int, steps: int, dtype: str, say: Progress = progress,
            timeout_s: float = 600) -> StartupResult:  # fmt: skip
    """Cold then warm start in separate processes sharing one fresh cache directory (CLI, then the app)."""
    with tempfile.TemporaryDirectory(prefix="sdxl-bench-cache-") as tmp:
        say("start-up: app, cold (empty compilation cache) ...")
        app_cold = app_ready_once(model, height, width, steps, dtype, Path(tmp) / "app-cache", timeout_s)
        app_warm = app_ready_once(model, height, width, steps, dtype, Path(tmp) / "app-cache", timeout_s)
        say(f"start-up: app ready in {app_cold:.1f} s cold, {app_warm:.1f} s warm")
        cache_dir, out = Path(tmp) / "cache", Path(tmp) / "images"
        command = cli_command(model, height, width, steps, dtype, out)
        say("start-up: cold process (empty compilation cache) ...")
        cold = start_once(command, cache_dir, "cold", timeout_s)
        entries = sum(1 for path in cache_dir.rglob("*") if path.is_file())
        say(f"start-up: cold first image {cold.first_image_s:.1f} s ({entries} cache files); warm process ...")
        warm = start_once(command, cache_dir, "warm", timeout_s)
        say(f"start-up: warm first image {warm.first_image_s:.1f} s")
    ratio = warm.first_image_s / cold.first_image_s
    return StartupResult(cold, warm, ratio, TARGET_RATIO, ratio <= TARGET_RATIO, entries, app_cold, app_warm)
