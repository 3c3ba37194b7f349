"""Where a process runs, decided before JAX starts (pipeline/platform.py), and the start-up noise it silences."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

from pipeline import platform


def test_libtpu_without_a_tpu_runs_jax_on_cpu(monkeypatch):
    """A dev venv with libtpu on a host without a TPU: the app/CLI run JAX on the CPU (no TPU probe, no error lines)."""
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(platform, "tpu_device_present", lambda: False)
    from bench.tpu.cost import libtpu_available

    if not libtpu_available():
        assert platform.skip_absent_tpu() is False
        return
    assert platform.skip_absent_tpu() is True and os.environ["JAX_PLATFORMS"] == "cpu"
    assert not platform.accelerator_installed()


def test_jaxs_probe_for_an_absent_tpu_is_one_calm_line():
    """Issue 68: where JAX still probes for the TPU (a GPU plugin beside libtpu; here: JAX_PLATFORMS unset and no
    `skip_absent_tpu`), its INFO line "Unable to initialize backend 'tpu': ..." read like an error at start-up. Real
    JAX in a fresh process, its log at INFO as the app's."""
    from bench.tpu.cost import libtpu_available

    if not libtpu_available() or platform.tpu_device_present():
        pytest.skip("needs libtpu on a host without a TPU (the dev venv's jax[tpu])")
    code = (
        "import logging; from pipeline.platform import calm_backend_probe; calm_backend_probe(); "
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s'); "
        "import jax; print(jax.default_backend())"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "cpu", done.stderr
    lines = [line for line in done.stderr.splitlines() if "jax._src.xla_bridge" in line]
    assert "INFO jax._src.xla_bridge: no TPU device on this host: JAX uses the next platform it has" in lines, lines
    assert not any("Unable to initialize" in line for line in lines), lines


def test_importing_the_engine_changes_nothing_in_the_environment():
    """Issue 65: no side effects at import. `pipeline.Generator` imports JAX and leaves XLA_FLAGS and JAX_PLATFORMS as
    they were; the entry points (app.py, `python -m pipeline`) call `platform.use_cpu_cores()` themselves."""
    code = (
        "import os, pipeline\npipeline.Generator\nprint(os.environ.get('XLA_FLAGS'), os.environ.get('JAX_PLATFORMS'))"
    )
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=environment, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "None"]
