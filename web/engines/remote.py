"""Engine services as the page's engine (`python app.py --engine URL ...`): the object web/page/handlers.py calls,
`generate(request, on_step, should_stop, on_preview)`, plus what the page reads from an engine (rules, config,
images per request, devices, sampler), built from the engines' `/v1/info`. No JAX: this process holds no weights.

Each request goes to a free engine (web/engines/pool.py) as `Request.to_dict()`; the engine's NDJSON stream
(pipeline/service/wire.py) brings its steps, previews and images. Stop closes the connection: the engine stops at
its next step. An engine that fails mid-request (killed, connection lost, an error event, a 5xx) is marked down and
the request runs once more, with the same seed (so the same pixels), on another engine: at once when one is free, when
one frees if all others are busy, and not at all when no other is ready (no timer to sit out). Else one sentence that
says what happened ("The engine stopped mid-request (connection lost at step 88 / 100) and ...").
"""

from __future__ import annotations

import contextlib
import contextvars
import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.contract.errors import InvalidInput
from pipeline.contract.hires import UPSCALERS
from pipeline.contract.request import Request, RequestRules
from pipeline.contract.stopping import Stopped
from pipeline.service.info import disagreement
from pipeline.service.wire import RemoteResult, preview_pixels

from .pool import Endpoint, EnginePool, NoEngine

logger = logging.getLogger("sdxl_jax.engines")

#: Seconds a read of an engine's stream may wait (one denoising step, or the decode, of the largest request).
READ_TIMEOUT_S = 600.0
#: Seconds the page waits at start-up for a first engine to be ready (engines may still be compiling).
START_WAIT_S = 1800.0
#: How often the page looks at Stop while a request runs on an engine.
STOP_POLL_S = 0.05
#: Seconds a request waits while no engine is ready (all down or restarting) before it answers NoEngine's sentence.
NO_ENGINE_WAIT_S = 60.0
#: The sentence a request answers when its engine failed and no other could run it: `why` is what happened in words a
#: visitor may read (no host, no path: EngineFailed.why), `then` ONLY_ENGINE or ALSO_FAILED.
ENGINE_LOST = "The engine stopped mid-request ({why}) and {then}; please try again."
ONLY_ENGINE = "no other engine is ready to run it again"
ALSO_FAILED = "so did the engine that ran it again"


def waiting_text(ready: int, known: int) -> str:
    """What the page shows while a request waits for an engine (its progress text), instead of a bare spinner."""
    if ready == 0:
        return f"waiting for an engine (0 of {known} ready)"
    return f"waiting for a free engine ({ready} of {known} ready, all busy)"


