""".ci/cost.py, CI's pytest budget: the CPU seconds of a command and of the processes it waited for (a grandchild's
too), exit 1 over the budget, else the command's own exit code."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

#: A child that starts a grandchild; each spins the CPU for about half a second.
SPIN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"
NESTED = SPIN + f"import subprocess, sys; subprocess.run([sys.executable, '-c', {SPIN!r}])\n"


def cost(budget: float, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / ".ci" / "cost.py"), "--name", "spin", "--cpu-budget", str(budget), "--", *command],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cpu_seconds_count_the_grandchildren_and_the_budget_fails_the_run():
    within = cost(100, sys.executable, "-c", NESTED)
    assert within.returncode == 0, within.stderr
    line = within.stdout.strip().splitlines()[-1]
    cpu = float(line.split(" and ")[1].split(" CPU")[0])
    assert line.startswith("CI cost: spin took") and cpu >= 1, line  # two half-second spins, whole seconds printed
    over = cost(0.5, sys.executable, "-c", NESTED)
    assert over.returncode == 1 and "CI budget: spin used" in over.stderr, over.stderr


def test_the_commands_own_failure_is_its_exit_code():
    failed = cost(100, sys.executable, "-c", "raise SystemExit(3)")
    assert failed.returncode == 3 and "CI budget" not in failed.stderr
