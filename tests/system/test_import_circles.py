"""No import circles between the project's own modules (as ../shared/tools/import_circles.py reads them): each layer
imports only those below it."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest
from conftest import REPO


def project_imports() -> dict[str, set[str]]:
    """Module -> the project's modules it imports, top-level and function-level alike (as
    ../shared/tools/import_circles.py reads them): the packages with an __init__.py and the top-level scripts."""
    modules = {}
    for path in sorted(REPO.rglob("*.py")):
        parts = path.relative_to(REPO).parts
        if any(part.startswith(".") or part in ("tests", "venv", "build") for part in parts):
            continue
        if len(parts) == 1 or (REPO / parts[0] / "__init__.py").is_file():
            modules[".".join(Path(*parts).with_suffix("").parts)] = path
    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        package = package.removesuffix(".__init__")
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)] if package else []
                    base = ".".join([*parent, *([base] if base else [])])
                imported |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        graph[module] = {name for name in imported if name in modules and name != module}
    return graph


def test_no_import_circles():
    graph = project_imports()
    assert {"app", "pipeline.generator", "pipeline.cluster.protocol", "web.page.layout", "bench.__main__"} <= set(graph)
    assert "pipeline.contract.errors" in graph["pipeline.checkpoint.convert"]  # the reader sees relative imports
    assert "pipeline.contract.sampler_names" in graph["pipeline.contract.request"]
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")


def test_the_page_imports_no_jax():
    """web/ is the page: building it with everything it imports loads no JAX (the engine is handed to it)."""
    import subprocess
    import sys

    code = (
        "import sys, web.page.layout, web.options, web.history.tab, web.apis, web.engines.remote; "
        "print(sorted(m for m in sys.modules if m == 'jax'))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


#: What web/ may import of the engine: the request contract, the engine service's wire format and info, and the
#: options (the engine's flags and the static settings they make, the service's own flags).
PAGE_MAY_IMPORT = (
    "pipeline.contract",
    "pipeline.service.wire",
    "pipeline.service.info",
    "pipeline.options",
    "pipeline.config",
    "pipeline.service.command_line",
)


def test_the_page_imports_only_the_contract():
    """web/ reaches the engine only through the contract, the service's wire and info, and the options: never its
    plans, programs, devices or checkpoint files (so the engine's insides can change without the page noticing)."""
    graph = project_imports()
    assert "pipeline.contract.request" in graph["web.page.handlers"]  # the reader sees the page's imports
    reached = {
        (module, name)
        for module, names in graph.items()
        if module.split(".")[0] == "web"
        for name in names
        if name.split(".")[0] == "pipeline"
        and not any(name == allowed or name.startswith(f"{allowed}.") for allowed in PAGE_MAY_IMPORT)
    }
    assert not reached, "web/ imports the engine's insides: " + ", ".join(f"{m} -> {n}" for m, n in sorted(reached))


def test_the_engine_clients_stand_apart():
    """web/engines/ (a page's clients of engine services) imports nothing else of web/: the page uses them, they know
    no page, server or Gradio (a bench or a test drives them alone)."""
    graph = project_imports()
    assert "web.engines.pool" in graph["web.engines.remote"]
    reached = {
        (m, n)
        for m, names in graph.items()
        if m.startswith("web.engines.")
        for n in names
        if n.split(".")[0] == "web" and not n.startswith("web.engines")
    }
    assert not reached, "web/engines/ imports: " + ", ".join(f"{m} -> {n}" for m, n in sorted(reached))


def test_the_contract_imports_nothing_else_of_the_engine():
    """pipeline/contract/ is the floor the engine and the page stand on: it imports only itself."""
    graph = project_imports()
    assert "pipeline.contract.fields" in graph["pipeline.contract.request"]
    above = {
        (m, n)
        for m, names in graph.items()
        if m.startswith("pipeline.contract.")
        for n in names
        if not n.startswith("pipeline.contract.")
    }
    assert not above, "the contract imports: " + ", ".join(f"{m} -> {n}" for m, n in sorted(above))


def test_no_arrow_runs_back_up():
    """Between the engine's folders and top-level modules (pipeline.host, pipeline.config, ...) no circle either: a
    module-level order could hide one package importing another that imports it back (host <-> cluster once)."""
    graph = project_imports()
    floors: dict[str, set[str]] = {}
    for module, names in graph.items():
        if module.startswith("pipeline."):
            floor = ".".join(module.split(".")[:2])
            floors.setdefault(floor, set()).update(
                ".".join(name.split(".")[:2]) for name in names if name.startswith("pipeline.")
            )
            floors[floor].discard(floor)
    assert {"pipeline.contract", "pipeline.host", "pipeline.device", "pipeline.config"} <= set(floors)
    try:
        graphlib.TopologicalSorter(floors).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"an arrow runs back up: {' -> '.join(exc.args[1])}")


def test_the_bench_reaches_the_engine_through_one_door():
    """bench/engine.py is the bench's only module that imports `pipeline` (issue 65): the engine names the bench
    measures are listed there once, and every other bench module asks it for them."""
    import bench.engine

    graph = project_imports()
    reaching = {
        module: sorted(name for name in imported if name.split(".")[0] == "pipeline")
        for module, imported in graph.items()
        if module.startswith("bench.")
    }
    assert reaching.pop("bench.engine") and len(reaching) >= 40
    assert {module: names for module, names in reaching.items() if names} == {}
    assert "bench.engine" in graph["bench.cpu.fused"] and "bench.engine" in graph["bench.__main__"]
    for name in bench.engine.__all__:  # every name of the door resolves (a moved engine name fails here)
        getattr(bench.engine, name)
