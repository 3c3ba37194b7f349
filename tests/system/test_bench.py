"""The benchmark: `python -m bench` end to end on the tiny checkpoint, every part at its smallest (the figures exist
and are sane), `python -m bench unet`, and the in-process parts (host path, host loop) on small inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BATCHED_DEVICES, BATCHED_SETTINGS, IMAGES_PER_DEVICE, REPO, TEST_SIZE, TEST_STEPS
from PIL import Image

PARTS = ("reference", "startup", "serving", "recompiles", "flops", "achieved", "fewstep")


def positive(value) -> bool:
    return isinstance(value, int | float) and value > 0


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    command = [
        sys.executable,
        "-m",
        "bench",
        "--model",
        "tiny",
        "--height",
        str(TEST_SIZE),
        "--width",
        str(TEST_SIZE),
        "--steps",
        str(TEST_STEPS),
        "--runs",
        "1",
        "--clients",
        "1,2",
        "--requests-per-client",
        "1",
        "--recompile-requests",
        "5",
        "--startup-runs",
        "1",
        "--out",
        str(out),
        "--only",
        "reference,startup,app,recompiles,flops,fewstep",
        "--check",
        "1000",
    ]
    # The start-up part compiles every served program cold, in an app (3 sizes), in a process and from executables:
    # with the 1- and 3-window text programs that took 10 minutes and more on 2 cores at load 8-15 (600 s ran out).
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[bench " in done.stdout  # progress lines while it runs
    assert "bench check passed: engine / diffusers = " in done.stdout
    return out


@pytest.mark.slow
@pytest.mark.long
def test_results_json_has_every_part_with_sane_values(bench_out):
    results = json.loads((bench_out / "results.json").read_text())
    for part in PARTS:
        assert results.get(part), f"results.json lacks {part}"
    assert results["failed"] == {}  # no part failed (a failed one is recorded there, the others still run)
    machine = results["machine"]
    assert machine["device_count"] == 8 and machine["cpu_count"] >= 1
    assert set(machine["packages"]) >= {"jax", "jaxlib", "flax", "gradio"}
    reference_packages = machine["reference_packages"]  # diffusers' pipeline ran in the reference venv
    assert set(reference_packages) >= {"jax", "jaxlib", "flax", "diffusers", "transformers"}
    assert reference_packages["diffusers"] != "not installed"
    assert int(reference_packages["transformers"].split(".")[0]) < 5  # transformers 5 has no Flax

    ref = results["reference"]
    assert ref["images_per_call"] == 8
    assert positive(ref["engine"]["median"]) and positive(ref["reference"]["median"]) and positive(ref["ratio"])
    assert ref["ratio"] == pytest.approx(ref["engine"]["median"] / ref["reference"]["median"])
    size = f"{TEST_SIZE}x{TEST_SIZE}"  # a plain request's programs, each timed: the parts of the engine's call
    first = ["encode cfg", f"start {size}", "cross_kv cfg"]  # the text's table: --cross-attention-cache on CPU
    assert list(ref["engine_programs"]) == [*first, f"step_full {size} cfg", f"decode {size}"]
    assert all(positive(seconds) for seconds in ref["engine_programs"].values())
    assert positive(ref["cpu_ratio"]) and positive(ref["new_text_cpu_ratio"]) and ref["pair_ratios"]["n"] == 1
    for side in ("engine_cpu_ms_by_thread", "reference_cpu_ms_by_thread"):  # where each side's CPU seconds ran
        assert list(ref[side]) == ["main", "XLA Eigen pool", "other"] and positive(sum(ref[side].values()))

    startup = results["startup"]
    for run in ("cold", "warm"):
        for phase in ("imports_s", "load_s", "compile_s", "first_run_s", "first_image_s", "process_wall_s"):
            assert positive(startup[run][phase]), (run, phase)
    assert startup["cache_entries"] > 0
    assert positive(startup["app_cold_ready_s"]) and positive(startup["app_warm_ready_s"])
    assert positive(startup["app_executables_ready_s"])
    kinds = [start["kind"] for start in startup["app"]]
    assert kinds == ["cold", "warm", "warm + executables"]  # --startup-runs 1
    cold, warm, whole = (start["programs"] for start in startup["app"])
    # Cold: every program traced and compiled, but one whose HLO an earlier program of the same start already put in
    # JAX's cache is read from it.
    assert cold["traced"] == cold["programs"] > 0 and cold["loaded"] == 0
    assert cold["compiled"] + cold["cached"] == cold["traced"] and cold["compiled"] > 0
    assert warm["traced"] == warm["cached"] == warm["programs"] and warm["loaded"] == 0
    assert whole["loaded"] == whole["programs"] and whole["traced"] == 0
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
@pytest.mark.long
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
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
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


@pytest.mark.long  # as the other parts' smoke tests; the request kinds' programs: tests/engine/test_request_programs.py
def test_bench_accelerator_smoke_on_cpu(tmp_path):
    """The accelerator part's command at the tiny checkpoint's size: engine vs diffusers on the same weights, and the
    request kinds, each running its own programs (a request without guidance: the guidance-free step)."""
    command = [
        sys.executable,
        "-m",
        "bench",
        "accelerator",
        "--model",
        "tiny",
        "--size",
        "64",
        "--steps",
        "2",
        "--runs",
        "1",
        "--parts",
        "engine,requests",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "accelerator.json").read_text())
    compared = results["engine_vs_diffusers"]
    assert compared["engine"]["median"] > 0 and compared["reference"]["median"] > 0 and compared["ratio"] > 0
    rows = {row["request"]: row for row in results["requests"]}
    assert len(rows) == 6 and all(row["median_s"] > 0 for row in rows.values())
    assert any("no-cfg" in label for label in rows["4 steps, no CFG (Lightning-4's shape)"]["programs_ms"])
    assert any("step_shallow" in label for label in rows["25 steps, DeepCache 3"]["programs_ms"])


def torch_python() -> str | None:
    """A python with torch, diffusers and transformers for the PyTorch peer: $SDXL_TORCH_PYTHON, else
    /work/torchenv's (this project's CPU machine), else None (CI: torch is in no requirements file)."""
    import os

    named = os.environ.get("SDXL_TORCH_PYTHON") or "/work/torchenv/bin/python"
    return named if Path(named).is_file() else None


@pytest.mark.long  # the engine's programs, then torch.compile of the tiny UNet and VAE decode: 4 min here at load 10
@pytest.mark.skipif(torch_python() is None, reason="no python with torch: set SDXL_TORCH_PYTHON")
def test_bench_accelerator_peer_torch_smoke_on_cpu(tmp_path):
    """`--peer torch`: diffusers' PyTorch pipeline on the tiny checkpoint's architectures, eager and compiled, each
    warmed up and timed beside the engine's same request, with the ratios and the worker's versions recorded."""
    command = [
        sys.executable,
        "-m",
        "bench",
        "accelerator",
        "--model",
        "tiny",
        "--size",
        "64",
        "--steps",
        "2",
        "--runs",
        "1",
        "--parts",
        "engine",
        "--peer",
        "torch",
        "--torch-python",
        torch_python(),
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    peer = json.loads((tmp_path / "accelerator.json").read_text())["peer_torch"]
    assert "error" not in peer and "skipped" not in peer, peer
    assert peer["device"] == "cpu" and peer["dtype"] == "float32" and peer["packages"]["diffusers"] == "0.39.0"
    assert positive(peer["engine"]["median_s"]) and len(peer["engine"]["seconds"]) == 1
    for mode, warmups in (("eager", 2), ("compile", 3)):
        row = peer["modes"][mode]
        assert len(row["seconds"]) == 1 and positive(row["median_s"]) and row["images_per_call"] == 1
        assert len(row["warmup_s"]) == warmups and all(positive(s) for s in row["warmup_s"])
        per_image = peer["engine"]["median_s"] / peer["engine"]["images_per_call"]  # one image per device
        assert row["engine_over_mode"] == pytest.approx(per_image / row["median_s"])
        assert f"engine / torch {mode} = " in done.stdout


def test_peer_torch_is_skipped_in_one_sentence_where_torch_does_not_import(monkeypatch):
    """A python that cannot import the worker's libraries (or cannot run) is named with the reason, in one line."""
    from bench.accelerator import torch_peer

    monkeypatch.setattr(torch_peer, "NEEDS", ("json", "no_such_module_here"))
    missing = torch_peer.torch_missing(sys.executable)
    assert missing.startswith(f"{sys.executable} cannot import json, no_such_module_here (ModuleNotFoundError")
    assert "\n" not in missing
    assert torch_peer.torch_missing("/nonexistent/python") == "/nonexistent/python could not run: FileNotFoundError"
    monkeypatch.setattr(torch_peer, "NEEDS", ("json",))
    assert torch_peer.torch_missing(sys.executable) is None


