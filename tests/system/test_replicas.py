"""Page replicas behind HAProxy (deploy/haproxy/haproxy.cfg, the shipped file; deploy/nginx/nginx.conf too) sharing
one PostgreSQL and one image store: a login keeps its replica (the sticky cookie), and what a user made through one
replica is in their history seen through the other. Real HAProxy and nginx, real PostgreSQL (tests/throwaway.py),
the tiny engine; nothing mocked.

The two replicas are two pages launched in this process around the session's engine: each is its own Gradio app,
with its own queue and its own login tokens, as two `python app.py --database-url ...` processes would be.
"""

from __future__ import annotations

import contextlib
import time
import uuid

import httpx
import pytest
from conftest import REPO, run_python, served
from gradio_client import Client
from throwaway import haproxy, nginx

USER = ("ann", "ann-secret")
CONFIG = REPO / "deploy" / "haproxy" / "haproxy.cfg"
NGINX_CONFIG = REPO / "deploy" / "nginx" / "nginx.conf"
#: Seconds for a finished request's entry to reach the database (written in the background after its PNGs).
LANDS_WITHIN_S = 120


@pytest.fixture(scope="module")
def replicas(ui_engine, postgres, tmp_path_factory):
    """Two pages with logins, one database, one image store."""
    from web.history.tab import History

    # The images in an object store both replicas reach: fsspec's memory:// is one per process, as a bucket is one
    # per deployment (a shared directory is tested with two stores in tests/web/test_history_store.py).
    database, images = postgres.new_database(), f"memory://replicas-{uuid.uuid4().hex}"
    with contextlib.ExitStack() as stack:
        pages = []
        for name in ("a", "b"):
            history = History.for_server(
                tmp_path_factory.mktemp(f"data-{name}"),
                logins=True,
                max_entries=None,
                database_url=database,
                image_store=images,
            )
            pages.append(stack.enter_context(served(ui_engine, auth=[USER], history=history)))
        yield pages


@pytest.fixture(scope="module")
def proxy(replicas):
    addresses = [page.local_url.removeprefix("http://").rstrip("/") for page in replicas]
    with haproxy(CONFIG, addresses) as url:
        _wait_until_both_up(url)
        yield url


def _wait_until_both_up(url: str) -> None:
    """Until HAProxy's health checks have seen both replicas (two fresh visitors land on two replicas)."""
    deadline = time.monotonic() + 60
    while True:
        seen = {httpx.get(url, timeout=30).cookies.get("SDXL_PAGE") for _ in range(2)}
        if seen == {"page1", "page2"} or time.monotonic() > deadline:
            return
        time.sleep(0.5)


def test_a_login_sticks_to_its_replica_and_history_is_shared(proxy, tmp_path):
    first, second = (
        Client(proxy, auth=USER, verbose=False, download_files=str(tmp_path / name)) for name in ("first", "second")
    )
    # Each login landed on a replica and holds HAProxy's cookie naming it: two visitors, two replicas.
    assert {first.cookies["SDXL_PAGE"], second.cookies["SDXL_PAGE"]} == {"page1", "page2"}
    token = {name: value for name, value in first.cookies.items() if name != "SDXL_PAGE"}
    # With the sticky cookie every call reaches the replica that knows the login ...
    assert [httpx.get(f"{proxy}config", cookies=first.cookies).status_code for _ in range(4)] == [200] * 4
    # ... without it (each call a new visitor), round robin sends some to the other replica, which never saw it.
    assert 401 in [httpx.get(f"{proxy}config", cookies=token).status_code for _ in range(4)]
    _made_on_one_replica_seen_on_the_other(proxy, first, second, "a lighthouse made on one replica")


def test_nginx_keeps_a_login_on_its_replica_too(replicas, tmp_path):
    """deploy/nginx/nginx.conf (its addresses put in): a route cookie hashed to one replica."""
    addresses = [page.local_url.removeprefix("http://").rstrip("/") for page in replicas]
    with nginx(NGINX_CONFIG, addresses) as proxy:
        logins = {}  # replica (the login cookie's name, one per Gradio app) -> cookies of a login that landed there
        for route in range(64):
            answer = httpx.post(
                f"{proxy}login",
                data=dict(zip(("username", "password"), USER, strict=True)),
                cookies={"sdxl_route": f"r{route}"},
                timeout=60,
            )
            assert answer.status_code == 200 and answer.cookies["sdxl_route"] == f"r{route}"
            replica = min(name for name in answer.cookies if name.startswith("access-token"))
            logins.setdefault(replica, dict(answer.cookies))
            if len(logins) == 2:
                break
        assert len(logins) == 2, "every route went to one replica"
        mine, theirs = logins.values()
        assert [httpx.get(f"{proxy}config", cookies=mine).status_code for _ in range(4)] == [200] * 4
        elsewhere = {**mine, "sdxl_route": theirs["sdxl_route"]}  # this login, the other replica's route
        assert httpx.get(f"{proxy}config", cookies=elsewhere).status_code == 401
        first, second = (
            Client(
                proxy,
                verbose=False,
                httpx_kwargs={"cookies": cookies, "timeout": 600},
                download_files=str(tmp_path / name),
            )
            for name, cookies in (("first", mine), ("second", theirs))
        )
        _made_on_one_replica_seen_on_the_other(proxy, first, second, "a windmill made behind nginx")


def _made_on_one_replica_seen_on_the_other(proxy: str, first: Client, second: Client, prompt: str) -> None:
    """A request through `first`'s replica is in the history seen through `second`'s, its PNG served there."""
    before = {entry["id"] for entry in second.predict(api_name="/history")}
    first.predict(prompt, seed=5, randomize_seed=False, steps=2, api_name="/generate")
    deadline = time.monotonic() + LANDS_WITHIN_S
    while time.monotonic() < deadline:
        listed = [entry for entry in second.predict(api_name="/history") if entry["id"] not in before]
        if listed:
            break
        time.sleep(0.5)  # the entry is written in the background once its PNGs are
    assert [entry["prompt"] for entry in listed] == [prompt]
    assert listed[0]["seed"] == 5 and listed[0]["images"][0].startswith(proxy)  # URLs as the proxy is reached
    assert listed[0]["id"] in [e["id"] for e in first.predict(api_name="/history")]
    image = httpx.get(listed[0]["images"][0], cookies=second.cookies, timeout=60)
    assert image.status_code == 200 and image.content[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.headers["content-type"] == "image/png" and prompt.encode() in image.content
    thumbnail = httpx.get(listed[0]["thumbnails"][0], cookies=second.cookies, timeout=60)
    assert thumbnail.headers["content-type"] == "image/jpeg" and thumbnail.content[:3] == b"\xff\xd8\xff"
    assert httpx.get(listed[0]["images"][0], timeout=60).status_code == 404  # no login: nothing


def test_the_app_takes_its_history_storage_from_the_options(tmp_path):
    """`python app.py --database-url` reaches the store before any model loads: an unreachable database is one
    line (its password hidden) and exit status 2."""
    socket_dir = tmp_path / "no-server-here"
    result = run_python(
        "app.py",
        "--model",
        "tiny",
        "--auth",
        "ann:pw",
        "--data-dir",
        str(tmp_path / "data"),
        env={
            "SDXL_DATABASE_URL": f"postgresql://sdxl:hunter2@/sdxl?host={socket_dir}",
            "SDXL_IMAGE_STORE": str(tmp_path / "images"),
        },
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("app.py: error:")]
    assert len(lines) == 1 and "cannot open the history database" in lines[0], result.stderr
    assert "hunter2" not in result.stderr + result.stdout and "Traceback" not in result.stderr
