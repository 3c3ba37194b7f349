"""The command lines, run as users run them (`python -m pipeline ...`, and `python app.py` where both programs
refuse the same input): subprocesses, exit codes, one-line errors, PNG files."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, TEST_SIZE, TEST_STEPS, free_port, generate, run_cli, run_python, xla_flags
from PIL import Image

PT_FIXTURE = FIXTURES / "tiny-pt"
CLOSED = "http://127.0.0.1:9"  # nothing listens on port 9 (discard): the Hub is unreachable at once
LIGHTNING = "ByteDance/SDXL-Lightning:sdxl_lightning_4step_unet.safetensors"
PROMPT = "a red fox in fresh snow"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--seed", "-5"], 2, "Seed"),
        (["--guidance-scale", "500"], 2, "Guidance"),
        (["--height", "100"], 2, "Height must be a multiple of 32; got 100."),
        (["--model", "/nonexistent/sdxl"], 2, "does not exist"),  # as the app: a wrong --model is bad input
        (["--model", "requirements.txt"], 2, "is a file"),
    ],
)
def test_bad_input_exits_non_zero_with_one_line(tiny_dir, tmp_path, args, code, message):
    base = ["generate", "--model", str(tiny_dir), "--prompt", "x", "--steps", "2", "--height", "64", "--width", "64"]
    done = run_cli(*base, "--out", str(tmp_path), *args)
    assert done.returncode == code
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["generate", "precompile", "make-tiny"])
@pytest.mark.parametrize("where", ["a file", "under a file", "/proc"])
def test_an_out_that_takes_no_files_is_refused_before_anything_loads(tmp_path, command, where):
    """Issue 68: `--out /etc/passwd` loaded the model, generated for 6 s, then ended in a traceback. Now one sentence
    and exit 2, with JAX not even imported; make-tiny's folder is checked the same way (it replaces what it is
    given)."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    out = {"a file": a_file, "under a file": a_file / "images", "/proc": Path("/proc/nope/out")}[where]
    argv = {
        "generate": ["generate", "--model", "tiny", "--prompt", "a cat", "--out", str(out)],
        "precompile": ["precompile", "--topology", "cpu", "--model", "tiny", "--out", str(out)],
        "make-tiny": ["make-tiny", str(out)],
    }[command]
    code = (
        f"import sys; from pipeline.__main__ import main; rc = main({argv!r}); print('jax' in sys.modules); "
        "sys.exit(rc)"
    )
    done = run_python("-c", code)
    assert done.returncode == 2, done.stderr
    assert done.stdout.strip() == "False"  # nothing loaded, nothing compiled: JAX was never imported
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and str(out) in line and "Traceback" not in done.stderr
    expected = {
        "a file": "is a file; name a folder instead.",
        "under a file": f"{a_file} is a file; name a folder",
        "/proc": "cannot be written: /proc takes no new files.",
    }[where]
    assert expected in line
    assert a_file.read_text() == "keep me"


def test_saved_images_continue_the_folders_numbers_and_replace_nothing(tmp_path):
    """Issue 68: each run replaced the last one's `image-00.png` .... As A1111 numbers its outputs, a run's files now
    continue the folder's highest number (an older two-digit name counts too); every earlier file is left as it was."""
    from pipeline.contract.image_files import save_pngs, to_pil

    def images(value: int, count: int) -> list:
        return to_pil(np.full((count, 8, 8, 3), value, np.uint8), [f"run {value}"] * count)

    first = save_pngs(images(10, 3), tmp_path / "out")
    assert [p.name for p in first] == ["image-00000.png", "image-00001.png", "image-00002.png"]
    (tmp_path / "out" / "image-07.png").write_bytes(b"an older run's image")
    (tmp_path / "out" / "image-x.png").write_bytes(b"not numbered")
    second = save_pngs(images(20, 2), tmp_path / "out")
    assert [p.name for p in second] == ["image-00008.png", "image-00009.png"]
    assert (tmp_path / "out" / "image-07.png").read_bytes() == b"an older run's image"
    for path, value in [*((p, 10) for p in first), *((p, 20) for p in second)]:
        with Image.open(path) as image:
            assert image.info["parameters"] == f"run {value}" and image.getpixel((0, 0)) == (value,) * 3
    assert len(list((tmp_path / "out").iterdir())) == 7


