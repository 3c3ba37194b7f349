"""The page behind Gradio's login (`--auth`), and what an API user of it sees: the login page's title, named outputs,
a capped long-prompt warning, a prompt box that never cuts silently. Real server, real tiny model; nothing mocked."""

from __future__ import annotations

import httpx
import pytest
from conftest import served
from gradio_client import Client
from gradio_client.exceptions import AppError

from web.page.texts import TITLE

LOGIN = ("ada", "s3cret:with-colon")


@pytest.fixture(scope="module")
def locked_page(engine):
    """The session's 8-device tiny engine behind Gradio's login."""
    with served(engine, auth=[LOGIN, ("bob", "pw")], logins=True) as page:
        yield page


@pytest.fixture(scope="module")
def client(locked_page, tmp_path_factory):
    return Client(locked_page.local_url, auth=LOGIN, verbose=False, download_files=str(tmp_path_factory.mktemp("dl")))


def test_login_is_required(locked_page, client):
    base = locked_page.local_url.rstrip("/")
    assert httpx.get(base + "/config").status_code == 401
    assert httpx.post(base + "/login", data={"username": LOGIN[0], "password": "wrong"}).status_code == 400
    with pytest.raises(Exception):  # noqa: B017  gradio_client cannot even read the API without the login
        Client(locked_page.local_url, verbose=False, download_files=False)
    gallery, seed, status = client.predict(prompt="a red kite", seed=3, randomize_seed=False, api_name="/generate")
    assert len(gallery) == 8 and seed == 3 and status.startswith("8 images in ")


def test_log_out_forgets_the_login(locked_page):
    """The page's Log out button goes to Gradio's /logout, which drops the session: the login is asked again."""
    buttons = [c["props"] for c in locked_page.demo.config["components"] if c["props"].get("elem_id") == "logout"]
    assert buttons and buttons[0]["link"] == "logout" and buttons[0]["value"] == "Log out"
    base = locked_page.local_url.rstrip("/")
    with httpx.Client(base_url=base) as browser:
        # bob: /logout ends every session of its user (ada's client serves the other tests)
        assert browser.post("/login", data={"username": "bob", "password": "pw"}).status_code == 200
        assert browser.get("/config").status_code == 200
        assert browser.get("/logout", follow_redirects=False).status_code == 302
        assert browser.get("/config").status_code == 401


def test_login_page_has_the_title(locked_page):
    reply = httpx.get(locked_page.local_url.rstrip("/") + "/gradio_api/login_check")  # what the login page reads
    assert reply.status_code == 401 and TITLE in reply.json()["detail"]["auth_message"]


def test_api_outputs_are_named_as_in_the_readme(client):
    returns = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["returns"]
    assert [r["label"] for r in returns][2] == "status"


def test_long_prompt_warning_is_capped(client):
    words = [f"word{i}" for i in range(150)]
    _, _, status = client.predict(prompt=" ".join(words), api_name="/generate")
    warning = status.splitlines()[-1]
    assert "⚠️" in warning and " more words." in warning
    assert "word149" not in warning and len(warning) < 200, warning


def test_prompt_box_does_not_cut_and_the_limit_is_said(client, locked_page):
    config = locked_page.demo.get_config_file()
    prompt_box = next(c for c in config["components"] if c["props"].get("elem_id") == "prompt")
    assert prompt_box["props"].get("max_length") is None  # no silent cut in the browser
    with pytest.raises(AppError, match=r"Prompt is too long: 2,001 characters; the limit is 2,000."):
        client.predict(prompt="x" * 2001, api_name="/generate")
