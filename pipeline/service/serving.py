"""`python -m pipeline serve`: listen at once (so /healthz and /readyz answer while it starts), load, compile and
warm up the engine, then serve it until SIGTERM or Ctrl-C. On several processes process 0 serves and the others
follow it (cluster/protocol.py), as with the app."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time

from ..cluster.join_options import options_from_args
from ..config import engine_config
from ..startup import start
from .auth import listen_problem, token_from
from .info import engine_info
from .server import EngineService, make_server

logger = logging.getLogger("sdxl_jax.service")

#: Seconds a stopping engine gives its running request to end at its next step and answer.
STOP_GRACE_S = 5.0


def serve(args: argparse.Namespace) -> int:
    """Run the engine service as `args` (the serve subcommand's options) ask; the process's exit status."""
    config = engine_config(args)
    token = token_from(args.engine_token)
    serves = args.process_id in (None, 0)  # process 0 (or the only one) serves; the others follow
    if serves and (problem := listen_problem(args.host, token)):
        print(f"python -m pipeline serve: error: {problem}", file=sys.stderr)
        return 2
    service = EngineService(token)
    server = None
    if serves:
        try:
            server = make_server(args.host, args.port, service)
        except OSError as exc:
            print(
                f"python -m pipeline serve: error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 2
        threading.Thread(target=server.serve_forever, name="engine-http", daemon=True).start()
        logger.info("listening on http://%s:%d/ (ready once warm: /readyz)", args.host, args.port)
    started = start(config, options_from_args(args), precompiled=args.precompiled)  # pipeline/startup.py
    cluster, generator = started.cluster, started.engine
    if not cluster.is_leader:
        service.following(cluster.process_index)  # its probes answer (a LeaderWorkerSet's workers have them too)
        try:
            return cluster.follow(generator)
        finally:
            _stop(service, server)
    service.ready(cluster.lead(generator), engine_info(generator, cluster.process_count))
    logger.info(
        "engine ready: %s, %d images per request; serving on http://%s:%d/",
        generator.device_summary,
        generator.num_images,
        args.host,
        args.port,
    )
    print(f"Serving the engine on http://{args.host}:{args.port}/", flush=True)
    try:
        _wait_for_signal()
    finally:
        _stop(service, server)
        cluster.stop()  # STOP to the followers (a no-op on one process)
    return 0


def _wait_for_signal() -> None:
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


def _stop(service: EngineService, server) -> None:
    """Refuse new requests, let a running one stop at its next step and answer, then close the listener."""
    service.stopping.set()
    if service.try_begin():  # nothing was running
        service.end()
    else:
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and not service.try_begin():
            time.sleep(0.05)
    if server is not None:
        server.shutdown()
        server.server_close()
    logger.info("engine service stopped")
