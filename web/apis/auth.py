"""Who may use the HTTP APIs, and who a caller is (the A1111 interrupt stops only the caller's own requests).

A1111's clients log in as A1111's `--api-auth` asks: HTTP Basic, here with the page's own logins (`--auth`). The
OpenAI clients and MCP send a bearer key (`--api-key`, several allowed). Without logins and on a loopback host the
APIs are open (A1111's and Gradio's defaults); on a reachable host without logins they are off unless `--api` says
so, so starting a public page never opens an unauthenticated API by accident.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import logging
from dataclasses import dataclass

from .queue_call import Refused

#: What a switched-off API answers (in its own error shape) and the start-up log says: why, and the flag.
APIS_OFF = (
    "The HTTP APIs (/sdapi/v1, /v1/images) are off: this server listens on a reachable host without --auth or "
    "--api-key; start it with --api (SDXL_API=1) to serve them without a login, or with --auth or --api-key."
)


@dataclass(frozen=True)
class ApiAccess:
    """The APIs' switches and secrets: `--api`, `--api-key`, `--auth`, `--mcp`, and the host served on."""

    logins: tuple[tuple[str, str], ...] = ()  # --auth: (user, password)
    keys: tuple[str, ...] = ()  # --api-key: bearer keys of the OpenAI API and MCP
    api: bool = False  # --api: serve the APIs on a reachable host without logins
    mcp: bool = False  # --mcp: Gradio's MCP server
    host: str = "127.0.0.1"

    @classmethod
    def from_args(cls, args) -> ApiAccess:
        return cls(
            logins=tuple(args.auth or ()),
            keys=tuple(args.api_key or ()),
            api=bool(args.api),
            mcp=bool(args.mcp),
            host=args.host,
        )

    @property
    def enabled(self) -> bool:
        """Whether the HTTP APIs are served at all."""
        return self.api or bool(self.logins) or bool(self.keys) or loopback(self.host)

    def startup_notes(self) -> list[tuple[int, str]]:
        """(log level, line) for the start-up log: a page any machine reaches without a login, and APIs left off."""
        notes = []
        if not self.logins and not loopback(self.host):
            where = "every interface" if self.host in ("0.0.0.0", "::", "") else self.host
            notes.append(
                (
                    logging.WARNING,
                    f"the page is open on {where} without a login: anyone who reaches this "
                    "port can generate; --auth USER:PASSWORD (SDXL_AUTH) or --auth-file asks "
                    "for one",
                )
            )
        if not self.enabled:
            notes.append((logging.INFO, APIS_OFF))
        return notes

    def a1111_caller(self, authorization: str | None, client_host: str) -> str:
        """The A1111 caller's identity; with logins, HTTP Basic with one of them (or a bearer key) or a 401."""
        user = self._basic_user(authorization)
        if user is not None:
            return f"user:{user}"
        key = self._key(authorization)
        if key is not None:
            return key
        if self.logins:
            raise Refused(401, "This server requires a login: send HTTP Basic credentials (--api-auth in A1111).")
        if self.keys and not (self.api or loopback(self.host)):  # keys alone on a reachable host: not open either
            raise Refused(401, "This server requires an API key: send it as 'Authorization: Bearer KEY'.")
        return f"host:{client_host}"

    def bearer_caller(self, authorization: str | None, client_host: str) -> str:
        """The OpenAI/MCP caller's identity; with keys or logins, a valid bearer key or a 401."""
        key = self._key(authorization)
        if key is not None:
            return key
        if self.keys or self.logins:
            raise Refused(401, "This server requires an API key: send it as 'Authorization: Bearer KEY'.")
        return f"host:{client_host}"

    def _basic_user(self, authorization: str | None) -> str | None:
        scheme, _, value = (authorization or "").partition(" ")
        if scheme.lower() != "basic" or not self.logins:
            return None
        try:
            user, _, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        for known, secret in self.logins:
            # both compared in constant time, every login tried: no timing says which part was wrong
            if hmac.compare_digest(known.encode(), user.encode()) & hmac.compare_digest(
                secret.encode(), password.encode()
            ):
                return known
        return None

    def _key(self, authorization: str | None) -> str | None:
        """ "key:<digest>" of a valid bearer key (never the key itself), else None."""
        scheme, _, value = (authorization or "").partition(" ")
        value = value.strip()
        if scheme.lower() != "bearer" or not value:
            return None
        if any(hmac.compare_digest(value.encode(), key.encode()) for key in self.keys):
            return "key:" + hashlib.sha256(value.encode()).hexdigest()[:16]
        return None


def loopback(host: str) -> bool:
    """Whether `host` (the --host bound) is reachable from this machine only."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
