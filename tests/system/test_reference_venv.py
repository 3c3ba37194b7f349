"""The reference venv and its worker (bench/reference_venv.py, bench/cpu/reference_worker.py): the venv made once per
requirements file, by one process at a time; the worker standalone; its failures one sentence, the worker gone."""

from __future__ import annotations

import ast
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO

from bench import reference_venv
from bench.cpu.reference import ReferenceWorker, ReferenceWorkerError

#: What the worker may import beside the standard library: the reference venv's libraries, never the project's.
WORKER_LIBRARIES = {"jax", "flax", "numpy", "PIL", "diffusers", "transformers"}


@pytest.fixture
def fake_builds(monkeypatch):
    """`ensure_venv` with its commands recorded and the venv's python written instead of installed."""
    commands: list[list[str]] = []

    def run(command, what):
        commands.append(command)
        if command[1:3] == ["-m", "venv"]:
            threading.Event().wait(0.2)  # widen the race window
            python = Path(command[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("")

    monkeypatch.setattr(reference_venv, "_run", run)
    monkeypatch.setattr(reference_venv, "_base_python", lambda: "python3.11")
    return commands


def test_venv_is_made_once_per_requirements_and_again_when_they_change(tmp_path, fake_builds):
    requirements = tmp_path / "requirements-reference.txt"
    requirements.write_text("diffusers==0.39.0\n")
    venv = tmp_path / ".venv-reference"
    pythons: list = []
    threads = [
        threading.Thread(target=lambda: pythons.append(reference_venv.ensure_venv(venv, requirements)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert pythons == [venv / "bin" / "python"] * 3
    installs = [command for command in fake_builds if "-r" in command]
    assert len(installs) == 1 and installs[0][-1] == str(requirements)  # one builder; the others waited and reused
    assert (venv / reference_venv.MARKER).read_text().strip() == reference_venv.requirements_hash(requirements)

    reference_venv.ensure_venv(venv, requirements)
    assert len([command for command in fake_builds if "-r" in command]) == 1  # unchanged: reused

    requirements.write_text("diffusers==0.39.0\ntransformers==4.57.6\n")
    (venv / "stale").write_text("")
    reference_venv.ensure_venv(venv, requirements)
    assert len([command for command in fake_builds if "-r" in command]) == 2 and not (venv / "stale").exists()


def test_made_python_never_makes_the_venv(tmp_path, monkeypatch, fake_builds):
    """`python -m bench gpu` asks which python is there without making one: none while the venv is absent or stale,
    its python once made from the requirements as they are, $SDXL_REFERENCE_PYTHON whenever set."""
    monkeypatch.delenv(reference_venv.ENV_PYTHON, raising=False)
    requirements = tmp_path / "requirements-reference.txt"
    requirements.write_text("diffusers==0.39.0\n")
    venv = tmp_path / ".venv-reference"
    assert reference_venv.made_python(venv, requirements) is None and fake_builds == []
    reference_venv.ensure_venv(venv, requirements)
    assert reference_venv.made_python(venv, requirements) == venv / "bin" / "python"
    requirements.write_text("diffusers==0.39.0\ntransformers==4.57.6\n")
    assert reference_venv.made_python(venv, requirements) is None  # stale: the bench would make it again
    monkeypatch.setenv(reference_venv.ENV_PYTHON, sys.executable)
    assert reference_venv.made_python(venv, requirements) == Path(sys.executable)
    monkeypatch.setenv(reference_venv.ENV_PYTHON, "python3")  # what the worker could not start: said at once
    with pytest.raises(reference_venv.ReferenceVenvError, match="is not an executable file"):
        reference_venv.made_python(venv, requirements)


def test_environment_names_the_python(tmp_path, monkeypatch, fake_builds):
    monkeypatch.setenv(reference_venv.ENV_PYTHON, sys.executable)
    assert reference_venv.reference_python(tmp_path / "venv") == Path(sys.executable)
    assert fake_builds == [] and not (tmp_path / "venv").exists()  # nothing made
    monkeypatch.setenv(reference_venv.ENV_PYTHON, str(tmp_path / "absent"))
    with pytest.raises(reference_venv.ReferenceVenvError, match="is not an executable file"):
        reference_venv.reference_python(tmp_path / "venv")


def test_failed_command_is_one_sentence():
    with pytest.raises(reference_venv.ReferenceVenvError, match=r"^could not install it: no such package$"):
        reference_venv._run([sys.executable, "-c", "import sys; sys.exit('no such package')"], "install it")


def test_failed_install_leaves_no_marker(tmp_path, monkeypatch, fake_builds):
    requirements = tmp_path / "requirements-reference.txt"
    requirements.write_text("diffusers==0.39.0\n")
    reference_venv.ensure_venv(tmp_path / "venv", requirements)  # made (fake_builds)
    requirements.write_text("diffusers==0.39.0\nno-such-package\n")
    make = reference_venv._run  # fake_builds' recorder

    def failing_install(command, what):
        if "-r" in command:
            raise reference_venv.ReferenceVenvError(f"could not {what}: no such package")
        make(command, what)

    monkeypatch.setattr(reference_venv, "_run", failing_install)
    with pytest.raises(reference_venv.ReferenceVenvError, match="no such package"):
        reference_venv.ensure_venv(tmp_path / "venv", requirements)
    assert not (tmp_path / "venv" / reference_venv.MARKER).exists()  # made again next time


def test_worker_imports_only_the_reference_libraries():
    tree = ast.parse((REPO / "bench" / "cpu" / "reference_worker.py").read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    libraries = imported - sys.stdlib_module_names - {"__future__"}
    assert libraries <= WORKER_LIBRARIES and {"jax", "diffusers"} <= libraries


def test_bench_reference_does_not_import_diffusers():
    code = (
        "import sys, bench.cpu.reference, bench.accelerator.end_to_end, bench.reference_venv, bench.__main__; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('diffusers', 'transformers')))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_worker_failure_is_one_sentence_and_the_worker_ends(monkeypatch, tmp_path):
    """A load the worker cannot do: its error in one line, the process gone; a worker that dies: the same."""
    monkeypatch.setenv(reference_venv.ENV_PYTHON, sys.executable)
    worker = ReferenceWorker({"mode": "no such mode", "dtype": "float32"})
    with pytest.raises(ReferenceWorkerError) as raised:
        worker.__enter__()
    message = str(raised.value)
    assert message.startswith("the reference worker could not load diffusers' pipeline: ") and "\n" not in message
    assert worker.process is None

    crashing = tmp_path / "python"
    crashing.write_text("#!/bin/sh\necho 'no such library' >&2\nexit 3\n")
    crashing.chmod(0o755)
    with pytest.raises(ReferenceWorkerError, match="^the reference worker exited before it could load .*: no such"):
        ReferenceWorker({"mode": "checkpoint"}, python=crashing).__enter__()

    chatty = tmp_path / "chatty"
    chatty.write_text("#!/bin/sh\necho 'Loading weights...'\nexec sleep 600\n")
    chatty.chmod(0o755)
    worker = ReferenceWorker({"mode": "checkpoint"}, python=chatty)
    with pytest.raises(ReferenceWorkerError, match="^the reference worker answered 'Loading weights...', not JSON$"):
        worker.__enter__()
    assert worker.process is None  # killed, not left sleeping


def test_a_worker_started_early_loads_while_its_caller_works(tmp_path):
    """`start` launches the worker and sends its load request without waiting (the speed guard's engine compiles
    meanwhile); entering waits for that one answer (the load is sent once) and counts the load's seconds from the
    launch to the answer, not to the entering."""
    import time

    answered, asked = tmp_path / "answered", tmp_path / "asked"
    quick = tmp_path / "quick"
    quick.write_text(
        '#!/bin/sh\nread line\necho \'{"devices": 1, "load_s": 0.1, "packages": {}}\'\n'
        f"touch {answered}\ncat > {asked}\n"
    )
    quick.chmod(0o755)
    worker = ReferenceWorker({"mode": "checkpoint"}, python=quick).start()
    while not answered.exists():
        time.sleep(0.01)
    time.sleep(0.5)  # the caller's own work
    entered = time.perf_counter()
    with worker:
        assert worker.devices == 1 and worker.started < worker.answered < entered
    assert worker.process is None and asked.read_text() == ""  # it exited on its closed stdin, asked nothing more


def test_thread_cpu_seconds_tells_the_calling_thread_from_the_others():
    """The reference part's split of a call's CPU seconds (bench/cpu/reference_worker.thread_cpu_seconds): work in the
    calling thread counts as "main", work in another live thread as "other"."""
    import threading
    import time

    from bench.cpu.reference_worker import THREAD_GROUPS, thread_cpu_seconds

    def spin(seconds: float) -> None:
        until = time.thread_time() + seconds
        while time.thread_time() < until:
            pass

    before = thread_cpu_seconds()
    assert tuple(before) == THREAD_GROUPS and all(seconds >= 0 for seconds in before.values())
    spin(0.3)
    spun, done = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (spin(0.3), spun.set(), done.wait(60)), daemon=True)
    worker.start()
    assert spun.wait(60)
    after = thread_cpu_seconds()  # the other thread is still alive: /proc still lists it
    done.set()
    worker.join(60)
    assert after["main"] - before["main"] >= 0.25 and after["other"] - before["other"] >= 0.25
