"""The three engines the page is built around each have everything `pipeline.contract.engine.Engine` names: the local
`Generator`, the cluster's `LeadingGenerator` and the engine services' `RemoteEngines`. Nothing is compiled: the
page only reads their attributes until a request runs."""

from __future__ import annotations

import dataclasses
import inspect

import jax
from conftest import TEST_SIZE, TEST_STEPS, TINY_PT

from pipeline.contract.engine import Engine
from pipeline.generator import GenerationResult, Generator
from pipeline.service.wire import RemoteResult


def test_every_engine_is_an_engine():
    from pipeline.cluster.join_options import ClusterOptions
    from pipeline.cluster.protocol import Cluster, LeadingGenerator
    from pipeline.service.info import engine_info
    from web.engines.pool import EnginePool
    from web.engines.remote import RemoteEngines

    local = Generator.from_pretrained(
        str(TINY_PT), height=TEST_SIZE, width=TEST_SIZE, steps=TEST_STEPS, dtype="float32", devices=jax.devices()[:1]
    )
    leading = LeadingGenerator(local, Cluster(ClusterOptions()))
    remote = RemoteEngines(EnginePool(["http://127.0.0.1:9"]), engine_info(local))  # nothing contacted
    try:
        for engine in (local, leading, remote):
            assert isinstance(engine, Engine), type(engine).__name__
            assert isinstance(engine.device_summary, str) and engine.num_images >= 1
            assert engine.config.steps == TEST_STEPS == engine.rules.steps
        assert not isinstance(object(), Engine)  # the check can fail: an object without the members is none
    finally:
        remote.close()


def test_the_results_have_what_the_page_reads():
    """`EngineResult`'s fields are both results' fields (the handlers read them from either)."""
    from pipeline.contract.engine import EngineResult

    wanted = set(inspect.get_annotations(EngineResult))
    for result in (GenerationResult, RemoteResult):
        assert wanted <= {f.name for f in dataclasses.fields(result)}, result.__name__


def test_generate_takes_what_the_handlers_pass():
    """web/page/handlers.py calls `generate(request, on_step, should_stop=..., on_preview=...)` on every engine."""
    from pipeline.cluster.protocol import LeadingGenerator
    from web.engines.remote import RemoteEngines

    for engine in (Generator, LeadingGenerator, RemoteEngines):
        parameters = inspect.signature(engine.generate).parameters
        assert list(parameters)[1:3] == ["request", "on_step"], engine.__name__
        assert {"should_stop", "on_preview"} <= set(parameters), engine.__name__
