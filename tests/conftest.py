"""Shared set-up of every test folder (engine/, web/, system/): 8 virtual CPU devices stand in for a TPU v5e-8 (set
before anything imports JAX), the tiny checkpoint, two warmed-up engines, the page around an engine, a browser, and
the helpers several folders use (a free port, running `python ...` as a user would, the page's browser steps)."""

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

#: How the tests' XLA compiles for the CPU: LLVM's first optimisation level, without its expensive passes. The same
#: programs compile in about 80 % of the CPU seconds and run about as fast at the tests' sizes, their pixels within one
#: 8-bit level of the default's (bench/HISTORY.md, "How long the tests take"). Compiling is most of the suite's cost;
#: the product, the bench and the speed guard compile with XLA's defaults.
TEST_COMPILE_FLAGS = "--xla_backend_optimization_level=1 --xla_llvm_disable_expensive_passes=true"
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {TEST_COMPILE_FLAGS}")


def xla_flags(devices: int | None = None) -> str:
    """XLA_FLAGS for a test's subprocess: this run's, with `devices` CPU devices, or with no device count (None: the
    app and the CLI then make one device per core, as on a user's machine). Its programs compile as this process's
    do, so they share the run's compilation cache and their pixels compare with an in-process engine's."""
    kept = [flag for flag in os.environ["XLA_FLAGS"].split() if not flag.startswith("--xla_force_host_platform_")]
    if devices is not None:
        kept.insert(0, f"--xla_force_host_platform_device_count={devices}")
    return " ".join(kept)


os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiled programs are shared between the tests of a run (and reruns) through JAX's persistent cache.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax")
)

import pytest  # noqa: E402

#: TEST_PROFILE=FOLDER: each test's seconds and compilations (tests/profiling.py).
pytest_plugins = ("profiling",)

# ---- nothing left in TMPDIR ------------------------------------------------------------------------------------------

#: The run's own temporary folder (the controller's, inherited by xdist workers and every subprocess through TMPDIR):
#: whatever a test, a server, a client or a subprocess writes to "the temporary directory" lands here, so the check
#: at the end of the session sees exactly this run's leftovers, not those of other processes on a shared machine.
RUN_TMP_PREFIX = "sdxl-tests-"
#: Leftovers named in the failure message (the rest are counted).
LEFTOVERS_SHOWN = 20


def pytest_configure(config) -> None:
    """In the controller (xdist's, or the only process under `-n 0`), before any worker starts: point TMPDIR at a
    fresh folder of this run; then, in every process, the gradio_client fixes below.

    pytest's own base temporary folder (tmp_path, tmp_path_factory) stays where pytest keeps it, beside the run's
    folder (PYTEST_DEBUG_TEMPROOT is pytest's way to name it): pytest keeps the last few runs' folders on purpose
    (a failed test's files). The run's folder goes at the end of the session (pytest_sessionfinish)."""
    if not hasattr(config, "workerinput"):
        import tempfile

        outer = tempfile.gettempdir()
        os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", outer)
        run_tmp = tempfile.mkdtemp(prefix=RUN_TMP_PREFIX, dir=outer)
        os.chmod(run_tmp, 0o1777)  # as /tmp: the throwaway PostgreSQL and nginx's workers run as other users
        config.stash[_RUN_TMP] = (Path(run_tmp), os.environ.get("TMPDIR"))
        os.environ["TMPDIR"] = run_tmp
        tempfile.tempdir = None  # gettempdir() caches its answer: read TMPDIR again
    _patient_gradio_clients()
    from bench.serving.gradio_downloads import tidy_downloads

    tidy_downloads()  # gradio_client left an empty $TMPDIR/<40 hex> folder for every file a test downloaded