@pytest.mark.slow
@pytest.mark.long  # the app's restart test (test_app_process.py) checks the cache and more
def test_restart_reuses_the_persistent_compilation_cache(tiny_dir, tmp_path):
    """A second process compiles nothing from scratch: every program comes from JAX_COMPILATION_CACHE_DIR."""
    args = ["generate", "--model", str(tiny_dir), "--prompt", "a cat", "--steps", "2", "--height", "64"]
    args += ["--width", "64", "--dtype", "float32", "--json"]
    env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache")}
    cold = run_cli(*args, "--out", str(tmp_path / "a"), env=env)
    assert cold.returncode == 0, cold.stderr
    assert json.loads(cold.stdout)["compiles"] >= 1 and any((tmp_path / "cache").iterdir())
    warm = run_cli(*args, "--out", str(tmp_path / "b"), env=env)
    assert warm.returncode == 0, warm.stderr
    summary = json.loads(warm.stdout)
    assert summary["compiles"] >= 1 and summary["compilation_cache_hits"] == summary["compiles"]
    # Off means off: nothing read from or written to the cache.
    off = run_cli(*args, "--no-compilation-cache", "--out", str(tmp_path / "c"), env=env)
    assert off.returncode == 0, off.stderr
    assert json.loads(off.stdout)["compiles"] >= 1 and json.loads(off.stdout)["compilation_cache_hits"] == 0


def test_cli_tiny_uses_the_small_defaults_a_style_and_every_core(tiny_dir, tmp_path):
    """No size flags: 128x128 at 4 steps, as in the app; XLA_FLAGS unset: one JAX device (one PNG, the next seed) per
    core. The request's own flags (negative prompt, guidance) are in every PNG's parameters, the model named as the
    user named it, never by the server's path (the checkpoint's cache folder)."""
    out = tmp_path / "out"
    done = run_python(
        "-m",
        "pipeline",
        "generate",
        "--model",
        "tiny",
        "--prompt",
        "a lighthouse",
        "--negative-prompt",
        "blurry",
        "--guidance-scale",
        "3.5",
        "--style",
        "Cinematic",
        "--seed",
        "77",
        "--dtype",
        "float32",
        "--out",
        str(out),
        "--json",
        env={"XLA_FLAGS": xla_flags()},  # no device count: one device per core
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    cores = os.cpu_count()
    paths = [Path(p) for p in summary["images"]]
    assert summary["devices"] == f"{cores} × cpu" and len(paths) == cores and paths == sorted(out.glob("*.png"))
    assert summary["seeds"] == list(range(77, 77 + cores))
    assert {"load_s", "compile_s", "first_run_s", "call_total_s"} <= set(summary["timings"])
    with Image.open(paths[0]) as image:
        assert image.size == (128, 128)
    text = Image.open(paths[-1]).info["parameters"]
    assert "Steps: 4," in text and "Size: 128x128" in text and f"Seed: {76 + cores}," in text
    assert text.startswith("cinematic still a lighthouse")  # the style template was applied, as in the API
    negative = text.split("\nNegative prompt: ")[1].split("\n")[0]
    assert negative.endswith(", blurry") and "CFG scale: 3.5" in text  # the style's negative prompt, then the user's
    assert "Model: tiny," in text and str(tiny_dir) not in text  # named, never the server's path
    # Only what its request runs: no previews, no levers' programs (a request that sets a lever compiles them:
    # tests/system/test_features_cli.py).
    from pipeline.host.compiling.programs import program_keys

    programs = summary["programs"]
    plain = program_keys([(128, 128)], cfg=True, levers=False, previews=False, windows=3, cross_kv=True)
    assert programs["traced"] + programs["loaded"] + programs["precompiled"] == len(plain) == 9, programs
    assert "deprecated" not in done.stderr.lower() and "Warning" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", ""], "error: Please enter a prompt."),
        (["--prompt", " \t "], "error: Please enter a prompt."),
        (["--prompt", "x", "--style", "Sepia"], "error: Unknown style 'Sepia'; choose one of: No style, Cinematic"),
        (["--prompt", "x", "--height", "100"], "error: Height must be a multiple of 32; got 100."),
        (["--prompt", "x", "--height", "100000"], "error: Height must be at most 4096; got 100000."),
        (["--prompt", "x", "--width", "100000"], "error: Width must be at most 4096; got 100000."),
        (
            ["--prompt", "x", "--seed", ""],
            "error: --seed is empty; give a whole number from 0 to 4294967295, or --seed random.",
        ),
    ],
    ids=["empty", "blank", "unknown-style", "height-only", "huge-height", "huge-width", "empty-seed"],
)
def test_cli_refuses_what_the_api_refuses(tiny_dir, tmp_path, args, message):
    done = run_cli("generate", "--model", "tiny", *args, "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.strip().startswith(message), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_make_tiny_writes_a_checkpoint_and_prints_only_its_path(tmp_path):
    """As a user runs it: without the tests' JAX_PLATFORMS=cpu (libtpu in the dev venv printed its errors). One run
    for both checks (a start-up each: importing JAX and diffusers is most of it)."""
    done = run_python("-m", "pipeline", "make-tiny", str(tmp_path / "tiny"), drop=("JAX_PLATFORMS",))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "tiny")
    assert done.stderr.strip() == ""
    assert (tmp_path / "tiny" / "model_index.json").is_file()
    assert (tmp_path / "tiny" / "unet" / "diffusion_flax_model.msgpack").is_file()


