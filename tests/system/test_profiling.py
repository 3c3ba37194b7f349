"""tests/profiling.py, the per-test profile CI writes (TEST_PROFILE): which programs a test compiled, told apart from
those read from JAX's persistent cache, and the summary that lists them by file."""

from __future__ import annotations

import json

from conftest import run_python

from tests.profiling import summary

#: A process that compiles one program, drops JAX's in-memory caches and asks for it again (now from the persistent
#: cache in the folder it is given), then prints what CompileSeconds saw.
COMPILE_TWICE = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
from tests.profiling import CompileSeconds
seen = CompileSeconds()
def doubled_sine(x):
    return jnp.sin(x) * 2
jax.jit(doubled_sine)(np.ones(3, np.float32)).block_until_ready()
first = seen.take()
jax.clear_caches()
jax.jit(doubled_sine)(np.ones(3, np.float32)).block_until_ready()
print(json.dumps({"count": seen.count, "hits": seen.hits, "first": first, "since": seen.take()}))
"""


def test_a_program_read_from_the_cache_is_a_hit_not_a_compile(tmp_path):
    done = run_python("-c", COMPILE_TWICE, str(tmp_path / "cache"), env={"JAX_PLATFORMS": "cpu"}, drop=("XLA_FLAGS",))
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["count"] == 2 and seen["hits"] == 1, seen  # both went through the backend compile; one from the cache
    assert list(seen["first"]) == ["jit(doubled_sine)"] and seen["first"]["jit(doubled_sine)"][0] == 1
    assert seen["since"] == {}  # the second one compiled nothing


def test_the_summary_lists_each_program_by_compile_seconds_with_its_files(tmp_path):
    rows = [
        {
            "test": "tests/a.py::one",
            "file": "tests/a.py",
            "seconds": 9.0,
            "compiles": 3,
            "compile_seconds": 7.0,
            "cache_hits": 1,
            "programs": {"jit(step)": [1, 5.0], "jit(decode)": [1, 1.5]},
        },
        {
            "test": "tests/b.py::two",
            "file": "tests/b.py",
            "seconds": 4.0,
            "compiles": 2,
            "compile_seconds": 4.5,
            "cache_hits": 0,
            "programs": {"jit(step)": [2, 4.5]},
        },
    ]
    (tmp_path / "gw0.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = summary(tmp_path).split("programs compiled")[1].splitlines()
    assert "(not from the cache; 1 read from it)" in text[0]
    assert text[2].split() == ["3", "9.5", "jit(step):", "b.py", "(2),", "a.py", "(1)"]
    assert text[3].split() == ["1", "1.5", "jit(decode):", "a.py", "(1)"]