_RUN_TMP = pytest.StashKey[tuple[Path, str | None]]()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session) -> None:
    """In every process, Gradio's empty folders (`_remove_gradio_leftover`). Then in the controller, after every
    worker has ended (xdist's own sessionfinish, before this one, waits for them; their atexit handlers have run):
    fail the run when the run's TMPDIR holds anything (pytest_terminal_summary names what); then remove the folder
    (the listing says enough, and a failed run should not add to the litter it reports)."""
    _remove_gradio_leftover()
    _send_first_seen(session.config)
    stashed = session.config.stash.get(_RUN_TMP, None)
    if stashed is None:
        return
    import shutil
    import tempfile

    run_tmp, outer_tmpdir = stashed
    leftovers = sorted(_leftovers(run_tmp, session.config))
    if leftovers:
        shown = "\n".join(f"  {entry}" for entry in leftovers[:LEFTOVERS_SHOWN])
        more = f"\n  ... and {len(leftovers) - LEFTOVERS_SHOWN} more" if len(leftovers) > LEFTOVERS_SHOWN else ""
        count = f"{len(leftovers)} {'entry' if len(leftovers) == 1 else 'entries'}"
        session.config.stash[_LEFT] = (
            f"Tests left {count} in the run's TMPDIR ({run_tmp}); every test writes under "
            f"tmp_path / tmp_path_factory and removes what its servers, clients and "
            f"subprocesses write:\n{shown}{more}"
        )
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(run_tmp, ignore_errors=True)
    if outer_tmpdir is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = outer_tmpdir
    tempfile.tempdir = None


_LEFT = pytest.StashKey[str]()

# Which test left what: each process lists the run's TMPDIR (and its gradio/ cache) after every test; a new entry is
# put down to the test it first appeared after (a server's thread may write it a little later: the test is then the
# one running meanwhile, still the place to look). Workers send theirs to the controller (xdist's workeroutput).
_SEEN: dict[str, str] = {}
_FIRST_SEEN = pytest.StashKey[dict[str, set[str]]]()  # a worker's entry was seen by the other one too: both named


def _tmpdir_names() -> set[str]:
    """The run's TMPDIR entries, and those of its `gradio/` (Gradio's cache: one hash-named folder per file)."""
    import tempfile

    root = Path(tempfile.gettempdir())
    names = set()
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            names.add(entry.name)
            if entry.name == "gradio" and entry.is_dir():
                names.update(f"gradio/{child.name}" for child in entry.iterdir())
    return names


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location) -> None:
    for name in _tmpdir_names() - _SEEN.keys():
        _SEEN[name] = nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """A worker's entries, as it saw them (xdist's controller hook)."""
    first_seen = node.config.stash.setdefault(_FIRST_SEEN, {})
    for name, nodeid in node.workeroutput.get("tmpdir_first_seen", {}).items():
        first_seen.setdefault(name, set()).add(nodeid)


def _send_first_seen(config) -> None:
    if hasattr(config, "workeroutput"):
        config.workeroutput["tmpdir_first_seen"] = dict(_SEEN)


def _remove_gradio_leftover() -> None:
    """Gradio makes an empty `vibe_edit_history/` in `$TMPDIR/gradio` (where it looked when imported) for every app it
    builds, each gr.Blocks. The app removes both with its last page (web/serving/temp_files.py); a test that builds a
    gr.Blocks outside a page (a page's part, MCP's tool names) leaves them: removed here, each only if empty, so
    anything Gradio did put there is still reported."""
    if "gradio" in sys.modules:
        from web.serving.temp_files import _remove_gradio_leftover as remove

        remove()


def pytest_terminal_summary(terminalreporter, config) -> None:
    """What the run left in TMPDIR (pytest_sessionfinish), after the failures and before the short summary."""
    if message := config.stash.get(_LEFT, None):
        terminalreporter.write_sep("=", "left in TMPDIR", red=True, bold=True)
        terminalreporter.write_line(message)


