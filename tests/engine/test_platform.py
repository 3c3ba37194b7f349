"""Where a process runs, decided before JAX starts (pipeline/platform.py), and the start-up noise it silences."""

from __future__ import annotations

import os

from pipeline import platform


def test_libtpu_without_a_tpu_runs_jax_on_cpu(monkeypatch):
    """A dev venv with libtpu on a host without a TPU: the app/CLI run JAX on the CPU (no TPU probe, no error lines)."""
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(platform, "tpu_device_present", lambda: False)
    from bench.cost import libtpu_available

    if not libtpu_available():
        assert platform.skip_absent_tpu() is False
        return
    assert platform.skip_absent_tpu() is True and os.environ["JAX_PLATFORMS"] == "cpu"
    assert not platform.accelerator_installed()
