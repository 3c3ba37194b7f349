"""An optional deny-list for prompts (`--prompt-filter FILE`): a server's policy, applied where a request enters."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterable

from pipeline.contract.errors import InvalidInput


class PromptFilter:
    """An optional deny-list for prompts, off unless a file is given (see assets/blocked_words.example.txt).

    Matches whole words case-insensitively, so "ass" does not block "class"; a phrase matches across any whitespace.
    """

    MESSAGE = "This prompt contains a blocked word; please rephrase it."

    def __init__(self, words: Iterable[str]) -> None:
        terms = sorted({" ".join(word.casefold().split()) for word in words} - {""}, key=len, reverse=True)
        self.words: tuple[str, ...] = tuple(terms)  # the normalised (casefolded) terms
        alternatives = [r"\s+".join(re.escape(part) for part in term.split(" ")) for term in terms]
        # (?<!\w)/(?!\w) rather than \b, so terms that start or end with punctuation still match as whole words.
        self._pattern = re.compile(rf"(?<!\w)(?:{'|'.join(alternatives)})(?!\w)") if alternatives else None

    @classmethod
    def from_file(cls, path: str | pathlib.Path) -> PromptFilter:
        """Load one word or phrase per line (UTF-8); lines starting with '#' and blank lines are ignored."""
        text = pathlib.Path(path).read_text(encoding="utf-8-sig")
        lines = (line.strip() for line in text.splitlines())
        return cls(line for line in lines if line and not line.startswith("#"))

    def __len__(self) -> int:
        return len(self.words)

    def blocks(self, text: str) -> bool:
        """True if text contains any listed word or phrase as a whole word."""
        return self._pattern is not None and self._pattern.search(text.casefold()) is not None

    def check(self, text: str) -> None:
        """Raise InvalidInput (without naming the word) if the text contains a blocked term."""
        if self.blocks(text):
            raise InvalidInput(self.MESSAGE)
