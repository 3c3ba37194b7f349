"""An import inside a function of the product code (app.py, pipeline/, web/) says why it is not at its module's top
(issue 65): a comment on its line naming the kind of reason, or one sentence of the module's docstring covering it.

The kinds: `heavy:` (the library would slow a light entry point, or JAX would start before `pipeline/platform.py`
set the CPU device count), `optional:` (a package some machines lack, needed by one feature) and `circle:` (the
module imports this one back). The docstring form is for a module with several of one kind: a paragraph that starts
"Imported inside functions" and names each package or project module it covers (the first part of the imported
name: `jax` for `import jax.numpy`, `checkpoint` for `from .checkpoint.lora import ...`) beside its reason's kind.
Everything else goes to the module's top, where a reader sees what the module depends on.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from conftest import REPO

#: What a reason starts with.
KINDS = ("heavy", "optional", "circle")
#: The product code: what a user runs.
PRODUCT = ("app.py", "pipeline", "web")
_REASON = re.compile(rf"#\s*({'|'.join(KINDS)}):\s*\S")
_DOCSTRING_RULE = re.compile(rf"\b({'|'.join(KINDS)}):")


def product_files() -> list[Path]:
    files = [REPO / "app.py"]
    for folder in PRODUCT[1:]:
        files += sorted((REPO / folder).rglob("*.py"))
    return files


def function_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement inside a function (at any depth: a nested block, a nested function or class)."""
    found = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def imported_roots(node: ast.Import | ast.ImportFrom) -> set[str]:
    """The first part of each name the statement imports: `jax` (import jax.numpy), `checkpoint` (from
    .checkpoint.lora import ...), `convert` (from . import convert)."""
    if isinstance(node, ast.Import):
        return {alias.name.split(".")[0] for alias in node.names}
    if node.module:
        return {node.module.split(".")[0]}
    return {alias.name for alias in node.names}


def docstring_rules(tree: ast.Module) -> list[str]:
    """The module docstring's paragraphs that start "Imported inside ..." and give a reason's kind."""
    docstring = ast.get_docstring(tree) or ""
    paragraphs = [" ".join(p.split()) for p in docstring.split("\n\n")]
    return [p for p in paragraphs if p.startswith("Imported inside") and _DOCSTRING_RULE.search(p)]


def unexplained(source: str) -> list[tuple[int, str]]:
    """(line, statement) of each function-level import in `source` with no reason: none on its lines, and no
    docstring paragraph naming what it imports."""
    tree = ast.parse(source)
    reasons = {
        start[0]
        for kind, text, start, _, _ in tokenize.generate_tokens(io.StringIO(source).readline)
        if kind == tokenize.COMMENT and _REASON.match(text)
    }
    rules = docstring_rules(tree)
    missing = []
    for node in function_level_imports(tree):
        if any(line in reasons for line in range(node.lineno, node.end_lineno + 1)):
            continue
        roots = imported_roots(node)
        if rules and all(any(re.search(rf"\b{re.escape(root)}\b", rule) for rule in rules) for root in roots):
            continue
        missing.append((node.lineno, ast.get_source_segment(source, node).split("\n")[0]))
    return missing


def test_every_import_inside_a_function_says_why():
    failures = []
    for path in product_files():
        name = path.relative_to(REPO).as_posix()
        failures += [f"{name}:{line}: {text}" for line, text in unexplained(path.read_text(encoding="utf-8"))]
    assert not failures, (
        "imports inside functions without a reason (move each to the module's top, or say why on its line: "
        f"# {': ... / # '.join(KINDS)}: ...):\n" + "\n".join(failures)
    )


def test_the_reader_finds_imports_and_their_reasons():
    """The check can fail: it sees nested imports, and takes only a reason of a known kind, on the statement's lines
    or in a docstring paragraph naming the import."""
    source = (
        '"""A module.\n\nImported inside functions: qwix (optional: --quantize int8 only)."""\n'
        "import os\n"
        "def f():\n"
        "    import jax  # heavy: JAX, after the CPU device count is set\n"
        "    import numpy  # noqa: F401\n"
        "    if os.sep:\n"
        "        from .checkpoint import lora\n"
        "    from qwix import quantize_model\n"
        "    from gradio.server_messages import (  # heavy: Gradio\n"
        "        ProgressMessage,\n"
        "    )\n"
        "class C:\n"
        "    def g(self):\n"
        "        from sqlalchemy.dialects.postgresql import (\n"
        "            insert,\n"
        "        )  # heavy: 45 ms\n"
    )
    assert unexplained(source) == [(7, "import numpy"), (9, "from .checkpoint import lora")]
