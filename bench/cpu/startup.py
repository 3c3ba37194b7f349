"""Part 2: process start -> first image, with an empty and then a warm persistent compilation cache; and the web
app's restart: cold, warm (JAX's persistent compilation cache only) and warm with this host's executables.

Each measurement is a fresh `python -m pipeline generate --json` subprocess (what a restarted server does), timed
from outside; the CLI reports its own phases (load, cast, replicate, compile, first run), and the rest of the
process wall time is interpreter start-up, imports and exit. The app is `python app.py` until it prints its URL
(loaded, compiled, warmed up and serving), in three kinds of start sharing one cache folder: cold (empty: it fills
JAX's cache and the executable store), warm with `--no-executable-cache` (every program traced and lowered, XLA's
part from JAX's cache) and warm with the executables (every program loaded whole), the two warm kinds interleaved
`runs` times. The app's own lines give each start's phases and where its programs came from.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..common import Progress, free_port, progress, stop_process
from ..engine import shape_defaults

TARGET_RATIO = 0.4
ROOT = Path(__file__).resolve().parents[2]


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


#: The app's restarts: empty cache folder; JAX's persistent cache only; that and this host's executables.
COLD, WARM, EXECUTABLES = "cold", "warm", "warm + executables"


@dataclass(frozen=True)
class AppRestart:
    """One `python app.py` start until it serves: its phases and where its programs came from (the app's lines)."""

    kind: str  # COLD, WARM or EXECUTABLES
    ready_s: float  # launch -> "Running on <url>", measured from outside
    phases: dict  # the app's phase lines, seconds: load, cast, replicate, compile, first run
    programs: dict  # the engine's programs line: programs, loaded, traced, trace_s, compiled, cached, xla_s, load_s


@dataclass(frozen=True)
class StartupResult:
    """Cold vs warm start-up."""

    cold: StartupRun  # empty compilation cache
    warm: StartupRun  # the cache (and executables) the cold run filled
    ratio: float  # warm.first_image_s / cold.first_image_s (lower is better)
    target_ratio: float  # the goal: ratio <= this
    meets_target: bool  # ratio <= target_ratio
    cache_entries: int  # files the cold run wrote into the cache directory
    app_cold_ready_s: float  # `python app.py` -> "Running on <url>" with an empty compilation cache
    app_warm_ready_s: float  # median, the same with JAX's persistent cache the cold start filled (no executables)
    app_executables_ready_s: float  # median, the same with that cache and this host's executables
    app: list[AppRestart]  # every app start, in order


def cli_command(model: str, height: int, width: int, steps: int, dtype: str, out: Path) -> list[str]:
    """The CLI call a user would make to get one image per device."""
    return [
        sys.executable,
        "-m",
        "pipeline",
        "generate",
        "--model",
        model,
        "--prompt",
        "a lighthouse at dawn",
        "--height",
        str(height),
        "--width",
        str(width),
        "--steps",
        str(steps),
        "--dtype",
        dtype,
        "--out",
        str(out),
        "--json",
    ]


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


#: The engine's line about its programs (host/compiling/executable_store.StartupPrograms.summary).
PROGRAMS_LINE = re.compile(
    r"programs \((?P<programs>\d+)\): (?P<loaded>\d+) loaded from this host's executables in (?P<load_s>[0-9.]+) s; "
    r"(?P<traced>\d+) traced and lowered in (?P<trace_s>[0-9.]+) s; (?P<compiled>\d+) compiled and (?P<cached>\d+) "
    r"from JAX's compilation cache in (?P<xla_s>[0-9.]+) s"
)
APP_PHASES = ("load", "cast", "replicate", "compile", "first run")


def app_phases(text: str) -> dict[str, float]:
    """The app's phase lines ("INFO sdxl_jax.app: compile    12.34 s"), seconds by phase."""
    phases = {}
    for phase in APP_PHASES:
        if match := re.search(rf"INFO sdxl_jax\.app: {phase}\s+([0-9.]+) s", text):
            phases[phase] = float(match.group(1))
    return phases


def programs_line(text: str) -> dict[str, float]:
    """The engine's programs line as numbers (empty when absent)."""
    match = PROGRAMS_LINE.search(text)
    return {name: float(value) for name, value in match.groupdict().items()} if match else {}


def app_restart(kind: str, args: list[str], cache_dir: Path, timeout_s: float) -> AppRestart:
    """One app start of `kind` on `cache_dir` (WARM adds --no-executable-cache)."""
    extra = ["--no-executable-cache"] if kind == WARM else []
    ready, lines = app_ready([*args, *extra], cache_dir, timeout_s)
    text = "".join(lines)
    return AppRestart(kind, ready, app_phases(text), programs_line(text))


def app_restarts(
    args: list[str], cache_dir: Path, runs: int, timeout_s: float, say: Progress = progress
) -> list[AppRestart]:
    """A cold start on the empty `cache_dir`, then `runs` x (warm, warm + executables), interleaved."""
    starts = [app_restart(COLD, args, cache_dir, timeout_s)]
    for _ in range(runs):
        starts += [app_restart(WARM, args, cache_dir, timeout_s), app_restart(EXECUTABLES, args, cache_dir, timeout_s)]
    for start in starts:
        p = start.programs
        say(
            f"start-up: app {start.kind}: ready in {start.ready_s:.1f} s; {p.get('loaded', 0):.0f} programs loaded, "
            f"{p.get('traced', 0):.0f} traced ({p.get('trace_s', 0):.1f} s)"
        )
    return starts


def median_ready(starts: list[AppRestart], kind: str) -> float:
    return statistics.median(start.ready_s for start in starts if start.kind == kind)


def startup(
    model: str,
    height: int,
    width: int,
    steps: int,
    dtype: str,
    say: Progress = progress,
    timeout_s: float = 1800,
    runs: int = 2,
) -> StartupResult:
    """The app's restarts (`app_restarts`; at the model's default size, the app's default sizes: `python app.py
    --model tiny` offers three), then the CLI's cold and warm start in separate processes sharing one fresh cache
    directory."""
    args = ["--model", model, "--steps", str(steps), "--dtype", dtype]
    if (height, width) != shape_defaults(model)[:2]:  # else the app's own default sizes, as `python app.py` offers
        args += ["--height", str(height), "--width", str(width)]
    with tempfile.TemporaryDirectory(prefix="sdxl-bench-cache-") as tmp:
        say("start-up: app, cold (empty compilation cache), then warm and warm + executables ...")
        app = app_restarts(args, Path(tmp) / "app-cache", runs, timeout_s, say)
        cache_dir, out = Path(tmp) / "cache", Path(tmp) / "images"
        command = cli_command(model, height, width, steps, dtype, out)
        say("start-up: cold process (empty compilation cache) ...")
        cold = start_once(command, cache_dir, "cold", timeout_s)
        entries = sum(1 for path in cache_dir.rglob("*") if path.is_file())
        say(f"start-up: cold first image {cold.first_image_s:.1f} s ({entries} cache files); warm process ...")
        warm = start_once(command, cache_dir, "warm", timeout_s)
        say(f"start-up: warm first image {warm.first_image_s:.1f} s")
    ratio = warm.first_image_s / cold.first_image_s
    return StartupResult(
        cold,
        warm,
        ratio,
        TARGET_RATIO,
        ratio <= TARGET_RATIO,
        entries,
        app[0].ready_s,
        median_ready(app, WARM),
        median_ready(app, EXECUTABLES),
        app,
    )