def test_the_python_example_is_quiet_and_makes_one_image_per_core(tiny_dir):
    """pipeline/README.md's `Generator.from_pretrained` example, as a user runs it (no JAX_PLATFORMS, no XLA_FLAGS):
    no libtpu lines, and one image per CPU core, as the app and the CLI (it calls `use_cpu_cores` itself: importing
    `pipeline` changes nothing in the environment)."""
    code = (
        "from pipeline.platform import use_cpu_cores\n"
        "use_cpu_cores()\n"
        "from pipeline import Generator\n"
        f"gen = Generator.from_pretrained({str(tiny_dir)!r}, height=64, width=64, steps=2)\n"
        "print(gen.num_images)"
    )
    done = run_python("-c", code, env={"XLA_FLAGS": xla_flags()}, drop=("JAX_PLATFORMS",))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(os.cpu_count())
    assert "tpu" not in done.stderr.lower(), done.stderr


def test_cli_absent_variant_is_bad_input_in_one_line(tmp_path):
    done = run_cli(
        "generate", "--model", str(PT_FIXTURE), "--variant", "bf16", "--prompt", "a cat", "--out", str(tmp_path / "out")
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {PT_FIXTURE} has no 'bf16' variant weights (*.bf16.safetensors); variants there: fp16."
    ]


def test_unet_from_the_hub_offline_is_one_line_with_the_right_command(tmp_path):
    started = time.perf_counter()
    env = {"HF_ENDPOINT": CLOSED, "HF_HOME": str(tmp_path / "hf")}
    done = run_cli(
        "generate", "--model", "tiny", "--unet", LIGHTNING, "--prompt", "a cat", "--out", str(tmp_path / "out"), env=env
    )
    elapsed = time.perf_counter() - started
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "`hf download ByteDance/SDXL-Lightning sdxl_lightning_4step_unet.safetensors`" in line
    assert "pass --unet a local .safetensors file" in line
    assert "MaxRetryError" not in line and "--include" not in line and "'tiny'" not in line
    assert elapsed < 60  # one short probe, not ~40 s of retries


