"""The command line, run as users run it: a subprocess, exit codes, PNG files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEST_SIZE, TEST_STEPS
from PIL import Image

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def test_generate_writes_one_png_per_device(tiny_dir, tmp_path):
    out = tmp_path / "out"
    done = run_cli(
        "generate",
        "--model",
        str(tiny_dir),
        "--prompt",
        "a tiny robot",
        "--negative-prompt",
        "blurry",
        "--seed",
        "77",
        "--guidance-scale",
        "3.5",
        "--steps",
        str(TEST_STEPS),
        "--height",
        str(TEST_SIZE),
        "--width",
        str(TEST_SIZE),
        "--dtype",
        "float32",
        "--out",
        str(out),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    paths = [Path(p) for p in summary["images"]]
    assert len(paths) == 8 and paths == sorted(out.glob("*.png"))
    assert summary["seeds"] == list(range(77, 85))
    assert {"load_s", "compile_s", "first_run_s", "call_total_s"} <= set(summary["timings"])
    text = Image.open(paths[7]).info["parameters"]
    assert (
        text.startswith("a tiny robot\nNegative prompt: blurry\n") and "Seed: 84" in text and "CFG scale: 3.5" in text
    )
    assert f"Model: {Path(tiny_dir).name}," in text and str(tiny_dir) not in text  # named, never the server's path


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--seed", "-5"], 2, "Seed"),
        (["--guidance-scale", "500"], 2, "Guidance"),
        (["--height", "100"], 2, "Height must be a multiple of 32; got 100."),
        (["--model", "/nonexistent/sdxl"], 3, "does not exist"),
        (["--model", "requirements.txt"], 3, "is a file"),
    ],
)
def test_bad_input_exits_non_zero_with_one_line(tiny_dir, tmp_path, args, code, message):
    base = ["generate", "--model", str(tiny_dir), "--prompt", "x", "--steps", "2", "--height", "64", "--width", "64"]
    done = run_cli(*base, "--out", str(tmp_path), *args)
    assert done.returncode == code
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_make_tiny_writes_a_loadable_checkpoint(tmp_path):
    done = run_cli("make-tiny", str(tmp_path / "tiny"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tiny" / "model_index.json").is_file()
    assert (tmp_path / "tiny" / "unet" / "diffusion_flax_model.msgpack").is_file()


@pytest.mark.slow
def test_restart_reuses_the_persistent_compilation_cache(tiny_dir, tmp_path):
    """A second process compiles nothing from scratch: every program comes from JAX_COMPILATION_CACHE_DIR."""
    args = ["generate", "--model", str(tiny_dir), "--prompt", "a cat", "--steps", "2", "--height", "64"]
    args += ["--width", "64", "--dtype", "float32", "--json"]
    env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache")}
    cold = run_cli(*args, "--out", str(tmp_path / "a"), env=env)
    assert cold.returncode == 0, cold.stderr
    assert json.loads(cold.stdout)["compiles"] >= 1 and any((tmp_path / "cache").iterdir())
    warm = run_cli(*args, "--out", str(tmp_path / "b"), env=env)
    assert warm.returncode == 0, warm.stderr
    summary = json.loads(warm.stdout)
    assert summary["compiles"] >= 1 and summary["compilation_cache_hits"] == summary["compiles"]
    # Off means off: nothing read from or written to the cache.
    off = run_cli(*args, "--no-compilation-cache", "--out", str(tmp_path / "c"), env=env)
    assert off.returncode == 0, off.stderr
    assert json.loads(off.stdout)["compiles"] >= 1 and json.loads(off.stdout)["compilation_cache_hits"] == 0