def _leftovers(run_tmp: Path, config) -> list[str]:
    """What is left in `run_tmp`, a folder with the first few names inside it (hash-named empty folders and a
    `gradio/` cache say little by their own name), but pytest's base temporary folder where `--basetemp` put it."""
    basetemp = config.option.basetemp
    exempt = Path(basetemp).resolve() if basetemp else None
    first_seen = {name: {nodeid} for name, nodeid in _SEEN.items()}
    for name, nodeids in config.stash.get(_FIRST_SEEN, {}).items():
        first_seen.setdefault(name, set()).update(nodeids)
    found = []
    for entry in run_tmp.iterdir():
        inside: list[str] = []
        if exempt is not None and (exempt == entry.resolve() or entry.resolve() in exempt.parents):
            continue
        if entry.is_dir() and not entry.is_symlink():
            inside = sorted(child.name for child in entry.iterdir())
            listed = ", ".join(inside[:5]) + (f", ... ({len(inside)} in all)" if len(inside) > 5 else "")
            found.append(f"{entry.name}/ ({listed or 'empty'})")
        else:
            found.append(entry.name)
        # The tests after which its contents first appeared, else the entry itself.
        culprits = set().union(*(first_seen.get(f"{entry.name}/{child}", ()) for child in inside))
        culprits = sorted(culprits or first_seen.get(entry.name, ()))
        if culprits:
            found[-1] += f" — first seen after {', '.join(culprits[:3])}"
    return found


#: Where a gradio_client Client made without `download_files` downloads (the innermost `clients_download_into`).
CLIENT_DOWNLOADS: list[str] = []


@contextlib.contextmanager
def clients_download_into(folder: Path):
    """Clients made inside (by code that does not name a download folder: the README's examples, run as written)
    download into `folder` instead of gradio_client's default, $TMPDIR/gradio."""
    CLIENT_DOWNLOADS.append(str(folder))
    try:
        yield
    finally:
        CLIENT_DOWNLOADS.remove(str(folder))


def _patient_gradio_clients() -> None:
    """gradio_client reads a page's API description with httpx's 5 s default timeout; on a loaded 2-core machine
    (CI, pytest-xdist) the app takes longer to answer it, and the test would fail before asking anything. The tests'
    clients wait up to 10 minutes for an answer (as long as gradio_client's own streams: without a limit, a hung
    server would hang the test), a minute to connect; a caller's own `httpx_kwargs` still win.

    Each test's client also names where it downloads answers' files (`download_files=`, a folder under tmp_path, or
    False, or `clients_download_into`): gradio_client's default is `$TMPDIR/gradio`, which nothing removes; a test
    without it fails at once."""
    import httpx
    from gradio_client import Client

    if getattr(Client.__init__, "patient", False):
        return
    original = Client.__init__

    def patient_init(self, *args, httpx_kwargs=None, **kwargs):
        if "download_files" not in kwargs and CLIENT_DOWNLOADS:
            kwargs["download_files"] = CLIENT_DOWNLOADS[-1]
        if "download_files" not in kwargs:
            raise TypeError(
                "a test's gradio_client Client names its download folder: download_files=tmp_path / ... "
                "(or False); the default, $TMPDIR/gradio, would be left behind"
            )
        original(self, *args, httpx_kwargs={"timeout": httpx.Timeout(60, read=600), **(httpx_kwargs or {})}, **kwargs)

    patient_init.patient = True
    Client.__init__ = patient_init


#: The files that keep one xdist worker busy for a minute or more, heaviest first (worker seconds in a clean-clone run:
#: test_cluster ~270, test_readme_examples ~230, test_cli ~210, test_tpu ~200, test_service ~140, ...). They are handed
#: out first, the many short files after them (`--no-loadscope-reorder` keeps this order; xdist's own puts the files
#: with the most tests first), so the two workers end together instead of one running a long file alone at the end.
HEAVY_FIRST = (
    "system/test_cluster.py",
    "system/test_readme_examples.py",
    "system/test_cli.py",
    "engine/test_tpu.py",
    "system/test_service.py",
    "web/test_features_browser.py",
    "engine/test_a1111_samplers.py",
    "engine/test_img2img.py",
    "engine/test_networks.py",
    "system/test_app_process.py",
    "engine/test_generator.py",
    "system/test_features_cli.py",
    "engine/test_attention.py",
    "engine/test_vae_tiles.py",
    "engine/test_esrgan.py",
    "web/test_second_pass_browser.py",
    "engine/test_refiner_together.py",
    "system/test_bench.py",
    "engine/test_lora.py",
    "web/test_stop.py",
    "web/test_png_info.py",
    "engine/test_quantize.py",
    "web/test_previews.py",
    "engine/test_controlnet.py",
    "engine/test_convert.py",
    "engine/test_executables.py",
    "engine/test_cross_attention_cache.py",
)


