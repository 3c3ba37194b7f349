"""The suite's own check that tests leave nothing in TMPDIR (tests/conftest.py, issue 68): a small pytest run with
the suite's conftest, in a subprocess, fails when one of its tests leaves a folder in TMPDIR and names it; a clean
run passes. Under xdist (the suite's `-n 2`: the workers inherit the run's TMPDIR, the controller checks after they
end) and in one process (`-n 0`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

LEAKY = """
import tempfile

def test_leaves_a_folder():
    tempfile.mkdtemp(prefix="deliberate-leak-")
"""
CLEAN = """
import tempfile

def test_cleans_up(tmp_path):
    with tempfile.TemporaryDirectory():
        (tmp_path / "kept-by-pytest").write_text("pytest's basetemp is not TMPDIR litter")
"""


def _run(folder, workers: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a run of its own
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))  # the conftest's imports
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            workers,
            "--basetemp",
            str(folder / "basetemp"),
            str(folder / "tests"),
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.parametrize("workers", ["2", "0"])
def test_a_test_that_leaves_a_folder_in_tmpdir_fails_the_run(tmp_path, workers):
    """One test leaves a folder, one cleans up (its tmp_path file stays: pytest's own). A clean run passing is the
    whole suite's own run."""
    tests = tmp_path / "tests"
    tests.mkdir()
    for module in ("conftest.py", "profiling.py"):  # the conftest names profiling as its plugin
        shutil.copy(REPO / "tests" / module, tests)
    (tests / "test_clean.py").write_text(CLEAN)
    (tests / "test_leaky.py").write_text(LEAKY)
    done = _run(tmp_path, workers)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed" in done.stdout  # the tests passed; the check failed the run
    report = done.stdout[done.stdout.index("left in TMPDIR") :]
    assert "Tests left 1 entry" in report and "deliberate-leak-" in report, report
