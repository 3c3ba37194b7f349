"""bench/README.md's and bench/HISTORY.md's result tables, written from the record under bench/results/record/.

    python -m bench.report.readme_tables            # rewrite every table between its markers from the record
    python -m bench.report.readme_tables --check    # exit 1 (and name them) when a page's tables differ from it

The record is one JSON file per subject (summary, cpu, accelerator, tpu, serving, features). Each holds tables, each
table its columns and rows, and each row the date, the machine and the command that measured it beside its figures,
copied as the journal wrote them (strings: "353 (323–433) ms" keeps its range and its rounding). A page names a
table by a marker line, `<!-- record: SUBJECT/ID -->` (or `<!-- record: SUBJECT/ID with=date -->`, which adds a
column with each row's date), and the table follows up to `<!-- /record -->`: what is between is this module's to
write, so the pages' tables cannot drift from the data (tests/system/test_bench_record.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
RECORD = BENCH / "results" / "record"
PAGES = (BENCH / "README.md", BENCH / "HISTORY.md")
#: A marked table: its opening marker (subject, id, options), the table, the closing marker.
MARKED = re.compile(
    r"^(?P<open><!-- record: (?P<subject>[\w-]+)/(?P<id>[\w-]+)(?: with=(?P<with>[\w,]+))? -->\n)"
    r"(?P<table>.*?)(?P<close>^<!-- /record -->$)",
    re.M | re.S,
)
#: What a row carries beside its figures, each a column a marker may ask for with `with=`.
ROW_FIELDS = ("date", "machine", "command")


def load_record(folder: Path = RECORD) -> dict[str, dict]:
    """Every table of the record by "subject/id"; each row's figures one per column, in the columns' order."""
    tables = {}
    for path in sorted(folder.glob("*.json")):
        subject = json.loads(path.read_text(encoding="utf-8"))
        for table in subject["tables"]:
            key = f"{path.stem}/{table['id']}"
            if key in tables:
                raise ValueError(f"{path.name}: table {table['id']!r} twice")
            for row in table["rows"]:
                if set(row["figures"]) != set(table["columns"]) or not set(ROW_FIELDS) <= set(row):
                    raise ValueError(f"{key}: a row's fields are not its columns and {', '.join(ROW_FIELDS)}: {row}")
            tables[key] = table
    return tables


def _line(cells: list[str]) -> str:
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def render(table: dict, extra: tuple[str, ...] = ()) -> str:
    """The table as the pages show it, one Markdown line per row; `extra` row fields (e.g. "date") as last columns."""
    lines = [_line([*table["columns"], *extra]), "|" + "|".join([*table["align"], *("---" for _ in extra)]) + "|"]
    for row in table["rows"]:
        lines.append(_line([*(row["figures"][column] for column in table["columns"]), *(row[f] or "" for f in extra)]))
    return "\n".join(lines) + "\n"


def rewrite(text: str, tables: dict[str, dict]) -> str:
    """`text` with every marked table written from `tables`; KeyError names a marker the record lacks."""

    def table(match: re.Match) -> str:
        key = f"{match['subject']}/{match['id']}"
        if key not in tables:
            raise KeyError(f"no table {key} in {RECORD}")
        extra = tuple(match["with"].split(",")) if match["with"] else ()
        if set(extra) - set(ROW_FIELDS):
            raise KeyError(f"{key}: with= takes {', '.join(ROW_FIELDS)}")
        return match["open"] + render(tables[key], extra) + match["close"]

    return MARKED.sub(table, text)


def marked(text: str) -> list[str]:
    """The "subject/id" of every table `text` marks, in order."""
    return [f"{m['subject']}/{m['id']}" for m in MARKED.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.report.readme_tables",
        description="Write bench/README.md's and bench/HISTORY.md's result tables from bench/results/record/.",
    )
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a page differs")
    args = parser.parse_args(argv)
    tables, stale = load_record(), []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        written = rewrite(text, tables)
        if written == text:
            continue
        stale.append(page.name)
        if not args.check:
            page.write_text(written, encoding="utf-8")
    if args.check and stale:
        print(
            f"readme_tables: {', '.join(stale)} differ from {RECORD}: run python -m bench.report.readme_tables",
            file=sys.stderr,
        )
        return 1
    print(
        f"readme_tables: {len(tables)} tables in the record; "
        f"{'rewrote ' + ', '.join(stale) if stale and not args.check else 'pages up to date'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
