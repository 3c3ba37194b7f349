"""Every start-up option is declared once (docs/architecture.md, "Where a setting lives"): a flag by one row of the
tables per program that takes it, an environment variable by one row of all of them, and nothing outside
pipeline/options.py adds a flag to a parser or reads an option's environment variable itself.

That docs/options.md's table is the one `python -m web.options` prints is tests/system/test_readme.py's
`test_the_options_page_lists_every_app_option_and_the_readme_is_a_front_door`.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from pipeline.options import Option, programs_of
from web.options import ALL_OPTIONS

REPO = Path(__file__).resolve().parents[2]
#: Where the project's programs read their options (bench/ and scripts/ are tools with their own flags).
SOURCES = sorted([REPO / "app.py", *(REPO / "pipeline").rglob("*.py"), *(REPO / "web").rglob("*.py")])
#: The one module that turns the tables into parsers and reads their environment variables.
TABLE_READER = REPO / "pipeline" / "options.py"


def flag_clashes(table: tuple[Option, ...]) -> list[str]:
    """Flags (or older spellings) that two rows taken by one program declare: "--out (generate)"."""
    rows = defaultdict(list)
    for option in table:
        for program in programs_of(option):
            for flag in (option.flag, *option.aliases):
                rows[flag, program].append(option)
    return [f"{flag} ({program})" for (flag, program), found in rows.items() if len(found) > 1]


def env_clashes(table: tuple[Option, ...]) -> list[str]:
    """Environment variables (or older names) that two rows declare."""
    rows = defaultdict(list)
    for option in table:
        for name in (option.env, *option.env_aliases) if option.env else ():
            rows[name].append(option.flag)
    return [f"{name}: {', '.join(flags)}" for name, flags in rows.items() if len(flags) > 1]


def _constants(tree: ast.Module) -> dict[str, str]:
    """A module's top-level NAME = "text" constants (an environment variable's name kept in a constant)."""
    return {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def stray_reads(source: str, names: set[str], constants: dict[str, str]) -> list[str]:
    """Where `source` adds a flag to a parser (`add_argument`) or reads one of the options' environment variables
    `names` (os.environ.get/[]/in, os.getenv), by a literal or a constant: "line 12: add_argument"."""
    tree = ast.parse(source)
    known = {**constants, **_constants(tree)}

    def text(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return known.get(node.id) if isinstance(node, ast.Name) else None

    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "add_argument":
                found.append(f"line {node.lineno}: add_argument")
            elif node.args and (
                (node.func.attr == "get" and _is_environ(node.func.value)) or node.func.attr == "getenv"
            ):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Compare) and any(_is_environ(right) for right in node.comparators):
            key = node.left
        if key is not None and text(key) in names:
            found.append(f"line {node.lineno}: reads {text(key)}")
    return found


def _option_env_names() -> set[str]:
    return {name for option in ALL_OPTIONS if option.env for name in (option.env, *option.env_aliases)}


def test_a_flag_is_declared_by_one_row_per_program():
    """A program's flag is one row: the same spelling in two programs (the page's --host, the engine service's)
    is two options, each with its own row, environment variable and default."""
    assert flag_clashes(ALL_OPTIONS) == []
    twice = Option("--steps", "again", programs=frozenset({"cli"}))
    assert flag_clashes((*ALL_OPTIONS, twice)) == ["--steps (cli)"]
    alias = Option("--per-device-batch", "again", programs=frozenset({"cli"}))
    assert flag_clashes((*ALL_OPTIONS, alias)) == ["--per-device-batch (cli)"]


def test_an_environment_variable_is_declared_by_one_row():
    assert env_clashes(ALL_OPTIONS) == []
    again = Option("--steps-again", "again", "SDXL_PER_DEVICE_BATCH")
    assert env_clashes((*ALL_OPTIONS, again)) == ["SDXL_PER_DEVICE_BATCH: --images-per-device, --steps-again"]


def test_no_flag_or_option_environment_variable_outside_the_tables():
    """No `add_argument` beside the tables (precompile's --topology and make-tiny's folder are rows too), and no
    option's environment variable read by the code that uses it (a list's, SDXL_CONTROLNET's, included): the table
    reads it once, when the parser is built, so the flag wins the same way everywhere."""
    names = _option_env_names()
    trees = {path: path.read_text(encoding="utf-8") for path in SOURCES}
    constants = {}
    for source in trees.values():
        constants.update(_constants(ast.parse(source)))
    stray = {
        str(path.relative_to(REPO)): found
        for path, source in trees.items()
        if path != TABLE_READER and (found := stray_reads(source, names, constants))
    }
    assert stray == {}


def test_the_scan_finds_a_flag_and_a_read_beside_the_tables():
    names = {"SDXL_CONTROLNET", "SDXL_AUTH"}
    source = (
        "import os\n"
        "CONTROLNET_ENV = 'SDXL_CONTROLNET'\n"
        "parser.add_argument('--out')\n"
        "os.environ.get(CONTROLNET_ENV, '')\n"
        "os.environ['SDXL_AUTH']\n"
        "'SDXL_AUTH' in os.environ\n"
        "os.getenv('SDXL_AUTH')\n"
        "os.environ.get('HF_HOME')\n"  # not an option's: an environment variable of its own
    )
    assert stray_reads(source, names, {}) == [
        "line 3: add_argument",
        "line 4: reads SDXL_CONTROLNET",
        "line 5: reads SDXL_AUTH",
        "line 6: reads SDXL_AUTH",
        "line 7: reads SDXL_AUTH",
    ]