#: Files that share a costly session engine: xdist builds session fixtures once per worker, so files spread over both
#: workers built the engine twice (the refiner's hires engine: both at once, cold, ~100 s each). Each group is one
#: work unit: its files run in one worker, one after the other, and the engine is built once.
SHARED_ENGINE_GROUPS = {
    # test_cluster needs both; spread over both workers, each engine was built twice.
    "feature_engine, control_engine": (
        "system/test_cluster.py",
        "system/test_service.py",
        "web/test_features_browser.py",
        "system/test_features_cli.py",
        "engine/test_img2img.py",
        "engine/test_speed_levers.py",
        "engine/test_prompts.py",
        "engine/test_clip_skip.py",
        "engine/test_lora.py",
        "engine/test_text_cache.py",
        "web/test_apis.py",
        "web/test_features_api.py",
        "engine/test_controlnet.py",
        "web/test_controlnet_page.py",
    ),
    "refiner_engine, refiner_hires_engine": (
        "engine/test_refiner_together.py",
        "web/test_second_pass_browser.py",
        "engine/test_refiner.py",
    ),
    "ui_engine, ui_page": (
        "web/test_stop.py",
        "web/test_previews.py",
        "web/test_history.py",
        "web/test_delivery.py",
        "web/test_steps_and_sampler.py",
        "web/test_page_quiet.py",
        "web/test_png_info.py",
        "web/test_progress_and_examples.py",
        "engine/test_loop.py",
        "system/test_replicas.py",
    ),
    "batched_engine": (
        "engine/test_generator.py",
        "web/test_throughput.py",
        "engine/test_request_merging.py",
        "engine/test_xyz_plot.py",
    ),
}
GROUP_OF = {f"tests/{path}": group for group, paths in SHARED_ENGINE_GROUPS.items() for path in paths}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with SHARED_ENGINE_GROUPS' files as one unit each (None: another --dist, xdist's own)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedEngineFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return GROUP_OF.get(path, path)

    return SharedEngineFiles(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    """Heavy files first (HEAVY_FIRST), each file's tests still together and in their order."""
    rank = {name: index for index, name in enumerate(HEAVY_FIRST)}

    def heaviness(item) -> int:
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        return rank.get(path, len(rank))

    items[:] = sorted(items, key=heaviness)  # stable: the rest keep pytest's order


#: The repository's root: where `python app.py` and `python -m pipeline` run from.
REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
#: Small enough for 2 CPU cores, large enough to exercise every block: 8x8 latents, 2 Euler steps.
TEST_SIZE = 64
TEST_STEPS = 2
CHROMIUM = "/usr/bin/chromium"
#: Skipped on a developer machine without Chromium; in CI (CI=true) a missing browser fails instead.
needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("CI"), reason="needs Debian chromium at /usr/bin/chromium"
)
#: Screenshots of the browser tests (git-ignored).
ARTIFACTS = REPO / "artifacts" / "browser"


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    """The tiny random-weight SDXL checkpoint, built once per machine."""
    from pipeline.checkpoint.tiny import tiny_checkpoint

    return tiny_checkpoint()


@pytest.fixture(scope="session")
def engine(tiny_dir):
    """A warmed-up float32 generator on all 8 devices."""
    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(tiny_dir), height=TEST_SIZE, width=TEST_SIZE, steps=TEST_STEPS, dtype="float32"
    )
    generator.warmup()
    return generator


#: Throughput mode's test engine (`batched_engine`): its devices and the images each makes per call.
BATCHED_DEVICES = 2
IMAGES_PER_DEVICE = 2
#: Its settings beyond the model, as `Generator.from_pretrained` takes them (a CLI run with the same flags reuses its
#: compiled programs): one prompt window, no previews, no speed levers, the fewest programs to compile; a call
#: nobody follows runs up to 4 steps (a throughput server's calls: device/step_block.py).
BATCHED_SETTINGS = dict(
    height=TEST_SIZE,
    width=TEST_SIZE,
    steps=TEST_STEPS,
    dtype="float32",
    per_device_batch=IMAGES_PER_DEVICE,
    prompt_windows=1,
    previews=False,
    speed_levers=False,
    steps_per_call=4,
)