def test_torch_worker_imports_only_its_libraries_and_the_bench_never_imports_torch():
    """torch is in no requirements file: only the worker, run by --torch-python, may import it."""
    import ast

    tree = ast.parse((REPO / "bench" / "accelerator" / "torch_worker.py").read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported - sys.stdlib_module_names - {"__future__"} == {"torch", "diffusers", "transformers"}
    code = (
        "import sys, bench.accelerator.end_to_end, bench.accelerator.torch_peer; "
        "print(sorted(m for m in sys.modules if m == 'torch'))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


def test_torch_worker_failure_is_one_sentence_and_the_worker_ends():
    """A load the worker cannot do (no torch here, or no such mode): its error in one line, the process gone."""
    from bench.accelerator.torch_peer import TorchWorker
    from bench.cpu.reference import ReferenceWorkerError

    worker = TorchWorker({"dtype": "float32", "modes": ["no such mode"]}, python=Path(sys.executable))
    with pytest.raises(ReferenceWorkerError) as raised:
        worker.__enter__()
    message = str(raised.value)
    assert message.startswith("the torch worker could not load diffusers' pipeline: ") and "\n" not in message
    assert worker.process is None


def test_peer_torch_spec_has_the_engines_architectures():
    """SDXL's configs (bench/accelerator/flops.py) or the tiny checkpoint's config.json files, and the tiny
    tokenizers."""
    from bench.accelerator.flops import SDXL_UNET_CONFIG
    from bench.accelerator.torch_peer import torch_spec
    from pipeline.checkpoint.loading import resolve_model

    tiny = Path(resolve_model("tiny"))
    scheduler = {"beta_schedule": "scaled_linear"}
    sdxl = torch_spec("sdxl", "bfloat16", tiny, scheduler)
    assert sdxl["unet"] == SDXL_UNET_CONFIG and sdxl["dtype"] == "bfloat16" and sdxl["modes"] == ["eager", "compile"]
    assert sdxl["scheduler_config"] == scheduler and Path(sdxl["tokenizer_2"], "vocab.json").is_file()
    small = torch_spec("tiny", "float32", tiny, scheduler)
    assert small["unet"] == json.loads((tiny / "unet" / "config.json").read_text())
    assert small["text_encoder_2"]["hidden_size"] < sdxl["text_encoder_2"]["hidden_size"]


@pytest.mark.long  # a subprocess compiling the tiny engine's request programs: 10-30 s here; the parser's test is fast
def test_bench_step_profile_smoke_on_cpu(tmp_path):
    """The step-profile part at the tiny checkpoint's size: the CFG step found, timed and traced, XLA:CPU's
    thunks summed by category into the JSON and the table, lever sets (an XLA option, an engine switch) timed beside
    the engine and one XLA refuses,
    and the throughput rows at 1 and 2 images per device."""
    command = [
        sys.executable,
        "-m",
        "bench",
        "step-profile",
        "--model",
        "tiny",
        "--size",
        "64",
        "--calls",
        "2",
        "--throughput",
        "1,2",
        "--runs",
        "1",
        "--request-runs",
        "2",
        "--out",
        str(tmp_path),
        "--levers",
        "fast:xla_cpu_enable_fast_math=true;kv:cross_attention_cache;refused:xla_no_such_option=1",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "step_profile.json").read_text())
    assert results["program"] == "step_full 64x64 cfg" and results["request_calls"]["step_full 64x64 cfg"] == 25
    assert results["timing"]["back_to_back_ms"] > 0 and results["tflop"] > 0
    profile = results["profile"]
    assert profile["source"]["rule"].startswith("host events") and profile["kernels_per_step"] > 0
    assert "convolution" in profile["categories"] and 0 < len(profile["top_kernels"]) <= 25
    assert abs(sum(row["percent"] for row in profile["categories"].values()) - 100) < 1e-6
    assert "| convolution |" in (tmp_path / "step_profile.md").read_text()
    rows, devices = results["throughput"], results["devices"]  # MLPerf's request at 1 and 2 images per device
    assert [(row["images_per_device"], row["images"]) for row in rows] == [(1, devices), (2, 2 * devices)]
    assert all(row["images_per_s"] > 0 and len(row["request_s"]) == 1 for row in rows)
    assert f"| 2 | {2 * devices} |" in (tmp_path / "step_profile.md").read_text()
    assert not (tmp_path / "trace").exists() and not (tmp_path / "trace.json.gz").exists()  # no --keep-trace
    base, fast, kv, refused = results["levers"]  # timed in rounds, beside the engine without them
    assert (base["name"], fast["name"], kv["name"], refused["name"]) == ("base", "fast", "kv", "refused")
    assert kv["engine_switches"] == ["cross_attention_cache"] and kv["max_pixel_difference"] == 0
    assert len(base["request_s"]) == len(fast["request_s"]) == 2 and fast["over_base"] > 0
    assert fast["xla_options"] == [["xla_cpu_enable_fast_math", "true"]] and fast["pixels_differing_percent"] >= 0
    assert refused["error"].startswith("XLA refused --xla-option xla_no_such_option=1") and "request_s" not in refused
    assert "| fast | `xla_cpu_enable_fast_math=true` |" in (tmp_path / "step_profile.md").read_text()
    assert "| kv | `--cross-attention-cache` |" in (tmp_path / "step_profile.md").read_text()


def test_step_profile_reads_the_device_streams_and_sorts_kernels_by_name():
    """A GPU-shaped trace: only the device's Stream lines count (not the derived XLA Ops line, not the host), and
    each kernel name lands in its category by the rules' order (cuDNN attention says fprop, its convolutions gemm)."""
    from bench.accelerator.step_profile import categorise, device_events, summarise

    def meta(kind, pid, name, tid=None):
        return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}

    def kernel(name, dur, tid=1, pid=2, hlo_op=""):
        return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": 0, "dur": dur, "args": {"hlo_op": hlo_op}}

    kernels = [
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", 4000, "attention"),
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 3000, "convolution"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 2000, "matrix products"),
        ("input_reduce_fusion_12", 500, "norms (reductions)"),
        ("loop_transpose_fusion_3", 300, "copies and layout"),
        ("loop_add_fusion_7", 200, "element-wise"),
        ("some_custom_kernel", 100, "other"),
    ]
    more = [
        ("loop_convert_fusion_2", "element-wise"),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NTN", "matrix products"),
        ("void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16>", "copies and layout"),
        ("triton_softmax_fusion_4", "norms (reductions)"),
        ("MemcpyD2D", "copies and layout"),
    ]
    assert [categorise(name) for name, _ in more] == [category for _, category in more]
    events = [
        meta("process_name", 1, "/host:CPU"),
        meta("process_name", 2, "/device:GPU:0"),
        meta("thread_name", 2, "Stream #13(Compute)", 1),
        meta("thread_name", 2, "XLA Ops", 9),
    ]
    for _ in range(2):  # two steps
        events += [kernel(name, dur) for name, dur, _ in kernels]
        events += [kernel("fusion.3", 99999, tid=9), kernel("cuLaunchKernel", 99999, pid=1, hlo_op="fusion.3")]
    chosen, source = device_events(events)
    assert len(chosen) == 14 and source["rule"] == "device Stream lines"
    assert source["lines"] == {"/device:GPU:0 / Stream #13(Compute)": 14}
    assert [categorise(name) for name, _, _ in kernels] == [category for _, _, category in kernels]
    summary = summarise(chosen, steps=2, top=3)
    assert summary["kernel_ms_per_step"] == 10.1 and summary["kernels_per_step"] == 7
    assert summary["categories"]["attention"] == {"ms_per_step": 4.0, "percent": 4000 / 101, "kernels_per_step": 1}
    assert [row["category"] for row in summary["top_kernels"]] == ["attention", "convolution", "matrix products"]


