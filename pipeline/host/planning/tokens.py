"""Prompts to token ids on the host, for both CLIP tokenizers (the encoders run on the device: `device/text.py`).

SDXL conditions on two text encoders. Their token ids travel together as `[B, 2, K * 77]` int32 (encoder 1,
encoder 2; K windows of 77, a server setting), so the compiled program has one fixed input shape whatever the
prompt. A prompt longer than 75 tokens goes on in the next window, as A1111 and ComfyUI read it; what is past the
last window is dropped, and `dropped_text` says what the model never saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .emphasis import segments

#: CLIP's window: 77 token ids, the begin and end tokens included.
WINDOW = 77
#: The prompt's own tokens per window (A1111's and ComfyUI's "chunk" of 75).
CHUNK = WINDOW - 2


def tokenize(tokenizers, prompt: str, chunks: int = 1) -> tuple[np.ndarray, int]:
    """Token ids of one prompt for each tokenizer, as A1111 and ComfyUI read a long prompt: its tokens in windows of
    75, each between the begin and end tokens and padded to 77 (`chunks` windows); int32 [2, chunks * 77], and how
    many windows the prompt fills (1 at least; the UNet does not attend to the others, `device/attention.py`).

    The first window is exactly what diffusers' `prepare_inputs` builds (`padding="max_length", truncation=True`),
    so a prompt of up to 75 tokens is read as the reference reads it. Tokens past `chunks * 75` are dropped.
    """
    rows, used = [], 1
    for tokenizer in tokenizers:
        ids = tokenizer.ids(prompt)
        used = max(used, min(chunks, -(-len(ids) // CHUNK)))
        begin, end, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
        row = []
        for window in range(chunks):
            part = ids[window * CHUNK : (window + 1) * CHUNK]
            row += [begin, *part, end] + [pad] * (CHUNK - len(part))
        rows.append(row)
    return np.asarray(rows, np.int32), used  # [2, chunks * 77]


def dropped_text(tokenizer, prompt: str, chunks: int = 1) -> str:
    """The words of `prompt` past the `chunks * 75` tokens read, as the user wrote them (empty when it fits).

    A word cut in the middle counts as dropped. Found by bisecting on whole words, since decoded tokens do not
    give back the user's spelling (CLIP lower-cases and splits numbers into digits).
    """
    room = chunks * CHUNK

    def fits(text: str) -> bool:
        return len(tokenizer.ids(text)) <= room

    if fits(prompt):
        return ""
    words = prompt.split()
    low, high = 0, len(words)  # words[:low] fits, words[:high] does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(" ".join(words[:middle])) else (low, middle)
    return " ".join(words[low:])


def summarize_dropped(dropped: str, chunks: int = 1, style_tail: str = "", shown: int = 8) -> str:
    """A sentence about the dropped words, short enough for a toast: the first `shown` words and how many more,
    and whose they are: `style_tail` is the style template's text after the prompt (when every dropped word is
    from it, the sentence says the style's words were cut, not the user's)."""
    if not dropped:
        return ""
    words = dropped.split()
    quoted = " ".join(words[:shown]) + ("…" if len(words) > shown else "")
    more = f" and {len(words) - shown} more word{'s' if len(words) - shown != 1 else ''}" if len(words) > shown else ""
    limit = f"the {chunks * CHUNK} tokens this server reads" if chunks > 1 else "CLIP's 77 tokens"
    if style_tail and " ".join(style_tail.split()).endswith(dropped):
        return (
            f"The prompt with its style's words is longer than {limit}; the end of the style's words was "
            f"ignored: “{quoted}”{more}."
        )
    return f"The prompt is longer than {limit}; this part was ignored: “{quoted}”{more}."


# ---- weighted prompts and embeddings ------------------------------------------------------------------------------

#: Token ids at or above this are rows of the request's embedding table (`ExtraRows`), not of the vocabulary.
EXTRA_BASE = 1 << 24


def extra_capacity(windows: int) -> int:
    """Rows of a request's embedding table for texts of `windows` windows: room for the prompt and the negative
    prompt to fill every position of every window with embedding vectors (a static shape: it never overflows)."""
    return 2 * CHUNK * windows


class ExtraRows:
    """One request's embedding table: each embedding named in its texts gets its n rows once (both texts share)."""

    def __init__(self):
        self._start: dict[str, int] = {}
        self._tables: list[tuple[np.ndarray, ...]] = []
        self.size = 0

    def start_of(self, embedding) -> int:
        """The first row of `embedding`'s vectors in the table, added on first use."""
        if embedding.name not in self._start:
            self._start[embedding.name] = self.size
            self._tables.append(embedding.vectors)
            self.size += embedding.length
        return self._start[embedding.name]

    @property
    def names(self) -> tuple[str, ...]:
        """The embeddings used, in order of first use."""
        return tuple(self._start)

    def tables(self, rows: int, widths: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """float32 [rows, D1], [rows, D2]: the vectors used, zeros after them."""
        out = []
        for encoder, width in enumerate(widths):
            table = np.zeros((rows, width), np.float32)
            if self._tables:
                used = np.concatenate([vectors[encoder] for vectors in self._tables])  # [size, D]
                table[: len(used)] = used
            out.append(table)
        return out[0], out[1]


@dataclass(frozen=True)
class TokenRows:
    """One text as the encode program reads it, for both tokenizers."""

    ids: np.ndarray  # int32 [2, chunks * 77]; an embedding's vectors are EXTRA_BASE + their table row
    weights: np.ndarray  # float32 [2, chunks * 77]: each token's emphasis (1 for begin, end and padding)
    windows: int  # the windows the text fills (1 at least, `chunks` at most)
    overflow: bool  # the text needs more than `chunks` windows: its end was dropped


class PromptReader:
    """Texts -> token ids and weights, as A1111 reads them: emphasis segments tokenized one by one, BREAK closing a
    window, an embedding's name (as its tokens, A1111's rule, the longest name first) replaced by its vectors.

    A text without brackets, BREAK or an embedding's name gives exactly `tokenize`'s ids (weights all 1).
    A1111's comma backtrack (moving the words after a late comma to the next window) is not done: windows split at
    75 tokens, as they do here for plain prompts.
    """

    def __init__(self, tokenizers, emphasis: str = "original", embeddings: Sequence = ()):
        self.tokenizers = tuple(tokenizers)
        self.emphasis = emphasis
        self.embeddings = {embedding.name: embedding for embedding in embeddings}
        self._lookups = [self._lookup(tokenizer) for tokenizer in self.tokenizers]

    def _lookup(self, tokenizer) -> dict[int, list[tuple[tuple[int, ...], object]]]:
        """First token id -> (the name's ids, embedding), longest names first (A1111's `ids_lookup`)."""
        lookup: dict[int, list] = {}
        for embedding in self.embeddings.values():
            ids = tuple(tokenizer.ids(embedding.name))
            if ids:
                lookup.setdefault(ids[0], []).append((ids, embedding))
        for matches in lookup.values():
            matches.sort(key=lambda match: len(match[0]), reverse=True)
        return lookup

    def read(self, text: str, chunks: int, extra: ExtraRows) -> TokenRows:
        """`text`'s rows in `chunks` windows; embeddings it names in them get rows of `extra` (at most 75 per
        window: the prompt and negative prompt together fit `extra_capacity`)."""
        parts = segments(text, self.emphasis)
        rows, weights, used, overflow = [], [], 1, False
        for tokenizer, lookup in zip(self.tokenizers, self._lookups, strict=True):
            windows = self._windows(tokenizer, lookup, parts, extra)
            used, overflow = max(used, min(chunks, len(windows))), overflow or len(windows) > chunks
            windows += [([], [])] * (chunks - len(windows))
            begin, end, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
            row, weight = [], []
            for ids, factors in windows[:chunks]:  # embedding rows only for the windows read (a bounded table)
                ids = [
                    token if isinstance(token, int) else EXTRA_BASE + extra.start_of(token[0]) + token[1]
                    for token in ids
                ]
                row += [begin, *ids, end] + [pad] * (CHUNK - len(ids))
                weight += [1.0, *factors, 1.0] + [1.0] * (CHUNK - len(ids))
            rows.append(row)
            weights.append(weight)
        return TokenRows(np.asarray(rows, np.int32), np.asarray(weights, np.float32), used, overflow)

    def _windows(self, tokenizer, lookup, parts, extra: ExtraRows) -> list[tuple[list, list]]:
        """The text's windows of at most 75 (ids, weights), A1111's `tokenize_line` without the comma backtrack."""
        windows: list[tuple[list, list]] = []
        ids, factors = [], []

        def close() -> None:
            nonlocal ids, factors
            windows.append((ids, factors))
            ids, factors = [], []

        for part in parts:
            if part.is_break:
                close()
                continue
            tokens = tokenizer.ids(part.text)
            position = 0
            while position < len(tokens):
                if len(ids) == CHUNK:
                    close()
                match = _match_at(lookup, tokens, position)
                if match is None:
                    ids.append(tokens[position])
                    factors.append(part.weight)
                    position += 1
                    continue
                name_ids, embedding = match
                if len(ids) + embedding.length > CHUNK:
                    close()
                ids += [(embedding, index) for index in range(embedding.length)]  # rows given when read
                factors += [part.weight] * embedding.length
                position += len(name_ids)
        if ids or not windows:
            close()
        return windows


def _match_at(lookup, tokens: list[int], position: int):
    """(the name's ids, embedding) of the longest embedding name starting at `position`, or None."""
    for ids, embedding in lookup.get(tokens[position], ()):
        if tuple(tokens[position : position + len(ids)]) == ids:
            return ids, embedding
    return None
