"""Where a process runs, decided before JAX starts (pipeline/platform.py), and the start-up noise it silences."""

from __future__ import annotations

import os
import warnings

import pytest

from pipeline import platform


@pytest.mark.parametrize("quiet", ["quiet_start", "quiet_gradio"])  # the app's; a page in front of engines'
def test_quiet_start_silences_gradios_starlette_warning(quiet):
    """The warning Gradio 6.17.3 triggers on each request, raised as Starlette raises it (its own class)."""
    from starlette.exceptions import StarletteDeprecationWarning

    message = "'HTTP_422_UNPROCESSABLE_ENTITY' is deprecated. Use 'HTTP_422_UNPROCESSABLE_CONTENT' instead."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn(message, StarletteDeprecationWarning, stacklevel=1)
        getattr(platform, quiet)()
        warnings.warn(message, StarletteDeprecationWarning, stacklevel=1)
        warnings.warn("something else", StarletteDeprecationWarning, stacklevel=1)  # others still show
    assert [str(w.message) for w in caught] == [message, "something else"]


def test_libtpu_without_a_tpu_runs_jax_on_cpu(monkeypatch):
    """A dev venv with libtpu on a host without a TPU: the app/CLI run JAX on the CPU (no TPU probe, no error lines)."""
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(platform, "tpu_device_present", lambda: False)
    from pipeline.host.aot import libtpu_available

    if not libtpu_available():
        assert platform.skip_absent_tpu() is False
        return
    assert platform.skip_absent_tpu() is True and os.environ["JAX_PLATFORMS"] == "cpu"
    assert not platform.accelerator_installed()
