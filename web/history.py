"""Past generations per signed-in user: an embedded SQLite database plus one folder of files per entry.

    store = HistoryStore(data_dir, max_entries=500)
    entry_id = store.add(username, settings, image_paths)      # after a request: one entry, all or nothing
    store.list(username, limit=50)                              # newest first; never another user's
    store.path_of(username, entry_id, 0, thumbnail=True)        # a file of one's own entry, or None

Layout under `directory`:
    history.sqlite3          the entries (WAL journal: readers never wait for the writer)
    lock                     held (flock) by the one store that owns the directory
    staging/<token>/         an entry's files while they are written
    files/<owner>/<token>/   a finished entry's images (`00.png`, ...) and thumbnails (`00.thumb.jpg`, ...)
`<owner>` is a keyed hash of the user name (the key is random per data directory and lives in the database), so a
folder never names its user and cannot be found from a name without the database.

An entry exists once its row is committed, and the row is written last: files are copied into a staging folder,
synced, moved into place with one rename, and only then is the row inserted (one transaction, which also prunes the
user's oldest entries past the cap). A kill at any point leaves either a complete entry or files no row points to,
which the next start-up removes; listings only ever come from rows. Rows of pruned or deleted entries are removed
first and their folders after, so a crash in between again leaves only unlisted files.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from pipeline.errors import InvalidInput

logger = logging.getLogger(__name__)

#: Entries one user keeps by default (`--history-max`); adding one more removes the oldest with its files.
DEFAULT_MAX_ENTRIES = 500
#: Longest side of an entry's thumbnails in pixels (the History tab's grid shows them, not the full images).
THUMBNAIL_SIZE = 256
#: JPEG quality of thumbnails.
THUMBNAIL_QUALITY = 85
#: Most entries one `list` call returns (a page of the History tab, or `/history`).
MAX_LIST = 1000
#: Most images one entry holds (one per accelerator core: 8 on a v5e-8; generous).
MAX_IMAGES = 64
#: Settings keys every entry carries (what `/history` promises), checked when an entry is added.
REQUIRED_SETTINGS = ("prompt", "negative_prompt", "seed", "steps", "sampler", "guidance_scale", "width", "height")
#: Image file suffixes an entry may hold (the project writes PNG and JPEG; WebP for completeness).
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp"})
#: Longest user name accepted (Gradio's logins are short; this bounds what is hashed).
MAX_USER_CHARS = 256
#: Seconds a database call waits for a lock held by another connection before failing.
BUSY_TIMEOUT_S = 10
DATABASE_NAME = "history.sqlite3"
SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- grows with every entry: newest first is id descending
    owner TEXT NOT NULL,                   -- keyed hash of the user name (never the name)
    created REAL NOT NULL,                 -- when the entry was kept: seconds since the epoch
    folder TEXT NOT NULL UNIQUE,           -- the entry's folder under files/<owner>/
    settings TEXT NOT NULL,                -- JSON object: the request's settings
    images TEXT NOT NULL,                  -- JSON list: image file names in the folder, in image order
    thumbnails TEXT NOT NULL               -- JSON list: thumbnail file names, same order
);
CREATE INDEX IF NOT EXISTS entries_by_owner ON entries (owner, id);
"""


class HistoryLocked(RuntimeError):
    """Another store (another server process) already uses this data directory."""


