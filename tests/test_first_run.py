"""Issue 20: what a new user and a clean CI run still tripped over. One test (or more) per defect and friction.

Real processes, the real tiny checkpoints (Flax and PyTorch), a real Gradio server and Debian's Chromium; nothing
mocked. The accelerator pins (defect 2) are in test_docker_install.py, the two-process gloo lines in
test_distributed.py, the size labels in test_progress_sizes.py, the guidance-free status note in test_samplers.py.
"""

from __future__ import annotations

import argparse
import ast
import graphlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import httpx
import pytest
from conftest import free_port, headless_chromium
from gradio_client import Client

import app
from pipeline import options
from pipeline.__main__ import build_parser
from pipeline.errors import CheckpointError, ModelLoadError

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PT_FIXTURE = REPO / "tests" / "fixtures" / "tiny-pt"
CLOSED = "http://127.0.0.1:9"  # nothing listens on port 9 (discard): the Hub is unreachable at once
LIGHTNING = "ByteDance/SDXL-Lightning:sdxl_lightning_4step_unet.safetensors"


def run(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    environment = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=environment
    )


def fp16_only(tmp_path: Path, keep_plain_index: bool) -> Path:
    """A copy of the PyTorch fixture as `huggingface-cli download --include "*.fp16.safetensors" "*.json" "*.txt"`
    leaves it: fp16 weights only, and (with `*.json`) the plain UNet's shard index without its shards."""
    target = tmp_path / ("fp16-with-index" if keep_plain_index else "fp16")
    shutil.copytree(PT_FIXTURE, target)
    for file in target.rglob("*.safetensors"):
        if not file.name.endswith(".fp16.safetensors"):
            file.unlink()
    if not keep_plain_index:
        (target / "unet" / "diffusion_pytorch_model.safetensors.index.json").unlink()
    return target


# ---- defect 1: a folder of fp16 files only ---------------------------------------------------------------------


@pytest.mark.parametrize("keep_plain_index", [False, True], ids=["fp16-only", "fp16-and-plain-index"])
def test_fp16_only_folder_loads_with_variant(tmp_path, monkeypatch, capfd, keep_plain_index):
    from pipeline.checkpoint.loading import load_model

    monkeypatch.setenv("SDXL_JAX_CACHE", str(tmp_path / "cache"))
    folder = fp16_only(tmp_path, keep_plain_index)
    loaded = load_model(str(folder), dtype="float32", variant="fp16", conversion_cache=False)
    assert loaded.origins == dict.fromkeys(("unet", "vae", "text_encoder", "text_encoder_2"), "converted")
    # The scheduler is built from the config fields the Flax class takes: no "config attributes ... were passed".
    assert "were passed to FlaxEulerDiscreteScheduler" not in capfd.readouterr().err


def test_fp16_only_folder_without_variant_and_an_absent_variant_say_so(tmp_path):
    from pipeline.checkpoint.loading import check_sdxl_directory

    folder = fp16_only(tmp_path, keep_plain_index=True)
    with pytest.raises(CheckpointError, match=r"has only fp16 variant weights for unet, .*; pass --variant fp16\.$"):
        check_sdxl_directory(folder)
    with pytest.raises(CheckpointError, match=r"has no 'bf16' variant weights \(\*\.bf16\.safetensors\); variants"):
        check_sdxl_directory(PT_FIXTURE, "bf16")  # the mixed folder: no silent fall-back to the plain files
    check_sdxl_directory(PT_FIXTURE, "fp16")
    check_sdxl_directory(PT_FIXTURE)


def test_cli_absent_variant_is_bad_input_in_one_line(tmp_path):
    done = run("-m", "pipeline", "generate", "--model", str(PT_FIXTURE), "--variant", "bf16", "--prompt", "a cat",
               "--out", str(tmp_path / "out"))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {PT_FIXTURE} has no 'bf16' variant weights (*.bf16.safetensors); variants there: fp16."
    ]


def test_readme_downloads_pytorch_weights_as_fp16_only():
    text = README.read_text(encoding="utf-8")
    assert '--include "*.fp16.safetensors" "*.json" "*.txt"' in text and "--variant fp16" in text


