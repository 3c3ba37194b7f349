"""bench/ as a tool (issue 65): its pages' result tables are the record's data (bench/results/record/), written by
bench/report/readme_tables.py, so they cannot drift; its README says how to run it, in at most 300 lines; its top
level stays small."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO

from bench.report.readme_tables import PAGES, RECORD, load_record, marked, render, rewrite

README = REPO / "bench" / "README.md"
HISTORY = REPO / "bench" / "HISTORY.md"


def test_the_pages_tables_are_the_records():
    tables = load_record()
    assert PAGES == (README, HISTORY) and len(tables) >= 40
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert rewrite(text, tables) == text, f"{page.name}: run python -m bench.report.readme_tables"
    assert sorted(marked(HISTORY.read_text(encoding="utf-8"))) == sorted(tables)  # the journal shows every table
    shown = marked(README.read_text(encoding="utf-8"))
    assert {"summary/cpu", "summary/h200-accelerator", "summary/h200-gpu", "summary/tpu-v5e"} <= set(shown)
    assert set(shown) <= set(tables)


def test_a_figure_changed_on_a_page_is_written_back_from_the_record():
    text = README.read_text(encoding="utf-8")
    table = render(load_record()["summary/h200-accelerator"])
    assert table in text and "**0.84 / 1.17 s (0.72)**" in table
    edited = text.replace("**0.84 / 1.17 s (0.72)**", "**0.80 / 1.17 s (0.68)**")
    assert edited != text and rewrite(edited, load_record()) == text
    done = subprocess.run(
        [sys.executable, "-m", "bench.report.readme_tables", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_every_row_says_when_where_and_how_it_was_measured():
    for key, table in load_record().items():
        for row in table["rows"]:
            assert row["machine"] and row["command"], key
            assert row["date"] is None or re.fullmatch(r"2026-\d\d-\d\d", row["date"]), (key, row["date"])
    assert {path.stem for path in RECORD.glob("*.json")} == {
        "summary",
        "cpu",
        "accelerator",
        "tpu",
        "serving",
        "features",
    }


def test_the_readme_is_a_manual_and_the_top_level_is_small():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    for command in (
        "python -m bench --only reference --height 64 --width 64 --steps 2 --runs 9 --check",
        "python -m bench.reference_venv",
        "python -m bench gpu",
        "python -m bench tpu",
        "python -m bench.report.readme_tables",
    ):
        assert command in text, command
    top = [entry.name for entry in (REPO / "bench").iterdir() if entry.name != "__pycache__"]
    assert len(top) <= 15, sorted(top)
    for package in ("cpu", "accelerator", "tpu", "serving", "features", "report"):
        assert (REPO / "bench" / package / "__init__.py").is_file(), package
