"""Engine services as the page's engine (`python app.py --engine URL ...`): the object web/handlers.py calls,
`generate(request, on_step, should_stop, on_preview)`, plus what the page reads from an engine (rules, config,
images per request, devices, sampler), built from the engines' `/v1/info`. No JAX: this process holds no weights.

Each request goes to a free engine (web/engine_pool.py) as `Request.to_dict()`; the engine's NDJSON stream
(pipeline/service/wire.py) brings its steps, previews and images. Stop closes the connection: the engine stops at
its next step. An engine that fails mid-request (killed, connection lost, an error event, a 5xx) is marked down and
the request runs once more, with the same seed (so the same pixels), on another engine; then one sentence.
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

from pipeline.errors import InvalidInput
from pipeline.request import Request, RequestRules
from pipeline.service.info import disagreement
from pipeline.service.wire import RemoteResult, preview_pixels
from pipeline.stopping import Stopped

from .engine_pool import Endpoint, EnginePool, NoEngine

logger = logging.getLogger("sdxl_jax.engines")

#: Seconds a read of an engine's stream may wait (one denoising step, or the decode, of the largest request).
READ_TIMEOUT_S = 600.0
#: Seconds the page waits at start-up for a first engine to be ready (engines may still be compiling).
START_WAIT_S = 1800.0
#: How often the page looks at Stop while a request runs on an engine.
STOP_POLL_S = 0.05
#: The sentence a request answers when its engine failed and no other could run it.
ENGINE_LOST = "The engine running this request stopped answering and no other engine could finish it; please try again."


class EngineFailed(Exception):
    """The engine failed this request (connection lost, 5xx, an error event): another engine may run it."""


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
    """The part of the engine's SamplerConfig the page reads (web/texts.sampler_summary)."""

    label: str
    timestep_spacing: str
    cfg: bool


class RemoteEngines:
    """Several engine services behind one page, with the interface of one local engine."""

    def __init__(self, pool: EnginePool, info: dict) -> None:
        self.pool = pool
        self.info = info
        self.config = RemoteConfig(model="tiny" if info.get("test_model") else info["model"], steps=info["steps"],
                                   unet=info.get("unet"), preset=info.get("preset"))  # fmt: skip
        self.rules = RequestRules(
            sizes=tuple(tuple(size) for size in info["sizes"]), steps=info["steps"], sampler=info.get("sampler"),
            guidance_scale=info["guidance_scale"], cfg=info["cfg"], levers=info["levers"], loras=tuple(info["loras"]),
            default_loras=tuple(tuple(lora) for lora in info.get("default_loras", ())),
            embeddings=tuple(info.get("embeddings", ())), controlnets=tuple(info.get("controlnets", ())),
        )  # fmt: skip
        self.sampler = RemoteSampler(**info["sampler_settings"])
        self.num_images = info["num_images"]
        self.unet_parameters = info.get("unet_parameters")  # the engine's model's size (None from an older engine)
        self.device_kind = info["device_kind"]
        self.device_summary = f"{info['device_summary']} per engine"
        #: Requests the page's generate event runs at once: two per engine known at start-up, ready or not (one on
        #: its devices, one writing its files); more wait in the page's queue, then in `EnginePool.acquire`.
        self.concurrency = max(2, 2 * len(pool.known))

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
        logger.info("engines: %d ready of %s; %s, %d images per request", len(pool.ready), ", ".join(pool.urls),
                    info["device_summary"], info["num_images"])  # fmt: skip
        return cls(pool, info)

    def close(self) -> None:
        self.pool.close()

    # ---- one request -----------------------------------------------------------------------------------------------

    def generate(self, request: Request, on_step: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, on_preview=None) -> RemoteResult:  # fmt: skip
        """Run `request` on a free engine; once more on another if that one fails; Stopped on Stop."""
        should_stop = should_stop or (lambda: False)
        failed: set[Endpoint] = set()
        while True:
            try:
                endpoint = self.pool.acquire(should_stop, exclude=frozenset(failed),
                                             give_up_s=10.0 if failed else 60.0)  # fmt: skip
            except NoEngine:
                if failed:
                    raise NoEngine(ENGINE_LOST) from None
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
                logger.warning("engine %s failed a request (seed %d): %s", endpoint, request.seed, exc)
                if failed:
                    raise NoEngine(ENGINE_LOST) from None
                failed.add(endpoint)
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
                raise EngineFailed(f"could not send the request: {exc}") from None
            self._check_status(response)
            watcher = threading.Thread(target=contextvars.copy_context().run,
                                       args=(_watch, should_stop, stopped, sock), daemon=True)  # fmt: skip
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
                        raise EngineFailed(event.get("message", "an error event"))
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if not stopped.is_set():
                    raise EngineFailed(f"connection lost: {exc or type(exc).__name__}") from None
            if stopped.is_set():
                raise Stopped(*last)
            raise EngineFailed("the stream ended before the images")
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
        raise EngineFailed(f"HTTP {response.status}: {message}")


def _watch(should_stop: Callable[[], bool], stopped: threading.Event, sock: socket.socket) -> None:
    """While the request runs: on Stop, shut the connection down (the engine stops at its next step)."""
    while not stopped.wait(STOP_POLL_S):
        if should_stop():
            stopped.set()
            with contextlib.suppress(OSError):  # already closed by the engine's side
                sock.shutdown(socket.SHUT_RDWR)
            return


def connect_engines(urls: list[str], token: str | None = None) -> RemoteEngines:
    """The app's entry: `--engine` values (and SDXL_ENGINES, comma-separated) as one engine for the page."""
    return RemoteEngines.connect(urls, token)
