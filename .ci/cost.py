"""Run a command and say what it cost: its wall seconds, and the CPU seconds (user + system) of it and of every process
it waited for, directly or through its children (getrusage's RUSAGE_CHILDREN: pytest, its xdist workers, the servers
and CLIs the tests start). Exit 1 when the CPU seconds pass --cpu-budget, else the command's own exit code.

Why CPU seconds and not wall seconds for the budget: on the shared CI machine the same suite took 1016 s of wall in
one run and 1413 s in another (2026-12-05/06, two 2-core AMD EPYC runs of one commit's tests but for ~30 CPU seconds of
new ones): wall seconds follow the other users' load, CPU seconds follow what the tests do, so a change that makes
the tests dearer is seen when it lands and a busy machine fails nothing. The wall seconds are printed beside them.

With --calibrated the budget is the one stated for the machine it was measured on, times how much slower this machine
is (.ci/calibration.py: a fixed XLA workload, measured before the command and after it, the slower of the two):
CPU seconds follow the machine too, by half again from one machine to another.

    python .ci/cost.py --name pytest --cpu-budget 2600 -- python -m pytest
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

import calibration


def children_cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def machine() -> str:
    """This machine's cores and CPU model, for the last lines of a CI log (the only ones some readers get)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        model = ""
    return f"{os.cpu_count()} cores, {model or 'an unnamed CPU'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="what the command is, in the lines printed")
    parser.add_argument("--cpu-budget", type=float, required=True, help="CPU seconds over which this exits 1")
    parser.add_argument("--calibrated", action="store_true", help="scale the budget by this machine's speed")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the command after --")
    speeds = [calibration.machine_seconds()] if args.calibrated else []
    started, cpu = time.perf_counter(), children_cpu_seconds()
    code = subprocess.call(command)
    wall, cpu = time.perf_counter() - started, children_cpu_seconds() - cpu
    speeds += [calibration.machine_seconds()] if args.calibrated else []
    budget, scale = args.cpu_budget, calibration.factor(max(speeds)) if speeds else 1.0
    if speeds:
        print(
            f"CI machine speed: the calibration took {' and '.join(f'{s:.2f}' for s in speeds)} CPU-s before and "
            f"after ({calibration.REFERENCE_SECONDS} on the budget's machine; {machine()}): "
            f"budget {budget:.0f} × {scale:.2f}"
        )
    budget *= scale
    print(f"CI cost: {args.name} took {wall:.0f} s of wall and {cpu:.0f} CPU seconds (budget {budget:.0f})")
    if code == 0 and cpu > budget:
        print(
            f"CI budget: {args.name} used {cpu:.0f} CPU seconds, over its {budget:.0f} "
            "(profile the tests: tests/profiling.py)",
            file=sys.stderr,
        )
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