def test_bench_unet_cost_counts_the_fused_kernels():
    """Lowered cost (in process): splash, lowered for TPU, puts its kernel in the program and XLA counts no FLOPs."""
    from bench.accelerator.unet import cost_report, parse_args

    args = parse_args(["--cost", "--model", "tiny", "--height", "256", "--width", "256", "--attention", "xla,splash"])
    rows = {row["attention"]: row for row in cost_report(args, progress=lambda message: None)}
    assert rows["splash"]["platform"] == "tpu" and rows["splash"]["fused_kernel_sites"] > 0
    assert rows["xla"]["platform"] == "cpu" and rows["xla"]["fused_kernel_sites"] == 0
    assert 0 < rows["splash"]["flops"] < rows["xla"]["flops"]


# ---- a part that fails ----------------------------------------------------------------------------------------------


def test_every_part_has_its_measurement():
    from bench.__main__ import DEFAULT_PARTS, ENGINE_PARTS, MEASURES, PARTS

    assert set(MEASURES) == set(PARTS) and set(DEFAULT_PARTS) | ENGINE_PARTS <= set(PARTS)


def test_a_part_that_fails_is_recorded_and_the_next_parts_run():
    """bench/parts.py over real measurements (the samplers part's plan timing): the one given an unknown sampler
    raises; its error and where it was raised are recorded, and the parts on either side of it still measure."""
    from bench.cpu.hostloop import plan_cost
    from bench.parts import run_parts

    measured: dict[str, float] = {}
    lines: list[str] = []
    failed = run_parts(
        [
            (name, lambda name=name: measured.update({name: plan_cost(name, steps=4, repeats=1)}))
            for name in ("Euler", "No such sampler", "Heun")
        ],
        say=lines.append,
    )
    assert list(measured) == ["Euler", "Heun"] and all(ms > 0 for ms in measured.values())
    assert list(failed) == ["No such sampler"]
    error, at = failed["No such sampler"]["error"], failed["No such sampler"]["at"]
    assert error.startswith("InvalidInput: Unknown sampler 'No such sampler'; choose one of: Euler")
    assert at.startswith("pipeline/contract/sampler_names.py:") and at.endswith(" in sampler_id")
    assert lines == [f"No such sampler failed: {error} ({at}); the next part runs"]

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # Ctrl-C still ends the bench
        run_parts([("interrupted", interrupted), ("after", lambda: measured.update(after=1.0))])
    assert "after" not in measured


