"""The APIs' switches and MCP's shape, without an engine: what the start-up log says about a reachable page, what a
switched-off API answers (its own error shape, the flag named), MCP tools named as their endpoints, and MCP answers
that carry the images themselves and no path on the server."""

from __future__ import annotations

import base64
import json
import logging

import gradio as gr
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from web.apis import OFF_STATUS, switched_off_routes
from web.apis.auth import APIS_OFF, ApiAccess
from web.apis.mcp import mcp_content, name_tools


def test_a_reachable_page_without_logins_is_said_with_the_apis_off_and_how_to_turn_them_on():
    notes = ApiAccess(host="0.0.0.0").startup_notes()
    assert [level for level, _ in notes] == [logging.WARNING, logging.INFO]
    assert "open on every interface without a login" in notes[0][1] and "--auth" in notes[0][1]
    assert notes[1][1] == APIS_OFF and "--api (SDXL_API=1)" in APIS_OFF
    assert [line for _, line in ApiAccess(host="0.0.0.0", api=True).startup_notes()] == [notes[0][1]]
    assert ApiAccess(host="0.0.0.0", logins=(("a", "b"),)).startup_notes() == []  # a login: nothing to say
    assert ApiAccess(host="127.0.0.1").startup_notes() == []  # this machine only: APIs on, nothing open
    assert "open on 10.1.2.3 without" in ApiAccess(host="10.1.2.3", keys=("k",)).startup_notes()[0][1]


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/sdapi/v1/txt2img"), ("GET", "/sdapi/v1/options"), ("GET", "/sdapi/v1/no-such-endpoint")],
)
def test_a_switched_off_a1111_api_answers_one_sentence_in_its_shape(method, path):
    answer = TestClient(Starlette(routes=switched_off_routes())).request(method, path, json={"prompt": "x"})
    assert answer.status_code == OFF_STATUS == 403
    assert answer.json()["detail"] == APIS_OFF


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/v1/images/generations"), ("POST", "/v1/images/edits"), ("GET", "/v1/models")]
)
def test_a_switched_off_openai_api_answers_one_sentence_in_its_shape(method, path):
    answer = TestClient(Starlette(routes=switched_off_routes())).request(method, path)
    assert answer.status_code == OFF_STATUS
    assert answer.json()["error"]["message"] == APIS_OFF and answer.json()["error"]["type"] == "permission_error"


def test_mcp_tools_are_named_as_their_endpoints():
    from gradio.mcp import GradioMCPServer

    def answer(prompt: str) -> str:
        """Make something."""
        return prompt

    def refuse(limit: int = 100) -> list:
        """List something."""
        return []

    with gr.Blocks() as blocks:
        text, number, out = gr.Textbox(), gr.Number(), gr.JSON()
        gr.Button().click(answer, text, out, api_name="generate_png")
        gr.Button().click(refuse, number, out, api_name="history")
        gr.Button().click(answer, text, out, api_name="hidden", api_visibility="private")
    assert name_tools(blocks) == ["generate_png", "history"]
    assert sorted(GradioMCPServer(blocks).tool_to_endpoint) == ["generate_png", "history"]


def file_record(path) -> dict:
    """A file as Gradio's API hands it over (its cache path and its /gradio_api/file= URL)."""
    return {
        "path": str(path),
        "url": f"http://h:7860/gradio_api/file={path}",
        "size": None,
        "orig_name": path.name,
        "mime_type": None,
        "is_stream": False,
        "meta": {"_type": "gradio.FileData"},
    }


@pytest.mark.parametrize("shape", ["client", "stream"])
def test_mcp_answers_carry_the_images_and_no_server_path(tmp_path, shape):
    jpeg, png = tmp_path / "gradio" / "a.jpg", tmp_path / "gradio" / "b.png"
    jpeg.parent.mkdir()
    jpeg.write_bytes(b"\xff\xd8jpeg bytes")
    png.write_bytes(b"\x89PNG png bytes")
    gallery = [{"image": file_record(jpeg), "caption": "seed 5 · 64×64"}, {"image": file_record(png), "caption": None}]
    outputs = [gallery, 5, "2 images in 1.0 s · seed 5"]
    # gradio_client's answer (a tuple of the outputs, in a list) or the stream's final message (the outputs' list)
    content = mcp_content([tuple(outputs)] if shape == "client" else outputs)
    assert [item.type for item in content] == ["image", "text", "image", "text", "text"]
    assert base64.b64decode(content[0].data) == jpeg.read_bytes() and content[0].mimeType == "image/jpeg"
    assert base64.b64decode(content[2].data) == png.read_bytes() and content[2].mimeType == "image/png"
    assert [item.text for item in content if item.type == "text"] == ["seed 5 · 64×64", "5", outputs[2]]
    said = json.dumps([item.model_dump() for item in content])
    assert str(tmp_path) not in said and "gradio_api/file" not in said


def test_mcp_answers_say_json_as_json_and_a_missing_image_without_its_path(tmp_path):
    listing = [{"id": "e1", "images": ["http://h/history/e1/0.png"]}]
    assert json.loads(mcp_content([listing])[0].text) == listing
    gone = mcp_content([[{"image": file_record(tmp_path / "gone.png"), "caption": ""}]])
    assert [item.type for item in gone] == ["text"] and str(tmp_path) not in gone[0].text
