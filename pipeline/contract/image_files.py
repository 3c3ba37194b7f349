"""Images: uint8 pixels to PIL images and files that carry how they were made.

The `parameters` text is parameters.py's (`describe` writes it, `parse_infotext` reads it). PNGs carry it
as a text chunk; JPEGs (the gallery's fast format) in EXIF `UserComment`, encoded as A1111 writes it (piexif's
"unicode": the 8-byte `UNICODE\\0` prefix, then UTF-16 big-endian).
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, PngImagePlugin

PARAMETERS_KEY = "parameters"
#: zlib level for PNGs: 1 encodes ~1.4x faster than Pillow's default 6 for ~10% larger files (measured on
#: 1024x1024 images); encoding 8 of them serially takes about as long as a TPU v5e call, so speed wins.
PNG_COMPRESS_LEVEL = 1
#: The gallery's format: JPEG encodes a 1024² image in ~4-7 ms here against ~130-200 ms for PNG or WebP (method 0:
#: ~40 ms), at ~225 KB for a photo-like image (bench/HISTORY.md, "host path at full size").
GALLERY_FORMAT = "jpeg"
#: JPEG quality of gallery images: 90 with 4:2:0 chroma, as most photo tools save; not told apart at gallery size.
JPEG_QUALITY = 90
#: EXIF tags: the Exif sub-IFD pointer and UserComment inside it (where A1111 puts `parameters` in JPEG/WebP).
EXIF_IFD, USER_COMMENT = 0x8769, 0x9286
#: EXIF UserComment's character-code prefix for UTF-16 (piexif's "unicode", big-endian as piexif writes it).
UNICODE_PREFIX = b"UNICODE\0"
#: Bytes of UserComment that fit one JPEG APP1 segment (64 KiB less the segment's and the TIFF headers).
MAX_EXIF_COMMENT = 65_000
#: File name suffix per format.
SUFFIXES = {"jpeg": ".jpg", "png": ".png"}


def to_pil(pixels: np.ndarray, parameters: list[str]) -> list[Image.Image]:
    """uint8 [B, H, W, 3] -> B RGB images, each with its `parameters` in `.info`."""
    images = []
    for array, text in zip(pixels, parameters, strict=True):
        image = Image.fromarray(array)
        image.info[PARAMETERS_KEY] = text
        images.append(image)
    return images


def exif_with_parameters(text: str) -> bytes:
    """EXIF bytes holding `text` in UserComment (type UNDEFINED), as A1111 (piexif) writes it for JPEG and WebP.

    Written by hand: Pillow's Exif would store the comment as BYTE, which piexif (and so A1111) cannot read back.
    Big-endian TIFF: IFD0 with one pointer to the Exif IFD, which holds one entry, UserComment, then its bytes.
    """
    comment = UNICODE_PREFIX + text.encode("utf-16-be")
    comment = comment[: MAX_EXIF_COMMENT - MAX_EXIF_COMMENT % 2]  # one JPEG APP1 segment holds at most 64 KiB
    sub_ifd = 8 + 2 + 12 + 4  # header, IFD0's entry count, its one entry, its next-IFD offset
    data = sub_ifd + 2 + 12 + 4
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8)
    tiff += struct.pack(">HHHII", 1, EXIF_IFD, 4, 1, sub_ifd) + struct.pack(">I", 0)  # LONG: offset of the Exif IFD
    tiff += struct.pack(">HHHII", 1, USER_COMMENT, 7, len(comment), data) + struct.pack(">I", 0)  # UNDEFINED
    return b"Exif\x00\x00" + tiff + comment


def save_jpeg(image: Image.Image, path: str | Path, quality: int = JPEG_QUALITY) -> Path:
    """Write `image` as JPEG with its `parameters` in EXIF UserComment (fast: the gallery's format)."""
    path = Path(path)
    text = image.info.get(PARAMETERS_KEY)
    exif = exif_with_parameters(text) if text else b""
    image.save(path, format="JPEG", quality=quality, exif=exif)
    return path


def save_png(image: Image.Image, path: str | Path) -> Path:
    """Write `image` as PNG with its `parameters` text chunk (lossless: the full-quality download)."""
    info = PngImagePlugin.PngInfo()
    if PARAMETERS_KEY in image.info:
        info.add_text(PARAMETERS_KEY, image.info[PARAMETERS_KEY])
    path = Path(path)
    image.save(path, format="PNG", pnginfo=info, compress_level=PNG_COMPRESS_LEVEL)
    return path


SAVERS = {"jpeg": save_jpeg, "png": save_png}


def read_parameters(path: str | Path) -> str:
    """The `parameters` text of a PNG (text chunk) or JPEG/WebP (EXIF UserComment); "" when there is none."""
    with Image.open(path) as image:
        if PARAMETERS_KEY in image.info:
            return str(image.info[PARAMETERS_KEY])
        comment = image.getexif().get_ifd(EXIF_IFD).get(USER_COMMENT, b"")
    if isinstance(comment, str):
        return comment
    if comment.startswith(UNICODE_PREFIX):
        return comment[len(UNICODE_PREFIX) :].decode("utf-16-be", errors="replace")
    return comment[8:].decode("utf-8", errors="replace") if comment[:8] == b"ASCII\0\0\0" else ""


def image_paths(count: int, directory: str | Path, stem: str, image_format: str) -> list[Path]:
    """`<stem>-00<suffix>`, `<stem>-01<suffix>`, ...: sorting the names gives image order."""
    width = max(2, len(str(count - 1)))
    return [Path(directory) / f"{stem}-{i:0{width}d}{SUFFIXES[image_format]}" for i in range(count)]


def save_images(
    images: list[Image.Image], directory: str | Path, stem: str = "image", image_format: str = "png"
) -> list[Path]:
    """Write images in `image_format` ("png" or "jpeg") with their `parameters` as `<stem>-00`, `<stem>-01`, ...
    (a folder of its own: the names are the same each time)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return _write(images, image_paths(len(images), directory, stem, image_format), image_format)


def _write(images: list[Image.Image], paths: list[Path], image_format: str) -> list[Path]:
    """One thread per core: both encoders release the GIL, so one image per core comes back at once."""
    workers = max(1, min(len(images), os.cpu_count() or 1))
    if workers == 1:
        return [SAVERS[image_format](image, path) for image, path in zip(images, paths, strict=True)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(SAVERS[image_format], images, paths))


#: Digits of a numbered file's number, as A1111's `00000-...` outputs: names sort in the order they were written.
NUMBER_DIGITS = 5


def next_number(directory: Path, stem: str, suffix: str) -> int:
    """One past the highest `<stem>-<digits><suffix>` in `directory` (any width: the older `image-07.png` too); 0 in
    an empty or absent folder."""
    name = re.compile(rf"{re.escape(stem)}-(\d+){re.escape(suffix)}")
    if not directory.is_dir():
        return 0
    found = [int(m.group(1)) for p in directory.iterdir() if (m := name.fullmatch(p.name))]
    return max(found, default=-1) + 1


def reserve_numbered(count: int, directory: str | Path, stem: str, image_format: str) -> list[Path]:
    """`count` new paths `<stem>-00000<suffix>`, ... numbered on from the highest already in `directory`, each created
    empty and exclusively: a run beside this one that counted the same numbers moves on to the next instead of
    writing over its images."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    suffix = SUFFIXES[image_format]
    number, paths = next_number(directory, stem, suffix), []
    while len(paths) < count:
        path = directory / f"{stem}-{number:0{NUMBER_DIGITS}d}{suffix}"
        try:
            path.open("xb").close()
            paths.append(path)
        except FileExistsError:
            pass
        number += 1
    return paths


def save_numbered(
    images: list[Image.Image], directory: str | Path, stem: str = "image", image_format: str = "png"
) -> list[Path]:
    """Write images into a folder a user keeps (the command line's `--out`) without replacing any earlier image: as
    A1111 numbers its outputs, each run's files continue the folder's numbers (`reserve_numbered`). A write that
    fails leaves none of this run's empty files behind."""
    paths = reserve_numbered(len(images), directory, stem, image_format)
    try:
        return _write(images, paths, image_format)
    except BaseException:
        for path in paths:
            with contextlib.suppress(OSError):
                if path.stat().st_size == 0:
                    path.unlink()
        raise


def save_pngs(images: list[Image.Image], directory: str | Path, stem: str = "image") -> list[Path]:
    """Write images as `<stem>-00000.png`, ... numbered on from the folder's highest (`save_numbered`), with their
    `parameters` text chunks."""
    return save_numbered(images, directory, stem, "png")
