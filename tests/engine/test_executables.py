"""This host's executable store (pipeline/host/compiling/executable_store.py): a restart loads every served program
whole (nothing traced, lowered or compiled) and makes the same pixels; a start with JAX's cache warm and no store yet
stores what the cache served without compiling it again; a broken file is named in one line and that program compiled
and stored again; entries of other program sources are dropped.

The first start is the session's `engine` (its warm-up stored its executables, or loaded them from an earlier run);
the others are fresh engines with the same settings, as a restarted server is. Real checkpoint, real JAX."""

import json
import logging
import os
import shutil

import numpy as np
import pytest
from conftest import TEST_SIZE, TEST_STEPS, generate


def restart(tiny_dir, **settings):
    """A new engine with the `engine` fixture's settings (and `settings`), warmed up: what a restarted server runs."""
    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(tiny_dir), height=TEST_SIZE, width=TEST_SIZE, steps=TEST_STEPS, dtype="float32", **settings
    )
    generator.warmup()
    return generator


def assert_same_pixels(a, b):
    first, second = generate(a, "a lighthouse at dusk", seed=5), generate(b, "a lighthouse at dusk", seed=5)
    for x, y in zip(first.images, second.images, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_restart_loads_every_program_and_makes_the_same_pixels(engine, tiny_dir):
    assert engine.startup_programs.directory is not None  # on by default, beside the compilation cache
    manifest = json.loads((engine.startup_programs.directory / "manifest.json").read_text())
    assert manifest["device_count"] == engine.device_count and manifest["versions"]["jaxlib"]

    again = restart(tiny_dir)
    counts, keys = again.startup_programs.counts(), again.program_keys()
    assert counts["loaded"] == len(keys) and counts["traced"] == 0 and counts["stored"] == 0
    assert again.startup_programs.trace_s == 0 and again.compile_count == 0  # nothing traced, nothing compiled
    summary = again.startup_programs.summary()
    assert summary.startswith(f"programs ({len(keys)}): {len(keys)} loaded from this host's executables"), summary
    assert_same_pixels(engine, again)


def test_each_number_of_images_per_device_has_its_own_store(engine):
    """Servers on one host with the same devices but another --images-per-device keep their executables apart: one
    store would drop the other's at every start (the bench's merging part starts both kinds in one process)."""
    from pipeline.host.compiling.executable_store import store_directory
    from pipeline.host.compiling.programs import ServedPrograms

    two = ServedPrograms(engine.programs.modules, engine._params, engine.mesh, per_device_batch=2)  # nothing compiled
    assert store_directory(engine.programs).name.startswith("cpu-8x1-")
    assert store_directory(two).name.startswith("cpu-8x2-") and store_directory(two) != store_directory(engine.programs)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A compilation cache folder of this test's own (JAX's cache empty), set back to the session's afterwards."""
    from pipeline.host.compiling.compile_cache import configure_compilation_cache

    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "cache"))
    try:
        yield tmp_path / "cache"
    finally:
        monkeypatch.undo()
        configure_compilation_cache(True)  # the session's folder again, for the tests after this one


def test_a_broken_executable_is_named_compiled_and_stored_again(engine, tiny_dir, own_cache, caplog):
    from pipeline.host.compiling.aot import fingerprint
    from pipeline.host.compiling.executable_store import store_directory
    from pipeline.host.compiling.programs import ProgramKey

    store = store_directory(engine.programs)  # the same devices and versions, under this test's cache folder
    shutil.copytree(engine.startup_programs.directory, store)
    manifest = json.loads((store / "manifest.json").read_text())
    preview = fingerprint(engine.programs, ProgramKey("preview", TEST_SIZE, TEST_SIZE))
    broken = next(entry for entry in manifest["programs"] if entry["fingerprint"] == preview)
    (store / broken["file"]).write_bytes(b"not an executable")
    (store / "old.jaxexe").write_bytes(b"x")  # an entry of other program sources: dropped at the next write
    manifest["programs"].append({**broken, "fingerprint": "0" * 20, "file": "old.jaxexe", "sources": "older code"})
    (store / "manifest.json").write_text(json.dumps(manifest))

    with caplog.at_level(logging.INFO, logger="pipeline"):
        again = restart(tiny_dir)
    counts = again.startup_programs.counts()
    assert counts["loaded"] == len(again.program_keys()) - 1
    assert counts["traced"] == counts["compiled"] == counts["stored"] == 1  # JAX's cache is empty here
    loaded_line = next(line for line in caplog.messages if line.startswith("executables "))
    assert f"compiling {broken['label']} (could not load: " in loaded_line
    assert_same_pixels(engine, again)

    rewritten = json.loads((store / "manifest.json").read_text())
    mine = {fingerprint(again.programs, key) for key in again.program_keys()}
    assert mine <= {entry["fingerprint"] for entry in rewritten["programs"]} and "0" * 20 not in str(rewritten)
    assert not (store / "old.jaxexe").exists() and os.path.getsize(store / broken["file"]) > 1000
    assert not list(store.glob(".*.partial"))  # written under another name, then renamed


def test_a_start_with_a_warm_jax_cache_and_no_store_compiles_nothing_twice(tiny_dir, own_cache, caplog):
    """JAX's cache holds every program (a first start with the store off filled it) but the store is empty: each
    program is built once (read from the cache: none compiled, none compiled again to be stored), all are stored from
    the cache's bytes, and the start after that loads them whole and makes the same pixels (the stored bytes hold
    the kernels). Few programs (no levers, no previews, one prompt window): this test compiles them. Each traced
    program is logged as it is built, "program k of N"."""
    settings = {"speed_levers": False, "previews": False, "prompt_windows": 1}
    first = restart(tiny_dir, executable_cache=False, **settings)
    keys = first.program_keys()
    assert first.startup_programs.counts()["compiled"] == len(keys) and first.startup_programs.directory is None

    with caplog.at_level(logging.INFO, logger="pipeline"):
        warm = restart(tiny_dir, **settings)
    progress = [line for line in caplog.messages if line.startswith("program ")]
    assert [line.split(":")[0] for line in progress] == [f"program {k} of {len(keys)}" for k in range(1, len(keys) + 1)]
    counts = warm.startup_programs.counts()
    assert counts["cached"] == len(keys) and counts["compiled"] == 0, counts
    assert warm.compile_count == len(keys)  # one build per program: none compiled again past the cache
    assert counts["stored"] == len(keys), counts

    whole = restart(tiny_dir, **settings)
    assert whole.startup_programs.counts()["loaded"] == len(keys) and whole.compile_count == 0
    assert_same_pixels(warm, whole)


def test_the_networks_code_is_in_every_programs_sources():
    """The networks are the project's own (device/nets/), not a library whose version keys the store: each of their
    files is one of the sources a stored executable was compiled from, so changed network code is never loaded stale."""
    from pathlib import Path

    from pipeline.host.compiling.aot import PROGRAM_SOURCES

    pipeline_dir = Path(__file__).resolve().parents[2] / "pipeline"
    covered = {path for pattern in PROGRAM_SOURCES for path in pipeline_dir.glob(pattern)}
    nets = set((pipeline_dir / "device" / "nets").glob("*.py"))
    assert nets and nets <= covered
    assert all((pipeline_dir / pattern).exists() or any(pipeline_dir.glob(pattern)) for pattern in PROGRAM_SOURCES)
