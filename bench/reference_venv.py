"""The reference venv: the python that runs diffusers' own Flax pipeline (bench/cpu/reference_worker.py).

    python -m bench.reference_venv        # make .venv-reference if missing or stale; print its python

diffusers' last Flax release needs transformers 4 and huggingface-hub<1.0, which the app's own stack can no longer
install beside it (requirements-reference.txt says why), so the reference runs in a venv of its own:
`.venv-reference` at the repository's root, made with `python3.11 -m venv` and `pip install -r
requirements-reference.txt`. A marker in it holds the hash of that file: the venv is reused while the file is
unchanged and made again when it changes. A file lock beside it keeps two processes (pytest-xdist workers, a bench
and a test) from building it at once. `SDXL_REFERENCE_PYTHON=/path/to/python` names a python to use instead; then
nothing is made or installed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO / "requirements-reference.txt"
DEFAULT_VENV = REPO / ".venv-reference"
ENV_PYTHON = "SDXL_REFERENCE_PYTHON"
#: The python a fresh venv is made with (the version the main venv uses: .ci/run).
BASE_PYTHON = "python3.11"
#: In the venv: the hash of the requirements file it was made from.
MARKER = "requirements-reference.sha256"
#: Making the venv downloads and installs a few hundred MB of wheels.
INSTALL_TIMEOUT_S = 1800


class ReferenceVenvError(RuntimeError):
    """The reference venv could not be found or made: one sentence saying why."""


def requirements_hash(requirements: Path = REQUIREMENTS) -> str:
    return hashlib.sha256(requirements.read_bytes()).hexdigest()


def reference_python(venv: Path = DEFAULT_VENV, requirements: Path = REQUIREMENTS) -> Path:
    """The reference's python: $SDXL_REFERENCE_PYTHON if set, else `venv`'s, made first when missing or stale."""
    named = os.environ.get(ENV_PYTHON)
    if named:
        python = Path(named)
        if not (python.is_file() and os.access(python, os.X_OK)):
            raise ReferenceVenvError(f"{ENV_PYTHON}={named} is not an executable file")
        return python
    return ensure_venv(venv, requirements)


def made_python(venv: Path = DEFAULT_VENV, requirements: Path = REQUIREMENTS) -> Path | None:
    """The reference's python where nothing has to be made: $SDXL_REFERENCE_PYTHON if set, else `venv`'s when it was
    made from `requirements` as they are now; None where `reference_python` would make the venv (pip, network),
    which a lent GPU machine cannot do (`python -m bench gpu` checks this before it starts). Raises
    ReferenceVenvError where $SDXL_REFERENCE_PYTHON is not an executable file, as `reference_python` does."""
    if os.environ.get(ENV_PYTHON):
        return reference_python(venv, requirements)  # checks the named python, makes nothing
    python = venv / "bin" / "python"
    return python if _made(venv, requirements) else None


def _made(venv: Path, requirements: Path) -> bool:
    """Whether `venv` was made, whole, from `requirements` as they are now (its marker holds their hash)."""
    marker = venv / MARKER
    return (
        (venv / "bin" / "python").is_file()
        and marker.is_file()
        and marker.read_text().strip() == requirements_hash(requirements)
    )


def ensure_venv(venv: Path = DEFAULT_VENV, requirements: Path = REQUIREMENTS) -> Path:
    """`venv`'s python, the venv made (again) unless its marker holds the hash of `requirements`."""
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits here, then finds the venv made
        if _made(venv, requirements):
            return python
        shutil.rmtree(venv, ignore_errors=True)  # stale or half made: start again
        _run([_base_python(), "-m", "venv", str(venv)], "make the venv")
        _run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], "upgrade its pip")
        _run([str(python), "-m", "pip", "install", "-q", "-r", str(requirements)], f"install {requirements.name}")
        (venv / MARKER).write_text(requirements_hash(requirements) + "\n")  # last: a venv without it is made again
    return python


def _base_python() -> str:
    found = shutil.which(BASE_PYTHON)
    if found is None:
        raise ReferenceVenvError(
            f"{BASE_PYTHON} is not on PATH: install it to make {DEFAULT_VENV.name}, or set {ENV_PYTHON}"
        )
    return found


def _run(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ReferenceVenvError(f"could not {what}: it took over {INSTALL_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise ReferenceVenvError(f"could not {what}: {lines[-1] if lines else f'exit status {done.returncode}'}")


def main() -> int:
    try:
        python = reference_python()
    except ReferenceVenvError as exc:
        print(f"reference venv: {exc}", file=sys.stderr)
        return 1
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