# ---- defect 3: import circles -------------------------------------------------------------------------------------


def project_imports() -> dict[str, set[str]]:
    """Module -> the project's modules it imports, top-level and function-level alike (as
    ../shared/tools/import_circles.py reads them): the packages with an __init__.py and the top-level scripts."""
    modules = {}
    for path in sorted(REPO.rglob("*.py")):
        parts = path.relative_to(REPO).parts
        if any(part.startswith(".") or part in ("tests", "venv", "build") for part in parts):
            continue
        if len(parts) == 1 or (REPO / parts[0] / "__init__.py").is_file():
            modules[".".join(Path(*parts).with_suffix("").parts)] = path
    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        package = package.removesuffix(".__init__")
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)] if package else []
                    base = ".".join([*parent, *([base] if base else [])])
                imported |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        graph[module] = {name for name in imported if name in modules and name != module}
    return graph


def test_no_import_circles():
    graph = project_imports()
    assert {"app", "pipeline.generator", "pipeline.distributed", "bench.__main__"} <= set(graph)
    assert "pipeline.errors" in graph["pipeline.convert"]  # the reader sees relative imports
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")


# ---- defect 4: generated images stay in the app's own folder and go with it --------------------------------------


def test_served_images_live_in_the_apps_folder_and_go_at_exit(engine, tmp_path):
    seed = 918273645  # a name no other test's files carry
    shared = Path(tempfile.gettempdir()) / "gradio"
    before = os.environ.get("GRADIO_TEMP_DIR")
    demo = app.build_demo(engine, examples=[])
    app.launch(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    files = demo.sdxl_files
    try:
        # Gradio reads it at request time too (a session's copy of an updated output): it points here while serving.
        assert os.environ.get("GRADIO_TEMP_DIR") == str(files.gradio_cache) != before
        assert demo.delete_cache == app.DELETE_CACHE  # bounded while running: old files are swept
        client = Client(demo.local_url, verbose=False, download_files=str(tmp_path / "client"))
        gallery, _, _ = client.predict(prompt="a red kite", seed=seed, randomize_seed=False, api_name="/generate")
        assert len(gallery) == engine.num_images
        served = sorted(files.gradio_cache.rglob(f"sdxl-{seed}-*.jpg"))
        assert len(served) == engine.num_images  # Gradio's copies, inside the app's folder
        assert not list(shared.rglob(f"sdxl-{seed}-*")) if shared.is_dir() else True
    finally:
        app.close_demo(demo)
    assert not files.root.exists() and not files.gradio_cache.exists()
    assert os.environ.get("GRADIO_TEMP_DIR") == before  # restored with the last page


# ---- defect 5: a busy port is found before loading -----------------------------------------------------------------


def test_busy_port_is_refused_before_loading(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.perf_counter()
        done = run("app.py", "--model", "tiny", "--port", str(port), env={"TMPDIR": str(tmp_path)})
        elapsed = time.perf_counter() - started
    assert done.returncode == 2, done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    expected = f"app.py: error: port {port} on 127.0.0.1 is in use (another server?); pass --port with a free one"
    assert lines == [expected]
    assert not list(tmp_path.iterdir())  # no temporary folder left behind
    assert elapsed < 60  # before loading: it never got as far as the model (a bound, not a benchmark)


# ---- defect 6: --unet REPO:FILE offline ----------------------------------------------------------------------------


def test_unet_from_the_hub_offline_is_one_line_with_the_right_command(tmp_path):
    started = time.perf_counter()
    env = {"HF_ENDPOINT": CLOSED, "HF_HOME": str(tmp_path / "hf")}
    done = run("-m", "pipeline", "generate", "--model", "tiny", "--unet", LIGHTNING, "--prompt", "a cat",
               "--out", str(tmp_path / "out"), env=env)  # fmt: skip
    elapsed = time.perf_counter() - started
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "`huggingface-cli download ByteDance/SDXL-Lightning sdxl_lightning_4step_unet.safetensors`" in line
    assert "pass --unet a local .safetensors file" in line
    assert "MaxRetryError" not in line and "--include" not in line and "'tiny'" not in line
    assert elapsed < 60  # one short probe, not ~40 s of retries


def test_unet_from_the_hub_offline_uses_the_cached_file(tmp_path):
    from pipeline.checkpoint.hub import hub_file

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--unets"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    cached = repo / "snapshots" / commit / "unet.safetensors"
    cached.write_bytes(b"x")
    assert hub_file("acme/unets", "unet.safetensors", endpoint=CLOSED, cache_dir=str(tmp_path / "hub")) == str(cached)
    with pytest.raises(ModelLoadError, match=r"run `huggingface-cli download acme/unets other.safetensors`"):
        hub_file("acme/unets", "other.safetensors", endpoint=CLOSED, cache_dir=str(tmp_path / "hub"))


# ---- defect 7 and the options table ---------------------------------------------------------------------------------


@pytest.mark.parametrize("program", ["app", "cli"])
def test_negative_cpu_devices_is_refused_in_one_line(program, tmp_path):
    args = ["app.py"] if program == "app" else ["-m", "pipeline", "generate", "--prompt", "x", "--out", str(tmp_path)]
    for extra, env in (["--cpu-devices", "-3"], {}), ([], {"SDXL_CPU_DEVICES": "-3"}):
        done = run(*args, "--model", "tiny", *extra, env=env, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "argument --cpu-devices: must be 0 or more; got -3" in done.stderr.strip().splitlines()[-1]
        assert "Traceback" not in done.stderr


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {action.option_strings[0]: action for action in parser._actions if action.option_strings}


def _generate_parser() -> argparse.ArgumentParser:
    return build_parser()._subparsers._group_actions[0].choices["generate"]


def test_both_parsers_come_from_the_options_table(monkeypatch):
    app_flags, cli_flags = _flags(app_parser()), _flags(_generate_parser())
    for option in options.OPTIONS:
        assert (option.flag in app_flags) == ("app" in option.programs), option.flag
        assert (option.flag in cli_flags) == ("cli" in option.programs), option.flag
        if option.env and option.kind != "append":
            assert option.env in app_flags.get(option.flag, cli_flags.get(option.flag)).help, option.flag
    # The next option is one line of the table, and both programs take it.
    extra = options.Option("--frobnicate", "a new knob", "SDXL_FROBNICATE", int, 3)
    monkeypatch.setattr(options, "OPTIONS", (*options.OPTIONS, extra))
    monkeypatch.setenv("SDXL_FROBNICATE", "7")
    assert app.parse_args(["--model", "tiny"]).frobnicate == 7
    assert _generate_parser().parse_args(["--prompt", "x", "--out", "o"]).frobnicate == 7


def app_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    options.add_options(parser, options.APP)
    return parser


def test_environment_and_mixed_size_flags(monkeypatch, capsys):
    monkeypatch.setenv("SDXL_STEPS", "3")
    assert app.parse_args(["--model", "tiny"]).steps == 3
    assert _generate_parser().parse_args(["--prompt", "x", "--out", "o"]).steps == 3  # the CLI reads it too
    assert app.parse_args(["--model", "tiny", "--no-compilation-cache"]).no_compilation_cache is True
    for argv, message in (
        (["--sizes", "1024x1024", "--height", "64"], "--sizes and --height/--width do not go together"),
        (["--sizes", "136x136"], "Each side of a size must be a multiple of 32 from 32 to 4096; got 136x136."),
        (["--port", "70000"], "argument --port: must be from 1 to 65535; got 70000"),
    ):
        with pytest.raises(SystemExit) as info:
            app.parse_args(argv)
        assert info.value.code == 2 and message in capsys.readouterr().err, argv
    monkeypatch.setenv("SDXL_DTYPE", "float16")
    with pytest.raises(SystemExit):
        app.parse_args([])
    assert "SDXL_DTYPE='float16': choose one of bfloat16, float32" in capsys.readouterr().err


# ---- defect 8: Ctrl-C during start-up --------------------------------------------------------------------------------


def test_ctrl_c_during_start_up_is_one_line(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "app.py", "--model", "tiny", "--sizes", "224x128", "--port", str(free_port())]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if " loading tiny" in line:
                break
        time.sleep(3)  # inside diffusers' and flax's loading code
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    lines += rest.splitlines()
    assert process.returncode == 130, "\n".join(lines)
    assert "loading tiny: 224×128, 4 steps" in lines[next(i for i, t in enumerate(lines) if " loading tiny" in t)]
    assert lines[-1] == "app.py: stopped during start-up"
    assert not [t for t in lines if "Traceback" in t or "KeyboardInterrupt" in t], "\n".join(lines)
    assert not list(tmp_path.glob("sdxl-jax-app-*"))


def test_a_swallowed_ctrl_c_is_still_noticed(capsys):
    """SIGINT landing in a __del__ or gc callback is printed and dropped by Python; start-up must still stop."""
    from web.server import InterruptRecord

    class InterruptedWhileCollected:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler runs here, inside __del__, where Python cannot propagate it

    with InterruptRecord() as interrupt:
        InterruptedWhileCollected()  # collected at once: the KeyboardInterrupt is swallowed
    assert interrupt.interrupted
    assert "KeyboardInterrupt" not in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ---- the page ------------------------------------------------------------------------------------------------------


def test_page_texts_for_visitors(engine):
    """No sampler jargon and no lone JAX link in the header, sizes counted as sizes, a short CPU note."""
    demo = app.build_demo(engine, examples=[])
    try:
        texts = {c["props"].get("elem_id"): c["props"].get("value") for c in demo.get_config_file()["components"]}
    finally:
        app.close_demo(demo)
    header = texts["header"]
    assert "spacing" not in header and "CFG" not in header and "[JAX]" not in header
    assert "Euler, leading spacing, CFG" in texts["server-settings"]  # in the advanced settings instead
    assert app.header_links("tiny") == ""
    assert app.model_texts(app.SDXL_BASE, on_cpu=True)["notice"] == "Running on a CPU: each request takes many minutes."

    import jax

    from pipeline.generator import Generator

    two = Generator.from_pretrained(  # the same 1:1 ratio twice is two sizes, not "other aspect ratios"
        "tiny", sizes=[(64, 64), (128, 128)], height=64, width=64, steps=2, dtype="float32", devices=jax.devices()[:1]
    )  # nothing compiled: the page only reads the configuration
    demo = app.build_demo(two, examples=[])
    try:
        header = next(c["props"]["value"] for c in demo.get_config_file()["components"]
                      if c["props"].get("elem_id") == "header")  # fmt: skip
    finally:
        app.close_demo(demo)
    assert "(or 1 other size)" in header and "aspect ratio" not in header


def test_login_page_has_the_title(engine):
    demo = app.build_demo(engine, examples=[])
    app.launch(demo, port=free_port(), prevent_thread_lock=True, quiet=True, auth=[("ada", "pw")])
    try:
        reply = httpx.get(demo.local_url.rstrip("/") + "/gradio_api/login_check")  # what the login page reads
        assert reply.status_code == 401 and app.TITLE in reply.json()["detail"]["auth_message"]
    finally:
        app.close_demo(demo)


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists("/usr/bin/chromium") and not os.environ.get("CI"), reason="needs chromium")
def test_status_clears_and_examples_leave_randomize_on(engine):
    demo = app.build_demo(engine)
    app.launch(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    page_timeout = 180_000
    try:
        with headless_chromium() as browser:
            page = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
            page.goto(demo.local_url, timeout=page_timeout)
            box = page.locator("#prompt textarea")
            box.wait_for(timeout=page_timeout)
            page.locator("#advanced").get_by_text("Advanced settings").click()  # the seed box and the checkbox
            box.fill("a watercolor fox")
            page.locator("#generate").click()
            page.wait_for_function("document.querySelector('#status').innerText.includes('images in')",
                                   timeout=page_timeout)  # fmt: skip
            box.fill("")
            page.locator("#generate").click()
            page.locator(".toast-body").get_by_text("Please enter a prompt.").wait_for(timeout=60_000)
            assert page.locator("#status").inner_text().strip() == ""  # the old request's line is gone
            example = app.load_examples()[0]
            page.get_by_text(example, exact=True).first.click()
            page.wait_for_function(
                "(s) => document.querySelector('#seed input').value === String(s)",
                arg=app.EXAMPLE_SEED_START, timeout=page_timeout,
            )  # fmt: skip
            assert page.locator("#randomize input").is_checked()  # the next prompt gets a fresh seed
            page.locator("#generate").click()
            page.wait_for_function(
                "(s) => document.querySelector('#status').innerText.includes('images in') && "
                "!document.querySelector('#status').innerText.includes('seed ' + s + '\\n') && "
                "document.querySelector('#seed input').value !== String(s)",
                arg=app.EXAMPLE_SEED_START, timeout=page_timeout,
            )  # fmt: skip
            # Phone width: each caption is whole and under its image (not over it, cut), no blank band below.
            layout = page.evaluate(
                """() => { const items = [...document.querySelectorAll('#gallery .thumbnail-item')];
                const gallery = document.querySelector('#gallery').getBoundingClientRect();
                const cells = items.map(t => { const i = t.querySelector('img').getBoundingClientRect();
                  const c = t.querySelector('.caption-label'); const r = c.getBoundingClientRect();
                  return {whole: c.scrollWidth <= c.clientWidth + 1, under: r.top >= i.bottom - 1,
                          bottom: t.getBoundingClientRect().bottom}; });
                return {cells, slack: gallery.bottom - Math.max(...cells.map(c => c.bottom))}; }"""
            )
            assert len(layout["cells"]) == engine.num_images
            assert all(c["whole"] and c["under"] for c in layout["cells"]), layout
            assert layout["slack"] < 40, layout
    finally:
        app.close_demo(demo)


# ---- the README ----------------------------------------------------------------------------------------------------


def readme_commands(prefix: str) -> list[list[str]]:
    """Every `prefix ...` command in the README's code blocks, continuation lines joined, comments dropped."""
    blocks, current = [], None
    for line in README.read_text(encoding="utf-8").splitlines():
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
    return commands


def test_every_readme_command_parses(monkeypatch):
    """The README's app and CLI examples run as written (as far as their flags go): no option the program lacks."""
    for name in [n for n in os.environ if n.startswith("SDXL_")]:
        monkeypatch.delenv(name)
    app_commands, cli_commands = readme_commands("python app.py"), readme_commands("python -m pipeline generate")
    assert len(app_commands) >= 8 and len(cli_commands) >= 2
    for argv in app_commands:
        app.parse_args(argv)
    for argv in cli_commands:
        _generate_parser().parse_args(argv)
    text = README.read_text(encoding="utf-8")
    # Offline examples: a UNet file from the fixture, the PyTorch fixture in the app, two processes on one machine.
    assert any("--unet" in a and "tests/fixtures/tiny-pt/unet/diffusion_pytorch_model.fp16.safetensors" in a
               for a in app_commands + cli_commands)  # fmt: skip
    assert any("tests/fixtures/tiny-pt" in argv for argv in app_commands)
    assert any("127.0.0.1:" in " ".join(argv) and "--process-id" in argv for argv in app_commands)
    assert "multiple of 8" not in text and "21.6 s" not in text


def test_readme_lists_every_app_option_and_is_for_users():
    text = README.read_text(encoding="utf-8")
    assert options.markdown_table() in text  # the table is the one pipeline/options.py prints
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(--[\w-]+)[^`]*` \| ([^|]*) \|", text, re.M)}
    for option in options.options_for(options.APP):
        assert option.flag in rows, option.flag
        if option.env:
            assert option.env in rows[option.flag], option.flag
    assert len(text.splitlines()) < 480  # for users: the measurement record lives in bench/README.md
    assert (REPO / "bench" / "README.md").is_file() and "bench/README.md" in text
    for section in ("## Install", "## Run", "## Options", "## API", "## Deploy", "## Figures"):
        assert re.search(rf"^{section}", text, re.M), section
    assert "8 images in 2.3 s · 1024×1024 · 25 steps, Euler · seed 1234" in text  # the status line today


def test_licences_are_said_apart():
    text = README.read_text(encoding="utf-8")
    front = text.split("---", 2)[1]
    code_licence = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]["text"]
    assert code_licence == "Apache-2.0" and re.search(r"^license: apache-2.0$", front, re.M)
    assert "Apache-2.0" in text and "CreativeML Open RAIL++-M" in text  # the code's and SDXL's, both named
