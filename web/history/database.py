"""The history's rows: one SQL database through SQLAlchemy Core, SQLite by default, PostgreSQL for page replicas.

    database = HistoryDatabase.open(database_url(data_dir, None))      # sqlite:///<data_dir>/history.sqlite3
    database = HistoryDatabase.open("postgresql://user:pw@db/sdxl")    # driven by psycopg 3
    with database.writing() as db: db.execute(...)                     # one transaction, committed or rolled back

One code path for both: the tables are declared once (`ENTRIES`, `META`) and created when missing, with the very
schema the SQLite-only store of earlier versions wrote (same names, `AUTOINCREMENT` ids, same index), so an existing
`history.sqlite3` opens as it is. SQLite must not live on a network file system (its locks and WAL need one host):
page replicas share a PostgreSQL server instead, and SQLite stays the one-process default.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

#: The SQLite file under --data-dir (the name earlier versions used: their history opens unchanged).
DATABASE_NAME = "history.sqlite3"
SCHEMA_VERSION = 1
#: Seconds a database call waits for a lock held by another connection before failing.
BUSY_TIMEOUT_S = 10
#: PostgreSQL advisory lock key taken while the schema is created (replicas starting together create it once).
_SCHEMA_LOCK = 0x5D1A_4157

METADATA = sa.MetaData()
META = sa.Table(
    "meta", METADATA, sa.Column("key", sa.Text, primary_key=True), sa.Column("value", sa.Text, nullable=False)
)
ENTRIES = sa.Table(
    "entries",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),  # newest first is id descending
    sa.Column("owner", sa.Text, nullable=False),  # keyed hash of the user name (never the name)
    sa.Column("created", sa.Float, nullable=False),  # when the entry was kept: seconds since the epoch
    sa.Column("folder", sa.Text, nullable=False, unique=True),  # the entry's folder under files/<owner>/
    sa.Column("settings", sa.Text, nullable=False),  # JSON object: the request's settings
    sa.Column("images", sa.Text, nullable=False),  # JSON list: image file names in the folder, in image order
    sa.Column("thumbnails", sa.Text, nullable=False),  # JSON list: thumbnail file names, same order
    sa.Index("entries_by_owner", "owner", "id"),
    sqlite_autoincrement=True,  # ids never reused after a delete (as the SQLite-only store wrote them)
)


def database_url(data_dir: str | Path, url: str | None) -> str:
    """The history's SQLAlchemy URL: `url` as given (postgresql:// runs on psycopg 3), else SQLite in `data_dir`."""
    if not url:
        return f"sqlite:///{Path(data_dir).expanduser().resolve() / DATABASE_NAME}"
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(
            f"--database-url must look like postgresql://USER:PASSWORD@HOST/DB or sqlite:///PATH; "
            f"got {url.split('@')[-1][:60]!r}"
        )
    if scheme in ("postgres", "postgresql"):
        return f"postgresql+psycopg://{rest}"
    if scheme in ("postgresql+psycopg", "sqlite"):
        return url
    raise ValueError(f"--database-url: {scheme}:// is not supported; use postgresql:// or sqlite:///")


@dataclass(frozen=True)
class HistoryDatabase:
    """An open database: `engine` (SQLAlchemy's pool) and whether it is the local SQLite file."""

    engine: sa.Engine
    is_sqlite: bool

    @classmethod
    def open(cls, url: str, *, durable: bool = True) -> HistoryDatabase:
        """Connect, create the tables when missing, and check the schema version. `durable` (SQLite): every commit
        synced to the disk (synchronous=FULL), not just handed to the OS."""
        is_sqlite = url.startswith("sqlite")
        if is_sqlite:
            engine = sa.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False})
            _sqlite_pragmas(engine, durable)
        else:
            engine = sa.create_engine(url, pool_pre_ping=True, pool_size=4, max_overflow=4)
        database = cls(engine, is_sqlite)
        try:
            database._create_schema()
        except BaseException:
            engine.dispose()
            raise
        return database

    def where(self) -> str:
        """The database for a log line (never its password)."""
        return self.engine.url.render_as_string(hide_password=True)

    @contextlib.contextmanager
    def writing(self):
        """One write transaction (SQLite: BEGIN IMMEDIATE, so writers queue instead of failing on upgrade)."""
        with self.engine.begin() as connection:
            yield connection

    @contextlib.contextmanager
    def reading(self):
        """A connection for reads (SQLite: a deferred BEGIN, so readers never wait for a writer under WAL)."""
        with self.engine.connect().execution_options(history_reading=True) as connection:
            yield connection

    def owner_key(self) -> bytes:
        """The key that turns user names into owner names: made once per database, shared by every replica."""
        with self.writing() as db:
            key = db.execute(sa.select(META.c.value).where(META.c.key == "owner_key")).scalar()
            if key is None:
                key = secrets.token_hex(32)
                db.execute(_insert_missing(self, META, {"key": "owner_key", "value": key}))
                key = db.execute(sa.select(META.c.value).where(META.c.key == "owner_key")).scalar_one()
        return bytes.fromhex(key)

    def close(self) -> None:
        self.engine.dispose()

    def _create_schema(self) -> None:
        with self.writing() as db:
            if not self.is_sqlite:  # replicas starting at once: one creates, the others wait and find it
                db.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
            METADATA.create_all(db, checkfirst=True)
            db.execute(_insert_missing(self, META, {"key": "schema_version", "value": str(SCHEMA_VERSION)}))
            version = db.execute(sa.select(META.c.value).where(META.c.key == "schema_version")).scalar_one()
        if int(version) != SCHEMA_VERSION:
            raise RuntimeError(f"history database schema {version} is not {SCHEMA_VERSION}: {self.where()}")


def _insert_missing(database: HistoryDatabase, table: sa.Table, row: dict):
    """INSERT ... ON CONFLICT DO NOTHING, in the database's dialect."""
    if database.is_sqlite:
        from sqlalchemy.dialects.sqlite import insert  # heavy: only the dialect in use is imported
    else:
        from sqlalchemy.dialects.postgresql import insert  # heavy: 45 ms, never needed by SQLite
    return insert(table).values(**row).on_conflict_do_nothing()


def _sqlite_pragmas(engine: sa.Engine, durable: bool) -> None:
    """WAL (readers never wait for the writer), the sync level, and SQLAlchemy's documented recipe for real
    transactions with pysqlite: autocommit at the driver, BEGIN IMMEDIATE emitted by us."""

    @sa.event.listens_for(engine, "connect")
    def on_connect(connection, _record):
        connection.isolation_level = None
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def on_begin(connection):
        reading = connection.get_execution_options().get("history_reading", False)
        connection.exec_driver_sql("BEGIN" if reading else "BEGIN IMMEDIATE")
