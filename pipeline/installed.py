"""Whether requirements.txt is installed, asked by each entry point (app.py, `python -m pipeline`, `python -m bench`)
before it imports anything else: a fresh clone run before its install says in one sentence which command to run,
where Python would print a ModuleNotFoundError's traceback from deep inside an import.

Standard library only, and `pipeline/__init__.py` imports nothing at import time, so this runs on a bare Python.
"""

from __future__ import annotations

import importlib.util
import sys

#: The install command that gives every entry point what it imports.
INSTALL = "pip install -r requirements.txt"
#: What requirements.txt installs, by the name it is imported as -> its requirement's name (in the file's order;
#: tests/system/test_entry_points.py keeps the two in step).
REQUIRED = {
    "jax": "jax",
    "jaxlib": "jaxlib",
    "flax": "flax",
    "huggingface_hub": "huggingface-hub",
    "safetensors": "safetensors",
    "regex": "regex",
    "gradio": "gradio",
    "numpy": "numpy",
    "ml_dtypes": "ml-dtypes",
    "PIL": "pillow",
    "psutil": "psutil",
    "cv2": "opencv-python-headless",
    "qwix": "qwix",
    "sqlalchemy": "sqlalchemy",
    "psycopg": "psycopg",
    "fsspec": "fsspec",
}


#: What the engine itself imports (networks, loader, host loop). `python -m bench` asks only for these: its parts run
#: on a lent accelerator machine that has the machine's own jax and a carried flax but not the page's packages
#: (gradio, the history's database drivers; bench/HISTORY.md), where a part that needs them fails on its import.
ENGINE = ("jax", "jaxlib", "flax", "huggingface_hub", "safetensors", "regex", "numpy", "ml_dtypes", "PIL")


def missing(modules: tuple[str, ...] | None = None) -> list[str]:
    """The requirements whose module this Python cannot find (found, not imported: a few milliseconds); only those
    of `modules` when given."""
    absent = []
    for module, requirement in REQUIRED.items():
        if modules is not None and module not in modules:
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken install, or a module set to None in sys.modules
            found = False
        if not found:
            absent.append(requirement)
    return absent


def require_installed(prog: str, modules: tuple[str, ...] | None = None) -> None:
    """Exit with status 2 and one line naming the install command when a requirement (of `modules`) is missing."""
    if absent := missing(modules):
        names = ", ".join(absent) if len(absent) <= 3 else f"{', '.join(absent[:3])} and {len(absent) - 3} more"
        verb = "is" if len(absent) == 1 else "are"
        print(f"{prog}: error: {names} {verb} not installed: run `{INSTALL}` first (README, Install).", file=sys.stderr)
        raise SystemExit(2)
