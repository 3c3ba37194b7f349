"""A request's image prompts as the programs read them: each slot's CLIP pixels and adapter, scale and step window.

The `image_prompt` program takes S slots always (--ip-slots): a request's prompts fill the first, the rest are
empty (their adapter column all 0, so their tokens are 0 and weigh 0). The steps read each slot's scale and the
window [first, stop) of plan rows where it acts (`contract/image_prompts.windows`, the rule of a ControlNet unit's
start and end), and which tokens are real (a plain adapter's 4 of a slot of 16, when a Plus adapter is served too).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ...contract.image_prompts import ImagePrompt, clip_pixels, windows


@dataclass(frozen=True)
class ServedAdapters:
    """What the engine serves of the IP-Adapters: their names (the flags' order), tokens per image, the slots and
    the encoder's image size."""

    names: tuple[str, ...]
    tokens: tuple[int, ...]  # per adapter: 4 (plain) or 16 (Plus)
    slots: int  # S: --ip-slots
    image_size: int  # the encoder's input side (224)
    modules: tuple[str, ...] = ()  # per adapter: sd-webui-controlnet's preprocessor name (what `parameters` writes)

    @property
    def slot_tokens(self) -> int:
        """t: each slot's block of tokens (the most an adapter gives)."""
        return max(self.tokens)


@dataclass(frozen=True)
class ImagePromptPlan:
    """The image prompt program's inputs (`pixels`, `slots`) and what every step reads beside its table."""

    pixels: np.ndarray  # float32 [S, 3, s, s]: each slot's CLIP pixels (zeros for an empty slot)
    slots: np.ndarray  # float32 [A, S]: one-hot, slot j's adapter (an empty slot's column is 0)
    scale: np.ndarray  # float32 [S]
    tokens: np.ndarray  # float32 [S * t]: 1 for a real token, 0 for padding (and an empty slot's)
    key: str  # the table's cache key: the pictures' and adapters' hash
    prompts: tuple[ImagePrompt, ...]

    def window(self, steps: int) -> dict[str, np.ndarray]:
        """The steps' numbers for a pass of `steps` plan rows: scale, first, stop [S] (empty slots act nowhere)."""
        first, stop = windows(self.prompts, steps)
        pad = self.scale.shape[0] - len(self.prompts)
        first, stop = (np.concatenate([x, np.zeros(pad, np.int32)]) for x in (first, stop))
        return {"scale": self.scale, "first": first, "stop": stop, "slots": self.slots, "tokens": self.tokens}


def image_prompt_plan(prompts: tuple[ImagePrompt, ...], served: ServedAdapters) -> ImagePromptPlan | None:
    """The plan of a request's `prompts` on `served` (None without any)."""
    if not prompts:
        return None
    count, size, t = served.slots, served.image_size, served.slot_tokens
    pixels = np.zeros((count, 3, size, size), np.float32)
    slots = np.zeros((len(served.names), count), np.float32)
    scale = np.zeros((count,), np.float32)
    tokens = np.zeros((count * t,), np.float32)
    digest = hashlib.sha256()
    for j, prompt in enumerate(prompts):
        adapter = served.names.index(prompt.adapter)
        pixels[j] = clip_pixels(prompt.pixels(), size)
        slots[adapter, j] = 1.0
        scale[j] = prompt.scale
        tokens[j * t : j * t + served.tokens[adapter]] = 1.0
        digest.update(prompt.adapter.encode() + b"\0" + hashlib.sha256(prompt.image).digest())
    return ImagePromptPlan(pixels, slots, scale, tokens, digest.hexdigest(), prompts)
