"""`python -m pipeline serve`'s command line: the app's engine options (pipeline/options.py, read as the app reads
them: `options.programs_of`) plus where the service listens and its token, declared here in the same style and
printed in docs/options.md's table with the others. Kept free of JAX."""

from __future__ import annotations

import argparse

from ..options import APP, OPTIONS, SERVE, Option, Parser, add_options, port_number
from .auth import TOKEN_ENV

#: The engine service's port when none is given.
DEFAULT_PORT = 7870

#: The token is taken by the service and by the page in front (web/options.py's ALL_OPTIONS holds this table).
ENGINE_TOKEN = Option(
    "--engine-token",
    "bearer token every engine endpoint but /healthz requires (the page sends "
    "it to its engines); required to listen on a non-loopback address",
    TOKEN_ENV,
    metavar="TOKEN",
    programs=frozenset({APP, SERVE}),
)

SERVICE_OPTIONS: tuple[Option, ...] = (
    Option(
        "--host",
        "interface the engine listens on; a non-loopback one needs --engine-token",
        "SDXL_ENGINE_HOST",
        default="127.0.0.1",
        programs=frozenset({SERVE}),
    ),
    Option(
        "--port",
        "port of the engine's HTTP API",
        "SDXL_ENGINE_PORT",
        port_number,
        DEFAULT_PORT,
        programs=frozenset({SERVE}),
    ),
    ENGINE_TOKEN,
)


def add_service_options(parser: argparse.ArgumentParser) -> None:
    """The serve subcommand's options: the app's engine options, then the service's own."""
    add_options(parser, SERVE, OPTIONS + SERVICE_OPTIONS)


def build_serve_parser(commands) -> Parser:
    """Add `serve` to the CLI's subcommands."""
    serve = commands.add_parser(
        "serve",
        help="serve the engine over HTTP (/v1/generate, /v1/info, /healthz, /readyz, /metrics) for pages in front",
        description="Loads, compiles and warms up the engine as the app does, then serves it over HTTP; each option "
        "can also be set by the environment variable in brackets; the flag wins.",
    )
    add_service_options(serve)
    return serve
