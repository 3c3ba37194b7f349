"""LoRAs, a picture to start from and the speed levers on the command line (issues 27, 28, 29): `python -m pipeline
generate` with --lora-dir/--lora, --init-image/--mask/--strength, --cfg-end/--deepcache gives the engine's images
with the parameters that name them; bad values are one line, before the model loads where they can be."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, LORA_NAMES, LORA_REFUSED, TEST_SIZE, TINY_PT, run_cli
from PIL import Image

from pipeline.__main__ import main as cli

PICTURE, MASK = FIXTURES / "image-input.png", FIXTURES / "image-mask.png"
PROMPT = "a cozy cabin in a snowy forest <lora:locon:-0.5>"
#: The request every feature at once (the CLI's flags; the engine's fields below).
FIELDS = dict(
    negative_prompt="blurry",
    loras=[["kohya_sgm", "0.8"], ["peft", "0.5", "1.2"]],
    init_image=PICTURE,
    mask_image=MASK,
    strength=0.75,
    cfg_end=0.5,
    deepcache=2,
    steps=4,
    sampler="DPM++ 2M",
)


def short_hash(name: str) -> str:
    """A1111's short LoRA hash: the first 12 hex digits of the sha256 of the file's bytes after its header."""
    data = (FIXTURES / "lora" / f"{name}.safetensors").read_bytes()
    return hashlib.sha256(data[8 + int.from_bytes(data[:8], "little") :]).hexdigest()[:12]


def engine_args(lora_dir: Path) -> list[str]:
    return [
        "--model",
        str(TINY_PT),
        "--lora-dir",
        str(lora_dir),
        "--height",
        str(TEST_SIZE),
        "--width",
        str(TEST_SIZE),
        "--steps",
        "3",
        "--dtype",
        "float32",
    ]


def test_every_feature_at_once_gives_the_engines_images(lora_dir, tmp_path, feature_engine, engine):
    """The CLI's process has the suite's 8 devices, so its programs are `engine`'s (the same settings but the LoRAs;
    tiny-pt is the tiny model's architecture): it takes them from JAX's compilation cache and compiles only the
    LoRA merge, where a process of its own device count compiled all 17 cold. Its 8 images are `feature_engine`'s
    (2 devices: 4 requests, each image with its own seed)."""
    done = run_cli(
        "generate",
        *engine_args(lora_dir),
        "--prompt",
        PROMPT,
        "--negative-prompt",
        "blurry",
        "--seed",
        "7",
        "--lora",
        "kohya_sgm:0.8",
        "--lora",
        "peft:0.5:1.2",
        "--init-image",
        str(PICTURE),
        "--mask-image",
        str(MASK),
        "--strength",
        "0.75",
        "--cfg-end",
        "0.5",
        "--deepcache",
        "2",
        "--steps",
        "4",
        "--sampler",
        "DPM++ 2M",
        "--out",
        str(tmp_path),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["compiles_after_warmup"] == 0 and summary["seeds"] == list(range(7, 15))
    assert summary["programs"]["compiled"] <= 1, summary["programs"]  # the merge; the rest from `engine`'s
    results = [
        feature_engine.generate(feature_engine.request(PROMPT, seed=seed, **FIELDS))
        for seed in range(7, 15, feature_engine.device_count)
    ]
    expected = results[0]
    got = [Image.open(path) for path in summary["images"]]
    for image, want in zip(got, [image for result in results for image in result.images], strict=True):
        # The CLI's process runs 8 devices, the feature engine 2 of 8: XLA:CPU may round a fused value differently
        # between the two (seen with 2 against 2 of 8: 1 value, 1 level).
        difference = np.abs(np.asarray(image.convert("RGB"), np.int16) - np.asarray(want, np.int16))
        assert difference.max() <= 1 and np.count_nonzero(difference) <= 4, np.argwhere(difference)
    text = got[0].info["parameters"]
    assert text == expected.parameters[0]
    assert text.startswith(f"{PROMPT} <lora:kohya_sgm:0.8> <lora:peft:0.5:1.2>\nNegative prompt: blurry\n")
    assert "Steps: 4, Sampler: DPM++ 2M," in text  # the request's steps: 3 of them ran (int(4 × 0.75))
    hashes = ", ".join(f"{name}: {short_hash(name)}" for name in ("locon", "kohya_sgm", "peft"))  # tags first
    assert text.endswith(f'Denoising strength: 0.75, Lora hashes: "{hashes}", CFG end: 0.5, DeepCache: 2'), text
    for name in LORA_REFUSED:  # a refused file is named in one line, and the run goes on without it
        lines = [line for line in done.stderr.splitlines() if f"{name}.safetensors" in line]
        assert len(lines) == 1 and "LoRA refused" in lines[0], done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--no-speed-levers", "--cfg-end", "0.5"],
            "error: This server runs every step whole and guided (started with --no-speed-levers): cfg_end and "
            "deepcache must be 1.",
        ),
        (
            ["--deepcache", "9"],
            "error: deepcache must be a whole number from 1 (off) to 5 (the whole UNet every N steps); got 9.",
        ),
        (["--mask", str(MASK)], "error: A mask needs an image to repaint; add the image or remove the mask."),
        (
            ["--init-image", str(PICTURE), "--strength", "0"],
            "error: Strength must be a number above 0 and at most 1; got 0.0.",
        ),
        (
            ["--init-image", "/nowhere/cabin.png"],
            "error: The image file '/nowhere/cabin.png' does not exist or is not a file.",
        ),  # as the user typed it
        (["--lora", "kohya_sgm:0.8"], "error: No LoRAs are offered (they come from --lora-dir DIR)."),
        (
            ["--lora-dir", "LORA_DIR", "--lora", "peft:abc"],
            "error: The weight of LoRA 'peft' must be a number from -10 to 10; got 'abc'.",
        ),
        (
            ["--lora-dir", "LORA_DIR", "--lora", "nope"],
            f"error: Unknown LoRA 'nope'; the LoRAs offered: {', '.join(sorted(LORA_NAMES))}.",
        ),  # not the refused ones
        (
            ["--lora-dir", "/nowhere/loras"],
            "error: LoRA directory /nowhere/loras does not exist or is not a directory.",
        ),
    ],
    ids=[
        "no-levers",
        "deepcache",
        "mask-alone",
        "strength",
        "missing-image",
        "no-lora-dir",
        "weight",
        "unknown",
        "missing-lora-dir",
    ],
)
def test_bad_values_are_one_line_before_the_model_loads(args, message, lora_dir, tmp_path, capsys):
    """Checked against the rules the flags give (RequestRules.of): nothing loads, nothing is written. Before loading,
    the directory's files are named as offered; a file it then refuses is named below."""
    args = [str(lora_dir) if arg == "LORA_DIR" else arg for arg in args]
    out = tmp_path / "out"
    code = cli(["generate", "--model", "/nonexistent/model", "--prompt", "a cabin", *args, "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == message and not out.exists()  # the model path was never read: the request was refused first


def test_a_lora_refused_at_start_up_is_one_line_when_asked_for(lora_dir, tmp_path):
    """dora.safetensors is in --lora-dir but cannot be applied: the start-up names it, and a request for it is
    refused in one line (exit 2), not a traceback."""
    done = run_cli(
        "generate", *engine_args(lora_dir), "--prompt", "a cabin", "--lora", "dora:1", "--out", str(tmp_path)
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: LoRA 'dora' is not offered: dora.safetensors is a DoRA file (dora_scale weights), which "
        "this app does not apply (only LoRA and LoCon)."
    ], done.stderr
    assert "loading" not in done.stderr.lower() and "compile" not in done.stderr.lower()  # refused before the load
    assert "Traceback" not in done.stderr and not list(tmp_path.glob("*.png"))
