"""CLIP's byte-level BPE, read from a checkpoint's `tokenizer/` folder (vocab.json, merges.txt, tokenizer_config.json).

Both SDXL text encoders read token ids made by this one algorithm. It is the project's own so the runtime needs no
transformers (its v5 line rebuilt CLIPTokenizer on `tokenizers`, and its old slow class is what every reference here
used). It gives the ids transformers 4.57's `CLIPTokenizer` gives without ftfy, as diffusers' PyTorch pipelines ran
it for this project's fixtures (tests/engine/test_clip_tokenizer.py checks it against ids that class wrote):

1. the text is split on the special tokens (begin, end, pad, unknown and any `added_tokens_decoder` entry), which
   map straight to their ids: SDXL's second tokenizer pads with "!", so a "!" in a prompt is that token alone;
2. each other piece is cleaned as BERT's BasicTokenizer does with CLIP's settings: control characters dropped,
   whitespace made spaces, spaces around CJK ideographs, NFC, lower case (accents kept, punctuation not split);
3. CLIP's regex splits words, letters and numbers; each word's UTF-8 bytes go through the byte-to-unicode table
   and the merges in rank order, the last symbol marked with "</w>";
4. a symbol missing from the vocabulary becomes the unknown token.
"""

from __future__ import annotations

import functools
import json
import unicodedata
from pathlib import Path

import regex

#: CLIP's word pattern (open_clip's and transformers'): special tokens, English contractions, letter runs, single
#: digits, and runs of anything else that is not a space.
WORD_PATTERN = regex.compile(
    r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""", regex.IGNORECASE
)
#: CLIP's begin and end markers: its BPE leaves them whole wherever the word pattern finds them.
CLIP_MARKERS = ("<|startoftext|>", "<|endoftext|>")
#: Merges CLIP reads: the file's first line is a header; 49152 - 256 - 2 ranks (its vocabulary's size less the
#: byte symbols and the two special tokens).
MAX_MERGES = 49152 - 256 - 2
#: Code point ranges BERT's BasicTokenizer treats as CJK ideographs (each gets spaces around it).
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


@functools.cache
def byte_symbols() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table: the printable Latin-1 bytes stand for themselves, the
    other 68 take code points from 256 up, so no byte is a space or a control character to the BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


def clean_text(text: str) -> str:
    """BasicTokenizer with CLIP's settings: controls dropped, whitespace as spaces, CJK spaced, NFC, lower case,
    then single spaces between the pieces."""
    characters = []
    for char in text:
        category = unicodedata.category(char)
        if char in " \t\n\r" or category == "Zs":
            characters.append(" ")
        elif ord(char) in (0, 0xFFFD) or category.startswith("C"):
            continue
        elif any(low <= ord(char) <= high for low, high in CJK_RANGES):
            characters.append(f" {char} ")
        else:
            characters.append(char)
    return " ".join(unicodedata.normalize("NFC", "".join(characters)).lower().split())


def _token_text(value) -> str:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict with its `content`."""
    return value["content"] if isinstance(value, dict) else str(value)


class ClipTokenizer:
    """One CLIP tokenizer: `ids(text)` gives the prompt's token ids without the begin and end tokens."""

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], config: dict):
        self.vocab = vocab
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.model_max_length = int(config.get("model_max_length", 77))
        names = {
            key: _token_text(config[key])
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
            if config.get(key) is not None
        }
        self.special = {name: vocab[name] for name in names.values() if name in vocab}
        for index, entry in (config.get("added_tokens_decoder") or {}).items():
            self.special[_token_text(entry)] = int(index)
        missing = [name for name in names.values() if name not in self.special]
        if missing:
            raise ValueError(f"the tokenizer's special token {missing[0]!r} is not in its vocabulary")
        self.bos_token_id, self.eos_token_id = self.special[names["bos_token"]], self.special[names["eos_token"]]
        self.unk_token_id = self.special[names["unk_token"]]
        self.pad_token = names.get("pad_token", names["eos_token"])
        self.pad_token_id = self.special[self.pad_token]
        by_length = sorted(self.special, key=len, reverse=True)  # the longest special token wins where two start
        self._special_split = regex.compile("(" + "|".join(regex.escape(token) for token in by_length) + ")")
        self._words: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_directory(cls, directory: Path | str) -> ClipTokenizer:
        """The tokenizer saved in `directory` (transformers' slow-tokenizer layout, as SDXL's repos ship it)."""
        directory = Path(directory)
        vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        lines = (directory / "merges.txt").read_text(encoding="utf-8").strip().split("\n")[1 : MAX_MERGES + 1]
        merges = [tuple(line.split()) for line in lines]
        config_file = directory / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        for key, value in {
            "bos_token": "<|startoftext|>",
            "eos_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>",
        }.items():
            config.setdefault(key, value)
        return cls(vocab, merges, config)

    def __len__(self) -> int:
        """Ids the tokenizer can give: the vocabulary with the special tokens."""
        return len(set(self.vocab.values()) | set(self.special.values()))

    def ids(self, text: str) -> list[int]:
        """Token ids of `text`, no begin or end token, no padding, nothing cut."""
        result: list[int] = []
        for piece in self._special_split.split(text):
            if piece in self.special:
                result.append(self.special[piece])
            elif piece:
                for word in WORD_PATTERN.findall(clean_text(piece)):
                    result.extend(self._word_ids(word))
        return result

    def _word_ids(self, word: str) -> tuple[int, ...]:
        if word in CLIP_MARKERS:  # a marker lower-cased by the cleaning ("<|ENDOFTEXT|>"): CLIP's BPE keeps it whole
            return (self.special.get(word, self.unk_token_id),)
        if word not in self._words:
            symbols = self._merge("".join(byte_symbols()[b] for b in word.encode("utf-8")))
            self._words[word] = tuple(self.special.get(s, self.vocab.get(s, self.unk_token_id)) for s in symbols)
        return self._words[word]

    def _merge(self, word: str) -> list[str]:
        """The BPE: the lowest-ranked adjacent pair merged everywhere, until no pair has a rank."""
        symbols = [*word[:-1], word[-1] + "</w>"]
        while len(symbols) > 1:
            pairs = {(a, b) for a, b in zip(symbols, symbols[1:], strict=False)}
            best = min(pairs, key=lambda pair: self.ranks.get(pair, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(symbols):
                if i < len(symbols) - 1 and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return symbols
