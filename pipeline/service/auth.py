"""The engine's bearer token: who may call it, and where it may listen without one.

A token is required to listen on anything but a loopback address: an engine holds accelerators, and whoever reaches
it can keep them busy. `/healthz` stays open (a Kubernetes liveness probe sends no header).
"""

from __future__ import annotations

import hmac
import ipaddress

#: The environment variable the token is read from when --engine-token is not given (its row: command_line.py).
TOKEN_ENV = "SDXL_ENGINE_TOKEN"
#: Paths served without a token.
OPEN_PATHS = frozenset({"/healthz"})


def is_loopback(host: str) -> bool:
    """Whether `host` (what --host names) only accepts connections from this machine."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def listen_problem(host: str, token: str | None) -> str | None:
    """One sentence when the engine must not listen on `host` as asked (no token off loopback), else None."""
    if token or is_loopback(host):
        return None
    return (
        f"--host {host} accepts connections from other machines: give a token with --engine-token or "
        f"{TOKEN_ENV} (the page then sends it with SDXL_ENGINE_TOKEN too)"
    )


def authorized(header: str | None, token: str | None) -> bool:
    """Whether an `Authorization` header carries the token (always, when the engine has none)."""
    if not token:
        return True
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def token_from(given: str | None) -> str | None:
    """The token --engine-token gave (the flag, else TOKEN_ENV, read by the options table); None when empty."""
    return given.strip() or None if given else None
