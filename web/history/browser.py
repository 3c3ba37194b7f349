"""Past generations of a visitor without a login: kept in their own browser (Gradio's BrowserState), never here.

BrowserState stores one JSON value per page in the browser's localStorage, AES-encrypted with the component's
`secret` and base64-encoded (about 4/3 of the JSON's size); localStorage holds about 5 MB per site, and a value
that does not fit is silently not written (Gradio 6.17.3's frontend logs it to the console). So an entry carries
its settings and small JPEG thumbnails as data URLs, and the list is capped in entries and in characters.

The value comes back from the browser with every event that reads it: it is the visitor's to change, so
`clean_entries` keeps only entries of the expected shape, and thumbnails are only ever turned into images with
`thumbnail_images` (decoded here), never used as file paths or URLs the server would fetch.

    entries = add_entry(clean_entries(state), browser_entry(settings, image_paths))   # the new BrowserState value
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from PIL import Image

#: Entries a browser keeps; adding one more drops the oldest.
BROWSER_MAX_ENTRIES = 50
#: Characters of JSON the whole list may take (×4/3 once encrypted: ~2.7 MB of the ~5 MB localStorage gives a site).
BROWSER_MAX_CHARS = 2_000_000
#: Longest side of a browser thumbnail in pixels, and its JPEG quality: ~4-6 KB each.
BROWSER_THUMBNAIL_SIZE = 160
BROWSER_THUMBNAIL_QUALITY = 75
#: Largest thumbnail accepted back from a browser (characters of its data URL).
MAX_THUMBNAIL_CHARS = 200_000
#: Settings values kept from a browser: JSON scalars, strings up to this many characters.
MAX_SETTING_CHARS = 8_000
#: Most thumbnails and settings one entry may carry back.
MAX_THUMBNAILS, MAX_SETTINGS = 64, 64
_DATA_URL = re.compile(r"data:image/jpeg;base64,[A-Za-z0-9+/]+={0,2}")
_ID = re.compile(r"[0-9a-f]{16}")
SECRET_NAME = "browser-state-secret"


def browser_entry(
    settings: Mapping,
    image_paths: Iterable[str | os.PathLike],
    created: float | None = None,
    entry_id: str | None = None,
) -> dict:
    """One request as a browser keeps it: {"id", "created", "settings", "thumbnails": [data URLs]} (`entry_id`: the
    id it was given when it finished, else a new one)."""
    thumbnails = [_thumbnail_data_url(Path(path)) for path in image_paths]
    return {
        "id": entry_id or secrets.token_hex(8),
        "created": time.time() if created is None else float(created),
        "settings": dict(settings),
        "thumbnails": thumbnails,
    }


def add_entry(
    entries: list[dict], entry: dict, max_entries: int = BROWSER_MAX_ENTRIES, max_chars: int = BROWSER_MAX_CHARS
) -> list[dict]:
    """`entry` first, then `entries` (newest first), the oldest dropped past `max_entries` or `max_chars` of JSON."""
    kept = [entry, *entries][:max_entries]
    while len(kept) > 1 and _json_chars(kept) > max_chars:
        kept.pop()
    return kept


def delete_entry(entries: list[dict], entry_id: str) -> list[dict]:
    """`entries` without the one called `entry_id` (a browser deletes its own; nothing on the server changes)."""
    return [entry for entry in entries if entry.get("id") != entry_id]


def clean_entries(value: object) -> list[dict]:
    """The entries of a BrowserState value that have the shape `browser_entry` makes; anything else is dropped.

    Settings keep JSON scalars only; thumbnails must be base64 JPEG data URLs; ids 16 hex digits.
    """
    if not isinstance(value, list):
        return []
    entries = []
    for item in value[:BROWSER_MAX_ENTRIES]:
        if not isinstance(item, dict):
            continue
        entry_id, created = item.get("id"), item.get("created")
        settings, thumbnails = item.get("settings"), item.get("thumbnails")
        if not (isinstance(entry_id, str) and _ID.fullmatch(entry_id)):
            continue
        if isinstance(created, bool) or not isinstance(created, int | float) or created != created:
            continue
        if not isinstance(settings, dict) or not isinstance(thumbnails, list) or len(thumbnails) > MAX_THUMBNAILS:
            continue
        clean_settings = {
            key: setting
            for key, setting in list(settings.items())[:MAX_SETTINGS]
            if isinstance(key, str) and len(key) <= 64 and (_scalar(setting) or (key == "loras" and _loras(setting)))
        }
        if not all(isinstance(t, str) and len(t) <= MAX_THUMBNAIL_CHARS and _DATA_URL.fullmatch(t) for t in thumbnails):
            continue
        entries.append(
            {"id": entry_id, "created": float(created), "settings": clean_settings, "thumbnails": list(thumbnails)}
        )
    return entries


def thumbnail_images(entry: dict) -> list[Image.Image]:
    """A cleaned entry's thumbnails as RGB images; undecodable ones are left out."""
    images = []
    for data in thumbnail_jpegs(entry):
        with Image.open(io.BytesIO(data)) as image:
            images.append(image.convert("RGB"))
    return images


def thumbnail_jpegs(entry: dict) -> list[bytes]:
    """A cleaned entry's thumbnails as JPEG bytes that decode as small JPEGs (for a gallery, as files); others are
    left out."""
    jpegs = []
    for url in entry.get("thumbnails", []):
        try:
            data = base64.b64decode(url.partition(",")[2], validate=True)
            with Image.open(io.BytesIO(data)) as image:
                if image.format != "JPEG" or max(image.size) > 4 * BROWSER_THUMBNAIL_SIZE:
                    continue
                image.load()
        except (binascii.Error, OSError, ValueError, Image.DecompressionBombError):
            continue
        jpegs.append(data)
    return jpegs


def browser_secret(data_dir: str | os.PathLike) -> str:
    """The BrowserState `secret`, kept in `data_dir` so browsers can still read their history after a restart.

    (Gradio picks a random one per launch otherwise, and a browser's stored value then no longer decrypts.)
    """
    path = Path(data_dir) / SECRET_NAME
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    secret = secrets.token_urlsafe(32)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secret)
    return secret


def _thumbnail_data_url(path: Path) -> str:
    with Image.open(path) as image:
        image.draft("RGB", (BROWSER_THUMBNAIL_SIZE, BROWSER_THUMBNAIL_SIZE))
        thumbnail = image.convert("RGB")
    thumbnail.thumbnail((BROWSER_THUMBNAIL_SIZE, BROWSER_THUMBNAIL_SIZE), Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    thumbnail.save(buffer, format="JPEG", quality=BROWSER_THUMBNAIL_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _scalar(value: object) -> bool:
    if isinstance(value, str):
        return len(value) <= MAX_SETTING_CHARS
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    return value is None or isinstance(value, bool | int)


def _loras(value: object) -> bool:
    """The one list setting: [[name, weight, weight], ...] of at most 8 LoRAs."""
    return (
        isinstance(value, list)
        and len(value) <= 8
        and all(
            isinstance(item, list)
            and 1 <= len(item) <= 3
            and isinstance(item[0], str)
            and len(item[0]) <= 256
            and all(isinstance(w, int | float) and not isinstance(w, bool) for w in item[1:])
            for item in value
        )
    )


def _json_chars(entries: list[dict]) -> int:
    return len(json.dumps(entries, ensure_ascii=False, separators=(",", ":")))