def test_bench_writes_its_results_with_the_failed_parts_and_exits_1(tmp_path):
    """An engine that does not load (no such checkpoint): recorded as "engine", the parts that need it as not run;
    results.json and results.md are written all the same; exit 1, and --check says its part measured nothing."""
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "bench",
        "--only",
        "reference,stop",
        "--model",
        str(tmp_path / "absent"),
        "--runs",
        "1",
        "--check",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    failed = results["failed"]
    assert list(failed) == ["engine", "reference", "stop"] and "reference" not in results and "stop" not in results
    engine_error = failed["engine"]["error"]
    assert engine_error.startswith("CheckpointError: Model directory ") and "does not exist" in engine_error
    assert failed["engine"]["at"].startswith("pipeline/checkpoint/")
    assert all("not run: the bench's engine did not load" in failed[part]["error"] for part in ("reference", "stop"))
    assert "engine failed: CheckpointError: Model directory" in done.stdout and "Traceback" not in done.stderr
    assert "bench: 3 part(s) failed (engine, reference, stop)" in done.stderr
    assert "bench check FAILED: the reference part measured nothing" in done.stderr
    text = (out / "results.md").read_text()
    assert "## Parts that failed (the others ran)" in text and "- **stop**: RuntimeError: not run" in text


# ---- in-process parts ---------------------------------------------------------------------------------------------


