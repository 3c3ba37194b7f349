"""Prompts to token ids on the host, for both CLIP tokenizers (the encoders run on the device: `device/text.py`).

SDXL conditions on two text encoders. Their token ids travel together as `[B, 2, 77]` int32 (encoder 1, encoder 2),
exactly as diffusers' `prepare_inputs` builds them, so the compiled program has one fixed input shape whatever the
prompt. A prompt longer than 77 tokens is cut as CLIP cuts it; `dropped_text` says what the model never saw.
"""

from __future__ import annotations

import numpy as np


def tokenize(tokenizers, prompt: str) -> np.ndarray:
    """Token ids of one prompt for each tokenizer, padded/truncated to its max length: int32 [2, 77]."""
    rows = [
        tokenizer(
            prompt,
            padding="max_length",
            max_length=tokenizers[0].model_max_length,
            truncation=True,
            return_tensors="np",
        ).input_ids[0]
        for tokenizer in tokenizers
    ]
    return np.stack(rows).astype(np.int32)  # [2, 77]


def dropped_text(tokenizer, prompt: str) -> str:
    """The words of `prompt` past CLIP's token limit, as the user wrote them (empty when the prompt fits).

    A word cut in the middle counts as dropped. Found by bisecting on whole words, since decoded tokens do not
    give back the user's spelling (CLIP lower-cases and splits numbers into digits).
    """
    room = tokenizer.model_max_length - 2  # the begin and end tokens take two places

    def fits(text: str) -> bool:
        return len(tokenizer(text, truncation=False, verbose=False).input_ids) - 2 <= room

    if fits(prompt):
        return ""
    words = prompt.split()
    low, high = 0, len(words)  # words[:low] fits, words[:high] does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(" ".join(words[:middle])) else (low, middle)
    return " ".join(words[low:])


def summarize_dropped(dropped: str, shown: int = 8) -> str:
    """A sentence about the dropped words, short enough for a toast: the first `shown` words and how many more."""
    if not dropped:
        return ""
    words = dropped.split()
    quoted = " ".join(words[:shown]) + ("…" if len(words) > shown else "")
    more = f" and {len(words) - shown} more word{'s' if len(words) - shown != 1 else ''}" if len(words) > shown else ""
    return f"The prompt is longer than CLIP's 77 tokens; this part was ignored: “{quoted}”{more}."
