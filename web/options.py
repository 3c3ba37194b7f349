"""The web server's own options (the app takes these beside the engine's, `pipeline/options.py`, and the engine
service's token, `pipeline/service/command_line.py`) and those of `python -m web.history.migrate`, declared once,
and the app's command line read from them.

    python -m web.options          # prints docs/options.md's table of every option: engine, service, server, tools
"""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Sequence

from pipeline.config import engine_config
from pipeline.contract.errors import InvalidInput
from pipeline.options import (
    APP,
    OPTIONS,
    Option,
    Parser,
    add_options,
    at_least_one,
    check_env_choices,
    markdown_table,
    port_number,
)
from pipeline.service.command_line import SERVICE_OPTIONS

from .engines.pool import parse_engine_url

#: Where the page listens by default (also `web/serving/server.launch`'s, for Python callers).
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 7860
#: Requests that may wait in the app's queue by default.
DEFAULT_QUEUE_SIZE = 20
#: Entries one user keeps by default (`--history-max`, web/history/store.py); adding one more removes the oldest with
#: its files. Declared here, not in web/history/store.py: reading the command line imports no database library
#: (SQLAlchemy, 1 s).
DEFAULT_MAX_ENTRIES = 500
_APP = frozenset({APP})
#: `python -m web.history.migrate`: a one-process history moved to the storage page replicas share.
MIGRATE = "migrate"

#: The server's options. Order is the order of --help, after the engine's.
SERVER_OPTIONS: tuple[Option, ...] = (
    Option(
        "--no-progress",
        "no live step progress on the page (reported by the host between steps; the programs are the same)",
        "SDXL_NO_PROGRESS",
        kind="switch",
        programs=_APP,
    ),
    Option(
        "--host",
        "interface to bind; 0.0.0.0 to accept remote connections",
        "GRADIO_SERVER_NAME",
        default=DEFAULT_HOST,
        programs=_APP,
    ),
    Option(
        "--port",
        "port to listen on (checked before the model loads)",
        "GRADIO_SERVER_PORT",
        port_number,
        DEFAULT_PORT,
        programs=_APP,
    ),
    Option(
        "--queue-size",
        "requests that may wait; more are turned away as busy",
        "SDXL_QUEUE_SIZE",
        at_least_one,
        DEFAULT_QUEUE_SIZE,
        programs=_APP,
    ),
    Option(
        "--prompt-filter",
        "block list, one word or phrase a line (see assets/blocked_words.example.txt)",
        "SDXL_PROMPT_FILTER",
        metavar="FILE",
        programs=_APP,
    ),
    Option(
        "--auth",
        "require this login (repeat for more users)",
        "SDXL_AUTH",
        kind="append",
        metavar="USER:PASSWORD",
        programs=_APP,
    ),
    Option(
        "--auth-file",
        "require a login from this file, one USER:PASSWORD a line",
        "SDXL_AUTH_FILE",
        metavar="FILE",
        programs=_APP,
    ),
    Option(
        "--data-dir",
        "where past generations are kept: with logins, each user's (a SQLite database and the "
        "images); without, only the key that lets browsers read their own history after a restart",
        "SDXL_DATA_DIR",
        metavar="DIR",
        default_text="$XDG_DATA_HOME/sdxl-jax (~/.local/share/sdxl-jax)",
        programs=_APP,
    ),
    Option(
        "--database-url",
        "where the history's rows live: postgresql://USER:PASSWORD@HOST/DB for page replicas "
        "that share one history (SQLAlchemy 2 + psycopg 3); SQLite in --data-dir when not given",
        "SDXL_DATABASE_URL",
        metavar="URL",
        default_text="sqlite:///DATA_DIR/history.sqlite3",
        programs=_APP,
    ),
    Option(
        "--image-store",
        "where the history's images live: a directory (a volume the replicas share) or an "
        "fsspec URL such as s3://BUCKET/PATH or gs://BUCKET/PATH (its package, s3fs or gcsfs, installed)",
        "SDXL_IMAGE_STORE",
        metavar="PLACE",
        default_text="--data-dir",
        programs=_APP,
    ),
    Option(
        "--history-max",
        "past generations kept per user; one more removes the oldest with its files",
        "SDXL_HISTORY_MAX",
        at_least_one,
        DEFAULT_MAX_ENTRIES,
        metavar="N",
        programs=_APP,
    ),
    Option(
        "--no-history",
        "keep no past generations (no History tab, no /history)",
        "SDXL_NO_HISTORY",
        kind="switch",
        programs=_APP,
    ),
    Option("--share", "also open a public *.gradio.live link (needs internet)", kind="switch", programs=_APP),
    Option(
        "--engine",
        "serve the page in front of this engine service (`python -m pipeline serve`; repeat for more; "
        "a name resolving to several addresses counts as each): no model is loaded here, no JAX",
        "SDXL_ENGINES",
        kind="append",
        metavar="URL",
        programs=_APP,
        env_list=True,
    ),
    Option(
        "--api",
        "serve the A1111 (/sdapi/v1) and OpenAI (/v1/images) APIs on a reachable --host without "
        "--auth (on 127.0.0.1, or with --auth or --api-key, they are served anyway; docs/apis.md)",
        "SDXL_API",
        kind="switch",
        programs=_APP,
    ),
    Option(
        "--api-key",
        "a bearer key the OpenAI API and MCP accept (repeat for more); with keys they require one",
        "SDXL_API_KEY",
        kind="append",
        metavar="KEY",
        programs=_APP,
    ),
    Option(
        "--mcp",
        "also serve the page's API as MCP tools: generate, generate_png, history (Gradio's MCP server, "
        "/gradio_api/mcp/)",
        "SDXL_MCP",
        kind="switch",
        programs=_APP,
    ),
)

