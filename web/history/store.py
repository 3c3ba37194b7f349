"""Past generations per signed-in user: rows in one SQL database, files in one image store.

    store = HistoryStore(data_dir, max_entries=500)            # SQLite and files under data_dir (one process)
    store = HistoryStore(data_dir, database_url="postgresql://…", image_store="s3://…")   # shared by page replicas
    entry_id = store.add(username, settings, image_paths)      # after a request: one entry, all or nothing
    store.list(username, limit=50)                              # newest first; never another user's
    store.file_of(username, entry_id, 0, thumbnail=True)        # a file of one's own entry (Path or bytes), or None

Storage is split by role: the rows (web/history/database.py: SQLite by default, PostgreSQL with `--database-url`)
and the files (web/history/image_store.py: `<data_dir>/files/` by default, a shared directory or an fsspec URL with
`--image-store`).
Layout of the default data directory:
    history.sqlite3          the entries (WAL journal: readers never wait for the writer)
    lock                     held (flock) by the one process whose SQLite history this is
    staging/<token>/         an entry's files while they are written
    files/<owner>/<token>/   a finished entry's images (`00.png`, ...) and thumbnails (`00.thumb.jpg`, ...)
`<owner>` is a keyed hash of the user name (the key is random per database and lives in it), so a folder never
names its user and cannot be found from a name without the database.

An entry exists once its row is committed, and the row is written last: the files are stored first (staged and
renamed into place in a directory, each object whole in an object store), and only then is the row inserted (one
transaction, which also prunes the user's oldest entries past the cap). A kill at any point leaves either a complete
entry or files no row points to, which a later start-up removes; listings only ever come from rows. Rows of pruned
or deleted entries are removed first and their folders after, so a crash in between again leaves only unlisted files.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import io
import json
import logging
import os
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from PIL import Image

from pipeline.contract.errors import InvalidInput

from ..options import DEFAULT_MAX_ENTRIES
from .database import DATABASE_NAME, ENTRIES, HistoryDatabase, database_url
from .image_store import SHARED_GRACE_S, image_store

logger = logging.getLogger(__name__)

__all__ = ["DATABASE_NAME", "DEFAULT_MAX_ENTRIES", "Entry", "HistoryLocked", "HistoryStore", "default_data_dir"]

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
_ROW = (ENTRIES.c.id, ENTRIES.c.created, ENTRIES.c.settings, ENTRIES.c.images, ENTRIES.c.thumbnails)


class HistoryLocked(RuntimeError):
    """Another store (another server process) already uses this data directory."""


@dataclass(frozen=True)
class Entry:
    """One kept request, as its owner sees it."""

    id: int  # the entry's number: unique across users, larger for newer entries
    created: float  # when it was kept: seconds since the epoch
    settings: dict  # the request's settings as given to `add` (JSON values); a copy, free to change
    images: tuple[str, ...]  # image file names in the entry's folder, in image order (`file_of` finds them)
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
    """Every user's past generations; thread-safe. With the default SQLite database one process owns the data
    directory; with a shared database (PostgreSQL) any number of page replicas use the same rows and files."""

    def __init__(
        self,
        directory: str | os.PathLike,
        max_entries: int | None = DEFAULT_MAX_ENTRIES,
        *,
        thumbnail_size: int = THUMBNAIL_SIZE,
        durable: bool = True,
        database_url: str | None = None,
        image_store: str | None = None,
    ) -> None:
        """Open (or create) the store, then remove what an earlier run left half-written.

        `directory`: the data directory (the SQLite file and the files when no URL says otherwise).
        `max_entries`: entries kept per user (None: no cap). `durable`: sync files and commits to the disk before
        an entry counts as kept (survives a power cut, not just a killed process); costs a few fsyncs per entry.
        `database_url`: `postgresql://...` to share the rows between replicas. `image_store`: a directory or fsspec
        URL for the files (a store the replicas share).
        """
        if max_entries is not None and (isinstance(max_entries, bool) or int(max_entries) < 1):
            raise ValueError(f"max_entries must be a positive whole number or None; got {max_entries!r}")
        self.directory = Path(directory).expanduser().resolve()
        self.max_entries = None if max_entries is None else int(max_entries)
        self.thumbnail_size = int(thumbnail_size)
        self.durable = durable
        url = _store_url(self.directory, database_url)
        self.shared = not url.startswith("sqlite")  # replicas share the rows: no directory lock, careful sweeps
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock_file = None if self.shared else take_lock(self.directory / "lock")
        self._database = None
        try:
            self.files = _open_files(self.directory, image_store, durable)
            self._database = _open_database(url, durable)
            self._owner_key = self._database.owner_key()
            self._sweep()
        except BaseException:
            self.close()
            raise

    def where(self) -> str:
        """Where the rows and the files are (for the log; no password)."""
        return f"{self._require().where()}, files in {self.files.where()}"

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
        In a directory the files are hard-linked where they can be (same file system: no copy; the app never
        rewrites a file it wrote) and copied otherwise. Thumbnails are made from `thumbnail_sources` when given,
        one per image: the request's PIL images still in memory, or its JPEG gallery files (decoded at 1/4 size);
        decoding a 1024² PNG instead costs ~50 ms per image.
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
        files: dict[str, Path | bytes] = {}
        for index, (source, thumbnail_source) in enumerate(zip(sources, thumbnail_sources, strict=True)):
            files[_image_name(index, source)] = source
            files[_thumbnail_name(index)] = self._thumbnail(thumbnail_source)
        token = secrets.token_hex(12)
        self.files.put(owner, token, files)
        try:
            return self._insert(owner, token, settings_json, sources, created)
        except BaseException:
            self.files.remove(owner, [token])
            raise

    def _insert(self, owner: str, token: str, settings_json: str, sources: list[Path], created: float | None) -> int:
        """Insert the row and prune past the cap, in one transaction; then remove the pruned entries' folders."""
        row = {
            "owner": owner,
            "created": time.time() if created is None else float(created),
            "folder": token,
            "settings": settings_json,
            "images": json.dumps([_image_name(index, source) for index, source in enumerate(sources)]),
            "thumbnails": json.dumps([_thumbnail_name(index) for index in range(len(sources))]),
        }
        with self._require().writing() as db:
            entry_id = int(db.execute(sa.insert(ENTRIES).values(**row).returning(ENTRIES.c.id)).scalar_one())
            pruned = []
            if self.max_entries is not None:
                pruned = db.execute(
                    sa.select(ENTRIES.c.id, ENTRIES.c.folder)
                    .where(ENTRIES.c.owner == owner)
                    .order_by(ENTRIES.c.id.desc())
                    .offset(self.max_entries)
                ).all()
                if pruned:
                    db.execute(sa.delete(ENTRIES).where(ENTRIES.c.id.in_([p.id for p in pruned])))
        self._remove_folders(owner, [p.folder for p in pruned])
        return entry_id

    def delete(self, user: str, entry_id: int) -> bool:
        """Remove one of `user`'s entries with its files; False when `user` has no such entry (theirs or nobody's)."""
        owner, entry_id = self._owner(user), _entry_id(entry_id)
        mine = (ENTRIES.c.id == entry_id) & (ENTRIES.c.owner == owner)
        with self._require().writing() as db:
            folders = db.execute(sa.delete(ENTRIES).where(mine).returning(ENTRIES.c.folder)).scalars().all()
        self._remove_folders(owner, folders)
        return bool(folders)

    def delete_all(self, user: str) -> int:
        """Remove every entry of `user` with its files; returns how many there were. Other users' stay."""
        owner = self._owner(user)
        with self._require().writing() as db:
            stmt = sa.delete(ENTRIES).where(ENTRIES.c.owner == owner).returning(ENTRIES.c.folder)
            folders = db.execute(stmt).scalars().all()
        self._remove_folders(owner, folders)
        return len(folders)

    # ---- reading -------------------------------------------------------------------------------------------------

    def list(self, user: str, limit: int = 100, offset: int = 0) -> list[Entry]:
        """`user`'s entries, newest first: at most `limit` (≤ MAX_LIST) after skipping `offset`."""
        owner = self._owner(user)
        limit, offset = _bounded("limit", limit, 0, MAX_LIST), _bounded("offset", offset, 0, 2**62)
        query = sa.select(*_ROW).where(ENTRIES.c.owner == owner).order_by(ENTRIES.c.id.desc())
        with self._require().reading() as db:
            rows = db.execute(query.limit(limit).offset(offset)).all()
        return [_entry(row) for row in rows]

    def count(self, user: str) -> int:
        """How many entries `user` has."""
        owner = self._owner(user)
        with self._require().reading() as db:
            return int(db.execute(sa.select(sa.func.count()).where(ENTRIES.c.owner == owner)).scalar_one())

    def get(self, user: str, entry_id: int) -> Entry | None:
        """One of `user`'s entries; None when `user` has no entry with that id (another user's counts as none)."""
        owner, entry_id = self._owner(user), _entry_id(entry_id)
        with self._require().reading() as db:
            row = db.execute(sa.select(*_ROW).where((ENTRIES.c.id == entry_id) & (ENTRIES.c.owner == owner))).first()
        return None if row is None else _entry(row)

    def file_of(self, user: str, entry_id: int, index: int, thumbnail: bool = False) -> Path | bytes | None:
        """The file of image `index` (or its thumbnail) of one of `user`'s entries: its path in a directory store,
        its bytes in an object store; None for anything else.

        Another user's entry, an unknown id and an index past the entry's images all answer None alike, so a
        caller learns nothing about entries that are not theirs.
        """
        owner, entry_id = self._owner(user), _entry_id(entry_id)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            return None
        query = sa.select(ENTRIES.c.folder, ENTRIES.c.images, ENTRIES.c.thumbnails)
        with self._require().reading() as db:
            row = db.execute(query.where((ENTRIES.c.id == entry_id) & (ENTRIES.c.owner == owner))).first()
        if row is None:
            return None
        names = json.loads(row.thumbnails if thumbnail else row.images)
        return self.files.find(owner, row.folder, names[index]) if index < len(names) else None

    # ---- housekeeping --------------------------------------------------------------------------------------------

    def _sweep(self) -> int:
        """Remove files no entry points to (staged or published by a run that was killed); returns how many folders.

        At start-up. A store that owns its directory removes them all, before its first `add`; replicas sharing
        the files remove only those older than `SHARED_GRACE_S` (another replica's newest folder has no row yet).
        """
        with self._require().reading() as db:
            known = {f"{owner}/{folder}" for owner, folder in db.execute(sa.select(ENTRIES.c.owner, ENTRIES.c.folder))}
        removed = self.files.sweep(known, SHARED_GRACE_S if self.shared else 0.0)
        if removed:
            logger.info("history: removed %d unfinished or orphaned entry folder(s) in %s", removed, self.files.where())
        return removed

    def close(self) -> None:
        """Close the database and release the directory (a new store may then open it)."""
        database, self._database = self._database, None
        if database is not None:
            database.close()
        if self._lock_file is not None:
            self._lock_file.close()  # closing the descriptor drops the flock
            self._lock_file = None

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- internals -----------------------------------------------------------------------------------------------

    def _owner(self, user: str) -> str:
        """The folder name and row owner of `user`: keyed BLAKE2b of the name (32 hex digits)."""
        if not isinstance(user, str) or not user.strip():
            raise InvalidInput("History needs a signed-in user.")
        if len(user) > MAX_USER_CHARS:
            raise InvalidInput(f"User names longer than {MAX_USER_CHARS} characters have no history.")
        return hashlib.blake2b(user.encode("utf-8", "surrogatepass"), key=self._owner_key, digest_size=16).hexdigest()

    def _require(self) -> HistoryDatabase:
        """The database; a closed store says so."""
        if self._database is None:
            raise RuntimeError("the history store is closed")
        return self._database

    def _thumbnail(self, source: Image.Image | str | os.PathLike) -> bytes:
        """A JPEG of at most `thumbnail_size` pixels a side."""
        box = (self.thumbnail_size, self.thumbnail_size)
        if isinstance(source, Image.Image):
            factor = max(1, max(source.size) // self.thumbnail_size)
            thumbnail = source.convert("RGB").reduce(factor) if factor > 1 else source.convert("RGB")
        else:
            with Image.open(source) as image:
                image.draft("RGB", box)  # JPEG: decoded at 1/2, 1/4 or 1/8 size, which is most of the saving
                thumbnail = image.convert("RGB")
        thumbnail.thumbnail(box, Image.Resampling.BILINEAR)
        buffer = io.BytesIO()
        thumbnail.save(buffer, format="JPEG", quality=THUMBNAIL_QUALITY)
        return buffer.getvalue()

    def _remove_folders(self, owner: str, folders: list[str]) -> None:
        self.files.remove(owner, folders)


def _store_url(directory: Path, url: str | None) -> str:
    try:
        return database_url(directory, url)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def _open_database(url: str, durable: bool) -> HistoryDatabase:
    """The database, or one sentence (no traceback) when it cannot be reached."""
    try:
        return HistoryDatabase.open(url, durable=durable)
    except sa.exc.OperationalError as exc:
        shown = sa.engine.make_url(url).render_as_string(hide_password=True)
        reason = str(exc.orig or exc).strip().splitlines()[0][:200]
        raise InvalidInput(f"cannot open the history database {shown}: {reason}") from None


def _open_files(directory: Path, url: str | None, durable: bool):
    try:
        return image_store(directory, url, durable=durable)
    except (ImportError, ValueError) as exc:  # an fsspec protocol whose package is not installed, or a bad URL
        raise InvalidInput(f"--image-store {url.split('?')[0]}: {exc}") from None


def default_data_dir() -> Path:
    """Where history lives unless `--data-dir` says: the OS user's data folder ($XDG_DATA_HOME/sdxl-jax)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "sdxl-jax"


def take_lock(path: Path):
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
