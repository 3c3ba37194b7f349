"""Move a one-process history (SQLite and files under --data-dir) to the shared storage of page replicas.

    python -m web.history.migrate --data-dir DIR --database-url postgresql://... [--image-store DIR|URL]

Stop the server using DIR first (its lock is taken here). The target database must hold no entries. Every entry
keeps its id, owner and files, and the owner key comes along, so each login finds its history as it was. The files
are copied when the image store is another place than DIR (each entry's folder written whole before any row); the
rows then go in one transaction, so a failed copy leaves the target without entries and may simply be run again.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from pipeline.options import add_options

from ..options import MIGRATE, MIGRATE_OPTIONS
from .database import ENTRIES, META, HistoryDatabase, database_url
from .image_store import LocalImageStore, image_store
from .store import take_lock


def copy_history(data_dir: str | Path, target_url: str, target_images: str | None = None) -> int:
    """Copy the history in `data_dir` to `target_url` (and `target_images`); returns how many entries."""
    data_dir = Path(data_dir).expanduser().resolve()
    if not (data_dir / "history.sqlite3").is_file():
        raise ValueError(f"{data_dir} holds no history (no history.sqlite3)")
    lock = take_lock(data_dir / "lock")  # no server may write it meanwhile
    source = target = None
    try:
        source = HistoryDatabase.open(database_url(data_dir, None))
        target = HistoryDatabase.open(database_url(data_dir, target_url))
        with target.reading() as db:
            if db.execute(sa.select(sa.func.count()).select_from(ENTRIES)).scalar_one():
                raise ValueError("the target database already holds entries; copy into an empty one")
        with source.reading() as db:
            rows = [dict(row._mapping) for row in db.execute(sa.select(ENTRIES).order_by(ENTRIES.c.id))]
            key = db.execute(sa.select(META.c.value).where(META.c.key == "owner_key")).scalar_one()
        files = image_store(data_dir, target_images)
        if not (isinstance(files, LocalImageStore) and files.directory == data_dir):
            _copy_files(LocalImageStore(data_dir), files, rows)
        with target.writing() as db:
            db.execute(sa.delete(META).where(META.c.key == "owner_key"))
            db.execute(sa.insert(META).values(key="owner_key", value=key))
            if rows:
                db.execute(sa.insert(ENTRIES), rows)
                if not target.is_sqlite:  # the id sequence goes on after the copied ids
                    db.execute(
                        sa.text("SELECT setval(pg_get_serial_sequence('entries', 'id'), :last)"),
                        {"last": rows[-1]["id"]},
                    )
        return len(rows)
    finally:
        for database in (source, target):
            if database is not None:
                database.close()
        lock.close()


def _copy_files(source: LocalImageStore, target, rows: list[dict]) -> None:
    for row in rows:
        names = json.loads(row["images"]) + json.loads(row["thumbnails"])
        found = {name: source.find(row["owner"], row["folder"], name) for name in names}
        missing = [name for name, path in found.items() if path is None]
        if missing:
            raise ValueError(f"entry {row['id']} lacks its file(s) {', '.join(missing)} in {source.where()}")
        target.put(row["owner"], row["folder"], found)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m web.history.migrate", description=__doc__.split("\n\n")[0])
    add_options(parser, MIGRATE, MIGRATE_OPTIONS)
    args = parser.parse_args(argv)
    try:
        count = copy_history(args.data_dir, args.database_url, args.image_store)
    except (OSError, ValueError, RuntimeError, ImportError, sa.exc.SQLAlchemyError) as exc:
        print(f"migrate: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"copied {count} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