@pytest.fixture(scope="session")
def batched_engine(tiny_dir):
    """A warmed-up float32 generator making 2 images on each of 2 devices per call (`--images-per-device 2`): the one
    engine of throughput mode's tests, the engine's (test_generator.py) and the entry points' (test_throughput.py)."""
    import jax

    from pipeline.generator import Generator

    generator = Generator.from_pretrained(str(tiny_dir), devices=jax.devices()[:BATCHED_DEVICES], **BATCHED_SETTINGS)
    generator.warmup()
    return generator


def generate(generator, prompt, **fields):
    """One request through the engine's Python entry point: `gen.generate(gen.request(prompt, **fields))`."""
    return generator.generate(generator.request(prompt, **fields))


@contextlib.contextmanager
def served_programs_only(generator):
    """Check that what runs in the block builds only `generator`'s served programs (`program_keys`: what its warm-up
    builds) and compiles nothing else: on a warmed-up server it would compile nothing. For the engines that are not
    warmed up and compile on first use the programs their tests run, not every one their settings serve."""
    keys = generator.program_keys()

    def built() -> set:
        return {key for key in keys if generator.programs.is_compiled(key)}

    before, compiles = built(), generator.compile_count
    yield
    assert generator.compile_count - compiles == len(built() - before), "a request compiled an unserved program"


def free_port() -> int:
    """A TCP port nobody listens on right now, for a server a test launches."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_python(
    *args: str, env: dict | None = None, drop: tuple[str, ...] = (), timeout: float = 600
) -> subprocess.CompletedProcess:
    """`python ARGS` from the repository as a user would run it, with `env` added and `drop` removed."""
    environment = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in drop}
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=environment
    )


def run_cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m pipeline ARGS`."""
    return run_python("-m", "pipeline", *args, env=env, timeout=timeout)


#: The LoRA fixtures a server accepts (tests/fixtures/lora, scripts/make_lora_fixtures.py), by name, and two it
#: refuses at start-up (it starts without them).
LORA_NAMES = ("kohya_diffusers", "kohya_sgm", "locon", "peft")
LORA_REFUSED = ("dora", "sd15")
#: The PyTorch fixtures' checkpoint (scripts/make_torch_fixtures.py): every reference image was made from it.
TINY_PT = FIXTURES / "tiny-pt"
#: Devices of the feature engine: two images per request are enough to see each image's own seed.
FEATURE_DEVICES = 2


@pytest.fixture(scope="session")
def lora_dir(tmp_path_factory) -> Path:
    """A --lora-dir with the accepted LoRA fixtures and two refused ones."""
    import shutil

    directory = tmp_path_factory.mktemp("loras")
    for name in LORA_NAMES + LORA_REFUSED:
        shutil.copy(FIXTURES / "lora" / f"{name}.safetensors", directory)
    return directory


@pytest.fixture(scope="session")
def feature_engine(lora_dir):
    """tiny-pt on 2 devices at 64x64 with the fixture LoRAs and the speed levers (the default), warmed up: the engine
    the LoRA, picture, speed-lever and prompt references run through, and the page of the feature tests serves
    (with the embedding fixtures: tests/fixtures/embeddings)."""
    import jax

    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(TINY_PT),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=3,
        dtype="float32",
        devices=jax.devices()[:FEATURE_DEVICES],
        lora_dir=str(lora_dir),
        embeddings_dir=str(FIXTURES / "embeddings"),
    )
    generator.warmup()
    return generator


#: The two tiny SDXL ControlNets of scripts/make_controlnet_fixtures.py (ControlNetModel.from_unet of tiny-pt's UNet).
CONTROLNETS = (FIXTURES / "controlnet-a", FIXTURES / "controlnet-b")


