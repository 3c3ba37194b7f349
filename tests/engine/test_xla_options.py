"""`--xla-option NAME=VALUE`: XLA compiler options handed to every served program's compile, checked at start-up
in one sentence, and part of each program's fingerprint (host/compiling/compiler_options.py)."""

from __future__ import annotations

import copy

import pytest
from conftest import TEST_SIZE, TEST_STEPS

from pipeline.config import EngineConfig
from pipeline.contract.errors import InvalidInput
from pipeline.host.compiling.compiler_options import compiler_options, typed


def test_values_are_typed_as_xla_takes_them():
    assert [typed(v) for v in ("true", "False", "0", "-3", "0.5", "fast")] == [True, False, 0, -3, 0.5, "fast"]
    assert compiler_options((("xla_gpu_enable_triton_gemm", "false"), ("xla_gpu_dot_merger_threshold_mb", "0"))) == {
        "xla_gpu_enable_triton_gemm": False,
        "xla_gpu_dot_merger_threshold_mb": 0,
    }


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (("xla_no_such_option", "1"), "XLA refused --xla-option xla_no_such_option=1: No such compile option"),
        (("xla_gpu_enable_triton_gemm", "sometimes"), "'sometimes' is not a valid bool value"),
    ],
)
def test_an_option_xla_refuses_is_one_sentence_before_any_weights_load(option, says):
    from pipeline.generator import Generator

    with pytest.raises(InvalidInput) as refused:
        Generator.load(EngineConfig(model="/nonexistent/checkpoint", xla_options=(option,)))
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_every_served_program_is_compiled_with_the_options(tiny_dir, tmp_path):
    """XLA's own dump option, given as --xla-option, writes each program the engine compiles: the options reach
    every compile (JAX's cache is off here: a cached program is not compiled, and its key leaves the dump path out)."""
    from pipeline.generator import Generator

    dump = tmp_path / "dump"
    generator = Generator.load(
        EngineConfig(
            model=str(tiny_dir),
            height=TEST_SIZE,
            width=TEST_SIZE,
            steps=TEST_STEPS,
            dtype="float32",
            speed_levers=False,
            previews=False,
            compilation_cache=False,
            executable_cache=False,
            xla_options=(("xla_dump_to", str(dump)),),
        )
    )
    generator.generate(generator.request("a lighthouse", seed=3))
    compiled = {key.label for key in generator.program_keys() if generator.programs.is_compiled(key)}
    assert {"encode cfg", f"step {TEST_SIZE}x{TEST_SIZE} cfg", f"decode {TEST_SIZE}x{TEST_SIZE}"} <= compiled
    modules = {path.name.split(".")[1] for path in dump.glob("module_*.before_optimizations.txt")}
    assert len(modules) >= len(compiled), sorted(modules)


def test_the_options_are_part_of_every_programs_fingerprint(engine):
    """A store or precompiled directory never hands a program compiled with other options to this server."""
    from pipeline.host.compiling.aot import fingerprint

    tuned = copy.copy(engine.programs)
    tuned.xla_options = (("xla_gpu_dot_merger_threshold_mb", "0"),)
    for key in engine.program_keys():
        assert fingerprint(tuned, key) != fingerprint(engine.programs, key), key.label
