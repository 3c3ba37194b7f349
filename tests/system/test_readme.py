"""The README and docs/, for users: their commands parse as written, the options table is the declaration's, the
status line is today's, the README stays a front door (short, its links alive), and the licences are said apart."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import tomllib

from conftest import REPO

from pipeline.__main__ import build_parser
from pipeline.config import engine_config
from pipeline.options import APP, markdown_table, options_for
from web.options import ALL_OPTIONS, parse_args

README = REPO / "README.md"
OPTIONS_PAGE = REPO / "docs" / "options.md"
RUN_PAGE = REPO / "docs" / "run.md"
API_PAGE = REPO / "docs" / "api.md"
#: What a user reads: the front door and the pages it links (commands and flags in any of them must work).
USER_DOCS = (README, *sorted((REPO / "docs").glob("*.md")))
#: Every page whose relative links must lead somewhere.
LINKED_DOCS = (*USER_DOCS, REPO / "bench" / "README.md", REPO / "bench" / "HISTORY.md", REPO / "pipeline" / "README.md")
README_MAX_LINES = 200  # a front door: pitch, the two commands, features, deploy, architecture, tests, licence, limits


def _generate_parser() -> argparse.ArgumentParser:
    return build_parser()._subparsers._group_actions[0].choices["generate"]


def test_the_docs_download_pytorch_weights_as_fp16_only():
    text = RUN_PAGE.read_text(encoding="utf-8")
    assert '--include "*.fp16.safetensors" "*.json" "*.txt"' in text and "--variant fp16" in text


def _user_docs_text() -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in USER_DOCS)


def readme_commands(prefix: str) -> list[list[str]]:
    """Every `prefix ...` command in the code blocks of the README and docs/, continuation lines joined, comments
    dropped."""
    blocks, current = [], None
    for line in _user_docs_text().splitlines():
        if line.startswith("```"):
            current = [] if current is None else blocks.append("\n".join(current))
            continue
        if current is not None:
            current.append(line)
    commands = []
    for block in blocks:
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip().removesuffix("&").strip()  # "... &": in the background
            if line.startswith(prefix):
                commands.append(shlex.split(line)[len(shlex.split(prefix)) :])
            elif line.startswith("pip install") and f"&& {prefix}" in line:  # "pip install ... && python app.py ..."
                commands.append(shlex.split(line.split(f"&& {prefix}", 1)[1]))
    return commands


def test_the_first_screen_installs_before_it_runs():
    """The first screen's two commands work as typed on a fresh clone: each installs what it then runs (issue 48:
    `python app.py --model tiny` alone met `No module named 'PIL'`), the tests' file the app's too."""
    first = re.search(r"^```bash\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S).group(1)
    commands = [line.split(" #", 1)[0].strip() for line in first.splitlines() if line.strip()]
    assert commands == [
        "pip install -r requirements.txt && python app.py --model tiny",
        "pip install -r requirements-dev.txt && python -m pytest",
    ]
    dev = (REPO / "requirements-dev.txt").read_text(encoding="utf-8").splitlines()
    assert "-r requirements.txt" in dev and any(line.startswith("pytest==") for line in dev)
    assert ["--model", "tiny"] in readme_commands("python app.py")  # the parser sees it behind its install


def test_the_first_screen_says_how_long_the_first_start_waits():
    """Issue 68: a first start refuses connections for minutes while it compiles, and the first screen said nothing
    of it. It says the wait on 2 cores cold and warm (the figures docs/run.md records), what is and is not measured
    on an accelerator, where the compiled programs stay, and how to offer the hires fix (`--hires-scales`)."""
    text = README.read_text(encoding="utf-8")
    first = text[: text.index("\n## Install")]
    cold, warm = (
        int(figure)
        for figure in re.search(
            r"First start on 2 CPU cores: (\d+) s\*\*.*?\*\*a restart: (\d+) s\*\*", first, re.S
        ).groups()
    )
    assert cold > warm > 0
    run_page = RUN_PAGE.read_text(encoding="utf-8")
    assert f"**{cold} s** cold" in run_page and f"**{warm} s** warm" in run_page  # one measurement, said alike
    assert "not measured" in first and "jax-compilation-cache" in first
    assert "python app.py --model tiny --hires-scales 2" in first


def test_the_dev_install_names_what_ci_installs_with_apt():
    """A developer machine gets the Debian packages CI gets (.ci/run), or the replicas' tests skip there."""
    ci_packages = re.findall(r"packages\+=\((\S+)\)", (REPO / ".ci" / "run").read_text(encoding="utf-8"))
    (line,) = re.findall(r"`sudo apt-get install ([^`]+)`", README.read_text(encoding="utf-8"))
    assert sorted(line.split()) == sorted(ci_packages) and {"chromium", "haproxy", "nginx-light"} <= set(ci_packages)


