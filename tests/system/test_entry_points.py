"""The entry points' first second (issue 48): bad arguments fail before JAX is imported, and a Python without the
requirements is told the install command. Each test is one short subprocess: no model loads, nothing compiles."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPO, free_port, run_python

from pipeline.installed import ENGINE, INSTALL, REQUIRED

#: Runs MODULE.main(ARGV) in a fresh process and prints which heavy libraries it had imported when main returned.
DRIVER = (
    "import json, sys\n"
    "from {module} import main\n"
    "code = main(sys.argv[1:])\n"
    "heavy = ('jax', 'gradio', 'diffusers', 'transformers', 'sqlalchemy')\n"
    "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))\n"
    "sys.exit(code)\n"
)


def _errors(stderr: str, prefix: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", ""], "error: Please enter a prompt."),
        (
            ["--prompt", "x", "--seed", "-1"],
            "error: Seed must be a whole number from 0 to 4294967295; got '-1' (pass --seed random for a random seed).",
        ),
        (
            ["--prompt", "x", "--init-image", "/nonexistent/folder/photo.png"],
            "error: The image file '/nonexistent/folder/photo.png' does not exist or is not a file.",
        ),
        (
            ["--prompt", "x", "--model", "/nonexistent/x"],
            "error: Model directory /nonexistent/x does not exist; pass an existing directory, a Hub id like "
            "stabilityai/stable-diffusion-xl-base-1.0, or 'tiny'.",
        ),
        (
            ["--prompt", "x", "--model", "requirements.txt"],
            "error: Model path requirements.txt is a file; pass the checkpoint directory (the one with "
            "model_index.json).",
        ),
        (
            ["--prompt", "x", "--lora-dir", "/nonexistent/loras"],
            "error: LoRA directory /nonexistent/loras does not exist or is not a directory.",
        ),
        (
            ["--prompt", "x", "--embeddings-dir", "/nonexistent/embeddings"],
            "error: Embeddings directory /nonexistent/embeddings does not exist or is not a directory.",
        ),
    ],
    ids=["empty-prompt", "seed-minus-one", "init-image", "model", "model-file", "lora-dir", "embeddings-dir"],
)
def test_cli_bad_input_is_one_line_before_jax_is_imported(args, message, tmp_path):
    """`python -m pipeline generate` with a bad argument: exit 2, one line, and JAX was never imported (it and the
    model's libraries cost 5-25 s before the line came)."""
    argv = ["generate", "--model", "tiny", *args, "--out", str(tmp_path / "out")]
    done = run_python("-c", DRIVER.format(module="pipeline.__main__"), *argv, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [message]
    assert json.loads(done.stdout) == []  # no jax, no diffusers, no transformers
    assert not (tmp_path / "out").exists()


def test_cli_names_the_mask_the_user_typed(tmp_path):
    """Each picture flag's file is named as given, folders and all: the CLI's user named their own file."""
    picture = tmp_path / "photo.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(picture)
    argv = [
        "generate",
        "--model",
        "tiny",
        "--prompt",
        "x",
        "--init-image",
        str(picture),
        "--mask-image",
        "../masks/nowhere.png",
        "--out",
        str(tmp_path / "out"),
    ]
    done = run_python("-c", DRIVER.format(module="pipeline.__main__"), *argv, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "error: The mask file '../masks/nowhere.png' does not exist or is not a file."
    assert json.loads(done.stdout) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--model", "/nonexistent/x"],
            "error: Model directory /nonexistent/x does not exist; pass an existing directory, a Hub id like "
            "stabilityai/stable-diffusion-xl-base-1.0, or 'tiny'.",
        ),
        (
            ["--model", "tiny", "--embeddings-dir", "/nonexistent/embeddings"],
            "error: Embeddings directory /nonexistent/embeddings does not exist or is not a directory.",
        ),
    ],
    ids=["model", "embeddings-dir"],
)
def test_serve_bad_path_is_one_line_before_jax_is_imported(args, message):
    argv = ["serve", *args, "--port", str(free_port())]
    done = run_python("-c", DRIVER.format(module="pipeline.__main__"), *argv, timeout=120)
    assert done.returncode == 2, done.stderr
    assert _errors(done.stderr, "error:") == [message]
    assert "Traceback" not in done.stderr and json.loads(done.stdout) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--model", "/nonexistent/x"],
            "app.py: error: Model directory /nonexistent/x does not exist; pass an existing directory, a Hub id like "
            "stabilityai/stable-diffusion-xl-base-1.0, or 'tiny'.",
        ),
        (
            ["--model", "tiny", "--lora-dir", "/nonexistent/loras"],
            "app.py: error: LoRA directory /nonexistent/loras does not exist or is not a directory.",
        ),
        (
            ["--model", "tiny", "--embeddings-dir", "/nonexistent/embeddings"],
            "app.py: error: Embeddings directory /nonexistent/embeddings does not exist or is not a directory.",
        ),
    ],
    ids=["model", "lora-dir", "embeddings-dir"],
)
def test_app_bad_path_is_one_line_before_jax_and_gradio_are_imported(args, message):
    done = run_python("-c", DRIVER.format(module="app"), *args, "--port", str(free_port()), timeout=120)
    assert done.returncode == 2, done.stderr
    assert _errors(done.stderr, "app.py:") == [message] and done.stderr.strip().endswith(message)
    assert "Traceback" not in done.stderr
    assert json.loads(done.stdout) == []  # no jax, no gradio, no sqlalchemy (the history's, 1 s)


