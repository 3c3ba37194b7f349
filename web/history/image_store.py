"""Where the history's image files live: a directory (a shared volume for page replicas) or an fsspec URL.

    store = image_store(data_dir, None)               # <data_dir>/files/<owner>/<folder>/<name>: the default
    store = image_store(data_dir, "s3://bucket/sdxl") # any fsspec file system (s3fs, gcsfs installed by the user)
    store.put(owner, folder, {"00.png": path, "00.thumb.jpg": jpeg_bytes})   # all of an entry's files, then the row
    store.find(owner, folder, "00.png")              # a Path (a directory) or the bytes (an object store), or None

An entry's files are written before its row (web/history/store.py), so a replica killed mid-write leaves files no row
points to, never a row without its files. In a directory the files are staged and appear at once with one rename;
an object store writes each object whole. `sweep` removes what no row lists: everything at start-up when one process
owns the directory, and only what is older than `SHARED_GRACE_S` when replicas share it (a folder another replica
published an instant ago has no row yet).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Collection, Mapping
from pathlib import Path

#: Seconds an unlisted folder must be old before a sweep of a shared store removes it.
SHARED_GRACE_S = 3600.0

#: What an entry's file is written from: a file on this machine, or its bytes.
Source = Path | bytes


class LocalImageStore:
    """files/<owner>/<folder>/ under one directory; staged in staging/ and renamed into place (synced if durable)."""

    def __init__(self, directory: str | os.PathLike, durable: bool = True) -> None:
        self.directory = Path(directory).expanduser().resolve()
        self.durable = durable
        self._files = self.directory / "files"
        self._staging = self.directory / "staging"
        for folder in (self.directory, self._files, self._staging):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    def where(self) -> str:
        return str(self._files)

    def put(self, owner: str, folder: str, files: Mapping[str, Source]) -> None:
        """Stage the files (linked where they can be), then move the folder into place in one rename."""
        staged = self._stage(folder, files)
        try:
            self._publish(owner, staged)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise

    def _stage(self, folder: str, files: Mapping[str, Source]) -> Path:
        """staging/<folder>/ with every file (synced when durable)."""
        staged = self._staging / folder
        staged.mkdir(mode=0o700)
        try:
            for name, source in files.items():
                if isinstance(source, bytes):
                    (staged / name).write_bytes(source)
                else:
                    _link_or_copy(source, staged / name)
            if self.durable:
                for path in staged.iterdir():
                    _fsync(path)
                _fsync(staged)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        return staged

    def _publish(self, owner: str, staged: Path) -> Path:
        """Move the staged folder to files/<owner>/<folder> in one rename (an entry's files appear all at once)."""
        owner_dir = self._files / owner
        if not owner_dir.is_dir():
            owner_dir.mkdir(mode=0o700, exist_ok=True)
            if self.durable:
                _fsync(self._files)
        folder = owner_dir / staged.name
        os.rename(staged, folder)
        if self.durable:
            _fsync(owner_dir)
            _fsync(self._staging)
        return folder

    def find(self, owner: str, folder: str, name: str) -> Path | None:
        path = self._files / owner / folder / name
        return path if path.is_file() else None

    def remove(self, owner: str, folders: Collection[str]) -> None:
        for folder in folders:
            _remove(self._files / owner / folder)

    def sweep(self, known: Collection[str], grace_s: float = 0.0) -> int:
        """Remove staged folders and folders no row lists (`known`: "owner/folder"), older than `grace_s`."""
        cutoff, removed = time.time() - grace_s, 0
        for staged in self._staging.iterdir():
            if _mtime(staged) <= cutoff:
                _remove(staged)
                removed += 1
        for owner_dir in self._files.iterdir():
            if not owner_dir.is_dir():
                _remove(owner_dir)
                continue
            for folder in owner_dir.iterdir():
                if f"{owner_dir.name}/{folder.name}" not in known and _mtime(folder) <= cutoff:
                    _remove(folder)
                    removed += 1
            with contextlib.suppress(OSError):
                owner_dir.rmdir()  # only when empty
        return removed


class FsspecImageStore:
    """<url>/files/<owner>/<folder>/<name> on any fsspec file system (`memory://` in tests, `s3://`, `gs://`...)."""

    durable = True

    def __init__(self, url: str) -> None:
        import fsspec  # heavy: 0.2 s, for an --image-store URL only

        self.fs, root = fsspec.core.url_to_fs(url)
        self.url = url
        self._files = root.rstrip("/") + "/files"

    def where(self) -> str:
        return self.url.split("?")[0]

    def put(self, owner: str, folder: str, files: Mapping[str, Source]) -> None:
        """Each object written whole; a failure removes what was written."""
        base = f"{self._files}/{owner}/{folder}"
        try:
            for name, source in files.items():
                data = source if isinstance(source, bytes) else Path(source).read_bytes()
                self.fs.pipe_file(f"{base}/{name}", data)
        except BaseException:
            with contextlib.suppress(Exception):
                self.fs.rm(base, recursive=True)
            raise

    def find(self, owner: str, folder: str, name: str) -> bytes | None:
        try:
            return self.fs.cat_file(f"{self._files}/{owner}/{folder}/{name}")
        except (FileNotFoundError, IsADirectoryError):
            return None

    def remove(self, owner: str, folders: Collection[str]) -> None:
        for folder in folders:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(f"{self._files}/{owner}/{folder}", recursive=True)

    def sweep(self, known: Collection[str], grace_s: float = SHARED_GRACE_S) -> int:
        """Remove folders no row lists whose newest object is older than `grace_s`."""
        cutoff, removed = time.time() - grace_s, 0
        if not self.fs.exists(self._files):
            return 0
        for owner_path in self.fs.ls(self._files, detail=False):
            owner = owner_path.rstrip("/").rsplit("/", 1)[-1]
            for folder_path in self.fs.ls(owner_path, detail=False):
                folder = folder_path.rstrip("/").rsplit("/", 1)[-1]
                if f"{owner}/{folder}" in known or self._newest(folder_path) > cutoff:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(folder_path, recursive=True)
                    removed += 1
        return removed

    def _newest(self, path: str) -> float:
        """When anything under `path` was last written (now when the file system does not say)."""
        newest = 0.0
        for info in self.fs.find(path, detail=True).values():
            stamp = info.get("mtime") or info.get("LastModified") or info.get("updated") or info.get("created")
            if stamp is None:
                return time.time()
            newest = max(newest, stamp.timestamp() if hasattr(stamp, "timestamp") else float(stamp))
        return newest


ImageStore = LocalImageStore | FsspecImageStore


def image_store(data_dir: str | os.PathLike, url: str | None, *, durable: bool = True) -> ImageStore:
    """The store `--image-store` names: a directory path or file:// URL (local), another fsspec URL, or, when
    none is given, `data_dir` itself."""
    if not url:
        return LocalImageStore(data_dir, durable)
    if url.startswith("file://"):
        return LocalImageStore(url.removeprefix("file://"), durable)
    if "://" not in url:
        return LocalImageStore(url, durable)
    return FsspecImageStore(url)


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


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