@dataclass(frozen=True)
class Entry:
    """One kept request, as its owner sees it."""

    id: int  # the entry's number: unique across users, larger for newer entries
    created: float  # when it was kept: seconds since the epoch
    settings: dict  # the request's settings as given to `add` (JSON values); a copy, free to change
    images: tuple[str, ...]  # image file names in the entry's folder, in image order (`path_of` finds them)
    thumbnails: tuple[str, ...]  # their thumbnails' file names, same order

    @property
    def created_iso(self) -> str:
        """`created` as ISO 8601 in UTC, e.g. "2025-01-31T12:00:00.123Z"."""
        moment = datetime.datetime.fromtimestamp(self.created, datetime.UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def as_json(self, images: Iterable[str] | None = None) -> dict:
        """The entry as `/history` answers it: the settings, then `id`, `created` (ISO 8601) and `images`.

        `images`: what to list for the images (e.g. URLs the caller may fetch); their file names otherwise.
        """
        return {
            **self.settings,
            "id": self.id,
            "created": self.created_iso,
            "images": list(self.images if images is None else images),
        }


class HistoryStore:
    """Every user's past generations under one data directory; thread-safe (one server process per directory)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        max_entries: int | None = DEFAULT_MAX_ENTRIES,
        *,
        thumbnail_size: int = THUMBNAIL_SIZE,
        durable: bool = True,
    ) -> None:
        """Open (or create) the store in `directory`, then remove what an earlier run left half-written.

        `max_entries`: entries kept per user (None: no cap). `durable`: sync files and commits to the disk before
        an entry counts as kept (survives a power cut, not just a killed process); costs a few fsyncs per entry.
        """
        if max_entries is not None and (isinstance(max_entries, bool) or int(max_entries) < 1):
            raise ValueError(f"max_entries must be a positive whole number or None; got {max_entries!r}")
        self.directory = Path(directory).expanduser().resolve()
        self.max_entries = None if max_entries is None else int(max_entries)
        self.thumbnail_size = int(thumbnail_size)
        self.durable = durable
        self._files = self.directory / "files"
        self._staging = self.directory / "staging"
        for folder in (self.directory, self._files, self._staging):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock_file = _take_lock(self.directory / "lock")
        self._lock = threading.Lock()  # one connection, used by one thread at a time
        try:
            self._db = db = sqlite3.connect(
                self.directory / DATABASE_NAME, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            db.execute("PRAGMA foreign_keys=ON")
            self._owner_key = self._setup()
            self._sweep()
        except BaseException:
            self.close()
            raise

    # ---- writing -------------------------------------------------------------------------------------------------

    def add(
        self,
        user: str,
        settings: Mapping,
        image_paths: Iterable[str | os.PathLike],
        created: float | None = None,
        thumbnail_sources: Sequence[Image.Image | str | os.PathLike] | None = None,
    ) -> int:
        """Keep one finished request: its `settings` (JSON values, with `REQUIRED_SETTINGS`) and its image files.

        Returns the new entry's id. Either the whole entry is kept or nothing is (see the module docstring); the
        user's oldest entries past `max_entries` are removed with their files in the same transaction.
        The files are hard-linked where they can be (same file system: no copy; the app never rewrites a file it
        wrote) and copied otherwise. Thumbnails are made from `thumbnail_sources` when given, one per image: the
        request's PIL images still in memory, or its JPEG gallery files (decoded at 1/4 size); decoding a 1024²
        PNG instead costs ~50 ms per image.
        """
        owner = self._owner(user)
        settings_json = _settings_json(settings)
        sources = [Path(path) for path in image_paths]
        if not 1 <= len(sources) <= MAX_IMAGES:
            raise ValueError(f"an entry holds 1 to {MAX_IMAGES} images; got {len(sources)}")
        for source in sources:
            if source.suffix.lower() not in IMAGE_SUFFIXES or not source.is_file():
                raise ValueError(f"not an image file this store keeps: {source}")
        thumbnail_sources = list(sources if thumbnail_sources is None else thumbnail_sources)
        if len(thumbnail_sources) != len(sources):
            raise ValueError(f"{len(thumbnail_sources)} thumbnail sources for {len(sources)} images")
        token = secrets.token_hex(12)
        staged = self._stage(token, sources, thumbnail_sources)
        try:
            folder = self._publish(owner, token, staged)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        try:
            return self._insert(owner, token, settings_json, sources, created)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def _stage(self, token: str, sources: list[Path], thumbnail_sources: list) -> Path:
        """Link or copy the images and write their thumbnails into staging/<token>/ (synced when durable)."""
        staged = self._staging / token
        staged.mkdir(mode=0o700)
        try:
            for index, (source, thumbnail_source) in enumerate(zip(sources, thumbnail_sources, strict=True)):
                _link_or_copy(source, staged / _image_name(index, source))
                self._make_thumbnail(thumbnail_source, staged / _thumbnail_name(index))
            if self.durable:
                for path in staged.iterdir():
                    _fsync(path)
                _fsync(staged)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        return staged

    def _publish(self, owner: str, token: str, staged: Path) -> Path:
        """Move the staged folder to files/<owner>/<token> in one rename (an entry's files appear all at once)."""
        owner_dir = self._files / owner
        if not owner_dir.is_dir():
            owner_dir.mkdir(mode=0o700, exist_ok=True)
            if self.durable:
                _fsync(self._files)
        folder = owner_dir / token
        os.rename(staged, folder)
        if self.durable:
            _fsync(owner_dir)
            _fsync(self._staging)
        return folder

    def _insert(self, owner: str, token: str, settings_json: str, sources: list[Path], created: float | None) -> int:
        """Insert the row and prune past the cap, in one transaction; then remove the pruned entries' folders."""
        images = json.dumps([_image_name(index, source) for index, source in enumerate(sources)])
        thumbnails = json.dumps([_thumbnail_name(index) for index in range(len(sources))])
        created = time.time() if created is None else float(created)
        with self._lock, self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO entries (owner, created, folder, settings, images, thumbnails) VALUES (?, ?, ?, ?, ?, ?)",
                (owner, created, token, settings_json, images, thumbnails),
            )
            entry_id = int(cursor.lastrowid)
            pruned = []
            if self.max_entries is not None:
                pruned = db.execute(
                    "SELECT id, folder FROM entries WHERE owner = ? ORDER BY id DESC LIMIT -1 OFFSET ?",
                    (owner, self.max_entries),
                ).fetchall()
                db.executemany("DELETE FROM entries WHERE id = ?", [(row[0],) for row in pruned])
        self._remove_folders(owner, [row[1] for row in pruned])
        return entry_id

    def delete(self, user: str, entry_id: int) -> bool:
        """Remove one of `user`'s entries with its files; False when `user` has no such entry (theirs or nobody's)."""
        owner, entry_id = self._owner(user), _entry_id(entry_id)
        with self._lock, self._transaction() as db:
            row = db.execute(
                "DELETE FROM entries WHERE id = ? AND owner = ? RETURNING folder", (entry_id, owner)
            ).fetchone()
        if row is None:
            return False
        self._remove_folders(owner, [row[0]])
        return True

    def delete_all(self, user: str) -> int:
        """Remove every entry of `user` with its files; returns how many there were. Other users' stay."""
        owner = self._owner(user)
        with self._lock, self._transaction() as db:
            rows = db.execute("DELETE FROM entries WHERE owner = ? RETURNING folder", (owner,)).fetchall()
        self._remove_folders(owner, [row[0] for row in rows])
        return len(rows)

    # ---- reading -------------------------------------------------------------------------------------------------

    def list(self, user: str, limit: int = 100, offset: int = 0) -> list[Entry]:
        """`user`'s entries, newest first: at most `limit` (≤ MAX_LIST) after skipping `offset`."""
        owner = self._owner(user)
        limit, offset = _bounded("limit", limit, 0, MAX_LIST), _bounded("offset", offset, 0, 2**62)
        with self._lock:
            db = self._require()
            rows = db.execute(
                "SELECT id, created, settings, images, thumbnails FROM entries WHERE owner = ? "
                "ORDER BY id DESC LIMIT ? OFFSET ?",
                (owner, limit, offset),
            ).fetchall()
        return [_entry(row) for row in rows]

    def count(self, user: str) -> int:
        """How many entries `user` has."""
        owner = self._owner(user)
        with self._lock:
            db = self._require()
            return int(db.execute("SELECT COUNT(*) FROM entries WHERE owner = ?", (owner,)).fetchone()[0])

    def get(self, user: str, entry_id: int) -> Entry | None:
        """One of `user`'s entries; None when `user` has no entry with that id (another user's counts as none)."""
        owner, entry_id = self._owner(user), _entry_id(entry_id)
        with self._lock:
            db = self._require()
            row = db.execute(
                "SELECT id, created, settings, images, thumbnails FROM entries WHERE id = ? AND owner = ?",
                (entry_id, owner),
            ).fetchone()
        return None if row is None else _entry(row)

    def path_of(self, user: str, entry_id: int, index: int, thumbnail: bool = False) -> Path | None:
        """The file of image `index` (or its thumbnail) of one of `user`'s entries; None for anything else.

        Another user's entry, an unknown id and an index past the entry's images all answer None alike, so a
        caller learns nothing about entries that are not theirs.
        """
        owner, entry_id = self._owner(user), _entry_id(entry_id)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            return None
        with self._lock:
            db = self._require()
            row = db.execute(
                "SELECT folder, images, thumbnails FROM entries WHERE id = ? AND owner = ?", (entry_id, owner)
            ).fetchone()
        if row is None:
            return None
        names = json.loads(row[2] if thumbnail else row[1])
        if index >= len(names):
            return None
        path = self._files / owner / row[0] / names[index]
        return path if path.is_file() else None

    def export(self, user: str, entry_id: int, index: int, directory: str | os.PathLike, thumbnail: bool = False):
        """Link (or copy) one of `user`'s files into `directory` (e.g. the app's served folder): the new path or None.

        For Gradio: files under the data directory must not be served directly (an allowed path is open to every
        signed-in user who knows it), so the page serves a copy in its own output folder instead.
        """
        source = self.path_of(user, entry_id, index, thumbnail)
        if source is None:
            return None
        target = Path(directory) / f"history-{_entry_id(entry_id)}-{source.name}"
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        _link_or_copy(source, target)
        return target

    # ---- housekeeping --------------------------------------------------------------------------------------------

    def _sweep(self) -> int:
        """Remove files no entry points to (staged or published by a run that was killed); returns how many folders.

        Only at start-up, before this store's first `add` (the directory lock keeps every other writer out): later,
        a folder published an instant before its row is inserted would look orphaned.
        """
        removed = 0
        for staged in self._staging.iterdir():
            _remove(staged)
            removed += 1
        with self._lock:
            db = self._require()
            known = {row[0] for row in db.execute("SELECT owner || '/' || folder FROM entries")}
        for owner_dir in self._files.iterdir():
            if not owner_dir.is_dir():
                _remove(owner_dir)
                continue
            for folder in owner_dir.iterdir():
                if f"{owner_dir.name}/{folder.name}" not in known:
                    _remove(folder)
                    removed += 1
            with contextlib.suppress(OSError):
                owner_dir.rmdir()  # only when empty
        if removed:
            logger.info("history: removed %d unfinished or orphaned entry folder(s) under %s", removed, self.directory)
        return removed

    def close(self) -> None:
        """Close the database and release the directory (a new store may then open it)."""
        with self._lock:
            db, self._db = getattr(self, "_db", None), None
            if db is not None:
                db.close()
        lock_file = getattr(self, "_lock_file", None)
        if lock_file is not None:
            lock_file.close()  # closing the descriptor drops the flock
            self._lock_file = None

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- internals -----------------------------------------------------------------------------------------------

    def _setup(self) -> bytes:
        """Create the schema on first use; return the key that turns user names into folder names."""
        with self._lock:
            self._require().executescript(_SCHEMA)  # idempotent (IF NOT EXISTS); runs outside our transactions
        with self._lock, self._transaction() as db:
            version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if version is None:
                db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(version[0]) != SCHEMA_VERSION:
                raise RuntimeError(f"history database schema {version[0]} is not {SCHEMA_VERSION}: {self.directory}")
            key = db.execute("SELECT value FROM meta WHERE key = 'owner_key'").fetchone()
            if key is None:
                key = (secrets.token_hex(32),)
                db.execute("INSERT INTO meta VALUES ('owner_key', ?)", key)
        return bytes.fromhex(key[0])

    def _owner(self, user: str) -> str:
        """The folder name and row owner of `user`: keyed BLAKE2b of the name (32 hex digits)."""
        if not isinstance(user, str) or not user.strip():
            raise InvalidInput("History needs a signed-in user.")
        if len(user) > MAX_USER_CHARS:
            raise InvalidInput(f"User names longer than {MAX_USER_CHARS} characters have no history.")
        return hashlib.blake2b(user.encode("utf-8", "surrogatepass"), key=self._owner_key, digest_size=16).hexdigest()

    def _require(self) -> sqlite3.Connection:
        """The connection (the caller holds `self._lock`); a closed store says so."""
        if self._db is None:
            raise RuntimeError("the history store is closed")
        return self._db

    @contextlib.contextmanager
    def _transaction(self):
        """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error): the caller holds `self._lock`."""
        db = self._require()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _make_thumbnail(self, source: Image.Image | str | os.PathLike, target: Path) -> None:
        box = (self.thumbnail_size, self.thumbnail_size)
        if isinstance(source, Image.Image):
            factor = max(1, max(source.size) // self.thumbnail_size)
            thumbnail = source.convert("RGB").reduce(factor) if factor > 1 else source.convert("RGB")
        else:
            with Image.open(source) as image:
                image.draft("RGB", box)  # JPEG: decoded at 1/2, 1/4 or 1/8 size, which is most of the saving
                thumbnail = image.convert("RGB")
        thumbnail.thumbnail(box, Image.Resampling.BILINEAR)
        thumbnail.save(target, format="JPEG", quality=THUMBNAIL_QUALITY)

    def _remove_folders(self, owner: str, folders: list[str]) -> None:
        for folder in folders:
            _remove(self._files / owner / folder)


def default_data_dir() -> Path:
    """Where history lives unless `--data-dir` says: the OS user's data folder ($XDG_DATA_HOME/sdxl-jax)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "sdxl-jax"


def _take_lock(path: Path):
    """An exclusive, non-blocking flock on `path` for this store's lifetime (released by the kernel on exit/kill)."""
    handle = open(path, "a+b")  # noqa: SIM115  # held open until close()
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise HistoryLocked(
            f"another server already keeps its history in {path.parent}; give each its own --data-dir"
        ) from None
    return handle


def _settings_json(settings: Mapping) -> str:
    if not isinstance(settings, Mapping):
        raise ValueError(f"settings must be a mapping; got {type(settings).__name__}")
    missing = [key for key in REQUIRED_SETTINGS if key not in settings]
    if missing:
        raise ValueError(f"settings lack {', '.join(missing)}")
    reserved = {"id", "created", "images"} & set(settings)
    if reserved:
        raise ValueError(f"settings may not use the entry's own keys {', '.join(sorted(reserved))}")
    return json.dumps(dict(settings), ensure_ascii=False, allow_nan=False)


def _entry(row) -> Entry:
    entry_id, created, settings, images, thumbnails = row
    return Entry(
        id=int(entry_id),
        created=float(created),
        settings=json.loads(settings),
        images=tuple(json.loads(images)),
        thumbnails=tuple(json.loads(thumbnails)),
    )


def _image_name(index: int, source: Path) -> str:
    suffix = source.suffix.lower()
    return f"{index:02d}{'.jpg' if suffix == '.jpeg' else suffix}"


def _thumbnail_name(index: int) -> str:
    return f"{index:02d}.thumb.jpg"


def _entry_id(value) -> int:
    """An entry id from a caller (API clients send strings or floats): a positive int, or one sentence."""
    if isinstance(value, bool):
        raise InvalidInput(f"History entry ids are whole numbers; got {value!r}.")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"History entry ids are whole numbers; got {str(value)[:40]!r}.") from None
    if number != value and str(number) != str(value).strip():
        raise InvalidInput(f"History entry ids are whole numbers; got {str(value)[:40]!r}.")
    if not 1 <= number < 2**63:
        raise InvalidInput(f"History entry ids are positive; got {number}.")
    return number


def _bounded(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"The history {name} must be a whole number from {low} to {high}; got {value!r}.")
    return value


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or links not allowed here: copy
        shutil.copyfile(source, target)


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's contents (a folder: its entries, i.e. renames into it) to the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
