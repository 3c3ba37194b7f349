"""The product code's functions fit on a screen (issue 65): no function of app.py, pipeline/ or web/ is over 60
lines, and the `Generator` class (pipeline/generator.py) is at most 300. A reader follows a request through the code
without scrolling: a function that outgrows a screen is split into helpers that each say one thing, not squeezed.

A function's lines run from its `def` to its last line, docstring and comments included (`ast`'s line numbers);
methods and nested functions count on their own. tests/, bench/ and scripts/ are not product code."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from conftest import REPO

#: The most lines a product function may have.
FUNCTION_LINES = 60
#: The most lines of the Generator class: the engine's front door, its helpers beside it (warmup.py, merged_calls.py).
GENERATOR_LINES = 300


def product_files() -> list[Path]:
    return [REPO / "app.py", *sorted((REPO / "pipeline").rglob("*.py")), *sorted((REPO / "web").rglob("*.py"))]


def definitions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of every function and class under `tree`, methods and nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            yield name, node
            yield from definitions(node, f"{name}.")
        else:
            yield from definitions(node, prefix)


def lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def product_functions() -> dict[str, tuple[int, int]]:
    """Every function of the product code by "path::qualified name": (its first line, its lines)."""
    found = {}
    for path in product_files():
        where = path.relative_to(REPO).as_posix()
        for name, node in definitions(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                found[f"{where}::{name}"] = (node.lineno, lines(node))
    return found


def test_no_product_function_is_over_60_lines():
    found = product_functions()
    assert len(found) > 1000, "the product code was not found"  # a moved folder must not pass by finding nothing
    long = [
        f"{name} (line {first}): {count} lines"
        for name, (first, count) in sorted(found.items())
        if count > FUNCTION_LINES
    ]
    assert not long, f"over {FUNCTION_LINES} lines; split each into named steps (issue 65): " + "; ".join(long)


def test_the_generator_class_is_at_most_300_lines():
    tree = ast.parse((REPO / "pipeline" / "generator.py").read_text(encoding="utf-8"))
    (generator,) = [node for name, node in definitions(tree) if name == "Generator"]
    assert lines(generator) <= GENERATOR_LINES, (
        f"the Generator class is {lines(generator)} lines, over {GENERATOR_LINES}: move a concern beside it "
        "(as warmup.py and merged_calls.py did) rather than squeeze it (issue 65)"
    )
