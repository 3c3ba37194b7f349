"""`python -m bench` end to end on the tiny checkpoint, every part at its smallest: the figures exist and are sane."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEST_SIZE, TEST_STEPS
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("reference", "startup", "serving", "recompiles", "flops", "achieved", "fewstep")


def positive(value) -> bool:
    return isinstance(value, int | float) and value > 0


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    command = [
        sys.executable, "-m", "bench", "--model", "tiny", "--height", str(TEST_SIZE), "--width", str(TEST_SIZE),
        "--steps", str(TEST_STEPS), "--runs", "1", "--clients", "1,2", "--requests-per-client", "1",
        "--recompile-requests", "5", "--out", str(out), "--only", "reference,startup,app,recompiles,flops,fewstep",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[bench " in done.stdout  # progress lines while it runs
    return out


@pytest.mark.slow
def test_results_json_has_every_part_with_sane_values(bench_out):
    results = json.loads((bench_out / "results.json").read_text())
    for part in PARTS:
        assert results.get(part), f"results.json lacks {part}"
    machine = results["machine"]
    assert machine["device_count"] == 8 and machine["cpu_count"] >= 1
    assert set(machine["packages"]) >= {"jax", "jaxlib", "flax", "diffusers", "transformers", "gradio"}

    ref = results["reference"]
    assert ref["images_per_call"] == 8
    assert positive(ref["engine"]["median"]) and positive(ref["reference"]["median"]) and positive(ref["ratio"])
    assert ref["ratio"] == pytest.approx(ref["engine"]["median"] / ref["reference"]["median"])

    startup = results["startup"]
    for run in ("cold", "warm"):
        for phase in ("imports_s", "load_s", "compile_s", "first_run_s", "first_image_s", "process_wall_s"):
            assert positive(startup[run][phase]), (run, phase)
    assert startup["cache_entries"] > 0
    assert positive(startup["app_cold_ready_s"]) and positive(startup["app_warm_ready_s"])
    assert startup["ratio"] == pytest.approx(startup["warm"]["first_image_s"] / startup["cold"]["first_image_s"])

    serving = results["serving"]
    assert positive(serving["engine"]["median"]) and positive(serving["app"]["median"])
    assert serving["compiles_added"] == 0 and positive(serving["gradio_floor"]["median"])
    assert [level["clients"] for level in serving["load"]] == [1, 2]
    for level in serving["load"]:
        assert level["failed"] == 0 and level["rejected"] == 0 and level["succeeded"] == level["requests"]
        assert positive(level["requests_per_s"]) and level["latency"]["p95"] >= level["latency"]["median"] > 0

    recompiles = results["recompiles"]
    assert recompiles["requests"] == 5 and recompiles["compiles_added"] == 0

    flops = results["flops"]
    assert 12e12 < flops["unet_step_flops_batch2"] < 15e12  # public figure: ~13.5 TFLOP per step at 1024 px
    assert positive(flops["vae_decode_flops_per_image"])
    assert {lim["name"] for lim in flops["limits"]} == {"TPU v5e", "TPU v6e", "H100 SXM", "H200"}
    for lim in flops["limits"]:
        assert all(positive(seconds) for seconds in lim["seconds_per_image"].values())

    fewstep = results["fewstep"]  # base (25 steps, CFG) vs lightning-4 (4 steps, no CFG), same checkpoint and size
    assert positive(fewstep["base"]["median"]) and positive(fewstep["lightning"]["median"])
    assert fewstep["ratio"] > 1 and fewstep["compiles_during_runs"] == 0 and fewstep["unet_evaluations_ratio"] == 12.5
    assert 5 < fewstep["expected_flops_ratio"] < 12.5  # text encoders and VAE decode cost the same in both

    achieved = results["achieved"]
    assert positive(achieved["achieved_flops_per_s"]) and achieved["peak_flops_per_s"] is None  # CPU: unknown peak


@pytest.mark.slow
def test_markdown_and_chart_are_written(bench_out):
    text = (bench_out / "results.md").read_text()
    for heading in ("Engine vs diffusers", "Start-up", "Through the Gradio app", "Recompilations", "Hardware limit"):
        assert heading in text
    with Image.open(bench_out / "chart.png") as chart:
        assert chart.format == "PNG" and chart.width >= 600 and chart.height >= 200
