"""Pictures in and out of the HTTP APIs: base64 and data URLs read with the engine's guarded decoder, request files
that never outlive the request, base64 PNG answers, and `url` answers under unguessable names that expire."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import pathlib
import re
import secrets
import threading
import time
from collections.abc import Iterator

from pipeline.contract.errors import InvalidInput
from pipeline.contract.image_inputs import open_image

#: Largest picture an API request may send, encoded (base64 of a 4096² PNG is about 60 MB at worst).
MAX_IMAGE_BYTES = 40 * 1024 * 1024
#: Seconds a `url` answer's file stays served.
URL_TTL_S = 3600
_DATA_URL = re.compile(r"^data:[\w./+-]*(;[\w=-]+)*;base64,", re.IGNORECASE)


def decode_picture(value: object, what: str) -> bytes:
    """A picture sent as base64 (A1111: raw or a data URL), checked: one sentence when it is not a picture."""
    return check_picture(decode_base64(value, what), what)


def decode_base64(value: object, what: str) -> bytes:
    """The bytes of a picture sent as base64 (raw or a data URL), not yet checked; one sentence when it is not
    base64 or past MAX_IMAGE_BYTES."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"The {what} must be a base64-encoded picture (or a data: URL).")
    text = _DATA_URL.sub("", value.strip(), count=1)
    if len(text) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise InvalidInput(f"The {what} is too large: the limit is {MAX_IMAGE_BYTES // 2**20} MB.")
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"The {what} is not valid base64.") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidInput(f"The {what} is too large: the limit is {MAX_IMAGE_BYTES // 2**20} MB.")
    return data


def check_picture(data: bytes, what: str) -> bytes:
    """`data` if it is a picture this server reads (format, size and pixel limits of the engine), else one sentence."""
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidInput(f"The {what} is too large: the limit is {MAX_IMAGE_BYTES // 2**20} MB.")
    open_image(data, what=what).close()
    return data


class RequestFiles:
    """A request's pictures as files for the page's handler (it takes uploads as paths), removed when it ends."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root

    @contextlib.contextmanager
    def hold(self, pictures: dict[str, bytes | None]) -> Iterator[dict[str, dict | None]]:
        """{name: {"path": file}} for each picture given (None stays None); every file removed on exit."""
        folder = self.root / "api-inputs"
        folder.mkdir(exist_ok=True)
        paths = []
        try:
            held = {}
            for name, data in pictures.items():
                if data is None:
                    held[name] = None
                    continue
                path = folder / f"{secrets.token_hex(16)}.img"
                path.write_bytes(data)
                paths.append(path)
                held[name] = {"path": str(path)}
            yield held
        finally:
            for path in paths:
                with contextlib.suppress(OSError):
                    path.unlink()


def png_base64(path: str | os.PathLike) -> str:
    """A picture file as base64 text (no data: prefix, as A1111 and OpenAI answer)."""
    return base64.b64encode(pathlib.Path(path).read_bytes()).decode("ascii")


class ServedFiles:
    """`url` answers: copies of the PNGs under 128-bit random names, served until URL_TTL_S after they were made."""

    def __init__(self, root: pathlib.Path, ttl_s: float = URL_TTL_S) -> None:
        self.folder = root / "api-urls"
        self.ttl_s = ttl_s
        self._made: dict[str, float] = {}
        self._lock = threading.Lock()

    def publish(self, png: str | os.PathLike) -> str:
        """The name under which `png` is served from now on (a fresh name each time)."""
        self.sweep()
        self.folder.mkdir(exist_ok=True)
        name = f"{secrets.token_urlsafe(24)}.png"
        target = self.folder / name
        with contextlib.suppress(OSError):
            os.link(png, target)  # the same bytes, no copy (the run's folder may be swept first: a link survives)
        if not target.exists():
            target.write_bytes(pathlib.Path(png).read_bytes())
        with self._lock:
            self._made[name] = time.monotonic()
        return name

    def path(self, name: str) -> pathlib.Path | None:
        """The file served as `name`, or None (unknown, expired)."""
        with self._lock:
            made = self._made.get(name)
        if made is None or time.monotonic() - made > self.ttl_s:
            return None
        path = self.folder / name
        return path if path.is_file() else None

    def sweep(self) -> None:
        """Remove the expired files."""
        now = time.monotonic()
        with self._lock:
            expired = [name for name, made in self._made.items() if now - made > self.ttl_s]
            for name in expired:
                del self._made[name]
        for name in expired:
            with contextlib.suppress(OSError):
                (self.folder / name).unlink()
