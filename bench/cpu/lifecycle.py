"""`python app.py --model tiny` from launch to serving, cold and warm, and from SIGTERM to exit on an idle app.

    python -m bench.cpu.lifecycle                 # cold, then warm (--runs times), each stopped with SIGTERM when idle
    python -m bench.cpu.lifecycle --runs 3 --timeout 1800

Cold is an empty compilation cache folder (JAX's persistent cache and this host's executable store both live under
$JAX_COMPILATION_CACHE_DIR, a fresh temporary folder here); warm is the same folder once the cold start filled it.
Each start is timed from outside, from launch to the app's "Running on" line; the app is then left idle for a moment
and sent SIGTERM, and the time to its exit is measured. The 1-minute load average is read before and after each
start: this machine's cores are shared, and every figure depends on what else runs. docs/run.md ("Start-up time") quotes
what this printed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..common import free_port

ROOT = Path(__file__).resolve().parents[2]
READY = "Running on"


@dataclass(frozen=True)
class Lifecycle:
    """One app process: launch -> serving, then SIGTERM -> exit."""

    kind: str  # "cold" or "warm"
    ready_s: float
    exit_s: float
    exit_code: int | None
    load_before: float  # 1-minute load average at launch
    load_after: float  # and once it served
    programs_line: str  # the engine's own line: where each program came from

    def line(self) -> str:
        return (
            f"{self.kind}: serving in {self.ready_s:.1f} s (load {self.load_before:.1f} -> {self.load_after:.1f}); "
            f"SIGTERM when idle -> exit {self.exit_code} in {self.exit_s:.2f} s; {self.programs_line}"
        )


def load_average() -> float:
    return os.getloadavg()[0]


def run_once(kind: str, args: list[str], cache_dir: Path, data_dir: Path, timeout_s: float, idle_s: float) -> Lifecycle:
    """Start the app on `cache_dir` (its history in `data_dir`), wait for its URL (at most `timeout_s`), leave it idle
    `idle_s`, SIGTERM it."""
    env = {
        **os.environ,
        "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
        "PYTHONUNBUFFERED": "1",
        "SDXL_DATA_DIR": str(data_dir),
    }
    command = [sys.executable, "app.py", "--port", str(free_port()), *args]
    load_before = load_average()
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        for line in process.stdout:
            lines.append(line)
            if line.startswith(READY):
                ready.set()
        ready.set()  # exited

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        ready.wait(timeout_s)
        ready_s = time.perf_counter() - started
        if process.poll() is not None or not any(line.startswith(READY) for line in lines):
            raise RuntimeError(f"{kind} start did not serve in {timeout_s:.0f} s: {''.join(lines[-20:])}")
        load_after = load_average()
        time.sleep(idle_s)  # idle: nothing runs, nothing is queued
        signalled = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=120)
        exit_s = time.perf_counter() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=10)
    programs = next((line.split(": ", 2)[-1].strip() for line in lines if "programs (" in line), "")
    return Lifecycle(kind, ready_s, exit_s, code, load_before, load_after, programs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu.lifecycle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="warm starts after the cold one (default 2)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one start may take (default 1800)")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds the app stays idle before SIGTERM")
    parser.add_argument("--no-cold", action="store_true", help="warm starts only, on --cache-dir")
    parser.add_argument("--cache-dir", type=Path, help="the compilation cache folder (default: a fresh temporary one)")
    parser.add_argument("app_args", nargs="*", default=["--model", "tiny"], help="app.py's arguments (--model tiny)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sdxl-lifecycle-") as tmp:
        cache_dir = args.cache_dir or Path(tmp) / "cache"
        kinds = ([] if args.no_cold else ["cold"]) + ["warm"] * args.runs
        print(f"python app.py {' '.join(args.app_args)}; {os.cpu_count()} CPUs; cache {cache_dir}", flush=True)
        for kind in kinds:
            run = run_once(kind, args.app_args, cache_dir, Path(tmp) / "data", args.timeout, args.idle)
            print(run.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
