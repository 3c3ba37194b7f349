"""The package maps say what is there (issue 65): each is checked against the tree, so a module added, renamed or
moved fails here, naming it, until its map says so.

The maps, both ways (every module of a mapped folder is named; every name a map gives exists):
- pipeline/README.md's tables, one per folder (`| `pipeline/host/` | what it is for |`), a row per module
  (`loop.py`) or per module of a sub-folder without its own table (`page/layout.py`): every module of pipeline/ and
  web/ has its row. A package's `__init__.py` needs none: the folder's table or row stands for it (its docstring
  says what the package is).
- a package docstring that lists its folder (`    fields.py    the table of request fields`): pipeline/contract/,
  web/ and its rooms. Each names every module and sub-package of its folder, `__init__.py` aside.
- the Layout blocks of pipeline/README.md (pipeline/'s folders) and bench/README.md (bench/'s modules and folders).

And every path these maps and docs/architecture.md name (`pipeline/host/loop.py`, `host/loop.run`,
`nets/rrdbnet.py`) is a file of the tree. Reads text only: no import, no JAX.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

PIPELINE_README = REPO / "pipeline" / "README.md"
BENCH_README = REPO / "bench" / "README.md"
ARCHITECTURE = REPO / "docs" / "architecture.md"
#: The packages whose every module pipeline/README.md's tables name.
TABLED = ("pipeline", "web")
#: The folders whose paths the docs name, with or without their top (`host/loop.py` is pipeline/host/loop.py).
TOPS = ("pipeline", "web", "bench", "tests", "scripts", "assets", "docs", "deploy")
#: File suffixes that are files, not a module's attribute (`assets/presets.json`; `host/loop.run` is loop.py's `run`).
DATA_SUFFIXES = {"json", "md", "txt", "css", "js", "yaml", "yml", "toml", "npz", "safetensors", "conf", "cfg", "html"}

_TABLE_HEAD = re.compile(r"^\| `((?:pipeline|web)/[\w/]*)` \|")
_TABLE_ROW = re.compile(r"^\| `([\w./]+)` \|")
_DOCSTRING_ENTRY = re.compile(r"^\s*(\w+\.py|\w+/)\s+\S")
_PATH = re.compile(r"(?<![\w./-])((?:[A-Za-z_]\w*/)+[A-Za-z_]\w*)(?:\.(\w+))?")


def modules_of(folder: Path) -> set[str]:
    """A folder's modules and sub-packages, as a map names them (`loop.py`, `planning/`), `__init__.py` aside."""
    return {p.name for p in folder.glob("*.py") if p.name != "__init__.py"} | {
        f"{p.parent.name}/" for p in folder.glob("*/__init__.py")
    }


def packages(top: str) -> list[Path]:
    return sorted(p.parent for p in (REPO / top).rglob("__init__.py"))


def readme_tables() -> dict[str, list[str]]:
    """pipeline/README.md's tables: folder -> the names of its rows, in order."""
    tables: dict[str, list[str]] = {}
    folder = None
    for line in PIPELINE_README.read_text(encoding="utf-8").splitlines():
        if head := _TABLE_HEAD.match(line):
            folder = head.group(1)
            tables[folder] = []
        elif folder and (row := _TABLE_ROW.match(line)):
            tables[folder].append(row.group(1))
        elif not line.startswith("|"):
            folder = None
    return tables


def test_the_readme_tables_name_every_module_of_pipeline_and_web():
    tables = readme_tables()
    assert {"pipeline/", "pipeline/host/planning/", "web/"} <= set(tables) and "loop.py" in tables["pipeline/host/"]
    named = [folder + name for folder, names in tables.items() for name in names]
    missing = sorted(
        module.relative_to(REPO).as_posix()
        for top in TABLED
        for module in (REPO / top).rglob("*.py")
        if module.name != "__init__.py" and module.relative_to(REPO).as_posix() not in named
    )
    assert not missing, "pipeline/README.md has no row for: " + ", ".join(missing)
    gone = [name for name in named if not (REPO / name).exists()]
    assert not gone, "pipeline/README.md names what is not there: " + ", ".join(gone)
    twice = sorted({name for name in named if named.count(name) > 1})
    assert not twice, "pipeline/README.md has two rows for: " + ", ".join(twice)


def docstring_maps() -> dict[Path, list[str]]:
    """Package folder -> the entries its `__init__.py` docstring lists, for each docstring that lists its folder."""
    maps = {}
    for top in TABLED:
        for folder in packages(top):
            docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
            entries = [m.group(1) for line in docstring.splitlines() if (m := _DOCSTRING_ENTRY.match(line))]
            if len(entries) >= 2:
                maps[folder] = entries
    return maps