#: `python -m web.history.migrate`'s: the history to copy and where it goes (the page's flags, another meaning).
MIGRATE_OPTIONS: tuple[Option, ...] = (
    Option("--data-dir", "the data directory of the history to copy", required=True, programs=frozenset({MIGRATE})),
    Option(
        "--database-url",
        "postgresql://USER:PASSWORD@HOST/DB (no entries yet)",
        required=True,
        programs=frozenset({MIGRATE}),
    ),
    Option(
        "--image-store",
        "where the replicas keep the images",
        default_text="--data-dir itself",
        programs=frozenset({MIGRATE}),
    ),
)

#: Every option of every program: the app's parser and docs/options.md's table come from it.
ALL_OPTIONS: tuple[Option, ...] = OPTIONS + SERVER_OPTIONS + SERVICE_OPTIONS + MIGRATE_OPTIONS


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The app's command line, checked: the flags as given, plus `config` (the engine's settings, resolved: flags,
    else the preset's, else the model's) and `auth` (the logins). A problem exits with one line, status 2."""
    parser = Parser(
        prog="app.py",
        description="Serve Stable Diffusion XL with JAX in a Gradio web app. "
        "Each option can also be set by the environment variable in brackets; the flag wins.",
    )
    add_options(parser, APP, ALL_OPTIONS)
    args = parser.parse_args(argv)
    check_env_choices(parser, args, APP, ALL_OPTIONS)
    try:
        args.auth = read_auth(args.auth, args.auth_file)  # the flags, else SDXL_AUTH (`add_options` read it)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    try:
        args.engine = [parse_engine_url(url)[0] for url in args.engine]
    except ValueError as exc:
        parser.error(str(exc))
    args.api_key = [key for key in args.api_key if key]
    if any(not key.strip() or any(ord(char) < 33 for char in key) for key in args.api_key):
        parser.error("--api-key: a key must be printable text without spaces")
    try:
        args.config = engine_config(args)
    except InvalidInput as exc:
        parser.error(str(exc))
    return args


def read_auth(pairs: Sequence[object], path: str | None = None) -> list[tuple[str, str]]:
    """USER:PASSWORD pairs from flags/env and from a file (one a line, '#' comments) for Gradio's own login."""
    lines = [str(p) for p in pairs if p]
    if path:
        text = pathlib.Path(path).read_text(encoding="utf-8-sig")
        lines += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    logins = []
    for number, line in enumerate(lines, 1):
        user, sep, password = line.partition(":")
        if not (sep and user.strip() and password):
            where = f"{path}, login {number}" if path else f"login {number}"
            raise ValueError(f"{where}: expected USER:PASSWORD with both parts non-empty")  # never echo a password
        logins.append((user.strip(), password))
    return logins


if __name__ == "__main__":
    print(markdown_table(ALL_OPTIONS))
