"""`python -m bench gpu`: both stages end to end at the tiny size, and (without JAX work) a stage cut by the budget,
a peer that cannot run, and the figures read back only from this run's JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO


def bench_gpu(out: Path, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "bench", "gpu", *args, "--out", str(out)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env, check=False)


@pytest.mark.slow
@pytest.mark.long  # the accelerator stage compiles every served program and diffusers' pipeline: minutes here
def test_bench_gpu_smoke_on_cpu(tmp_path):
    """Both stages finish; the headline figures are the children's own, and the PyTorch peer (no torch in this
    python) is left out in one line while the Flax pipeline is compared."""
    done = bench_gpu(
        tmp_path,
        "--model",
        "tiny",
        "--size",
        "64",
        "--steps",
        "2",
        "--runs",
        "1",
        "--throughput",
        "1,2",
        "--throughput-runs",
        "1",
        "--calls",
        "2",
        "--torch-python",
        sys.executable,
        "--request-runs",
        "1",
        "--budget-s",
        "1500",
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len([line for line in done.stdout.splitlines() if "torch peer missing" in line]) == 1
    summary = json.loads((tmp_path / "gpu.json").read_text())
    accelerator, profile = summary["stages"]
    assert [accelerator["status"], profile["status"]] == ["finished", "finished"]
    assert all(0 < stage["seconds"] <= stage["deadline_s"] for stage in summary["stages"])
    compared = json.loads((tmp_path / "accelerator.json").read_text())["engine_vs_diffusers"]
    figures = accelerator["figures"]
    assert figures == {
        "engine_s": compared["engine"]["median"],
        "flax_pipeline_s": compared["reference"]["median"],
        "engine_over_flax": compared["ratio"],
    }
    assert all(value > 0 for value in figures.values())
    assert "cannot import torch" in accelerator["missing_figures"]["torch_compile_s"]
    steps = json.loads((tmp_path / "step_profile.json").read_text())
    assert profile["figures"]["step_ms_back_to_back"] == steps["timing"]["back_to_back_ms"] > 0
    rows = profile["figures"]["throughput"]
    assert [row["images_per_device"] for row in rows] == [1, 2] and profile["missing_figures"] == {}
    assert [row["images_per_s"] for row in rows] == [row["images_per_s"] for row in steps["throughput"]]
    levers = profile["figures"]["levers"]  # the default sets: GPU options, on this CPU the same pixels
    assert [row["name"] for row in levers] == ["base", "nomerge", "kvcache"] == [row["name"] for row in steps["levers"]]
    assert all(row["max_pixel_difference"] == 0 and row["over_base"] > 0 for row in levers[1:])
    table = (tmp_path / "gpu.md").read_text()
    assert "| accelerator | finished |" in table and "| step-profile | finished |" in table
    assert f"| engine / Flax pipeline | {compared['ratio']:.4g} |" in table


def test_missing_peers_are_one_line_each_and_the_stage_is_skipped(tmp_path):
    """No reference python and no torch: one line per peer saying what to install, the accelerator stage skipped
    (nothing started), its figures absent with the reason, exit 1."""
    env = {**os.environ, "SDXL_REFERENCE_PYTHON": str(tmp_path / "no-python")}
    done = bench_gpu(tmp_path / "out", "--stages", "accelerator", "--torch-python", sys.executable, env=env)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    torch_lines = [line for line in done.stdout.splitlines() if "torch peer missing" in line]
    assert len(torch_lines) == 1 and f"{sys.executable} cannot import torch" in torch_lines[0]
    assert "--torch-python" in torch_lines[0]  # what to install, and where
    flax_lines = [line for line in done.stdout.splitlines() if "flax peer missing" in line]
    assert len(flax_lines) == 1 and "no-python is not an executable file" in flax_lines[0]
    assert "SDXL_REFERENCE_PYTHON" in flax_lines[0]
    assert "Traceback" not in done.stdout + done.stderr
    [stage] = json.loads((tmp_path / "out" / "gpu.json").read_text())["stages"]
    assert stage["status"] == "skipped" and stage["figures"] == {} and stage["seconds"] == 0
    assert "cannot import torch" in stage["missing_figures"]["engine_over_torch_eager"]
    assert not (tmp_path / "out" / "accelerator.json").exists() and not (tmp_path / "out" / "accelerator.log").exists()


def test_a_missing_peer_is_left_out_of_the_accelerator_command():
    """One peer missing: the stage still runs, without that peer (no --peer torch; or --parts "" for the Flax one)."""
    from bench.accelerator.gpu import parse_args, plan

    args = parse_args(["--stages", "accelerator", "--torch-python", "/opt/torch/bin/python"])
    [no_torch] = plan(args, {"torch peer": "no torch"})
    assert no_torch.skipped is None and "--peer" not in no_torch.command
    assert no_torch.command[no_torch.command.index("--parts") + 1] == "engine"
    assert no_torch.left_out == {"peer_torch": "no torch"}
    [no_flax] = plan(args, {"flax peer": "no venv"})
    assert no_flax.command[no_flax.command.index("--parts") + 1] == ""
    assert no_flax.command[-3:] == ["torch", "--torch-python", "/opt/torch/bin/python"]
    [both] = plan(args, {})
    assert both.left_out == {} and "--peer" in both.command and "engine" in both.command
    assert both.command[both.command.index("--warm-up") + 1] == "request"  # only what the measured requests run


def test_the_step_profile_stage_times_the_levers_and_they_are_read_back():
    """The default lever sets go to the step-profile stage; their rows are read back from its JSON, and a set the
    stage did not reach is named with the reason."""
    from bench.accelerator.gpu import LEVERS, Stage, headline, parse_args, plan

    [stage] = plan(parse_args(["--stages", "step-profile"]), {})
    assert stage.command[stage.command.index("--levers") + 1] == LEVERS
    assert stage.command[stage.command.index("--request-runs") + 1] == "3"
    [custom] = plan(parse_args(["--stages", "step-profile", "--levers", "", "--request-runs", "5"]), {})
    assert custom.command[custom.command.index("--levers") + 1] == ""
    rows = [
        {"name": "base", "xla_options": [], "request_s": [0.84], "request_s_median": 0.84},
        {
            "name": "nomerge",
            "xla_options": [["xla_gpu_dot_merger_threshold_mb", "0"]],
            "request_s": [0.80],
            "request_s_median": 0.80,
            "over_base": 0.80 / 0.84,
            "max_pixel_difference": 10,
            "pixels_differing_percent": 67.1,
        },
    ]
    outcome = {"status": "cut", "seconds": 200.0, "error": "killed at its deadline, 200 s"}
    figures, absent = headline(Stage("step-profile", [], "step_profile.json"), outcome, {"levers": rows}, [8], LEVERS)
    assert [row["name"] for row in figures["levers"]] == ["base", "nomerge"]
    assert figures["levers"][1]["over_base"] == 0.80 / 0.84 and "request_s" not in figures["levers"][1]
    assert absent["lever kvcache"] == "stage cut: killed at its deadline, 200 s"
    assert "lever nomerge" not in absent and "throughput at 8 per device" in absent


def test_lever_sets_are_parsed_or_refused_in_one_sentence():
    from bench.accelerator.step_profile import parse_levers

    assert parse_levers("a:xla_x=1,xla_y=false; b:xla_z=2") == {
        "a": (("xla_x", "1"), ("xla_y", "false")),
        "b": (("xla_z", "2"),),
    }
    assert parse_levers("") == {}
    assert parse_levers("kv:cross_attention_cache,xla_x=1") == {
        "kv": (("xla_x", "1"), ("cross_attention_cache", "true"))
    }
    for bad in ("xla_x=1", "a:xla_x=1;a:xla_y=2", "base:xla_x=1", "a:", "a:xla_x"):
        with pytest.raises(ValueError) as refused:
            parse_levers(bad)
        assert "\n" not in str(refused.value)


def test_a_stage_past_its_deadline_is_killed_with_its_workers_and_its_partial_json_kept(tmp_path):
    """A child that wrote one part of its JSON, then runs on (with a worker of its own): at the deadline both are
    killed, the stage is recorded as cut, and the figures it wrote are read back; the rest say it was cut."""
    from bench.accelerator.gpu import Stage, headline, run_stage

    partial = {"engine_vs_diffusers": {"engine": {"median": 0.5}, "reference": {"median": 0.75}, "ratio": 2 / 3}}
    (tmp_path / "partial.json").write_text(json.dumps(partial))
    script = (
        f"sleep 600 & echo $! > {tmp_path}/worker.pid; cp {tmp_path}/partial.json {tmp_path}/accelerator.json;"
        " echo measured; wait"
    )
    outcome = run_stage(["sh", "-c", script], 5, tmp_path / "accelerator.log")
    assert outcome["status"] == "cut" and 5 <= outcome["seconds"] < 60 and "deadline, 5 s" in outcome["error"]
    worker = int((tmp_path / "worker.pid").read_text())
    state = Path(f"/proc/{worker}/stat")
    assert not state.exists() or state.read_text().split(")")[-1].split()[0] == "Z"  # gone, or dead and unreaped
    assert "measured" in (tmp_path / "accelerator.log").read_text()
    data = json.loads((tmp_path / "accelerator.json").read_text())
    figures, absent = headline(Stage("accelerator", [], "accelerator.json"), outcome, data, [1])
    assert figures == {"engine_s": 0.5, "flax_pipeline_s": 0.75, "engine_over_flax": 2 / 3}
    assert absent["torch_eager_s"] == "stage cut: killed at its deadline, 5 s"


def test_a_tiny_budget_cuts_the_stage_and_no_earlier_figure_is_read_back(tmp_path):
    """`--budget-s 5`: the step profile is killed at its deadline, exit 1; a step_profile.json left from an earlier
    run is not read back as this run's."""
    out = tmp_path / "out"
    out.mkdir()
    earlier = {
        "timing": {"back_to_back_ms": 12345.0},
        "throughput": [{"images_per_device": 1, "images": 1, "request_s_median": 1.0, "images_per_s": 1.0}],
    }
    (out / "step_profile.json").write_text(json.dumps(earlier))
    done = bench_gpu(out, "--stages", "step-profile", "--model", "tiny", "--size", "64", "--budget-s", "5")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    [stage] = json.loads((out / "gpu.json").read_text())["stages"]
    assert stage["status"] == "cut" and stage["deadline_s"] <= 5 and stage["seconds"] < 60
    assert stage["figures"].get("step_ms_back_to_back") != 12345.0 and stage["figures"]["throughput"] == []
    assert stage["missing_figures"]["throughput at 8 per device"].startswith("stage cut: killed at its deadline")
    assert "| step-profile | cut |" in (out / "gpu.md").read_text()


