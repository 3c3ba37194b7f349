"""Textual-inversion embeddings for SDXL: `--embeddings-dir` files -> vectors for both text encoders' inputs.

An SDXL embedding is a `.safetensors` file with `clip_l` [n, 768] (the first encoder's input vectors) and `clip_g`
[n, 1280] (the second's), as A1111 and diffusers' `load_textual_inversion` read it; its name is the file's stem,
and that name in a prompt puts its n vectors there (`host/planning/tokens.py`). The vectors are data for the encode
program (a per-request table, `device/text.py`): an embedding never recompiles anything. A file that is not an SDXL
embedding for this checkpoint (an SD 1.5 one, a broken one) is refused in one logged line; the others are offered.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy: safetensors needs it to read bf16 tensors)
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from ..contract.errors import CheckpointError

logger = logging.getLogger(__name__)

#: The two tensors of an SDXL embedding, in the text encoders' order.
KEYS = ("clip_l", "clip_g")
#: Most vectors of one embedding: one 77-token window's own tokens (A1111 cannot place more either).
MAX_VECTORS = 75
#: How many hex characters of the file's sha256 A1111's `TI hashes` shows (textual_inversion.py `shorthash`).
SHORT_HASH_CHARS = 12
#: Keys of SD 1.x/2.x embedding files (A1111's .pt/.safetensors forms), to say what a refused file is.
_SD1_KEYS = ("emb_params", "string_to_param", "<*>")


class EmbeddingFileError(CheckpointError):
    """A file of --embeddings-dir that is not an SDXL embedding for this checkpoint; one sentence naming it."""


@dataclass(frozen=True)
class Embedding:
    """One textual-inversion embedding: its name, one vector table per text encoder, and A1111's short hash."""

    name: str  # the file's stem: the word a prompt uses
    vectors: tuple[np.ndarray, np.ndarray]  # float32 [n, D1], [n, D2]
    short_hash: str  # first 12 hex characters of the file's sha256 (A1111's `TI hashes`)

    @property
    def length(self) -> int:
        """n, the token positions the embedding fills."""
        return int(self.vectors[0].shape[0])


def load_embedding(path: Path, widths: tuple[int, int]) -> Embedding:
    """`path` read as an SDXL embedding whose vectors fit encoders of `widths` (D1, D2), or one refusal."""
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise EmbeddingFileError(f"{path.name} could not be read as a .safetensors file ({exc}).") from None
    if not all(key in tensors for key in KEYS):
        kind = (
            "an SD 1.5/2.x embedding"
            if any(key in tensors for key in _SD1_KEYS) or len(tensors) == 1
            else "no SDXL embedding"
        )
        raise EmbeddingFileError(f"{path.name} is {kind} (SDXL embeddings have clip_l and clip_g); not offered.")
    vectors = tuple(np.asarray(tensors[key], np.float32) for key in KEYS)
    shapes = [v.shape for v in vectors]
    if any(v.ndim != 2 for v in vectors) or shapes[0][0] != shapes[1][0] or (shapes[0][1], shapes[1][1]) != widths:
        raise EmbeddingFileError(
            f"{path.name} has clip_l {shapes[0]} and clip_g {shapes[1]}; this checkpoint's encoders take "
            f"[n, {widths[0]}] and [n, {widths[1]}]; not offered."
        )
    if not 1 <= shapes[0][0] <= MAX_VECTORS or not all(np.isfinite(v).all() for v in vectors):
        raise EmbeddingFileError(
            f"{path.name} has {shapes[0][0]} vectors or non-finite values (1–75 finite vectors are read); not offered."
        )
    return Embedding(path.stem, vectors, file_hash(path)[:SHORT_HASH_CHARS])


def file_hash(path: Path) -> str:
    """sha256 of the whole file (A1111 hashes an embedding's file whole)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class EmbeddingDirectory:
    """What `--embeddings-dir` gave: the embeddings offered (sorted by name) and the refused files' names (stems)."""

    offered: tuple[Embedding, ...] = ()
    refused: tuple[str, ...] = ()


def load_embeddings_dir(directory: str | Path, widths: tuple[int, int]) -> EmbeddingDirectory:
    """Every `*.safetensors` SDXL embedding in `directory`, sorted by name; each refused file logged in one line."""
    directory = Path(directory)
    if not directory.is_dir():
        raise EmbeddingFileError(f"Embeddings directory {directory} does not exist or is not a directory.")
    offered, refused = [], []
    for path in sorted(directory.glob("*.safetensors")):
        if not path.is_file():
            continue
        try:
            offered.append(load_embedding(path, widths))
        except EmbeddingFileError as exc:
            refused.append(path.stem)
            logger.warning("Embedding refused: %s", exc)
    logger.info("Embeddings: %d offered from %s", len(offered), directory)
    return EmbeddingDirectory(tuple(offered), tuple(refused))
