"""web/serving/startup_guard.StartupGuard, the app's Ctrl-C during start-up: the slow work runs in a worker thread (its
result or its exception comes back), the handlers are the guard's only inside it, and a SIGINT that lands where Python
would swallow the KeyboardInterrupt (a `__del__`) still ends start-up at once with one line. The whole app is stopped at
several moments of its start-up in tests/system/test_app_process.py."""

from __future__ import annotations

import signal
import textwrap

import pytest
from conftest import run_python

from web.serving.startup_guard import EXIT_INTERRUPTED, StartupGuard


def test_run_returns_the_result_or_raises_the_error_of_the_work():
    def fails():
        raise ValueError("bad checkpoint")

    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with StartupGuard("prog") as guard:
        for signum, handler in before.items():
            assert signal.getsignal(signum) is not handler  # the guard's own, inside
        assert guard.run(lambda: 6 * 7) == 42
        with pytest.raises(ValueError, match="bad checkpoint"):
            guard.run(fails)
    assert {signum: signal.getsignal(signum) for signum in before} == before  # restored as they were


def test_a_swallowed_ctrl_c_still_stops_start_up(tmp_path):
    """SIGINT landing in a __del__ (where Python prints and drops a KeyboardInterrupt) ends the process with one line
    and status 130, after the clean-up ran; the start-up after it never runs."""
    marker = tmp_path / "cleaned"
    code = textwrap.dedent(f"""
        import os, signal, time
        from web.serving.startup_guard import StartupGuard

        class InterruptedWhileCollected:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)  # the handler runs here, inside __del__, where Python cannot propagate an exception

        with StartupGuard("prog", cleanup=lambda: open({str(marker)!r}, "w").close()):
            InterruptedWhileCollected()  # collected at once
            print("start-up went on", flush=True)
    """)
    done = run_python("-c", code, timeout=120)
    assert done.returncode == EXIT_INTERRUPTED
    assert done.stderr == "prog: stopped during start-up\n"
    assert "went on" not in done.stdout
    assert marker.is_file()  # what start-up wrote was removed before leaving