def test_every_readme_command_parses(monkeypatch):
    """The app and CLI examples of the README and docs/ run as written (as far as their flags go): no option the
    program lacks."""
    for name in [n for n in os.environ if n.startswith("SDXL_")]:
        monkeypatch.delenv(name)
    app_commands, cli_commands = readme_commands("python app.py"), readme_commands("python -m pipeline generate")
    assert len(app_commands) >= 8 and len(cli_commands) >= 2
    for argv in app_commands:
        parse_args(argv)
    for argv in cli_commands:
        engine_config(_generate_parser().parse_args(argv))
    text = _user_docs_text()
    # Offline examples: a UNet file from the fixture, the PyTorch fixture in the app, two processes on one machine.
    assert any(
        "--unet" in a and "tests/fixtures/tiny-pt/unet/diffusion_pytorch_model.fp16.safetensors" in a
        for a in app_commands + cli_commands
    )
    assert any("tests/fixtures/tiny-pt" in argv for argv in app_commands)
    assert any("127.0.0.1:" in " ".join(argv) and "--process-id" in argv for argv in app_commands)
    assert "multiple of 8" not in text and "21.6 s" not in text


def _prose_flags() -> set[str]:
    """Every `--flag` the README and docs/ name in inline code outside code blocks (the sentences users copy from)."""
    prose = re.sub(r"^```.*?^```", "", _user_docs_text(), flags=re.M | re.S)
    return {flag for span in re.findall(r"`([^`\n]+)`", prose) for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", span)}


def test_every_flag_the_readme_names_is_taken():
    """A flag named in the prose of the README or docs/ (e.g. the CLI's `--mask-image`) is one the app, the CLI,
    precompile, the engine service or the bench takes: the README once sent CLI users to a flag the CLI lacked."""
    from bench.__main__ import build_parser as bench_parser

    taken = {"--help"}
    for option in ALL_OPTIONS:
        taken.update((option.flag, *option.aliases))
    parsers = [bench_parser(), *build_parser()._subparsers._group_actions[0].choices.values()]
    for parser in parsers:
        taken.update(parser._option_string_actions)
    for script in (REPO / "bench").rglob("*.py"):  # the bench's own scripts (bench.features.prompts's --repeats;
        # bench tpu's parser names `add = parser.add_argument`)
        taken.update(re.findall(r"\badd(?:_argument)?\(\s*\"(--[\w-]+)\"", script.read_text(encoding="utf-8")))
    taken.add("--api-auth")  # AUTOMATIC1111's own flag, named as A1111's (docs/apis.md)
    named = _prose_flags()
    assert {"--mask-image", "--init-image", "--lora-dir", "--data-dir"} <= named
    assert named <= taken, sorted(named - taken)
    assert "--mask-image" in _generate_parser()._option_string_actions


def test_the_options_page_lists_every_app_option_and_the_readme_is_a_front_door():
    """Every option is on docs/options.md (the README links the page); the README is a front door: short, in its
    sections, the manual in docs/ and the measurement record in bench/README.md."""
    text = README.read_text(encoding="utf-8")
    options_page = OPTIONS_PAGE.read_text(encoding="utf-8")
    assert "docs/options.md" in text
    rows = {}  # flag -> its rows' environment variables (the page's --host and the engine service's: two rows)
    for m in re.finditer(r"^\| `(--[\w-]+)[^`]*` \| ([^|]*) \|", options_page, re.M):
        rows.setdefault(m.group(1), []).append(m.group(2))
    for option in options_for(APP, ALL_OPTIONS):
        assert option.flag in rows, option.flag
        if option.env:
            assert any(option.env in env for env in rows[option.flag]), option.flag
    assert len(text.splitlines()) <= README_MAX_LINES  # the manual lives in docs/, the record in bench/README.md
    assert (REPO / "bench" / "README.md").is_file() and "bench/README.md" in text
    for section in (
        "## Install",
        "## What it does",
        "## Deploy",
        "## How it works",
        "## Tests",
        "## Licence",
        "## What this does not do",
    ):
        assert re.search(rf"^{section}", text, re.M), section
    for page in ("docs/run.md", "docs/api.md", "docs/deploy.md", "docs/options.md", "docs/architecture.md"):
        assert f"]({page}" in text, page  # the front door links each room
    status = "8 images in 2.3 s · 1344×768 · 4 steps, DPM++ 2M Karras · seed 1234"  # the status line today
    assert status in API_PAGE.read_text(encoding="utf-8")
    assert markdown_table(ALL_OPTIONS) in options_page  # the table is the one `python -m web.options` prints


def test_licences_are_said_apart():
    text = README.read_text(encoding="utf-8")
    front = text.split("---", 2)[1]
    code_licence = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]["text"]
    assert code_licence == "Apache-2.0" and re.search(r"^license: apache-2.0$", front, re.M)
    assert "Apache-2.0" in text and "CreativeML Open RAIL++-M" in text  # the code's and SDXL's, both named


def _slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page) -> set[str]:
    prose = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", prose, re.M):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_relative_link_leads_somewhere():
    """A relative link in the README, docs/, bench/README.md and HISTORY.md or pipeline/README.md names a file of the
    repository, and its #anchor, on a Markdown page, one of that page's headings: moving text between pages breaks
    neither."""
    checked = 0
    for page in LINKED_DOCS:
        prose = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
        prose = re.sub(r"`[^`\n]*`", "", prose)  # code spans: `f(x)[0](y)` is no link
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.relative_to(REPO)}: {target}"
            if anchor and linked.suffix == ".md":
                assert anchor in _anchors(linked), f"{page.relative_to(REPO)}: {target}"
            checked += 1
    assert checked >= 30
