"""The benchmark: `python -m bench` end to end on the tiny checkpoint, every part at its smallest (the figures exist
and are sane), `python -m bench unet`, and the in-process parts (host path, host loop) on small inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TEST_SIZE, TEST_STEPS
from PIL import Image

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
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
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


# ---- `python -m bench unet` (the UNet step per attention core) ---------------------------------------------------


def bench_unet(tmp_path, *args) -> dict:
    """`python -m bench unet ARGS` in a subprocess (as a device owner would run it); its unet.json."""
    command = [sys.executable, "-m", "bench", "unet", "--model", "tiny", *args, "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((tmp_path / "unet.json").read_text())


def test_bench_unet_smoke_on_cpu(tmp_path):
    """The device benchmark's command at a tiny size: the core resolved, timed, its output finite."""
    args = ("--height", "64", "--width", "64", "--steps", "1", "--runs", "1", "--attention", "auto")
    run = bench_unet(tmp_path, *args)["unet"]
    assert run["platform"] == "cpu" and run["dtype"] == "float32" and run["unfused_flops_per_step"] > 0
    [row] = run["kinds"]
    assert (row["attention"], row["resolved"]) == ("auto", "xla")
    assert row["ms_per_step"] > 0 and row["finite"] and row["mfu"] is None  # CPU: no known peak for the MFU


def test_bench_unet_cost_counts_the_fused_kernels():
    """Lowered cost (in process): splash, lowered for TPU, puts its kernel in the program and XLA counts no FLOPs."""
    from bench.unet import cost_report, parse_args

    args = parse_args(["--cost", "--model", "tiny", "--height", "256", "--width", "256", "--attention", "xla,splash"])
    rows = {row["attention"]: row for row in cost_report(args, progress=lambda message: None)}
    assert rows["splash"]["platform"] == "tpu" and rows["splash"]["fused_kernel_sites"] > 0
    assert rows["xla"]["platform"] == "cpu" and rows["xla"]["fused_kernel_sites"] == 0
    assert 0 < rows["splash"]["flops"] < rows["xla"]["flops"]


# ---- in-process parts ---------------------------------------------------------------------------------------------


def test_bench_host_path_part_reports_both_paths(tmp_path):
    """`python -m bench --only hostpath` at a small size: every figure present (timings are the bench's, not ours)."""
    from bench.fullsize import CODECS, host_path, markdown

    result = host_path(size=128, runs=1, images=2, say=lambda _: None)
    assert [c.codec for c in result.codecs] == list(CODECS) * 2 and all(c.kb > 0 for c in result.codecs)
    for request in result.requests:
        assert request.images == 2 and request.after_kb_per_image < request.before_kb_per_image
        assert request.after_ms.n == request.before_ms.n == request.background_png_ms.n == 1
    assert 0 < result.after_share < 1 and 0 < result.before_share < 1
    text = "\n".join(markdown(result, None))
    assert "## Host path at 128²" in text and "Lightning-4" in text


def test_bench_hostloop_part_measures_both_loops(engine):
    """`python -m bench --only hostloop` on the shared engine: both loops timed, no compilation while timing."""
    from bench.hostloop import host_loop_cost

    result = host_loop_cost(engine, steps=3, runs=1, say=lambda _line: None)
    assert result.host_loop_call.median > 0 and result.fused_call.median > 0
    assert result.compiles_while_timing == 0 and result.steps == 3
