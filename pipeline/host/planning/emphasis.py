"""A1111's emphasis syntax read on the host: a prompt -> (text, weight) segments, as A1111's prompt parser reads it.

`(x)` ×1.1, `[x]` ÷1.1, `(x:1.3)` ×1.3, nesting multiplies, `\\(` `\\)` `\\[` `\\]` `\\\\` are literal characters,
`BREAK` (upper case, a word of its own) starts a new 77-token window. Unbalanced brackets are no error: an unclosed
`(` or `[` weighs everything after it, a stray `)` or `]` is plain text, a `:w)` without its `(` is plain text.
Adjacent segments of equal weight are joined, so a prompt without brackets is one segment: its tokens are exactly
the plain prompt's. The weights are data for the encode program (`device/text.py`): nothing recompiles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A1111's multipliers of one round / square bracket level.
ROUND = 1.1
SQUARE = 1 / 1.1
#: The weight A1111 marks a BREAK with (a segment of its own, never a real weight).
BREAK_WEIGHT = -1.0

# One lexical piece of a prompt, in A1111's order of preference: escapes, brackets, an explicit weight's close,
# runs of plain text, a lone colon.
_PIECE = re.compile(r"""\\\(|\\\)|\\\[|\\]|\\\\|\\|\(|\[|:([+-]?[.\d]+)\)|\)|]|[^\\()\[\]:]+|:""")
_BREAK = re.compile(r"\s*\bBREAK\b\s*", re.S)


@dataclass(frozen=True)
class Segment:
    """A run of the prompt read with one weight; `is_break` marks a BREAK (its text is empty)."""

    text: str
    weight: float
    is_break: bool = False


def parse_emphasis(prompt: str) -> list[Segment]:
    """`prompt`'s segments with their weights, as A1111's `parse_prompt_attention` reads it (at least one)."""
    pieces: list[list] = []  # [text, weight, is_break], weights multiplied as brackets close
    open_round: list[int] = []  # where each open "(" starts in `pieces`
    open_square: list[int] = []

    def scale(start: int, factor: float) -> None:
        for piece in pieces[start:]:
            piece[1] *= factor

    for match in _PIECE.finditer(prompt):
        piece, weight = match.group(0), match.group(1)
        if piece.startswith("\\"):
            pieces.append([piece[1:], 1.0, False])
        elif piece == "(":
            open_round.append(len(pieces))
        elif piece == "[":
            open_square.append(len(pieces))
        elif weight is not None and open_round:
            scale(open_round.pop(), float(weight))
        elif piece == ")" and open_round:
            scale(open_round.pop(), ROUND)
        elif piece == "]" and open_square:
            scale(open_square.pop(), SQUARE)
        else:
            for index, part in enumerate(_BREAK.split(piece)):
                if index:
                    pieces.append(["", BREAK_WEIGHT, True])
                pieces.append([part, 1.0, False])
    for start in open_round:  # unclosed brackets weigh what follows them
        scale(start, ROUND)
    for start in open_square:
        scale(start, SQUARE)
    return _joined(pieces)


def _joined(pieces: list[list]) -> list[Segment]:
    """Adjacent pieces of one weight as one segment (a BREAK stays apart; inside brackets it is still a BREAK,
    where A1111 would read the word "BREAK" at a negative weight)."""
    if not pieces:
        return [Segment("", 1.0)]
    joined = [pieces[0]]
    for text, weight, is_break in pieces[1:]:
        if weight == joined[-1][1] and not is_break and not joined[-1][2]:
            joined[-1][0] += text
        else:
            joined.append([text, weight, is_break])
    return [Segment(text, weight, is_break) for text, weight, is_break in joined]


def segments(prompt: str, emphasis: str) -> list[Segment]:
    """The segments the encoders read: parsed, or the whole prompt at weight 1 with `--emphasis off`."""
    return [Segment(prompt, 1.0)] if emphasis == "off" else parse_emphasis(prompt)


def has_emphasis(prompt: str) -> bool:
    """Whether A1111 would note a non-default emphasis mode for `prompt` (it has a bracket)."""
    return "(" in prompt or "[" in prompt