def test_accelerator_runs_the_torch_peer_alone_only_when_asked():
    """`--parts ""` (what the gpu stage passes when the Flax peer cannot run) needs `--peer torch`."""
    from bench.accelerator.end_to_end import parse_args

    assert parse_args(["--parts", "", "--peer", "torch"]).part_list == []
    with pytest.raises(SystemExit):
        parse_args(["--parts", ""])


def test_the_benchs_json_is_renamed_into_place_whole(tmp_path):
    """A stage killed while writing leaves its last complete JSON: write_json writes beside it, then renames."""
    from bench.report.outputs import write_json

    path = tmp_path / "accelerator.json"
    write_json({"startup": {"compile_s": 1.5}}, path)
    write_json({"startup": {"compile_s": 2.5}}, path)
    assert json.loads(path.read_text()) == {"startup": {"compile_s": 2.5}} and list(tmp_path.iterdir()) == [path]


def test_the_device_tarball_keeps_the_packages_and_leaves_out_scripts_and_bytecode(tmp_path):
    """bench.accelerator.device_site.pack: what `pip install --target` laid out, without bin/ and __pycache__,
    replaced whole."""
    import tarfile

    from bench.accelerator.device_site import pack

    site = tmp_path / "site"
    for path in (
        "diffusers/__init__.py",
        "diffusers/__pycache__/x.pyc",
        "diffusers-0.39.0.dist-info/METADATA",
        "bin/diffusers-cli",
    ):
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text("x")
    out = tmp_path / ".device" / "site.tar.xz"
    size = pack(site, out)
    assert size == out.stat().st_size > 0 and sorted(p.name for p in out.parent.iterdir()) == ["site.tar.xz"]
    with tarfile.open(out) as archive:
        names = sorted(archive.getnames())
    assert names == [
        "diffusers",
        "diffusers-0.39.0.dist-info",
        "diffusers-0.39.0.dist-info/METADATA",
        "diffusers/__init__.py",
    ]


def test_the_device_tarball_from_an_empty_folder_is_one_line(tmp_path):
    command = [
        sys.executable,
        "-m",
        "bench.accelerator.device_site",
        "--wheels",
        str(tmp_path),
        "--out",
        str(tmp_path / "t.xz"),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip() == f"device_site: no wheels in {tmp_path}"


@pytest.mark.downloads  # 22 MB of wheels from the package index
def test_the_device_tarball_holds_the_pinned_packages(tmp_path):
    """The six packages the 2026-11-28 run carried, unpacked for python 3.12 and packed: about 7.6 MB."""
    import tarfile

    command = [sys.executable, "-m", "bench.accelerator.device_site", "--out", str(tmp_path / "site.tar.xz")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    with tarfile.open(tmp_path / "site.tar.xz") as archive:
        top = {name.split("/")[0] for name in archive.getnames()}
    for package in (
        "flax-0.12.12",
        "diffusers-0.39.0",
        "transformers-4.57.6",
        "huggingface_hub-0.36.2",
        "tokenizers-0.22.2",
        "importlib_metadata-10.2.0",
    ):
        assert f"{package}.dist-info" in top, sorted(top)
    assert 3e6 < (tmp_path / "site.tar.xz").stat().st_size < 20e6
