"""Compile turns (pipeline/host/compiling/compile_turns.py): one lock per program on this host, named by what the
program is compiled from, held around its compile; a process that finds it taken waits, then reads the cache entry. The
two engine services of tests/system/test_service.py start at once and compile each program once between them."""

import subprocess
import sys

from conftest import REPO


def test_a_turn_is_one_program_on_these_devices_with_these_flags(engine, monkeypatch):
    from pipeline.host.compiling.compile_turns import turn_path
    from pipeline.host.compiling.programs import ProgramKey

    step = ProgramKey("step_full", *engine.sizes[0], True)
    decode = ProgramKey("decode", *engine.sizes[0])
    assert turn_path(engine.programs, step) == turn_path(engine.programs, step)  # another process: the same lock
    assert turn_path(engine.programs, step) != turn_path(engine.programs, decode)
    assert turn_path(engine.programs, step).parent.parent.name.startswith("host-")  # in the cache's own folder
    flags = turn_path(engine.programs, step)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_cpu_enable_fast_math=true")
    assert turn_path(engine.programs, step) != flags  # other flags compile another program


def test_no_turn_without_the_persistent_cache(engine):
    import jax

    from pipeline.host.compiling.compile_turns import compile_turn, turn_path
    from pipeline.host.compiling.programs import ProgramKey

    key = ProgramKey("decode", *engine.sizes[0])
    cached = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        assert turn_path(engine.programs, key) is None
        with compile_turn(engine.programs, key) as waited:
            assert waited == [0.0]
    finally:
        jax.config.update("jax_enable_compilation_cache", cached)


def test_a_process_holding_the_turn_makes_the_next_one_wait(engine):
    from pipeline.host.compiling.compile_turns import compile_turn, turn_path
    from pipeline.host.compiling.programs import ProgramKey

    key = ProgramKey("decode", *engine.sizes[0])
    path = turn_path(engine.programs, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(  # another process on this host, compiling the same program for 2 s
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(2)",
            str(path),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with compile_turn(engine.programs, key) as waited:
            assert waited[0] >= 1.0  # our turn came only once the other process let go
    finally:
        holder.kill()
        holder.wait()


def test_the_start_up_line_says_how_long_a_program_waited():
    from pipeline.host.compiling.executable_store import CACHED, ProgramBuild, StartupPrograms

    label = "decode 64x64"
    build = ProgramBuild(label, CACHED, trace_s=0.4, compile_s=0.1, wait_s=12.3)
    assert build.line() == (
        f"{label}: traced and lowered in 0.4 s, from JAX's compilation cache in 0.1 s "
        "after 12.3 s waiting for another process compiling it"
    )
    assert "waiting" not in ProgramBuild(label, CACHED, 0.4, 0.1).line()
    summary = StartupPrograms((build,), 0.0, 0.0, 0, None).summary()
    assert "12.3 s waiting for other processes on this host compiling the same programs" in summary
