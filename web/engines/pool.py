"""The engines a page sends its requests to (`python app.py --engine URL ...`): their addresses, which are ready,
which are free. Stdlib only, no JAX.

Each URL's host is resolved again at every probe, and each address it resolves to counts as one engine (a Kubernetes
headless Service names every ready pod). A prober thread asks every engine's `/readyz` each `probe_s`: an engine that
does not answer, or answers 503, is skipped until it answers 200 again, so a restarted engine rejoins within about one
probe. `acquire` hands a request the first engine that is ready and not running one of this page's requests; when
all are busy the request waits there, in the order of arrival.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.contract.errors import EngineUnavailable
from pipeline.service.info import disagreement

logger = logging.getLogger("sdxl_jax.engines")

#: Seconds between two probes of every engine.
PROBE_S = 1.0
#: Seconds one probe may take before the engine counts as not ready.
PROBE_TIMEOUT_S = 2.0


class NoEngine(EngineUnavailable):
    """No engine could take the request (none ready, or the only one failed): its message is one sentence."""


@dataclass(frozen=True)
class Endpoint:
    """One engine: an address one of the page's URLs resolved to."""

    url: str  # the URL as given, e.g. http://engine:7870
    address: str  # the IP address connected to
    port: int
    host_header: str  # the URL's host[:port], sent as Host

    def __str__(self) -> str:
        return self.url if self.url.split("//")[-1].split(":")[0] == self.address else f"{self.url} ({self.address})"

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.address, self.port, timeout=timeout)


def parse_engine_url(text: str) -> tuple[str, str, int]:
    """(the URL, its host, its port) of an --engine value ('host:port' or 'http://host:port'); ValueError if odd."""
    url = text.strip().rstrip("/")
    if "//" not in url:
        url = f"http://{url}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"engine {text!r}: expected http://HOST:PORT (https: put the engines behind a proxy)")
    return url, parts.hostname, parts.port or 80


def resolve(url: str) -> list[Endpoint]:
    """Every address `url`'s host resolves to (IPv4 first: a name such as localhost that also has an IPv6 address
    is one engine, not two); [] when it does not resolve now."""
    url, host, port = parse_engine_url(url)
    header = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    try:
        ipaddress.ip_address(host)
        return [Endpoint(url, host, port, header)]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    v4 = [info[4][0] for info in found if info[0] == socket.AF_INET]
    addresses = dict.fromkeys(v4 or [info[4][0] for info in found])  # ordered, unique
    return [Endpoint(url, address, port, header) for address in addresses]


