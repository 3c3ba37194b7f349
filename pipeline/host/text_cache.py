"""The encoded text of recent requests, kept on the devices: a request that reads the same texts as one of the last N
runs none of the text programs again (`--text-cache N`).

    cache = TextCache(entries=4)
    kept = cache.outputs(text_key(...))    # the outputs this text made before ({} the first time), most recent now
    loop.run(..., kept=kept)               # Stage.once: "encode cfg", "refiner_encode", "cross_kv cfg" from `kept`

Why: a person at the page changes the seed, the sampler or the steps far more often than the prompt, and ComfyUI
runs only the sampler again when its prompt nodes are unchanged (A1111 keeps its last conditioning too). Here the
text programs are the two CLIP encoders (`encode`), the refiner's (`refiner_encode`) and, with
`--cross-attention-cache`, the UNet's cross-attention keys and values (`cross_kv`).

Why it is exact: those programs are pure functions of the served weights and of their arguments, and the key holds
every argument a request can change: both texts' token ids and emphasis weights (as read, at the request's K
windows), the windows each fills, whether a negative prompt is given, `clip_skip`, the embeddings the texts name
(their vectors are fixed at start-up) and the LoRA set (a LoRA changes the text encoders' and the UNet's kernels).
What the server fixes at start-up (weights, CFG, emphasis mode, sizes) is the same for every entry. A hit hands
the very arrays the programs made, so the pixels are bit for bit those of a request that ran them.

Every process of a multi-host run is handed the same requests in the same order (cluster/protocol.py), so their
caches hold the same keys and they all skip the same programs. An entry holds device memory: the text's hidden
states (SDXL: 0.6 MiB per image with CFG) and, with --cross-attention-cache, its keys and values (SDXL: 49 MiB per
image with CFG); 0 entries keeps none.
"""

from __future__ import annotations

import collections

import numpy as np

#: Texts whose outputs stay on the devices by default (`--text-cache`).
ENTRIES = 4


def text_key(
    prompt_rows, negative_rows, read: int, has_negative: bool, clip_skip: int, embeddings: tuple[str, ...], loras: tuple
) -> tuple:
    """Everything a request gives the text programs, as a hashable key: each text's ids and weights ([2, N*77], of
    which the programs read the first `read` columns) and the windows it fills, whether there is a negative prompt,
    `clip_skip`, the embeddings named (their table rows, in order) and the LoRA set ((name, te, unet) each)."""

    def read_of(rows) -> tuple:
        return (
            np.ascontiguousarray(rows.ids[:, :read]).tobytes(),
            np.ascontiguousarray(rows.weights[:, :read]).tobytes(),
            rows.windows,
        )

    return (
        read,
        read_of(prompt_rows),
        read_of(negative_rows),
        bool(has_negative),
        int(clip_skip),
        tuple(embeddings),
        tuple(tuple(lora) for lora in loras),
    )


class TextCache:
    """The text programs' outputs of the last `entries` texts, least recently used dropped first."""

    def __init__(self, entries: int = ENTRIES):
        self.entries = entries
        self._kept: collections.OrderedDict[tuple, dict] = collections.OrderedDict()
        self.hits = 0  # requests whose text was kept
        self.misses = 0  # requests whose text was not (or nothing is kept)

    def outputs(self, key: tuple) -> dict | None:
        """The outputs `key`'s text made (program name -> arrays; empty the first time, filled as the request runs
        them), now the most recent; None when nothing is kept (`entries` 0)."""
        if self.entries <= 0:
            self.misses += 1
            return None
        if key in self._kept:
            self._kept.move_to_end(key)
            self.hits += 1
            return self._kept[key]
        self.misses += 1
        kept = self._kept[key] = {}
        while len(self._kept) > self.entries:
            self._kept.popitem(last=False)
        return kept

    def forget(self, key: tuple) -> None:
        """Drop `key`'s outputs (a request that failed on the devices may have left unusable arrays there)."""
        self._kept.pop(key, None)

    def __len__(self) -> int:
        return len(self._kept)