def test_bench_host_path_part_reports_both_paths(tmp_path):
    """`python -m bench --only hostpath` at a small size: every figure present (timings are the bench's, not ours)."""
    from bench.serving.fullsize import CODECS, host_path, markdown

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
    from bench.cpu.hostloop import host_loop_cost

    result = host_loop_cost(engine, steps=3, runs=1, say=lambda _line: None)
    assert result.host_loop_call.median > 0 and result.fused_call.median > 0
    assert result.compiles_while_timing == 0 and result.steps == 3


def test_bench_merging_part_measures_the_engines(tiny_dir):
    """`python -m bench --only merging` at the tests' size, 2 per call, one round: both engines timed, the merged
    rounds' calls held at most 2 requests, and a lone request was timed on each; no compilation while timing.

    On `batched_engine`'s settings and devices (2 × 2 images per call, 1 text window, no previews or levers): its
    programs and those of test_request_merging.py's merging engine (1 image per device) are these engines' (JAX's
    cache serves whichever ran first); the bench's defaults on 8 devices compiled 17 programs of their own."""
    import argparse

    import jax

    from bench.cpu.merging import merged_serving

    shape = ("height", "width", "steps", "dtype")
    args = argparse.Namespace(model=str(tiny_dir), **{name: BATCHED_SETTINGS[name] for name in shape})
    settings = {name: value for name, value in BATCHED_SETTINGS.items() if name not in (*shape, "per_device_batch")}
    result = merged_serving(
        args,
        slots=IMAGES_PER_DEVICE,
        runs=1,
        say=lambda _line: None,
        settings={"devices": jax.devices()[:BATCHED_DEVICES], **settings},
    )
    assert (result.slots, result.clients, result.requests_per_round, result.images_per_request) == (2, 4, 8, 2)
    assert result.alone_requests_per_s.median > 0 and result.merged_requests_per_s.median > 0
    assert result.alone_latency_s.n == result.merged_latency_s.n == 8
    # How many shared a call depends on timing; that they do is test_request_merging.py's (event-driven).
    assert 1 <= result.merged_requests_per_call <= 2 and result.compiles_during_runs == 0
    assert set(result.merged_calls_by_size) <= {1, 2} and sum(result.merged_calls_by_size.values()) >= 4
    assert {name: stats.n for name, stats in result.lone_latency_s.items()} == {
        "alone": 3,
        "merged": 3,
        "full calls": 3,
    }


