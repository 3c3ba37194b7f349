"""Prompts to token ids on the host, for both CLIP tokenizers (the encoders run on the device: `device/text.py`).

SDXL conditions on two text encoders. Their token ids travel together as `[B, 2, K * 77]` int32 (encoder 1,
encoder 2; K windows of 77, a server setting), so the compiled program has one fixed input shape whatever the
prompt. A prompt longer than 75 tokens goes on in the next window, as A1111 and ComfyUI read it; what is past the
last window is dropped, and `dropped_text` says what the model never saw.
"""

from __future__ import annotations

import numpy as np

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
        ids = tokenizer(prompt, add_special_tokens=False, truncation=False, verbose=False).input_ids
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
        return len(tokenizer(text, add_special_tokens=False, truncation=False, verbose=False).input_ids) <= room

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
        return f"The prompt with its style's words is longer than {limit}; the end of the style's words was " \
            f"ignored: “{quoted}”{more}."  # fmt: skip
    return f"The prompt is longer than {limit}; this part was ignored: “{quoted}”{more}."