class EnginePool:
    """The page's engines, probed in the background; `acquire`/`release` around each request."""

    def __init__(self, urls: list[str], token: str | None = None, probe_s: float = PROBE_S) -> None:
        self.urls = [parse_engine_url(url)[0] for url in urls]
        self.token = token
        self.probe_s = probe_s
        self._ready: dict[Endpoint, bool] = {}  # every endpoint known, and whether it answered /readyz 200
        self._busy: dict[Endpoint, int] = {}  # this page's requests running on each engine (absent: none)
        self._refused_until: dict[Endpoint, float] = {}  # answered 503 busy (another page's request): not before
        self.infos: dict[Endpoint, dict] = {}  # each ready engine's /v1/info
        self.reference: dict | None = None  # the info the page built its form from: a joining engine is compared
        self._refused_token: set[Endpoint] = set()
        self._changed = threading.Condition()
        self._closed = threading.Event()
        self._prober: threading.Thread | None = None

    # ---- probing ---------------------------------------------------------------------------------------------------

    def headers(self, endpoint: Endpoint) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return {"Host": endpoint.host_header, **auth}

    def get_json(self, endpoint: Endpoint, path: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[int, dict]:
        """(status, JSON body) of a GET; OSError when the engine cannot be reached."""
        connection = endpoint.connection(timeout)
        try:
            connection.request("GET", path, headers=self.headers(endpoint))
            response = connection.getresponse()
            body = response.read()
            try:
                return response.status, json.loads(body or b"{}")
            except ValueError:
                return response.status, {}
        finally:
            connection.close()

    def probe(self) -> None:
        """Resolve every URL and ask every engine whether it is ready (and, the first time it is, its info)."""
        found = [endpoint for url in self.urls for endpoint in resolve(url)]
        states = {}
        for endpoint in found:
            try:
                status, _ = self.get_json(endpoint, "/readyz")
                if status == 200 and not self._ready.get(endpoint):  # (re)joining: its info now, as it runs now
                    status, info = self.get_json(endpoint, "/v1/info")
                    if status == 200:
                        self.infos[endpoint] = info
                        if self.reference is not None and (difference := disagreement(self.reference, info)):
                            logger.warning("engine %s differs from the page's form: %s", endpoint, difference)
                usable = endpoint in self.infos and not self.infos[endpoint].get("follower")  # not a worker
                states[endpoint] = status == 200 and usable
                if status == 401 and endpoint not in self._refused_token:  # said once per engine
                    self._refused_token.add(endpoint)
                    logger.error("engine %s refuses this page's token (SDXL_ENGINE_TOKEN / --engine-token)", endpoint)
            except OSError:
                states[endpoint] = False
        with self._changed:
            for endpoint, ready in states.items():
                if ready != self._ready.get(endpoint):
                    logger.info("engine %s is %s", endpoint, "ready" if ready else "not ready")
            busy_gone = {endpoint: False for endpoint in self._busy if endpoint not in states}
            self._ready = {**busy_gone, **states}  # an address no longer resolved goes once its request ends
            self._changed.notify_all()

    def start(self) -> EnginePool:
        """Probe now, then every `probe_s` in a background thread."""
        self.probe()
        self._prober = threading.Thread(target=self._probe_loop, name="engine-prober", daemon=True)
        self._prober.start()
        return self

    def _probe_loop(self) -> None:
        while not self._closed.wait(self.probe_s):
            try:
                self.probe()
            except Exception:  # never let the prober die: the page would stop noticing engines
                logger.exception("probing the engines failed")

    def close(self) -> None:
        self._closed.set()

    @property
    def known(self) -> list[Endpoint]:
        """Every engine the URLs resolved to at the last probe, ready or not."""
        with self._changed:
            return list(self._ready)

    @property
    def ready(self) -> list[Endpoint]:
        with self._changed:
            return [endpoint for endpoint, ready in self._ready.items() if ready]

    def slots(self, endpoint: Endpoint) -> int:
        """The requests `endpoint` takes at once: its info's `requests_at_once` (one; more for an engine whose
        calls merge requests, --merge-requests), 1 for an engine that does not say."""
        return max(1, int(self.infos.get(endpoint, {}).get("requests_at_once", 1)))

    # ---- one request -----------------------------------------------------------------------------------------------

    def acquire(
        self,
        should_stop: Callable[[], bool],
        exclude: frozenset = frozenset(),
        give_up_s: float = 60.0,
        on_wait: Callable[[int, int], None] | None = None,
    ) -> Endpoint | None:
        """A free, ready engine not in `exclude`, marked busy; waits while every engine is busy. None when
        `should_stop()` turns true; NoEngine when none is ready (or none but `exclude`) for `give_up_s`. While it
        waits, `on_wait(ready, known)` is told the engines ready of those known, first and whenever that changes (the
        page says "waiting for an engine (0 of 2 ready)" rather than a bare spinner)."""
        unready_since = told = None
        while True:
            with self._changed:
                now = time.monotonic()
                usable = [e for e, ready in self._ready.items() if ready and e not in exclude]
                free = [
                    e for e in usable if self._busy.get(e, 0) < self.slots(e) and self._refused_until.get(e, 0) <= now
                ]
                if free:
                    chosen = min(free, key=lambda e: self._busy.get(e, 0))  # the least busy, the first of equals
                    self._busy[chosen] = self._busy.get(chosen, 0) + 1
                    return chosen
                if should_stop():
                    return None
                if usable:
                    unready_since = None
                elif unready_since is None:
                    unready_since = now
                if unready_since is not None and now - unready_since >= give_up_s:  # give_up_s=0: at once
                    raise NoEngine("No engine is available to run this request right now; please try again shortly.")
                counts = (sum(self._ready.values()), len(self._ready))
            if on_wait is not None and counts != told:  # outside the lock: the page's report may take a while
                told = counts
                on_wait(*counts)
            with self._changed:
                self._changed.wait(0.1)

    def release(self, endpoint: Endpoint, *, failed: bool = False, retry_after: float = 0.0) -> None:
        """The request left `endpoint`: `failed` marks it not ready until a probe finds it ready again;
        `retry_after` (it answered busy) skips it for that many seconds."""
        with self._changed:
            if self._busy.get(endpoint, 0) > 1:
                self._busy[endpoint] -= 1
            else:
                self._busy.pop(endpoint, None)
            if failed:
                self._ready[endpoint] = False
            if retry_after:
                self._refused_until[endpoint] = time.monotonic() + retry_after
            self._changed.notify_all()
