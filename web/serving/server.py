"""Serving the page: Gradio's launch settings (theme, CSS, script, login), the port check, serving until a signal.

Gradio 6 takes the theme and CSS at launch time; its login (`--auth`) too. The port is checked before minutes of
loading and compiling, and SIGTERM or Ctrl-C while serving close the server and remove the app's files (exit 0).
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence

import gradio as gr
import httpx

from ..options import DEFAULT_HOST, DEFAULT_PORT
from ..page.texts import CSS_PATH, PAGE_JS, TITLE

logger = logging.getLogger("sdxl_jax.app")

#: How long the page may take to answer its first request once it listens: Gradio's own check gives each try 3 s and
#: gives up at the first that times out, which a loaded 2-core machine passed (CI, 2026-12-07: "When localhost is not
#: accessible, a shareable link must be created"), so the page checks itself, patiently.
REACHABLE_WITHIN_S = 120.0


class PageUnreachable(ConnectionError):
    """The page listens but never answers on its own URL (serve_until_signal says so in one line, exit 2)."""


def theme() -> gr.themes.Base:
    """Gradio's default theme with a violet accent; fonts are served by Gradio itself (works offline)."""
    return gr.themes.Default(primary_hue="violet", secondary_hue="slate", radius_size="lg")


def launch(
    demo: gr.Blocks,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    share: bool = False,
    prevent_thread_lock: bool = False,
    quiet: bool = False,
    auth: Sequence[tuple[str, str]] | None = None,
    middleware: Sequence = (),
    routes: Sequence = (),
    mcp_server: bool = False,
) -> gr.Blocks:
    """Start serving `demo`; `auth`: Gradio's login, if given; `middleware`: ASGI middleware for Gradio's app;
    `routes`: more HTTP routes on its port, matched before Gradio's (web/apis); `mcp_server`: Gradio's MCP server."""
    demo.launch(
        app_kwargs={"middleware": list(middleware), "routes": list(routes)},
        mcp_server=mcp_server,
        auth=list(auth) if auth else None,
        auth_message=f"<h2>{TITLE}</h2><p>Sign in to generate images.</p>" if auth else None,
        server_name=host,
        server_port=port,
        share=share,
        prevent_thread_lock=prevent_thread_lock,
        quiet=quiet,
        show_error=True,
        theme=theme(),
        css_paths=[CSS_PATH],
        js=PAGE_JS.read_text(encoding="utf-8"),
        ssr_mode=False,
        _frontend=False,  # Gradio's 3-second reachability check: wait_until_reachable instead
    )
    if not share:
        wait_until_reachable(demo.local_url)
    return demo


def wait_until_reachable(url: str, within_s: float = REACHABLE_WITHIN_S) -> None:
    """Return once `url` answers (any HTTP status: a login's 401 or a redirect is an answer); raise, saying so, when it
    never does within `within_s` (a proxy that keeps localhost away; share=True is the way around it)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            httpx.head(url, timeout=max(1.0, min(10.0, deadline - time.monotonic())), verify=False)
            return
        except httpx.HTTPError:
            if time.monotonic() >= deadline:
                raise PageUnreachable(
                    f"The page at {url} did not answer within {within_s:.0f} s: localhost is not reachable here "
                    "(a proxy?); --share serves it through a public link instead."
                ) from None
            time.sleep(0.5)


def port_problem(host: str, port: int) -> str | None:
    """Why the page could not be served on host:port (in use, or no such interface), checked before minutes of
    loading and compiling; None when it is free. Binds the way uvicorn does (SO_REUSEADDR), then lets go."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"--host {host}: not an address of this machine ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use (another server?); pass --port with a free one"
            return f"cannot listen on {host}:{port} ({exc.strerror}); pass another --host or --port"
    return None


def serve_until_signal(
    page, *, host: str, port: int, share: bool, auth: Sequence[tuple[str, str]], started: float, **extra
) -> int:
    """Open the page and serve until SIGTERM or Ctrl-C; the caller closes it. The exit status. `started`: when the
    page began to be built (time.perf_counter), for the log's "web UI up in" line; `extra`: more of `launch`'s
    keywords (the APIs' routes, middleware, MCP)."""
    stop = threading.Event()

    def request_stop(signum, _frame):
        logger.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        page.launch(host=host, port=port, share=share, prevent_thread_lock=True, quiet=True, auth=auth, **extra)
    except OSError as exc:  # the port was taken while the model loaded, or the page never answered (PageUnreachable)
        print(f"app.py: error: cannot serve on {host}:{port}: {exc}", file=sys.stderr, flush=True)
        return 2
    if auth:
        logger.info("login required: %d user(s)", len(auth))
    logger.info("web UI up in %.2f s", time.perf_counter() - started)
    print(f"Running on {page.local_url}", flush=True)
    if page.demo.share_url:
        print(f"Public link: {page.demo.share_url}", flush=True)
    while not stop.wait(1.0):
        pass
    logger.info("stopped")
    return 0