ENTRY_POINTS = {
    "app.py": ["app.py", "--model", "tiny"],
    "python -m pipeline": ["-m", "pipeline", "generate", "--prompt", "x", "--out", "unused"],
    "python -m bench": ["-m", "bench", "--help"],
}


@pytest.mark.parametrize("prog", list(ENTRY_POINTS))
def test_entry_point_without_its_packages_names_the_install_command(prog):
    """A Python without site-packages (`-S`: as a fresh clone before `pip install`): one line naming the command."""
    done = run_python("-S", *ENTRY_POINTS[prog], timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"{prog}: error: jax, jaxlib, flax and ") and "are not installed" in line, line
    assert f"run `{INSTALL}` first" in line and "Traceback" not in done.stderr


@pytest.mark.parametrize("prog", list(ENTRY_POINTS))
def test_entry_point_missing_one_package_names_it(prog):
    """Only Pillow missing (the issue's `No module named 'PIL'`): the line names it and the command."""
    argv = ENTRY_POINTS[prog]
    run = (
        f"runpy.run_module({argv[1]!r}, run_name='__main__', alter_sys=True)"
        if argv[0] == "-m"
        else f"runpy.run_path({argv[0]!r}, run_name='__main__')"
    )
    code = f"import runpy, sys\nsys.modules['PIL'] = None\nsys.argv = {[prog, *argv[2:]]!r}\n{run}\n"
    done = run_python("-c", code, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"{prog}: error: pillow is not installed: run `{INSTALL}` first (README, Install)."


def test_the_bench_asks_only_for_the_engines_packages():
    """A lent accelerator machine has the engine's packages but not the page's: `python -m bench` runs there."""
    code = (
        "import runpy, sys\n"
        "for name in ('gradio', 'sqlalchemy', 'psycopg', 'qwix'):\n    sys.modules[name] = None\n"
        "sys.argv = ['python -m bench', '--help']\n"
        "runpy.run_module('bench', run_name='__main__', alter_sys=True)\n"
    )
    done = run_python("-c", code, timeout=120)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr
    assert set(ENGINE) <= set(REQUIRED) and {"jax", "flax", "PIL"} <= set(ENGINE)


def test_the_required_modules_are_requirements_txt():
    """pipeline/installed.py's list names every requirement of requirements.txt, and nothing else."""
    names = set()
    for line in (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.match(r"[A-Za-z0-9_.-]+", line).group(0).lower())
    assert set(REQUIRED.values()) == names