@pytest.mark.long  # 100-step requests through a launched app: 9 min with the engine's start-up at load 15-20; the
# parts' runner is checked by the fast tests above, the Stop path by tests/web/test_stop.py
def test_bench_stop_part_measures_a_cancelled_request(engine):
    """`python -m bench --only stop` on the shared engine (64×64): a 100-step request cancelled through
    gradio_client stops well before its end, and the server's moments come in order."""
    from bench.cpu.hostloop import STOP_STEPS, stop_latency

    result = stop_latency(engine, runs=1, say=lambda _line: None)
    assert result.steps == STOP_STEPS == 100 and 2 <= result.engine_stopped_after < STOP_STEPS
    assert result.cancelled_at_step >= 2 and result.cancel_to_stop_seen.n == 1 and result.step_s.median > 0
    assert 0 <= result.cancel_to_stop_seen.median <= result.cancel_to_devices_free.median
    assert result.cancel_to_devices_free.median <= result.cancel_to_next_first_step_queued.median
    assert result.cancel_to_next_first_step_queued.median <= result.cancel_to_next_first_step_ready.median


# ---- the feature parts: lora, img2img, levers, previews, history (one `python -m bench` at its smallest) -------------

FEATURE_PARTS = ("lora", "img2img", "levers", "previews", "history")
FEATURE_STEPS = 4  # levers and previews: cfg_end 0.5 and deepcache 2/3 differ, and one preview comes (at step 2)


