"""Where a test run's time goes: each test's seconds (setup, call, teardown), the CPU seconds its process and the
subprocesses it waited for used meanwhile, and the XLA compilations its process made, written as JSON lines when
`TEST_PROFILE=FOLDER` is set (one file per xdist worker). A fixture's engine build shows in the setup of the first test
that asks for it. `python -m tests.profiling FOLDER` prints the totals per file, the dearest tests, the compile
seconds and which programs compiled in which files (issue 68: profile before cutting).

Compilations are counted in the test process only (a test's subprocesses compile on their own), from JAX's own
monitoring events, as pipeline.host.compiling.compile_cache.CompileCounter counts them. CPU seconds count the
subprocesses too (once they have been waited for: a server a module fixture ends is counted in its last test): on a
shared machine, where wall seconds follow the other users' load, they are the figure to compare before and after."""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

ENV = "TEST_PROFILE"


def program_tallies() -> dict[str, list]:
    """An empty tally of compiles: program name -> [compiles, seconds]."""
    return defaultdict(lambda: [0, 0.0])


class CompileSeconds:
    """XLA compilations of this process and their seconds (JAX records a duration event per backend compile), and
    per program name those that compiled (not read from JAX's persistent cache): which programs a test pays for.

    JAX's backend compile event wraps the persistent cache's lookup, so a program read from the cache counts here too
    (`count`, `seconds`, as before); the cache's own hit event (CompileCounter's) comes first, on the same thread, and
    marks it."""

    def __init__(self) -> None:
        import jax

        from pipeline.host.compiling.compile_cache import BACKEND_COMPILE_EVENT, CACHE_HITS_EVENT

        self._compile_event, self._hit_event = BACKEND_COMPILE_EVENT, CACHE_HITS_EVENT
        self._lock, self._thread = threading.Lock(), threading.local()
        self.count, self.seconds, self.hits = 0, 0.0, 0
        self._compiled = program_tallies()
        jax.monitoring.register_event_listener(self._on_event)
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)

    def _on_event(self, event: str, **_: object) -> None:
        if event == self._hit_event:
            self._thread.hit = True

    def _on_duration(self, event: str, duration: float, fun_name: str = "?", **_: object) -> None:
        if event != self._compile_event:
            return
        hit, self._thread.hit = getattr(self._thread, "hit", False), False
        with self._lock:
            self.count += 1
            self.seconds += duration
            if hit:
                self.hits += 1
            else:
                self._compiled[fun_name][0] += 1
                self._compiled[fun_name][1] += duration

    def take(self) -> dict[str, list]:
        """The programs compiled since the last `take`: name -> [compiles, seconds]."""
        with self._lock:
            taken, self._compiled = self._compiled, program_tallies()
        return {name: [count, round(seconds, 3)] for name, (count, seconds) in taken.items()}


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that have ended and been waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class TestProfile:
    """The pytest plugin: one JSON line per test and phase."""

    def __init__(self, folder: Path, worker: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._out = (folder / f"{worker}.jsonl").open("a", encoding="utf-8")
        self._compiles = CompileSeconds()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        before = (self._compiles.count, self._compiles.seconds, self._compiles.hits)
        self._compiles.take()  # what compiled between tests (a worker's start) is no test's
        started, cpu = time.perf_counter(), cpu_seconds()
        try:
            return (yield)
        finally:
            line = {
                "test": item.nodeid,
                "file": item.nodeid.split("::")[0],
                "seconds": round(time.perf_counter() - started, 3),
                "cpu_seconds": round(cpu_seconds() - cpu, 3),
                "compiles": self._compiles.count - before[0],
                "compile_seconds": round(self._compiles.seconds - before[1], 3),
                "cache_hits": self._compiles.hits - before[2],
                "programs": self._compiles.take(),  # compiled, not from the cache: name -> [n, seconds]
                "pid": os.getpid(),
            }
            self._out.write(json.dumps(line) + "\n")
            self._out.flush()


def pytest_configure(config) -> None:
    folder = os.environ.get(ENV)
    if folder:
        worker = getattr(config, "workerinput", {}).get("workerid", "main")
        config.pluginmanager.register(TestProfile(Path(folder), worker), "test-profile")


def summary(folder: Path, top: int = 40) -> str:
    """Per-file totals (seconds, CPU seconds, compiles, compile seconds), then the `top` dearest tests. (Profiles
    written before CPU seconds were recorded show 0 there.)"""
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0.0, 0])
    for row in rows:
        total = files[row["file"]]
        total[0] += row["seconds"]
        total[1] += row.get("cpu_seconds", 0.0)
        total[2] += row["compiles"]
        total[3] += row["compile_seconds"]
        total[4] += 1
    lines = [
        f"{len(rows)} tests, {sum(r['seconds'] for r in rows):.0f} worker-seconds, "
        f"{sum(r.get('cpu_seconds', 0.0) for r in rows):.0f} CPU-s, "
        f"{sum(r['compiles'] for r in rows)} compiles, {sum(r['compile_seconds'] for r in rows):.0f} compile-s",
        "",
        f"{'seconds':>8} {'cpu-s':>7} {'compiles':>8} {'compile-s':>9} {'tests':>5}  file",
    ]
    for name, (seconds, cpu, compiles, compile_s, count) in sorted(files.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{seconds:8.1f} {cpu:7.1f} {compiles:8d} {compile_s:9.1f} {count:5d}  {name}")
    lines += ["", f"{'seconds':>8} {'cpu-s':>7} {'compiles':>8}  test"]
    for row in sorted(rows, key=lambda r: -r["seconds"])[:top]:
        lines.append(f"{row['seconds']:8.1f} {row.get('cpu_seconds', 0.0):7.1f} {row['compiles']:8d}  {row['test']}")
    return "\n".join(lines + programs_compiled(rows, top))


def programs_compiled(rows: list[dict], top: int) -> list[str]:
    """The `top` programs by compile seconds (compiled, not read from the cache), each with how often and in which
    files: a UNet-sized program compiled in many files is an engine family per file, the cost issue 68 points at.
    (Profiles written before programs were recorded give none.)"""
    programs: dict[str, list] = defaultdict(lambda: [0, 0.0, defaultdict(int)])
    for row in rows:
        for name, (count, seconds) in row.get("programs", {}).items():
            programs[name][0] += count
            programs[name][1] += seconds
            programs[name][2][row["file"].removeprefix("tests/")] += count
    if not programs:
        return []
    hits = sum(row.get("cache_hits", 0) for row in rows)
    lines = ["", f"programs compiled (not from the cache; {hits} read from it), the dearest first:"]
    lines.append(f"{'compiles':>8} {'compile-s':>9}  program: files (compiles)")
    for name, (count, seconds, files) in sorted(programs.items(), key=lambda kv: -kv[1][1])[:top]:
        where = ", ".join(f"{file} ({n})" for file, n in sorted(files.items(), key=lambda kv: -kv[1]))
        lines.append(f"{count:8d} {seconds:9.1f}  {name}: {where}")
    return lines


if __name__ == "__main__":
    print(summary(Path(sys.argv[1]), top=int(sys.argv[2]) if len(sys.argv) > 2 else 40))