@pytest.fixture(scope="session")
def control_engine(lora_dir):
    """tiny-pt with both fixture ControlNets and the fixture LoRAs on 2 devices at 64x64, 4 steps; no levers, one
    text window, previews on: the engine of the ControlNet parity tests, the ControlNet page, and the embedded
    reference of ControlNet requests on two processes and through the engine service."""
    import jax

    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(TINY_PT),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=4,
        dtype="float32",
        speed_levers=False,
        prompt_windows=1,
        devices=jax.devices()[:FEATURE_DEVICES],
        controlnets=tuple(str(n) for n in CONTROLNETS),
        lora_dir=str(lora_dir),
    )
    generator.warmup()
    return generator


#: The tiny SDXL refiner of scripts/make_refiner_fixtures.py (its text encoder 2 is tiny-pt's file).
TINY_REFINER = FIXTURES / "tiny-refiner"


@pytest.fixture(scope="session")
def refiner_engine():
    """tiny-pt with the tiny refiner on 2 devices at 64x64, 4 steps; no levers, one text window, no previews: the
    engine of the refiner tests (its parity with diffusers' base + refiner pipelines)."""
    import jax

    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(TINY_PT),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=4,
        dtype="float32",
        speed_levers=False,
        prompt_windows=1,
        previews=False,
        devices=jax.devices()[:FEATURE_DEVICES],
        refiner=str(TINY_REFINER),
    )
    generator.warmup()
    return generator


@pytest.fixture(scope="session")
def refiner_hires_engine():
    """tiny-pt with the tiny refiner on 2 devices at 64x64, 4 steps, the speed levers, hires scale 2; one text window,
    no previews: the refiner together with the hires fix and the levers (tests/engine/test_refiner_together.py), and
    the page of the Second pass section's browser test.

    Not warmed up: it serves 29 programs (the levers' and the refiner's at both sizes, six latent upscalers), a dozen
    of which no test runs (5 UNet steps among them, at 128² most). Its tests check each request with
    `served_programs_only` instead; one plain request here builds what every request runs first (and the host's
    small programs a first request builds)."""
    import jax

    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(TINY_PT),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=4,
        dtype="float32",
        prompt_windows=1,
        previews=False,
        devices=jax.devices()[:FEATURE_DEVICES],
        refiner=str(TINY_REFINER),
        hires_scales=(2.0,),
    )
    generator.generate(generator.request("warm-up"))
    return generator


#: The UI tests' offered sizes (height, width): square and 16:9 (7:4 like SDXL's 1344x768), multiples of 32.
UI_SIZES = [(TEST_SIZE, TEST_SIZE), (128, 224)]
#: Enough steps to watch a progress bar move.
UI_STEPS = 4


@pytest.fixture(scope="session")
def ui_engine(tiny_dir):
    """A warmed-up generator with two sizes (compiled once, shared by the page's test files; the page reports
    live progress). One 77-token window: the page's tests send short prompts, and 3-window programs at both sizes
    would be 10 more to compile (`engine` serves 3 windows: test_request_programs.py)."""
    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(tiny_dir),
        steps=UI_STEPS,
        dtype="float32",
        sizes=UI_SIZES,
        height=UI_SIZES[0][0],
        width=UI_SIZES[0][1],
        prompt_windows=1,
    )
    generator.warmup()
    return generator


@contextlib.contextmanager
def served(generator, *, auth=None, apis=None, **build_kwargs):
    """The app's page (web.page.layout.Page) around `generator`, launched on a free port in this process; closed after.
    `apis` (a web.apis.ApiAccess) mounts the A1111, OpenAI and MCP APIs as app.py does."""
    from web.apis import attach_apis
    from web.page.layout import build_page

    page = build_page(generator, **build_kwargs)
    try:
        extra = attach_apis(page, apis) if apis is not None else {}
        page.launch(port=free_port(), prevent_thread_lock=True, quiet=True, auth=auth, **extra)
        yield page
    finally:
        page.close()