@pytest.fixture(scope="module")
def feature_results(tmp_path_factory) -> dict:
    """results.json of `python -m bench --only lora,img2img,levers,previews,history` at a tiny scale."""
    out = tmp_path_factory.mktemp("bench-features")
    command = [
        sys.executable,
        "-m",
        "bench",
        "--model",
        "tiny",
        "--height",
        str(TEST_SIZE),
        "--width",
        str(TEST_SIZE),
        "--steps",
        str(TEST_STEPS),
        "--runs",
        "1",
        "--only",
        ",".join(FEATURE_PARTS),
        "--lora-rounds",
        "1",
        "--feature-steps",
        str(FEATURE_STEPS),
        "--preview-size",
        "256",
        "--history-adds",
        "1",
        "--history-entries",
        "20",
        "--history-size",
        "128",
        "--history-calls",
        "2",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    results["markdown"] = (out / "results.md").read_text()
    return results


def timed_ok(stats: dict, n: int) -> bool:
    """A Millis summary of `n` positive measurements."""
    return stats["n"] == n and 0 < stats["min"] <= stats["median"] <= stats["p90"] <= stats["max"]


@pytest.mark.slow
@pytest.mark.long
def test_bench_lora_part(feature_results):
    lora = feature_results["lora"]
    assert len(lora["offered"]) >= 2 and "corrupt" not in lora["offered"]  # the fixtures the engine accepts
    assert lora["set_a"] != lora["set_b"] and lora["kernels"] > 0 and lora["rank"] >= 1 and lora["slot_mb"] > 0
    assert positive(lora["merge_lower_s"]) and positive(lora["merge_compile_s"]) and timed_ok(lora["merge_alone"], 2)
    assert timed_ok(lora["switch_request"], 2) and timed_ok(lora["same_request"], 2)
    assert timed_ok(lora["no_lora_request"], 1) and lora["compiles_while_timing"] == 0
    assert lora["switch_cost_ms"] == pytest.approx(lora["switch_request"]["median"] - lora["same_request"]["median"])
    assert "## LoRA sets" in feature_results["markdown"]


@pytest.mark.slow
@pytest.mark.long
def test_bench_img2img_part(feature_results):
    images = feature_results["img2img"]
    kinds = {kind["name"]: kind for kind in images["kinds"]}
    assert list(kinds) == ["txt2img", "img2img 0.5", "img2img 1.0", "inpainting 1.0"]
    assert [kind["steps_run"] for kind in kinds.values()] == [TEST_STEPS, TEST_STEPS // 2, TEST_STEPS, TEST_STEPS]
    assert kinds["inpainting 1.0"]["mask"] and not kinds["img2img 1.0"]["mask"]
    assert all(timed_ok(kind["generate"], 1) and timed_ok(kind["parse"], 1) for kind in kinds.values())
    assert kinds["txt2img"]["vs_txt2img"] == 1 and images["compiles_while_timing"] == 0
    assert "## Image inputs" in feature_results["markdown"]


@pytest.mark.slow
@pytest.mark.long
def test_bench_levers_part(feature_results):
    levers = feature_results["levers"]
    rows = {(row["cfg_end"], row["deepcache"]): row for row in levers["rows"]}
    assert list(rows) == [(1.0, 1), (1.0, 2), (1.0, 3), (0.5, 1), (0.5, 2), (0.5, 3)]
    # speed_plan at 4 steps: guidance on ⌈0.5 × 4⌉ = 2 steps; the whole UNet on steps 0, 2 (N=2) and 0, 3 (N=3)
    assert [(row["guided_steps"], row["whole_unet_steps"]) for row in rows.values()] == [
        (4, 4),
        (4, 2),
        (4, 2),
        (2, 4),
        (2, 2),
        (2, 2),
    ]
    assert all(timed_ok(row["request"], 1) for row in rows.values()) and rows[(1.0, 1)]["vs_default"] == 1
    assert levers["steps"] == FEATURE_STEPS and levers["compiles_while_timing"] == 0
    assert "CPU ratios are not TPU ratios" in levers["note"] and "## Speed levers" in feature_results["markdown"]


@pytest.mark.slow
@pytest.mark.long
def test_bench_previews_part(feature_results):
    on_off = feature_results["previews"]
    assert on_off["previews_per_request"] == 1 and on_off["compiles_while_timing"] == 0  # 4 steps: one, at step 2
    assert timed_ok(on_off["with_previews"], 1) and timed_ok(on_off["without_previews"], 1)
    host = feature_results["preview_host"]
    assert host["size"] == 256 and host["latents_shape"] == [8, 4, 32, 32] and host["devices"] == 8
    assert host["every"] == 2 and host["jpeg_quality"] == 85 and positive(host["jpeg_kb"])
    for name in ("dispatch", "local_rows", "put", "loop_thread", "jpeg", "content_files", "page_thread"):
        assert timed_ok(host[name], host["repeats"]), name
    assert host["host_ms_per_step"] == pytest.approx(host["loop_thread_ms_per_step"] + host["page_thread_ms_per_step"])
    assert host["page_thread_ms_per_step"] == pytest.approx(host["page_thread"]["median"] / 2)
    assert host["v5e_step_ms"] == {} and host["share_of_v5e_step"] == {}  # shares at 1024² only
    assert "host work per preview at 256²" in feature_results["markdown"]


def test_bench_previews_v5e_steps_come_from_the_tpu_results():
    """The v5e step the 1024² share is taken of is the recorded roofline of the served step program, not a guess."""
    from bench.features.previews import TPU_RESULTS, v5e_steps

    steps, source = v5e_steps()
    programs = json.loads(TPU_RESULTS.read_text())["programs"]
    splash = {}  # the first plain row per CFG: FreeU/PAG steps (extras) and 3-window steps are other programs
    for p in programs:
        plain = p.get("prompt_windows", 1) == 1 and not p.get("extras") and not p.get("cross_attention_cache")
        if (p["kind"], p["size"], p["attention"]) == ("step", "1024x1024", "splash") and plain:
            splash.setdefault(p["cfg"], p["roofline_s"] * 1000)
    assert list(steps.values()) == [splash[True], splash[False]] and "tpu.json" in source
    assert v5e_steps(TPU_RESULTS.with_name("absent.json"))[0] == {}


@pytest.mark.slow
@pytest.mark.long
def test_bench_history_part(feature_results):
    history = feature_results["history"]
    assert history["entries"] == 20 and history["image_size"] == 128 and history["images_per_request"] == 4
    kinds = ("jpeg", "png", "png_thumbs_from_memory", "png_thumbs_from_jpeg")
    assert set(history["add"]) == {f"{kind}_{sync}" for kind in kinds for sync in ("durable", "fast")}
    assert all(timed_ok(stats, 1) for stats in history["add"].values())
    assert timed_ok(history["list_50"], 30) and timed_ok(history["list_all"], 30) and timed_ok(history["delete"], 20)
    assert timed_ok(history["get"], 200) and timed_ok(history["path_of"], 200) and positive(history["answer_kb"])
    assert history["file_kb"]["png"] > history["file_kb"]["jpeg"] > 0
    endpoint = history["endpoint"]  # /history through gradio_client, logged in
    assert endpoint["entries_returned"] == 20 and timed_ok(endpoint["per_call"], 2) and positive(endpoint["answer_kb"])
    assert "## Server history" in feature_results["markdown"]


def test_bench_check_fails_over_its_threshold_and_names_the_parts():
    from bench.common import Stats
    from bench.cpu.reference import CHECK_RATIO, EngineVsReference, check_ratio

    def call(engine_s: float, reference_s: float) -> EngineVsReference:
        engine, reference, ratio = Stats.of([engine_s]), Stats.of([reference_s]), engine_s / reference_s
        return EngineVsReference(
            images_per_call=8,
            engine=engine,
            reference=reference,
            engine_images_per_s=8 / engine_s,
            reference_images_per_s=8 / reference_s,
            ratio=ratio,
            target_ratio=0.9,
            meets_target=False,
            engine_host=Stats.of([0.004]),
            reference_host=Stats.of([0.006]),
            reference_load_s=1.0,
            reference_first_call_s=9.0,
            pair_ratios=Stats.of([ratio]),
            cpu_ratio=ratio,
            engine_programs={"encode cfg": 0.02, "step_full 128x128 cfg": 0.5},
            engine_programs_s=0.6,
        )

    assert check_ratio(call(0.2, 0.2), CHECK_RATIO) is None
    failure = check_ratio(call(0.3, 0.2), CHECK_RATIO)
    assert failure.startswith(f"engine / diffusers = 1.50 in CPU seconds > {CHECK_RATIO:g} (wall 1.50: engine 300 ms")
    assert "step_full 128x128 cfg 500.0" in failure
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "flops", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "--check guards the reference part" in done.stderr


@pytest.mark.slow
def test_bench_apphost_part_times_each_way_of_calling():
    from bench.serving.apphost import CALLS, IMAGES, app_host_cost

    cost = app_host_cost(runs=1, say=lambda _: None)
    assert set(cost.overhead) == set(CALLS) and cost.images == IMAGES
    assert all(positive(stats.median) for stats in cost.cpu.values())
    assert all(cost.overhead[label].median < cost.wall[label].median for label in CALLS)
    fetched = cost.fetched_bytes  # the same 8 JPEGs with or without previews; nothing when nothing is fetched
    assert fetched["previews"] == fetched["no previews"] > 8 * 400_000 and fetched["no previews, nothing fetched"] == 0
    assert fetched["png"] > fetched["previews"]
