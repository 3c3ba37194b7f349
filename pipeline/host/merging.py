"""Queued requests that share one device call (`--merge-requests`): throughput mode for many users at once.

With `--images-per-device N` every call makes N images per device. With merging, a request asks for one image per
device (one block of D images, as the Space serves them), and the requests that wait while a call runs are taken
together: up to N of them whose `key` agrees (size, UNet calls, speed plan, text windows, clip skip, embeddings,
LoRAs, picture or not: what the programs and weights of a call fix) run as one call, each in its own block of the
batch with its own prompt, negative prompt, seed, guidance, sampler and schedule (each image reads its own plan's
rows) and, for image to image and inpainting, its own picture, mask and strength. Image i of a
block depends only on its own rows, so a merged request gets the pixels it would get alone.

One worker thread runs the calls, so a request's thread only waits for its ticket: Stop answers a request at the
next step while the call goes on for the others (its block is computed and dropped), and the call ends early only
when every request in it has stopped. Calls come in a few sizes, each compiled (`EngineConfig.merge_call_sizes`:
N and the powers of two below it), and a call takes the largest size the waiting requests fill: a request that
arrives while the devices are idle runs at once in a one-image call, three waiting at N = 4 run as two and then one
(with whoever arrived meanwhile), so no call computes blocks nobody asked for. With --merge-full-calls the one size is
N: a call of fewer requests pads its free blocks, and a request's pixels never depend on its call's size (a smaller
call's are within 1 level: float rounding of another batch).
Nothing here imports JAX: the generator gives the merger the function that runs a group.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..contract.stopping import Stopped
from .loop import follows_steps

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Ticket:
    """One request waiting for, or in, a merged call: what it needs of the call and, once answered, its outcome."""

    key: Hashable  # what the requests of one call share (`RunPlan.merge_key`)
    rows: tuple[np.ndarray, ...]  # the request's per-image host arrays, [D, ...] each (`Conditioning.rows`)
    total: int  # the request's steps (what its progress counts to)
    request: Any = None  # the request itself (the group's runner reads its shared settings from the first one)
    on_step: Callable[[int, int], None] | None = None
    should_stop: Callable[[], bool] | None = None
    on_preview: Callable[[int, int, np.ndarray], None] | None = None
    extra: Any = None  # the runner's own (the generator's: the request's `RunPlan`, pipeline/merged_calls.py)
    _answered: threading.Event = field(default_factory=threading.Event)
    _outcome: tuple[Any, float] | None = None
    _error: BaseException | None = None

    @property
    def live(self) -> bool:
        """Not yet answered: the call still computes its block for it."""
        return not self._answered.is_set()

    def answer(self, pixels: np.ndarray, device_s: float) -> None:
        """The request's block of the call's pixels, uint8 [D, H, W, 3], and the seconds the call held the devices."""
        if self.live:
            self._outcome = (pixels, device_s)
            self._answered.set()

    def fail(self, error: BaseException) -> None:
        """End the request with `error` (`Stopped` for a stopped one); a ticket already answered keeps its answer."""
        if self.live:
            self._error = error
            self._answered.set()

    def wait(self) -> tuple[np.ndarray, float]:
        """Block until answered: (pixels, device seconds), or the error raised."""
        self._answered.wait()
        if self._error is not None:
            raise self._error
        return self._outcome


class GroupWatchers:
    """One call's listeners over its tickets: each ticket's progress, previews (its own block) and Stop.

    Used as the loop's `on_step`, `on_preview` and `gate` (`host/loop.Watchers`): the gate asks every live ticket
    before each step, ends a stopped one with `Stopped` at once, and stops the call when none is left."""

    def __init__(self, tickets: list[Ticket], block: int):
        self.tickets = tickets
        self.block = block  # D: images per request, the rows of one block

    def on_step(self, done: int, total: int) -> None:
        for ticket in self._live():
            if ticket.on_step is not None:
                ticket.on_step(done, total)

    def on_preview(self, done: int, total: int, pixels: np.ndarray) -> None:
        for index, ticket in enumerate(self.tickets):
            if ticket.live and ticket.on_preview is not None:
                ticket.on_preview(done, total, pixels[index * self.block : (index + 1) * self.block])

    @property
    def previews(self) -> bool:
        """Whether any request in the call watches its picture form (else no preview program runs)."""
        return any(ticket.on_preview is not None for ticket in self.tickets)

    @property
    def stepwise(self) -> bool:
        """Whether any request in the call follows its steps (progress, previews, Stop): one step per call then."""
        return any(follows_steps(ticket.on_step, ticket.should_stop, ticket.on_preview) for ticket in self.tickets)

    def gate(self, position: int, _wants_stop: bool) -> bool:
        """Before step `position`: each request that asks to stop ends now; True (stop the call) when none is left."""
        for ticket in self._live():
            try:
                stop = ticket.should_stop is not None and ticket.should_stop()
            except Exception:  # a stop check must never break the others' call
                logger.exception("a stop check failed before step %d", position)
                stop = False
            if stop:
                ticket.fail(Stopped(position, ticket.total))
        return not any(self._live())

    def answer(self, pixels: np.ndarray, device_s: float) -> None:
        """Each live ticket's block of the call's pixels [slots × D, H, W, 3]."""
        for index, ticket in enumerate(self.tickets):
            ticket.answer(pixels[index * self.block : (index + 1) * self.block], device_s)

    def _live(self) -> list[Ticket]:
        return [ticket for ticket in self.tickets if ticket.live]


class CallMerger:
    """The queue of tickets and the one worker thread that runs them: calls of one key, as many tickets as the
    largest of `sizes` (ascending) that the waiting tickets of that key fill (fewer than the smallest: all of them,
    and the runner pads the call).

    `run_group(tickets)` runs one call and answers every ticket (the merger answers any it left with the error it
    raised). Tickets are taken oldest first: the oldest waiting request's key picks the next call's requests, so no
    request waits behind later ones of another key for more than one call each."""

    def __init__(self, sizes: tuple[int, ...], run_group: Callable[[list[Ticket]], None]):
        if not sizes or sizes[0] < 1 or list(sizes) != sorted(set(sizes)):
            raise ValueError(f"call sizes must be positive and ascend; got {sizes}")
        self.sizes = tuple(sizes)
        self.slots = self.sizes[-1]  # the most requests one call holds (N)
        self._run_group = run_group
        self._pending: list[Ticket] = []
        self._changed = threading.Condition()
        self._worker: threading.Thread | None = None
        self.calls = 0  # calls run
        self.merged = 0  # requests that shared a call with another
        self.calls_by_size: dict[int, int] = {}  # calls run, per requests in them

    def submit(self, ticket: Ticket) -> tuple[np.ndarray, float]:
        """Queue `ticket` and wait for its answer: (its pixels [D, H, W, 3], device seconds); raises its error."""
        with self._changed:
            self._pending.append(ticket)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="merged-calls", daemon=True)
                self._worker.start()
            self._changed.notify_all()
        return ticket.wait()

    def waiting(self) -> int:
        """Requests queued for the next calls (not yet in one)."""
        with self._changed:
            return len(self._pending)

    def wait_for_waiting(self, count: int, timeout: float) -> bool:
        """Block until at least `count` requests are queued (or `timeout` seconds): whether they are."""
        return self.wait_until(lambda: len(self._pending) >= count, timeout)

    def wait_until(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Block until `condition()` holds, asked whenever a request is queued or a call takes some (or `timeout`
        seconds): whether it does."""
        with self._changed:
            return self._changed.wait_for(condition, timeout)

    def _take(self) -> list[Ticket]:
        """The next call's tickets: the oldest and the next ones with its key, as many as the largest size they fill."""
        key = self._pending[0].key
        group = [ticket for ticket in self._pending if ticket.key == key][: self.slots]
        group = group[: max((size for size in self.sizes if size <= len(group)), default=len(group))]
        self._pending = [ticket for ticket in self._pending if ticket not in group]
        return group

    def _work(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._pending))
                group = self._take()
                self.calls += 1
                self.calls_by_size[len(group)] = self.calls_by_size.get(len(group), 0) + 1
                self.merged += len(group) if len(group) > 1 else 0
                self._changed.notify_all()
            try:
                self._run_group(group)
            except BaseException as exc:  # answered to the requests; the worker serves the next call
                for ticket in group:
                    ticket.fail(exc)
            for ticket in group:  # a runner that forgot one must not leave its request waiting forever
                ticket.fail(RuntimeError("the merged call ended without answering this request"))