class EngineFailed(Exception):
    """The engine failed this request (connection lost, 5xx, an error event): another engine may run it. `reason`
    says what happened in words a visitor may read; str() adds the detail the log keeps (the engine's message, the
    socket's error)."""

    def __init__(self, reason: str, detail: str = "", at: list[int] | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.done, self.total = at or (0, 0)  # the last step the engine reported

    @property
    def why(self) -> str:
        """e.g. "connection lost at step 88 / 100"."""
        at = f"at step {self.done} / {self.total}" if self.done else "before its first step"
        return f"{self.reason} {at}"


class EngineBusy(Exception):
    """The engine answered 503: it runs another page's request (or is stopping)."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"busy, retry after {retry_after:g} s")
        self.retry_after = retry_after


@dataclass(frozen=True)
class RemoteConfig:
    """The part of an EngineConfig the page reads (header, footer, server defaults)."""

    model: str
    steps: int
    unet: str | None = None
    preset: str | None = None


@dataclass(frozen=True)
class RemoteSampler:
    """The part of the engine's SamplerConfig the page reads (web/page/texts.sampler_summary)."""

    label: str
    timestep_spacing: str
    cfg: bool


class RemoteEngines:
    """Several engine services behind one page, with the interface of one local engine."""

    def __init__(self, pool: EnginePool, info: dict) -> None:
        self.pool = pool
        self.info = info
        self.config = RemoteConfig(
            model="tiny" if info.get("test_model") else info["model"],
            steps=info["steps"],
            unet=info.get("unet"),
            preset=info.get("preset"),
        )
        self.rules = RequestRules(
            sizes=tuple(tuple(size) for size in info["sizes"]),
            steps=info["steps"],
            sampler=info.get("sampler"),
            guidance_scale=info["guidance_scale"],
            cfg=info["cfg"],
            levers=info["levers"],
            loras=tuple(info["loras"]),
            default_loras=tuple(tuple(lora) for lora in info.get("default_loras", ())),
            embeddings=tuple(info.get("embeddings", ())),
            controlnets=tuple(info.get("controlnets", ())),
            union_controlnets=tuple(info.get("union_controlnets", ())),
            ip_adapters=tuple(info.get("ip_adapters", ())),  # an older engine: none
            ip_slots=info.get("ip_slots", 2),
            refiner=info.get("refiner") or "",
            hires_scales=tuple(info.get("hires_scales") or ()),
            hires_upscalers=tuple(info.get("hires_upscalers") or UPSCALERS),  # an older engine: the built-in ones
        )
        self.sampler = RemoteSampler(**info["sampler_settings"])
        self.num_images = info["num_images"]
        self.unet_parameters = info.get("unet_parameters")  # the engine's model's size (None from an older engine)
        self.device_kind = info["device_kind"]
        self.device_summary = f"{info['device_summary']} per engine"
        #: Requests the page's generate event runs at once: per engine known at start-up, ready or not, two (one on
        #: its devices, one writing its files), or what a merging engine takes at once (`requests_at_once`); more
        #: wait in the page's queue, then in `EnginePool.acquire`.
        self.concurrency = max(2, len(pool.known) * max(2, int(info.get("requests_at_once", 1))))

    @classmethod
    def connect(cls, urls: list[str], token: str | None = None, wait_s: float = START_WAIT_S) -> RemoteEngines:
        """Probe the engines, wait for a first ready one, and say in one line how any other differs from it."""
        pool = EnginePool(urls, token).start()
        deadline = time.monotonic() + wait_s
        if not pool.ready:
            logger.info("waiting for an engine to be ready: %s", ", ".join(pool.urls))
        while not pool.ready:
            if time.monotonic() > deadline:
                pool.close()
                raise OSError(f"no engine was ready within {wait_s:.0f} s: {', '.join(pool.urls)}")
            time.sleep(0.25)
        first, *others = pool.ready
        info = pool.reference = pool.infos[first]
        for other in others:
            if difference := disagreement(info, pool.infos[other]):
                logger.warning("engine %s differs from %s: %s", other, first, difference)
        logger.info(
            "engines: %d ready of %s; %s, %d images per request",
            len(pool.ready),
            ", ".join(pool.urls),
            info["device_summary"],
            info["num_images"],
        )
        return cls(pool, info)

    def close(self) -> None:
        self.pool.close()

    # ---- one request -----------------------------------------------------------------------------------------------

    def generate(
        self,
        request: Request,
        on_step: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        on_preview=None,
        on_wait: Callable[[str], None] | None = None,
    ) -> RemoteResult:
        """Run `request` on a free engine; once more on another if that one fails; Stopped on Stop. `on_wait` is told
        what the request waits for while no engine is free ("waiting for an engine (0 of 2 ready)")."""
        should_stop = should_stop or (lambda: False)
        report = (lambda ready, known: on_wait(waiting_text(ready, known))) if on_wait is not None else None
        failed: set[Endpoint] = set()
        lost: EngineFailed | None = None  # the first engine's failure, once there was one
        while True:
            try:  # a re-run waits for a busy engine to free, never for one that is not ready: it answers at once
                endpoint = self.pool.acquire(
                    should_stop,
                    exclude=frozenset(failed),
                    give_up_s=0.0 if failed else NO_ENGINE_WAIT_S,
                    on_wait=report,
                )
            except NoEngine:
                if lost is not None:
                    raise NoEngine(ENGINE_LOST.format(why=lost.why, then=ONLY_ENGINE)) from None
                raise
            if endpoint is None:
                raise Stopped(0, request.steps)
            try:
                result = self._run_on(endpoint, request, on_step, should_stop, on_preview)
            except EngineBusy as busy:
                self.pool.release(endpoint, retry_after=busy.retry_after)
                continue
            except EngineFailed as exc:
                self.pool.release(endpoint, failed=True)
                logger.warning(
                    "engine %s failed a request (seed %d, step %d / %d): %s",
                    endpoint,
                    request.seed,
                    exc.done,
                    exc.total,
                    exc,
                )
                if lost is not None:
                    raise NoEngine(ENGINE_LOST.format(why=exc.why, then=ALSO_FAILED)) from None
                failed.add(endpoint)
                lost = exc
                continue
            except BaseException:
                self.pool.release(endpoint)
                raise
            self.pool.release(endpoint)
            return result

    def _run_on(self, endpoint: Endpoint, request: Request, on_step, should_stop, on_preview) -> RemoteResult:
        """One attempt on one engine: the request sent, its stream read until the result."""
        connection = endpoint.connection(READ_TIMEOUT_S)
        body = json.dumps(request.to_dict()).encode()
        headers = {**self.pool.headers(endpoint), "Content-Type": "application/json"}
        stopped = threading.Event()
        last = [0, request.steps]
        response = None
        try:
            try:
                connection.request("POST", f"/v1/generate?previews={1 if on_preview else 0}", body, headers)
                sock = connection.sock  # the response takes it over (the stream ends with the connection)
                response = connection.getresponse()
            except OSError as exc:
                raise EngineFailed("could not send the request", str(exc)) from None
            self._check_status(response)
            watcher = threading.Thread(
                target=contextvars.copy_context().run, args=(_watch, should_stop, stopped, sock), daemon=True
            )
            watcher.start()
            try:
                while raw := response.readline():
                    event = json.loads(raw)
                    kind = event.get("event")
                    if kind == "step":
                        last[:] = [event["done"], event["total"]]
                        if on_step is not None:
                            on_step(event["done"], event["total"])
                    elif kind == "preview" and on_preview is not None:
                        on_preview(event["done"], event["total"], preview_pixels(event))
                    elif kind == "result":
                        return RemoteResult.of(event)
                    elif kind == "stopped":
                        raise Stopped(event["done"], event["total"])
                    elif kind == "error":
                        raise EngineFailed("the engine reported an error", event.get("message", ""), last)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if not stopped.is_set():
                    raise EngineFailed("connection lost", repr(exc), last) from None
            if stopped.is_set():
                raise Stopped(*last)
            raise EngineFailed("connection lost", "the stream ended before the images", last)
        finally:
            stopped.set()  # ends the watcher
            if response is not None:
                response.close()
            connection.close()

    @staticmethod
    def _check_status(response) -> None:
        if response.status == 200:
            return
        body = response.read()
        try:
            message = json.loads(body).get("error", "")
        except (ValueError, AttributeError):
            message = ""
        if response.status == 503:
            raise EngineBusy(float(response.getheader("Retry-After") or 1))
        if response.status == 400:
            raise InvalidInput(message or "The engine refused this request.")
        raise EngineFailed(f"it answered HTTP {response.status}", message)


def _watch(should_stop: Callable[[], bool], stopped: threading.Event, sock: socket.socket) -> None:
    """While the request runs: on Stop, shut the connection down (the engine stops at its next step)."""
    while not stopped.wait(STOP_POLL_S):
        if should_stop():
            stopped.set()
            with contextlib.suppress(OSError):  # already closed by the engine's side
                sock.shutdown(socket.SHUT_RDWR)
            return
