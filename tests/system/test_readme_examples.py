"""The Python examples of the README and docs/ run as written against the server their first line names (issue 26:
an example asked the first-screen server for a size it does not offer; issue 68: an example iterated previews it
had not asked for, another imported packages requirements.txt does not install).

Every ```python block of README.md and docs/*.md either starts with `# server: python app.py ...` and is run, or is
listed in NOT_RUN with the reason; a new block that is neither fails `test_every_python_block_is_run_or_excused`.
A run block gets that server, started in this process the way app.py does (its options, its engine start, its
history, its page) on a free port, once per module for each command; the block runs with only the address changed,
and gradio_client downloads into the test's tmp_path instead of the system's temporary folder (what the docs tell a
user to do to clean up).

The docs' servers are small on purpose: `--model tiny --sizes 64x64,224x128` and tiny-pt (the same architecture) at
64x64 on the test process's 8 devices run the session `engine`'s programs and, at 224x128, `ui_engine`'s one-window
ones, so JAX's cache serves all but a few of them (the 3-window steps at 224x128, the LoRA merge) to whichever comes
second; `--model tiny` (three sizes) and 128x128 were 63 programs of their own, 3 CPU minutes.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex

import pytest
from conftest import REPO, clients_download_into, free_port

DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
API_PAGE = REPO / "docs" / "api.md"
SERVER = "# server: python app.py "
ADDRESS = "http://127.0.0.1:7860/"

pytestmark = pytest.mark.slow


def blocks_of(page) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S)


#: Blocks not run, by page and the start of their first line, with the reason: what they need that a test lacks.
NOT_RUN = {
    (
        "docs/apis.md",
        "# a sketch, not run by the tests (photo.png, mask.png: yours)",
    ): "an image edit of the reader's own photo.png and mask.png; the OpenAI edits run in tests/web/test_apis.py"
}


def excused(source: str, block: str) -> tuple[str, str] | None:
    """The NOT_RUN entry of `block` of page `source`, if any."""
    return next((key for key in NOT_RUN if key[0] == source and block.startswith(key[1])), None)


def python_blocks() -> list[tuple[str, str]]:
    """(page, block) for every block of the README and docs/ that names its server."""
    return [
        (page.relative_to(REPO).as_posix(), block)
        for page in DOCS
        for block in blocks_of(page)
        if block.startswith(SERVER)
    ]


def test_every_python_block_is_run_or_excused():
    """Each block names its server (and is run) or is in NOT_RUN with a reason; every NOT_RUN entry is a block."""
    assert len(python_blocks()) >= 3
    every = [(page.relative_to(REPO).as_posix(), block) for page in DOCS for block in blocks_of(page)]
    for source, block in every:
        assert block.startswith(SERVER) or excused(source, block), (
            f"a python block of {source} neither names its server nor is in NOT_RUN: {block[:200]}"
        )
    found = {excused(source, block) for source, block in every} - {None}
    assert found == set(NOT_RUN), f"NOT_RUN names blocks the docs no longer have: {set(NOT_RUN) - found}"
    for block in blocks_of(REPO / "README.md") + blocks_of(API_PAGE):
        assert block.startswith(SERVER) and ADDRESS in block, block[:200]
    for _, block in python_blocks():
        assert ADDRESS in block, block[:200]


@contextlib.contextmanager
def app_server(argv: list[str]):
    """What `python app.py ARGV` serves, started as app.main starts it, in this process."""
    from app import start_cluster_and_engine
    from web.apis import ApiAccess, attach_apis
    from web.history.store import default_data_dir
    from web.history.tab import History
    from web.options import parse_args
    from web.page.layout import build_page

    args = parse_args([*argv, "--cpu-devices", "0"])  # the test process's 8 virtual devices stand for the machine's
    history = History.off()
    if not args.no_history:
        history = History.for_server(
            args.data_dir or default_data_dir(), logins=bool(args.auth), max_entries=args.history_max
        )
    _, engine = start_cluster_and_engine(args)
    page = build_page(engine, queue_size=args.queue_size, progress=not args.no_progress, history=history)
    try:
        apis = attach_apis(page, ApiAccess.from_args(args))  # as app.py: the A1111, OpenAI and MCP APIs
        page.launch(port=free_port(), prevent_thread_lock=True, quiet=True, auth=args.auth, **apis)
        yield page
    finally:
        page.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The servers the blocks name, each started once (two blocks naming the same command share it), in the
    repository (the README's paths are the repository's), each with its own data home (the default --data-dir)."""
    started: dict[tuple[str, ...], object] = {}
    with contextlib.ExitStack() as stack, pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)

        def server(argv: list[str]):
            if tuple(argv) not in started:
                patch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data")))
                started[tuple(argv)] = stack.enter_context(app_server(argv))
            return started[tuple(argv)]

        yield server


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_example_runs_against_its_server(index, servers, tmp_path):
    source, block = python_blocks()[index]
    page = servers(shlex.split(block.splitlines()[0].removeprefix(SERVER)))
    code = block.replace(ADDRESS, page.local_url)
    printed = io.StringIO()
    # The examples' clients download where gradio_client puts files by default ($TMPDIR/gradio): here, tmp_path.
    downloads = tmp_path / "downloads"
    with contextlib.redirect_stdout(printed), clients_download_into(downloads):
        exec(compile(code, f"{source} python block {index}", "exec"), {"__name__": "readme_example"})  # noqa: S102
    output = printed.getvalue()
    assert "images in" in output, output
    if "in job:" in block:  # iterating a job shows its previews (it asked for them), then the answer
        assert re.search(r"^step \d+ / \d+", output, re.M), output
    if "gradio_client" in block:  # what it fetched is under tmp_path, not in the system's temporary folder
        assert any(path.is_file() for path in downloads.rglob("*")), output
    print(output)
