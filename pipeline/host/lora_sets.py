"""The LoRAs a server offers, and the set merged into the served weights: merged again only when a request asks for
another set, restored bit for bit when it asks for none.

    sets = LoraSets(files, layout, programs, params, put)   # at start-up: each file packed once on the host
    params = sets.params_for(request.loras)         # per request, on the device lock: the weights to run with

A change runs the compiled merge program (`ProgramKey("merge")`, device/lora.py) on the unmerged kernels, kept
beside the served ones, with the previous merged kernels donated; the same set twice costs nothing, and a request
without LoRA runs the unmerged weights themselves. Every process of a multi-host run merges the same sets in the
same order (requests reach them as data), so their weights never differ.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence

import numpy as np

from ..checkpoint.lora import LoraFile
from ..contract.errors import InvalidInput
from ..contract.parameters import hashes_field
from ..device.lora import (
    MergeLayout,
    MergeProgram,
    SlotFactors,
    empty_slot,
    get_leaves,
    pack,
    slot_weights,
    with_leaves,
)
from .compiling.programs import ProgramKey, ServedPrograms

logger = logging.getLogger(__name__)

#: A request's LoRAs: (name, text-encoder weight, UNet weight) each.
LoraChoice = tuple[tuple[str, float, float], ...]
#: LoRAs whose packed factors stay on the devices by default (most recently used), so a switch back transfers
#: nothing (`--lora-cache`: each costs one slot's memory, rank × the touched kernels' sides).
PLACED = 8


class LoraSets:
    """The offered LoRAs of one engine and the set its served weights hold now."""

    def __init__(
        self,
        files: Sequence[LoraFile],
        layout: MergeLayout,
        programs: ServedPrograms,
        params,
        put: Callable[[Sequence[np.ndarray]], tuple],
        placed: int = PLACED,
    ):
        self.files = {lora.name: lora for lora in files}  # name -> the accepted file
        self.layout = layout
        self._programs = programs
        self._put = put  # host arrays -> replicated device arrays (on one process or several)
        self._packed = {lora.name: pack(layout, lora) for lora in files}  # host, the layout's dtype, padded to rank R
        self._placed: collections.OrderedDict[str, SlotFactors] = collections.OrderedDict()
        self._keep = max(1, placed)  # LoRAs (and the empty slot) kept placed between requests
        self._base = params  # the unmerged weights (what a request without LoRA runs)
        self._originals = get_leaves(params, layout.leaves)  # the unmerged kernels the merge starts from
        self._merged: tuple | None = None  # the last merged kernels (donated to the next merge)
        self.current: LoraChoice = ()  # the set the served weights hold
        self._served = params

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.files)

    def hashes(self, choice: LoraChoice) -> str:
        """A1111's `Lora hashes` value for `choice` ("" for none)."""
        return hashes_field([(name, self.files[name].short_hash) for name, _, _ in choice])

    def prepare(self) -> None:
        """Make the first merge's `previous` buffers now (at warm-up): on several processes a copy of a global array
        is a small program per kernel shape, which a request must never be the first to compile."""
        if self._merged is None:
            self._merged = MergeProgram.copies(self._originals)

    def params_for(self, choice: LoraChoice) -> dict:
        """The weights a request with `choice` runs with (merging only when the set or a weight changed)."""
        choice = tuple(choice)
        for name, _, _ in choice:
            if name not in self.files:  # a file of --lora-dir that could not be read (logged at start-up)
                raise InvalidInput(f"LoRA '{name}' could not be read at start-up; it is not offered.")
        if choice == self.current:
            return self._served
        if not choice:
            self.current, self._served = (), self._base
            return self._served
        merge = self._programs.compile(ProgramKey("merge"))
        self.prepare()
        previous = self._merged
        slots = [self._slot(name) for name, _, _ in choice]
        slots += [self._slot(None)] * (self.layout.slots - len(slots))
        (weights,) = self._put([slot_weights(self.layout, [(te, unet) for _, te, unet in choice])])
        downs, ups = tuple(slot.downs for slot in slots), tuple(slot.ups for slot in slots)
        self._merged = merge(tuple(previous), self._originals, downs, ups, weights)
        self._served = with_leaves(self._base, self.layout.leaves, self._merged)
        self.current = choice
        return self._served

    def _slot(self, name: str | None) -> SlotFactors:
        """`name`'s packed factors on the devices (an empty slot for None), kept for the next switch."""
        key = name or ""
        if key in self._placed:
            self._placed.move_to_end(key)
            return self._placed[key]
        packed = self._packed[name] if name else empty_slot(self.layout)
        slot = SlotFactors(downs=self._put(packed.downs), ups=self._put(packed.ups))
        self._placed[key] = slot
        while len(self._placed) > self._keep:
            self._placed.popitem(last=False)
        return slot