@contextlib.contextmanager
def engine_service(generator):
    """`python -m pipeline serve`'s HTTP service around `generator` (in this process, on a free port) and a page's
    client of it (web.engines.remote.RemoteEngines), connected; both closed after."""
    import threading

    from pipeline.service.info import engine_info
    from pipeline.service.server import EngineService, make_server
    from web.engines.remote import RemoteEngines

    service = EngineService(token=None)
    server = make_server("127.0.0.1", free_port(), service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    remote = None
    try:
        service.ready(generator, engine_info(generator))
        remote = RemoteEngines.connect([f"http://127.0.0.1:{server.server_address[1]}"], wait_s=60)
        yield remote
    finally:
        if remote is not None:
            remote.close()
        server.shutdown()
        server.server_close()


def page_client(page, tmp_path_factory):
    """A gradio_client for a served page, downloading into a fresh temporary folder."""
    from gradio_client import Client

    return Client(page.local_url, verbose=False, download_files=str(tmp_path_factory.mktemp("downloads")))


@pytest.fixture(scope="module")
def ui_page(ui_engine):
    """The app's page around `ui_engine`, one per test file that asks for it."""
    with served(ui_engine) as page:
        yield page


@pytest.fixture(scope="module")
def ui_client(ui_page, tmp_path_factory):
    """A gradio_client for `ui_page`, downloading into a temporary folder."""
    return page_client(ui_page, tmp_path_factory)


@contextlib.contextmanager
def headless_chromium():
    """Debian's Chromium through Playwright (never `playwright install`)."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for one test file's browser tests. Not one per session (a launch costs about a CPU second):
    Playwright's sync API keeps an asyncio loop running in the thread while it is open, and the later files' tests
    that call `asyncio.run` (MCP's client, the twin routing) failed under it."""
    with headless_chromium() as browser:
        yield browser


# ---- the page in a browser ------------------------------------------------------------------------------------------

TIMEOUT_MS = 180_000
LONG = 100  # steps of a request that gets stopped: long enough to press Stop in the middle


#: Two animation frames of the page: what Gradio waits (a tick and a frame) before it gives a section's newly shown
#: controls their values.
TWO_FRAMES = "() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"


def open_section(page, section: str, label: str, control: str) -> None:
    """Open the closed accordion `#section` by its `label` and wait until its controls hold their first values.

    Gradio mounts a closed accordion's controls only when it opens, and gives them their values a tick and an
    animation frame after they show (core's `render_previously_invisible_children`): a value typed in between is
    overwritten (a loaded CI run sent hires scale 1 though its slider had held a typed 2). So: `control` (a
    selector inside the section) is visible, then two frames have passed."""
    page.locator(f"#{section}").get_by_text(label).first.click()
    page.locator(control).first.wait_for(state="visible", timeout=TIMEOUT_MS)
    page.evaluate(TWO_FRAMES)


def open_advanced(page) -> None:
    open_section(page, "advanced", "Advanced settings", "#steps input[type=range]")


#: The gallery shows a request's pictures forming (a preview's caption: "step 2 / 100 · 64×64").
FORMING_JS = "() => /step \\d+ \\/ 100 ·/.test(document.querySelector('#gallery').innerText)"
#: The status line holds a new answer to a LONG-step request (it differs from `before`: each answer rewrites it).
ANSWERED_JS = """(before) => { const text = document.querySelector('#status').innerText;
    return text !== before && /Stopped at step|100 steps/.test(text); }"""


def choose_size(page, label: str) -> None:
    """Pick an offered size ("224×128 (16:9)") in the open Advanced settings."""
    page.locator("#aspect input").click()
    page.get_by_role("option", name=label).click()


class StoppedTry(NamedTuple):
    status: str  # the status line: "Stopped at step k / 100. ..."
    gallery_before: str  # the gallery's text before that try's Generate (what a stop goes back to)


def generate_and_stop(page, *, tries: int = 3, forming=None) -> StoppedTry | None:
    """Generate (the steps already set to LONG), press Stop once the first preview shows, and wait for the answer;
    again when the request ran whole before Stop reached it, up to `tries` times. None when every try ran whole.

    On a loaded machine the browser can show a preview late, when the engine is near its last step (CI once saw
    two 100-step requests end before Stop). Each answer rewrites the status line, so the answer of this try is the
    first status that differs from the one before Generate. `forming()` runs while the pictures form, before Stop."""
    status = page.locator("#status")
    for _ in range(tries):
        before, gallery_before = status.inner_text(), page.locator("#gallery").inner_text()
        page.locator("#generate").click()
        page.wait_for_function(FORMING_JS, timeout=TIMEOUT_MS)
        if forming is not None:
            forming()
        page.locator("#stop").click()
        page.wait_for_function(ANSWERED_JS, arg=before, timeout=TIMEOUT_MS)
        if "Stopped at step" in (text := status.inner_text()):
            return StoppedTry(text, gallery_before)
    return None


def set_slider(page, elem_id: str, value) -> None:
    """Type `value` into the slider's number box and wait until the slider holds it: Generate sends the slider's
    value, and on a loaded machine a click right after Enter could still send the old one.

    The value is typed again when the slider has not taken it within 20 s: an update the page was still applying
    (a request's answer that had just arrived, or the section just opened) can overwrite what was typed, and the
    slider would then never hold it (loaded CI runs waited their whole 180 s, for the steps and the hires scale)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    box = page.locator(f"#{elem_id} input[type=number]")
    holds = "([id, v]) => Number(document.querySelector(`#${id} input[type=range]`)?.value) === v"
    for attempt in range(3):
        box.fill(str(value))
        box.press("Enter")
        try:
            page.wait_for_function(holds, arg=[elem_id, value], timeout=20_000 if attempt < 2 else TIMEOUT_MS)
            return
        except PlaywrightTimeout:
            if attempt == 2:
                raise


#: Every slider `id` of `values` ({id: v}) holds its `v`.
SLIDERS_HOLD = """(values) => Object.entries(values).every(([id, v]) => {
    const ranges = [...document.querySelectorAll(`#${id} input[type=range]`)];
    return ranges.length > 0 && ranges.every((range) => Number(range.value) === v); })"""


def set_sliders(page, values: dict[str, float]) -> None:
    """`set_slider` for each of `values` ({elem_id: value}), then, right before the caller's Generate, wait until
    every one still holds its value, typing again any an update overwrote (`open_section` says which update can)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for elem_id, value in values.items():
        set_slider(page, elem_id, value)
    for attempt in range(3):
        try:
            page.wait_for_function(SLIDERS_HOLD, arg=values, timeout=5_000 if attempt < 2 else TIMEOUT_MS)
            return
        except PlaywrightTimeout:
            if attempt == 2:
                raise
            for elem_id, value in values.items():
                set_slider(page, elem_id, value)


def set_steps(page, steps: int) -> None:
    """The steps slider (`set_slider`)."""
    set_slider(page, "steps", steps)


#: Each gallery image of the page: (HTTP status of its file, whether the browser decoded it).
GALLERY_LOADS = """async () => Promise.all([...document.querySelectorAll('#gallery img')].map(async (img) => {
    if (!img.complete) await new Promise((done) => { img.onload = img.onerror = done; });
    return [(await fetch(img.src)).status, img.naturalWidth > 0];
}))"""


def stop_then_generate(page, url: str, done_text: str) -> list:
    """Steps 100, Generate, Stop, steps 4, Generate: the sequence that once broke a tab's images (issue 26)."""
    page.goto(url, timeout=TIMEOUT_MS)
    open_advanced(page)
    set_steps(page, LONG)
    page.locator("#prompt textarea").fill("a kite over the dunes")
    assert generate_and_stop(page), f"Stop never reached a {LONG}-step request in 3 tries"
    set_steps(page, 4)
    page.locator("#generate").click()
    page.locator("#status").get_by_text(done_text).wait_for(timeout=TIMEOUT_MS)
    page.wait_for_function("() => document.querySelectorAll('#gallery img').length > 0", timeout=TIMEOUT_MS)
    return page.evaluate(GALLERY_LOADS)


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL (tests/throwaway.py) for the whole run; `postgres.new_database()` gives a test its own
    empty database. Skipped where PostgreSQL is missing, failed instead under CI=true."""
    from throwaway import ThrowawayPostgres

    server = ThrowawayPostgres()
    try:
        yield server
    finally:
        server.stop()
