"""The engine's HTTP server (stdlib `http.server`, one thread per connection; one generation at a time, or with
--merge-requests as many as the engine's merged calls take: its info's `requests_at_once`).

    GET  /healthz       200 while the process is alive (no token asked)
    GET  /readyz        200 once warmed up, 503 before
    GET  /v1/info       what a page builds its form from (info.py)
    GET  /metrics       Prometheus text (metrics.py)
    POST /v1/generate   body: Request.to_dict(); answer: the NDJSON stream of wire.py. Query: previews=0 runs no
                        preview program. A request over `requests_at_once`: 503 with Retry-After, at once.

Closing the connection stops the request at its next step: between steps the engine asks `should_stop()`, which
looks whether the client's socket has reached its end (no read blocks; a write to it that fails counts too).
"""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..contract.errors import InvalidInput
from ..contract.stopping import Stopped
from . import wire
from .auth import OPEN_PATHS, authorized
from .metrics import TEXT_TYPE, Metrics

logger = logging.getLogger("sdxl_jax.service")

#: The largest request body taken (two 1024² PNG pictures in base64 are ~8 MiB).
MAX_BODY = 64 * 2**20
#: Seconds a refused caller is told to wait before asking this engine again.
RETRY_AFTER_S = 1
#: The sentence a request that failed inside the engine answers (the log has the traceback).
FAILED = "The engine failed on this request; it is logged on the engine's side. Please try again."


