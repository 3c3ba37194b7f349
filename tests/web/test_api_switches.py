"""The APIs' switches, without an engine: what the start-up log says about a reachable page, and what a switched-off
API answers (its own error shape, the flag named)."""

from __future__ import annotations

import logging

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from web.apis import OFF_STATUS, switched_off_routes
from web.apis.auth import APIS_OFF, ApiAccess


def test_a_reachable_page_without_logins_is_said_with_the_apis_off_and_how_to_turn_them_on():
    notes = ApiAccess(host="0.0.0.0").startup_notes()
    assert [level for level, _ in notes] == [logging.WARNING, logging.INFO]
    assert "open on every interface without a login" in notes[0][1] and "--auth" in notes[0][1]
    assert notes[1][1] == APIS_OFF and "--api (SDXL_API=1)" in APIS_OFF
    assert [line for _, line in ApiAccess(host="0.0.0.0", api=True).startup_notes()] == [notes[0][1]]
    assert ApiAccess(host="0.0.0.0", logins=(("a", "b"),)).startup_notes() == []  # a login: nothing to say
    assert ApiAccess(host="127.0.0.1").startup_notes() == []  # this machine only: APIs on, nothing open
    assert "open on 10.1.2.3 without" in ApiAccess(host="10.1.2.3", keys=("k",)).startup_notes()[0][1]


@pytest.mark.parametrize(("method", "path"), [("POST", "/sdapi/v1/txt2img"), ("GET", "/sdapi/v1/options"),
                                              ("GET", "/sdapi/v1/no-such-endpoint")])  # fmt: skip
def test_a_switched_off_a1111_api_answers_one_sentence_in_its_shape(method, path):
    answer = TestClient(Starlette(routes=switched_off_routes())).request(method, path, json={"prompt": "x"})
    assert answer.status_code == OFF_STATUS == 403
    assert answer.json()["detail"] == APIS_OFF


@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/images/generations"), ("POST", "/v1/images/edits"),
                                              ("GET", "/v1/models")])  # fmt: skip
def test_a_switched_off_openai_api_answers_one_sentence_in_its_shape(method, path):
    answer = TestClient(Starlette(routes=switched_off_routes())).request(method, path)
    assert answer.status_code == OFF_STATUS
    assert answer.json()["error"]["message"] == APIS_OFF and answer.json()["error"]["type"] == "permission_error"
