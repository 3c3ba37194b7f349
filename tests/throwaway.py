"""Throwaway servers for the tests: a PostgreSQL cluster in a temporary folder, HAProxy on a loopback port.

Both are the machine's own (Debian's PostgreSQL 15 and haproxy packages; `.ci/run` installs them). Where one is
missing the tests that need it skip with the reason, except under CI=true, where they fail: CI must run them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

#: Where Debian puts PostgreSQL's server programs (initdb, pg_ctl are not on PATH).
POSTGRES_BINS = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
START_TIMEOUT_S = 300


def missing(what: str) -> None:
    """Skip (on a developer machine) or fail (CI=true): `what` is absent."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing, and CI must run this test (.ci/run installs it)")
    pytest.skip(f"{what} is missing")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = START_TIMEOUT_S) -> None:
    """Until something listens on 127.0.0.1:`port` (or `process` died: its output is the failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            out = process.stdout.read() if process.stdout else ""
            raise RuntimeError(f"exited with {process.returncode} before listening:\n{out}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listened on port {port} within {timeout} s")


class ThrowawayPostgres:
    """A PostgreSQL cluster in a temporary folder, on a Unix socket only (no TCP), trust authentication.

    initdb refuses to run as root, so as root it runs as the `postgres` user (`runuser -u postgres --`).
    """

    def __init__(self) -> None:
        if not POSTGRES_BINS:
            missing("PostgreSQL (/usr/lib/postgresql/*/bin)")
        self.bin = Path(POSTGRES_BINS[-1])
        as_root = os.geteuid() == 0
        if as_root and not shutil.which("runuser"):
            missing("runuser (to run PostgreSQL as the postgres user)")
        self._prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
        self.root = Path(tempfile.mkdtemp(prefix="sdxl-pg-"))
        if as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self.data, self.socket_dir, self.port = self.root / "data", self.root, free_port()
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        options = f"-k {self.socket_dir} -c listen_addresses='' -p {self.port} -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "-t", "300", "start"
        )

    def url(self, database: str = "postgres") -> str:
        """The URL the app takes (`--database-url`): psycopg over the Unix socket."""
        return f"postgresql://postgres@/{database}?host={self.socket_dir}&port={self.port}"

    def new_database(self) -> str:
        """A fresh, empty database's URL (one per test: no test sees another's rows)."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(host=str(self.socket_dir), port=self.port, user="postgres", autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        subprocess.run(
            [*self._prefix, str(self.bin / program), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )


@contextlib.contextmanager
def haproxy(config: Path, pages: list[str]):
    """HAProxy running `config` (the shipped file) on a free loopback port in front of `pages` (host:port each);
    yields its URL."""
    program = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
    if program is None:
        missing("HAProxy (apt-get install haproxy)")
    port = free_port()
    env = {**os.environ, "SDXL_PROXY_BIND": f"127.0.0.1:{port}"}
    env.update({f"SDXL_PAGE_{i}": page for i, page in enumerate(pages, 1)})
    process = subprocess.Popen(
        [program, "-f", str(config), "-db"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for_port(port, process, timeout=60)
        yield f"http://127.0.0.1:{port}/"
    finally:
        _stop(process)


@contextlib.contextmanager
def nginx(config: Path, pages: list[str]):
    """nginx running `config` (the shipped file, its `listen` and `server` lines given loopback addresses) with a
    prefix in a temporary folder; yields its URL."""
    program = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if program is None:
        missing("nginx (apt-get install nginx)")
    port, text = free_port(), config.read_text()
    text = re.sub(r"listen \d+;", f"listen 127.0.0.1:{port};", text)
    for index, page in enumerate(pages, 1):
        text = re.sub(rf"server page{index}:\d+", f"server {page}", text)
    with tempfile.TemporaryDirectory(prefix="sdxl-nginx-") as prefix:
        os.chmod(prefix, 0o777)  # nginx's workers run as nobody when started as root
        (Path(prefix) / "nginx.conf").write_text(text)
        process = subprocess.Popen(
            [program, "-p", prefix, "-c", f"{prefix}/nginx.conf", "-g", "daemon off;"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_for_port(port, process, timeout=60)
            yield f"http://127.0.0.1:{port}/"
        finally:
            _stop(process)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 30 s."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