class EngineService:
    """What the handlers serve: the engine once it is warm, its info, its token and counters, one run at a time."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        self.metrics = Metrics()
        self.engine = None  # set by `ready` once warmed up
        self.info: dict | None = None
        self.stopping = threading.Event()  # the server is shutting down: a running request stops at its next step
        self._slots = threading.Semaphore(1)  # the requests running; the engine's `requests_at_once` once ready
        self._running = 0
        self._counting = threading.Lock()

    def ready(self, engine, info: dict) -> None:
        self._slots = threading.Semaphore(max(1, int(info.get("requests_at_once", 1))))
        self.info = info
        self.engine = engine

    def following(self, process: int) -> None:
        """This process is warm and follows process 0 (a multi-host engine): ready for its probes, no requests."""
        self.info = {"follower": True, "process": process}

    @property
    def is_ready(self) -> bool:
        return self.info is not None and not self.stopping.is_set()

    def try_begin(self) -> bool:
        """Take one of the engine's slots for a request (one; with --merge-requests, `requests_at_once`, which its
        merged calls share); False at once when all are taken."""
        if not self._slots.acquire(blocking=False):
            return False
        with self._counting:
            self._running += 1
            self.metrics.busy(self._running)
        return True

    def end(self) -> None:
        with self._counting:
            self._running -= 1
            self.metrics.busy(self._running)
        self._slots.release()


class Handler(BaseHTTPRequestHandler):
    """One connection's requests; `self.server.service` is the EngineService."""

    server_version = "sdxl-jax-engine"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's own signature
        logger.debug("%s %s", self.address_string(), format % args)

    @property
    def service(self) -> EngineService:
        return self.server.service

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = urllib.parse.urlsplit(self.path).path
        if not self._allowed(path):
            return
        if path == "/healthz":
            self._json(200, {"status": "alive"})
        elif path == "/readyz":
            ready = self.service.is_ready
            self._json(200 if ready else 503, {"ready": ready}, retry=not ready)
        elif path == "/v1/info":
            info = self.service.info
            self._json(200, info) if info else self._json(503, {"error": "The engine is still starting."}, retry=True)
        elif path == "/metrics":
            cache = getattr(self.service.engine, "text_cache", None)  # None until the engine is warm
            counts = (cache.hits, cache.misses) if cache is not None else None
            self._send(200, self.service.metrics.text(counts).encode(), TEXT_TYPE)
        else:
            self._json(404, {"error": f"No such endpoint: {path}."})

    def do_POST(self) -> None:  # noqa: N802
        parts = urllib.parse.urlsplit(self.path)
        if not self._allowed(parts.path):
            return
        if parts.path != "/v1/generate":
            self._json(404, {"error": f"No such endpoint: {parts.path}."})
            return
        request = self._read_request()
        if request is None:
            return
        service = self.service
        if service.engine is None and service.is_ready:  # a follower
            self._json(
                503, {"error": "This process follows process 0 of a multi-host engine: send requests to process 0."}
            )
            return
        if not service.is_ready or not service.try_begin():
            service.metrics.finished("refused")
            why = "The engine is busy with another request." if service.is_ready else "The engine is not ready."
            self._json(503, {"error": f"{why} Try another engine or again shortly."}, retry=True)
            return
        previews = urllib.parse.parse_qs(parts.query).get("previews", ["1"])[0] not in ("0", "false")
        try:
            self._generate(request, previews)
        finally:
            service.end()

    # ---- pieces ----------------------------------------------------------------------------------------------------

    def _allowed(self, path: str) -> bool:
        if path in OPEN_PATHS or authorized(self.headers.get("Authorization"), self.service.token):
            return True
        self._json(
            401,
            {"error": "A valid engine token is required (Authorization: Bearer TOKEN)."},
            extra={"WWW-Authenticate": "Bearer"},
        )
        return False

    def _read_request(self):
        """The body as a checked Request, or None after answering 400/413."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self.close_connection = True  # the body is left unread
            self._json(
                413 if length > 0 else 400,
                {
                    "error": f"The body must be a JSON request of at most "
                    f"{MAX_BODY // 2**20} MiB with its Content-Length."
                },
            )
            return None
        try:
            data = json.loads(self.rfile.read(length) or b"null")
        except (ValueError, UnicodeDecodeError):
            self._json(400, {"error": "The body is not valid JSON."})
            return None
        if self.service.engine is None:  # not ready: answered by the caller with 503
            return data
        try:
            return wire.request_from_wire(data, self.service.engine.rules)
        except InvalidInput as exc:
            self._json(400, {"error": str(exc)})
            return None

    def _generate(self, request, previews: bool) -> None:
        """Run the request, streaming its events; count how it ended."""
        service, stream = self.service, Stream(self)
        started = time.perf_counter()
        stream.open()
        outcome = "failed"
        try:
            result = service.engine.generate(
                request,
                stream.step,
                should_stop=lambda: stream.closed() or service.stopping.is_set(),
                **({"on_preview": stream.preview} if previews else {}),
            )
            stream.write(wire.result_line(result))
            outcome = "ok"
        except Stopped as stopped:
            outcome = "stopped"
            logger.info("request %s (seed %d)%s", stopped, request.seed, " (client gone)" if stream.closed() else "")
            stream.write(wire.line("stopped", done=stopped.done, total=stopped.total))
        except Exception:
            logger.exception("generation failed (seed %d)", request.seed)
            stream.write(wire.line("error", message=FAILED))
        finally:
            service.metrics.finished(outcome, time.perf_counter() - started)
            self.close_connection = True

    def _json(self, status: int, body: dict, *, retry: bool = False, extra: dict | None = None) -> None:
        headers = {**({"Retry-After": str(RETRY_AFTER_S)} if retry else {}), **(extra or {})}
        self._send(status, json.dumps(body).encode(), "application/json", headers)

    def _send(self, status: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class Stream:
    """The streamed answer of one request: events written as they come (from the engine's threads, one at a time);
    `closed()` tells whether the client has gone."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._sock: socket.socket = handler.connection
        self._lock = threading.Lock()
        self._gone = False

    def open(self) -> None:
        handler = self._handler
        handler.send_response(200)
        handler.send_header("Content-Type", wire.STREAM_TYPE)
        handler.send_header("Cache-Control", "no-store")
        handler.send_header("Connection", "close")  # the stream ends where the connection does
        handler.end_headers()
        handler.wfile.flush()

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._gone:
                return
            try:
                self._handler.wfile.write(data)
                self._handler.wfile.flush()
            except OSError:  # the client went away: the request stops at its next step
                self._gone = True

    def step(self, done: int, total: int) -> None:
        self.write(wire.line("step", done=done, total=total))

    def preview(self, done: int, total: int, pixels) -> None:
        self.write(wire.previews_line(done, total, pixels))

    def closed(self) -> bool:
        """Whether the client closed its end: its socket reads as ended (checked without blocking)."""
        if self._gone:
            return True
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
            if readable and not self._sock.recv(1, socket.MSG_PEEK):
                self._gone = True
        except OSError:
            self._gone = True
        return self._gone


def make_server(host: str, port: int, service: EngineService) -> ThreadingHTTPServer:
    """The bound server (not yet serving): `serve_forever()` in a thread, `shutdown()` to stop."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("EngineHTTPServer", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
    server = server_class((host, port), Handler)
    server.service = service
    return server