def test_cli_generates_from_the_pytorch_fixture_and_exits_2_on_a_single_file(tmp_path, engine):
    """Into a folder holding an earlier run's image: it is kept, and this run's images are numbered after it.

    The run's programs are `engine`'s (tiny-pt is the tiny model's architecture; 8 devices, 64x64; a lever in the
    request keeps the levers' programs, as `engine` serves them): it loads them whole from this host's executables
    instead of compiling its own cold."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "image-00003.png").write_bytes(b"an earlier run's image")
    done = run_cli(
        "generate",
        "--model",
        str(PT_FIXTURE),
        "--variant",
        "fp16",
        "--prompt",
        "a tiny robot",
        "--steps",
        "2",
        "--height",
        "64",
        "--width",
        "64",
        "--dtype",
        "float32",
        "--deepcache",
        "2",
        "--out",
        str(tmp_path / "out"),
        "--json",
        env={"SDXL_JAX_CACHE": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    images = [Path(p).name for p in json.loads(done.stdout)["images"]]
    assert images == [f"image-{n:05d}.png" for n in range(4, 12)] and "Traceback" not in done.stderr
    assert (tmp_path / "out" / "image-00003.png").read_bytes() == b"an earlier run's image"
    single = tmp_path / "model.safetensors"
    shutil.copy(PT_FIXTURE / "vae" / "diffusion_pytorch_model.fp16.safetensors", single)
    bad = run_cli("generate", "--model", str(single), "--prompt", "x", "--out", str(tmp_path / "bad"))
    lines = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 2 and len(lines) == 1 and "single-file checkpoint" in lines[0], bad.stderr


@pytest.mark.long  # ancestral noise per image, 4 devices against 8: test_generator.py's device-count test, in process;
# the turbo preset's flags: test_presets.py; what a guidance-free request ignores: test_request.py
def test_cli_preset_turbo_ancestral_same_images_on_4_and_8_devices(tiny_dir, tmp_path):
    """Euler-ancestral noise comes from each image's own seed: 4 devices give images 0-3 of 8 devices, bit for bit."""
    from pipeline.generator import Generator

    def pixels(result) -> np.ndarray:
        return np.stack([np.asarray(image) for image in result.images]).astype(np.int16)  # [B, H, W, 3]

    eight = Generator.from_pretrained(
        str(tiny_dir),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=TEST_STEPS,
        dtype="float32",
        sampler="euler_ancestral",
        timestep_spacing="trailing",
        prediction_type="v_prediction",
        cfg=False,
        speed_levers=False,
        prompt_windows=1,
        previews=False,  # the programs the CLI runs for this request
    )
    expected = generate(eight, PROMPT, seed=42)
    done = run_cli(
        "generate",
        "--model",
        str(tiny_dir),
        "--preset",
        "turbo",
        "--prediction-type",
        "v_prediction",
        "--steps",
        str(TEST_STEPS),
        "--height",
        str(TEST_SIZE),
        "--width",
        str(TEST_SIZE),
        "--dtype",
        "float32",
        "--prompt",
        PROMPT,
        "--seed",
        "42",
        "--guidance-scale",
        "7",
        "--out",
        str(tmp_path),
        "--json",
        env={"XLA_FLAGS": xla_flags(4)},
    )
    assert done.returncode == 0, done.stderr
    assert "warning: no classifier-free guidance" in done.stderr
    summary = json.loads(done.stdout)
    assert summary["seeds"] == expected.seeds[:4] and summary["compiles_after_warmup"] == 0
    got = np.stack([np.asarray(Image.open(p)) for p in summary["images"]]).astype(np.int16)
    # Bit for bit before the 1-window text programs; since, XLA:CPU rounds one value of the 4-device process 1 level
    # apart from the 8-device one (seen: 1 value of 49152).
    difference = np.abs(got - pixels(expected)[:4])
    assert difference.max() <= 1 and np.count_nonzero(difference) <= 4, np.argwhere(difference)
    text = Image.open(summary["images"][0]).info["parameters"]
    assert "Steps: 2, Sampler: Euler a, v-prediction, CFG scale: 0," in text and "Timestep spacing: trailing" in text
    assert len({pixels(expected)[i].tobytes() for i in range(8)}) == 8 and pixels(expected).std() > 1


# ---- both programs refuse the same input in one line ------------------------------------------------------------


@pytest.mark.parametrize("program", ["app", "cli"])
def test_negative_cpu_devices_is_refused_in_one_line(program, tmp_path):
    args = ["app.py"] if program == "app" else ["-m", "pipeline", "generate", "--prompt", "x", "--out", str(tmp_path)]
    for extra, env in (["--cpu-devices", "-3"], {}), ([], {"SDXL_CPU_DEVICES": "-3"}):
        done = run_python(*args, "--model", "tiny", *extra, env=env, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "argument --cpu-devices: must be 0 or more; got -3" in done.stderr.strip().splitlines()[-1]
        assert "Traceback" not in done.stderr


def test_app_and_cli_refuse_a_fused_kind_without_its_device_in_one_line(capsys, monkeypatch):
    import app
    from pipeline.__main__ import main as cli

    monkeypatch.setenv("SDXL_ATTENTION", "splash")  # the app reads its environment variable
    assert app.main(["--model", "tiny", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("app.py: error: Attention 'splash' needs a TPU") and "\n" not in err
    assert cli(["generate", "--model", "tiny", "--prompt", "a cat", "--attention", "cudnn", "--out", "/tmp/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Attention 'cudnn' needs a GPU") and "\n" not in err