def test_the_package_docstrings_that_list_their_folder_list_all_of_it():
    maps = docstring_maps()
    mapped = {folder.relative_to(REPO).as_posix() for folder in maps}
    assert {"pipeline/contract", "web", "web/page", "web/history", "web/engines", "web/serving"} <= mapped
    wrong = []
    for folder, entries in maps.items():
        where = f"{folder.relative_to(REPO).as_posix()}/__init__.py"
        if missing := sorted(modules_of(folder) - set(entries)):
            wrong.append(f"{where} does not list {', '.join(missing)}")
        if gone := sorted(set(entries) - modules_of(folder)):
            wrong.append(f"{where} lists {', '.join(gone)}, not in its folder")
    assert not wrong, "; ".join(wrong)


def layout_block(readme: Path) -> list[str]:
    """The lines of the first ```text block after the page's "## Layout" heading."""
    text = readme.read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return block.splitlines()


def test_the_layout_blocks_name_what_is_there():
    """bench/README.md: bench/'s modules and folders, each at the start of its line; pipeline/README.md: the
    top-level entries and pipeline/'s folders."""
    bench = {line.split()[0] for line in layout_block(BENCH_README) if line.startswith("  ") and line[2] != " "}
    actual = {p.name for p in (REPO / "bench").glob("*.py") if p.name != "__init__.py"}
    actual |= {f"{p.name}/" for p in (REPO / "bench").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert bench == actual, f"bench/README.md's Layout: missing {actual - bench}, not there {bench - actual}"

    lines = layout_block(PIPELINE_README)
    top = {line.split()[0] for line in lines if line[:1] not in (" ", "")}
    assert {"app.py", "pipeline/", "web/", "tests/"} <= top
    assert all((REPO / name).exists() for name in top), top
    under = {line.split()[0] for line in lines if line.startswith("  ") and line[2] != " "}
    folders = {name for name in modules_of(REPO / "pipeline") if name.endswith("/")}
    assert under == folders, f"pipeline/README.md's Layout: missing {folders - under}, not there {under - folders}"


def named_paths(text: str) -> list[tuple[str, str]]:
    """(as written, the file it means) for each project path in `text`: `host/loop.py`, `host/loop.run` (loop.py),
    `assets/presets.json`."""
    found = []
    folders = {*TOPS, *_folder_names()}
    for match in _PATH.finditer(text):
        path, suffix = match.group(1), match.group(2)
        if path.split("/")[0] not in folders:
            continue
        if suffix is None:
            continue  # a folder, or words with a slash
        file = f"{path}.{suffix}" if suffix in DATA_SUFFIXES or suffix == "py" else f"{path}.py"
        found.append((match.group(0), file))
    return found


def _folder_names() -> set[str]:
    return {p.name for top in TABLED for p in (REPO / top).rglob("*") if p.is_dir() and p.name != "__pycache__"}


def _exists(file: str, files: set[str], tails: set[str]) -> bool:
    """A path from the repository's root, or the tail of one (`host/loop.py`, as pipeline/README.md writes it)."""
    return file in files or (file.split("/")[0] not in TOPS and file in tails)


def test_every_path_the_maps_name_is_there():
    files = {
        p.relative_to(REPO).as_posix()
        for top in TOPS
        for p in (REPO / top).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    } | {"app.py"}
    tails = {f.split("/", i)[-1] for f in files for i in range(1, f.count("/") + 1)}
    docs = [PIPELINE_README, BENCH_README, ARCHITECTURE, *(folder / "__init__.py" for folder in docstring_maps())]
    checked, gone = 0, []
    for doc in docs:
        for written, file in named_paths(doc.read_text(encoding="utf-8")):
            checked += 1
            if not _exists(file, files, tails):
                gone.append(f"{doc.relative_to(REPO).as_posix()}: {written}")
    assert checked > 100
    assert not gone, "named but not there: " + ", ".join(gone)


#: Issue 65's sizes for the rooms a newcomer opens first: web/'s top level (page, engine clients, HTTP plumbing in
#: their folders), bench/'s top level, and bench/README.md (how to run each part and what it prints; the journal is
#: bench/HISTORY.md).
WEB_TOP_MODULES, BENCH_TOP_ENTRIES, BENCH_README_LINES = 12, 15, 300


def test_the_rooms_stay_small():
    web_top = [p.name for p in (REPO / "web").glob("*.py") if p.name != "__init__.py"]
    assert len(web_top) <= WEB_TOP_MODULES, f"web/ has {len(web_top)} top-level modules: {sorted(web_top)}"
    bench_top = [
        p.name
        for p in (REPO / "bench").iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").is_file())
    ]
    assert len(bench_top) <= BENCH_TOP_ENTRIES, f"bench/ has {len(bench_top)} entries at its top: {sorted(bench_top)}"
    lines = len(BENCH_README.read_text(encoding="utf-8").splitlines())
    assert lines <= BENCH_README_LINES, f"bench/README.md is {lines} lines; the journal goes to bench/HISTORY.md"
