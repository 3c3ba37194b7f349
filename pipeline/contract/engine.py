"""What the page (web/) needs of an engine: the `Engine` protocol, without JAX.

Three classes are engines, none by inheritance: `generator.Generator` (this process's devices),
`cluster/protocol.LeadingGenerator` (process 0 of several; the generator's attributes are its own) and
`web/engines/remote.RemoteEngines` (engine services behind one page; no weights here). web/page/handlers.py,
web/page/layout.py and web/apis/ read only what is named here; `isinstance(x, Engine)` checks that an object has all
of it (tests/engine/test_engine_protocol.py checks the three).

One more attribute is read where an engine has it: `concurrency`, the requests the page's generate event runs at once
(RemoteEngines: two per engine; a Generator: REQUESTS_AT_ONCE, or twice `--images-per-device` with
`--merge-requests`, so the next call fills while one runs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from .request import Request, RequestRules

#: `on_step(done, total)`: a denoising step's result is ready.
StepListener = Callable[[int, int], None]
#: `should_stop()`: asked before each step; True ends the request (`stopping.Stopped`).
StopCheck = Callable[[], bool]
#: `on_preview(done, total, pixels)`: the pictures forming, uint8 [b, h, w, 3] at latent size.
PreviewListener = Callable[[int, int, np.ndarray], None]


class EngineSettings(Protocol):
    """The part of an engine's settings the page shows (header, footer, server defaults): `config.EngineConfig`'s."""

    @property
    def model(self) -> str: ...
    @property
    def steps(self) -> int: ...
    @property
    def unet(self) -> str | None: ...
    @property
    def preset(self) -> str | None: ...


class SamplerSettings(Protocol):
    """The part of the sampler's settings the page shows (web/page/texts.sampler_summary)."""

    @property
    def label(self) -> str: ...
    @property
    def timestep_spacing(self) -> str: ...
    @property
    def cfg(self) -> bool: ...


class EngineResult(Protocol):
    """What one request produced, as the page and the APIs read it (`generator.GenerationResult`,
    `service/wire.RemoteResult`)."""

    images: list  # PIL images, each with .info["parameters"]
    seeds: list[int]
    prompt: str
    negative_prompt: str
    truncated: str  # "" or the sentence naming the words past CLIP's limit
    parameters: list[str]
    timings: dict[str, float]
    steps: int
    sampler: str


#: Requests an engine runs at once by default: one on the devices while another does its host work (tokenizing
#: before, writing files after); the engine's device lock keeps device calls one at a time.
REQUESTS_AT_ONCE = 2


@runtime_checkable
class Engine(Protocol):
    """A ready (loaded, warmed-up) engine, as the page, its handlers and the APIs use it."""

    @property
    def config(self) -> EngineSettings: ...
    @property
    def rules(self) -> RequestRules: ...  # what a request may ask for: sizes, steps, LoRAs, embeddings, ...
    @property
    def sampler(self) -> SamplerSettings: ...
    @property
    def num_images(self) -> int: ...  # images per request
    @property
    def device_kind(self) -> str: ...  # "cpu", "TPU v5 lite", ...: the page's CPU note
    @property
    def device_summary(self) -> str: ...  # e.g. "8 × cpu" for the header
    @property
    def unet_parameters(self) -> int | None: ...  # the UNet's size (the CPU note: a test-sized model is quick)

    def generate(
        self,
        request: Request,
        on_step: StepListener | None = None,
        should_stop: StopCheck | None = None,
        *,
        on_preview: PreviewListener | None = None,
    ) -> EngineResult:
        """Run a checked request; `Stopped` when `should_stop()` said so between steps. An engine that can wait for
        another (RemoteEngines) also takes `on_wait(text)`: what the request waits for."""
        ...
