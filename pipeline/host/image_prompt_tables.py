"""The served IP-Adapters as the engine runs them: their modules and weights beside the model's, what planning reads
of them, and each request's image prompt table, made once and kept for the next requests with the same pictures.

    tables = ImagePromptTables(adapters, slots)                # at load: `modules`, `with_weights`, `served`
    tables.bind(programs, params, put)                         # once the programs exist
    for_pass = tables.for_run(run.image_prompt)                # per request: N plan rows -> what the steps read
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import jax.numpy as jnp

from ..checkpoint.ip_adapter_loading import IPAdapterWeights
from ..device.nets.image_projection import image_projection
from .compiling.programs import ProgramKey, ServedPrograms
from .planning.image_prompt_plan import ImagePromptPlan, ServedAdapters

#: Image prompts' tables kept on the devices between requests (each is small: every layer's keys of S x t tokens).
KEPT_TABLES = 4


class ImagePromptTables:
    """The adapters (`--ip-adapter`, in the flags' order) and the request tables made with them."""

    def __init__(self, adapters: tuple[IPAdapterWeights, ...], slots: int) -> None:
        self.adapters, self.slots = tuple(adapters), slots
        self.programs: ServedPrograms | None = None
        self._params, self._put = None, None
        #: the tables by their pictures' and adapters' hash, newest last
        self._kept: collections.OrderedDict[str, dict] = collections.OrderedDict()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(adapter.name for adapter in self.adapters)

    def modules(self, dtype: str) -> dict:
        """The image prompt's `Modules` fields: the adapters' shared image encoder, each one's projection (none
        without adapters)."""
        if not self.adapters:
            return {}
        projections = tuple(image_projection(adapter.projection, getattr(jnp, dtype)) for adapter in self.adapters)
        return {"image_encoder": self.adapters[0].encoder.module, "image_projections": projections}

    def with_weights(self, params: dict) -> dict:
        """The programs' weights with the image encoder's and each adapter's (projection, to_k_ip / to_v_ip)."""
        if not self.adapters:
            return params
        trees = tuple(adapter.params for adapter in self.adapters)
        return {**params, "image_encoder": self.adapters[0].encoder.params, "ip_adapters": trees}

    def served(self) -> ServedAdapters | None:
        """What planning an image prompt reads of the adapters (None: none served)."""
        if not self.adapters:
            return None
        return ServedAdapters(
            names=self.names,
            tokens=tuple(adapter.projection.tokens for adapter in self.adapters),
            slots=self.slots,
            image_size=self.adapters[0].encoder.module.config.image_size,
            modules=tuple(adapter.a1111_module for adapter in self.adapters),
        )

    def bind(self, programs: ServedPrograms, params, put: Callable) -> None:
        """The programs and placed weights the tables are made with, and how a host array reaches every device."""
        self.programs, self._params, self._put = programs, params, put

    def for_run(self, plan: ImagePromptPlan | None) -> Callable[[int], dict] | None:
        """A pass of N plan rows -> the image prompt its steps read, on every device (None without one): the table
        of `plan`'s pictures (the `image_prompt` program's, made once and kept for a few requests) and the pass's
        slot windows."""
        if plan is None:
            return None
        put, key = self._put, ProgramKey("image_prompt")
        table = self._kept.pop(plan.key, None)
        if table is None:
            program = self.programs.compile(key)
            table = program(self.programs.weights(key, self._params), put(plan.pixels), put(plan.slots))
        self._kept[plan.key] = table
        while len(self._kept) > KEPT_TABLES:
            self._kept.popitem(last=False)

        def for_pass(steps: int) -> dict:
            return {**table, **{name: put(array) for name, array in plan.window(steps).items()}}

        return for_pass
