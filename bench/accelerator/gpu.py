"""`python -m bench gpu`: the full-size GPU benchmark of issue 46 in one command, within one time budget.

    python -m bench gpu --out $OUT                          # GPU: SDXL's architectures, 1024², 510 s at most
    python -m bench gpu --model tiny --size 64 --steps 2 --runs 1 --throughput 1,2 --throughput-runs 1 --calls 2
                                                            # CPU smoke test

Stages, in this order, each a child process of an existing command (its own process group) writing into --out:
1. `accelerator`: `python -m bench accelerator --parts engine --peer torch --prompt-windows 1 --warm-up request`:
   the engine against diffusers' Flax pipeline (the reference venv's worker) and diffusers' PyTorch pipeline, eager
   and compiled, at one image per request (accelerator.json); only the programs the measured requests run are
   compiled, by their untimed first calls.
2. `step-profile`: `python -m bench step-profile --levers LEVERS --throughput 1,2,4,8`: the CFG step's profile by op
   category, the 25-step request with each lever set (XLA options, engine switches) against the engine without them
   (seconds and pixels),
   then MLPerf's request (20 steps, CFG 8) at each images-per-device value (step_profile.json).

Before either starts, the pieces each needs are checked (the engine's packages here; the reference python's and
--torch-python's imports, a few seconds each) and each missing one is printed in one line: which stage or peer it
leaves out and what to install. A peer that is missing is left out of stage 1; with both missing, stage 1 is skipped.

The budget (--budget-s, default 510 s: 9 minutes less margin) is shared out as the stages start: each gets the time
left times its share (SHARES) over the shares of the stages still to run, so a stage that ends early leaves its time
to the next. A stage still running at its deadline is killed with its process group (its peers' workers too) and
recorded as cut; the children write their JSON as each part ends, so what they measured is kept. A stage that exits
non-zero is recorded as failed with its error's last line; the next stage still runs. gpu.json and gpu.md then hold
each stage's command, seconds and outcome, and the headline figures read back from the children's JSON (never made
here); a figure that is absent says why (the stage cut, failed or skipped, the part's error). Each stage's output
is also kept in --out/<stage>.log. Exit status 0 only if every stage finished.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .step_profile import BASE, lever_table, parse_levers

REPO = Path(__file__).resolve().parents[2]
#: Each stage's share of the budget (see the module docstring). A plan, not a measurement: on the H200 the
#: accelerator's parts took minutes each (bench/HISTORY.md) and the step profile with 1,2,4,8 took 281 s.
SHARES = {"accelerator": 0.55, "step-profile": 0.45}
#: The lever sets the step-profile stage times on the 25-step request by default (`--levers`): XLA without its dot
#: merger (3.5 % faster on the step alone, 0.957 of a request timed second: bench/HISTORY.md), and the engine with
#: `--cross-attention-cache` (its text keys and values once per request: 0.956 of a 25-step request on this CPU's
#: tiny model; never timed on a GPU).
LEVERS = "nomerge:xla_gpu_dot_merger_threshold_mb=0;kvcache:cross_attention_cache"
#: What diffusers' Flax pipeline's worker (bench/cpu/reference_worker.py) imports, checked in the reference python.
FLAX_PEER_IMPORTS = "import jax, flax; from diffusers import FlaxStableDiffusionXLPipeline; import transformers"
#: Seconds a killed stage gets between SIGTERM and SIGKILL.
KILL_GRACE_S = 10.0


@dataclass
class Stage:
    """One child command: its name, command line, the JSON it writes in --out, and why it does not run (if so)."""

    name: str
    command: list[str]
    json_name: str
    skipped: str | None = None
    left_out: dict[str, str] = field(default_factory=dict)  # part of its JSON -> why this run leaves it out


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench gpu",
        description="The full-size GPU benchmark in one command: engine vs diffusers' Flax and PyTorch pipelines, "
        "the CFG step's profile and MLPerf throughput, within one time budget.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--budget-s", type=float, default=510.0, help="seconds for every stage together (default 510)")
    add("--stages", default=",".join(SHARES), help=f"some of {','.join(SHARES)} (default both, in that order)")
    add("--model", choices=("sdxl", "tiny"), default="sdxl", help="SDXL's architectures (default) or the tiny one's")
    add("--size", type=int, default=1024, help="image side in pixels (default 1024)")
    add("--steps", type=int, default=25, help="steps of the engine-vs-peers requests (default 25)")
    add("--runs", type=int, default=3, help="timed requests per peer comparison (default 3)")
    add("--throughput", default="1,2,4,8", help="images per device for MLPerf's request (default 1,2,4,8)")
    add("--throughput-runs", type=int, default=2, help="timed requests per --throughput value (default 2)")
    add("--calls", type=int, default=20, help="step calls the profile times and traces (default 20)")
    add(
        "--levers",
        default=LEVERS,
        help="lever sets the step-profile stage times on the 25-step request, "
        "NAME:OPTION=VALUE,...;NAME:... or an engine switch ('' for none; default: without XLA's dot merger, and "
        "--cross-attention-cache)",
    )
    add("--request-runs", type=int, default=3, help="timed requests per lever set (default 3)")
    add("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bfloat16, float32 on CPU")
    add("--cpu-devices", type=int, default=0, help="virtual CPU devices when XLA_FLAGS is unset (default 0)")
    add("--torch-python", default=sys.executable, help="the python of the PyTorch pipeline (default: this one)")
    add("--out", default="bench-results", help="directory of every stage's JSON, gpu.json and gpu.md")
    args = parser.parse_args(argv)
    args.stage_list = [s.strip() for s in args.stages.split(",") if s.strip()]
    if set(args.stage_list) - set(SHARES) or not args.stage_list:
        parser.error(f"--stages takes some of {', '.join(SHARES)}")
    if args.budget_s <= 0 or min(args.runs, args.throughput_runs, args.calls, args.steps, args.request_runs) < 1:
        parser.error(
            "--budget-s must be positive; --runs, --throughput-runs, --calls, --steps and --request-runs at least 1"
        )
    try:
        args.per_device = [int(n) for n in args.throughput.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--throughput takes whole numbers separated by commas; got {args.throughput!r}")
    if not args.per_device or min(args.per_device) < 1:
        parser.error("--throughput takes images per device of at least 1, e.g. 1,2,4,8")
    return args


def missing_pieces(args: argparse.Namespace) -> dict[str, str]:
    """What each piece lacks, by piece ("engine", "flax peer", "torch peer"), each one sentence; only the pieces
    the selected stages need are checked."""
    from ..engine import engine_packages_missing
    from .torch_peer import torch_missing

    found: dict[str, str] = {}
    if absent := engine_packages_missing():
        found["engine"] = f"this python lacks {', '.join(absent)}"
    if "accelerator" in args.stage_list:
        for piece, failure in (("flax peer", flax_peer_missing()), ("torch peer", torch_missing(args.torch_python))):
            if failure:
                found[piece] = failure
    return found


def flax_peer_missing() -> str | None:
    """None when diffusers' Flax pipeline can run: a reference python that is already there (nothing is made)
    imports what its worker imports."""
    from ..common import import_failure
    from ..reference_venv import DEFAULT_VENV, ENV_PYTHON, ReferenceVenvError, made_python

    try:
        python = made_python()
    except ReferenceVenvError as exc:
        return str(exc)
    if python is None:
        return f"{DEFAULT_VENV.name} is not made and {ENV_PYTHON} is unset"
    return import_failure(str(python), FLAX_PEER_IMPORTS, "jax, flax, diffusers, transformers")


#: What to install for each missing piece (bench/HISTORY.md, "The GPU benchmark in one command", lists the wheels).
INSTALL = {
    "engine": "install requirements.txt's engine packages (on a GPU machine: the carried flax wheel)",
    "flax peer": "run `python -m bench.reference_venv`, or set SDXL_REFERENCE_PYTHON to a python with jax, flax, "
    "diffusers 0.39.0 and transformers 4.57.6 (e.g. $(command -v python3) with the carried wheels on PYTHONPATH)",
    "torch peer": "give --torch-python a python with torch, diffusers 0.39.0 and transformers 4.57.6",
}


def plan(args: argparse.Namespace, missing: dict[str, str]) -> list[Stage]:
    """The selected stages' command lines, with the missing pieces left out or the stage skipped."""
    bench = [sys.executable, "-m", "bench"]
    common = [
        "--model",
        args.model,
        "--size",
        str(args.size),
        "--cpu-devices",
        str(args.cpu_devices),
        "--out",
        str(Path(args.out).resolve()),
        *(["--dtype", args.dtype] if args.dtype else []),
    ]
    stages = []
    if "accelerator" in args.stage_list:
        flax, torch = "flax peer" not in missing, "torch peer" not in missing
        command = [
            *bench,
            "accelerator",
            "--parts",
            "engine" if flax else "",
            "--steps",
            str(args.steps),
            "--runs",
            str(args.runs),
            "--prompt-windows",
            "1",
            "--warm-up",
            "request",
            *common,
            *(["--peer", "torch", "--torch-python", args.torch_python] if torch else []),
        ]
        left_out = {
            part: missing[piece]
            for part, piece in (("engine_vs_diffusers", "flax peer"), ("peer_torch", "torch peer"))
            if piece in missing
        }
        skipped = "; ".join(left_out.values()) if not (flax or torch) else None
        stages.append(Stage("accelerator", command, "accelerator.json", skipped, left_out))
    if "step-profile" in args.stage_list:
        command = [
            *bench,
            "step-profile",
            "--throughput",
            ",".join(map(str, args.per_device)),
            "--runs",
            str(args.throughput_runs),
            "--calls",
            str(args.calls),
            "--levers",
            args.levers,
            "--request-runs",
            str(args.request_runs),
            *common,
        ]
        stages.append(Stage("step-profile", command, "step_profile.json"))
    if "engine" in missing:
        for stage in stages:
            stage.skipped = missing["engine"]
    return stages


def run_stage(command: list[str], deadline_s: float, log: Path) -> dict:
    """Run `command` in its own process group until it exits or `deadline_s` passes (then the group is killed):
    {"status": finished | failed | cut, "seconds", "error"}. Its output goes to this process's and to `log`."""
    if deadline_s <= 0:
        return {"status": "cut", "seconds": 0.0, "error": "no time was left in the budget"}
    started = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # progress lines as they come, not at exit
    with log.open("w") as sink:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        last_error: list[str] = []
        streams = ((process.stdout, sys.stdout, []), (process.stderr, sys.stderr, last_error))
        copies = [
            threading.Thread(target=_copy, args=(src, echo, sink, last), daemon=True) for src, echo, last in streams
        ]
        for copy in copies:
            copy.start()
        try:
            returncode = process.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            returncode = None
        except BaseException:  # Ctrl-C: no stage outlives the command
            _kill_group(process)
            raise
        for copy in copies:
            copy.join(timeout=KILL_GRACE_S)
    seconds = time.monotonic() - started
    if returncode is None:
        return {"status": "cut", "seconds": seconds, "error": f"killed at its deadline, {deadline_s:.0f} s"}
    if returncode != 0:
        return {
            "status": "failed",
            "seconds": seconds,
            "error": last_error[-1] if last_error else f"exit status {returncode}",
        }
    return {"status": "finished", "seconds": seconds, "error": None}


def _copy(stream, echo, sink, last: list[str]) -> None:
    """Copy a child's stream line by line to `echo` and `sink`; keep its last non-empty line in `last`."""
    for line in stream:
        echo.write(line)
        echo.flush()
        sink.write(line)
        if line.strip():
            last[:] = [line.strip()]


def _kill_group(process: subprocess.Popen) -> None:
    """SIGTERM to the child's process group (the child and its peers' workers), SIGKILL after KILL_GRACE_S to
    whatever is left in it."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=KILL_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # a worker the child started, if it outlived it
    process.wait()


def _dig(data: dict, part: str, path: tuple[str, ...], why_absent: str):
    """The figure at `data[part][path...]`, else (None, why it is absent)."""
    value = data.get(part)
    if isinstance(value, dict) and ("error" in value or "skipped" in value):
        return None, f"{part}: {value.get('error') or value.get('skipped')}"
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return (value, None) if isinstance(value, int | float) else (None, why_absent)


#: Headline figures: name -> (the stage's JSON part, path in it).
FIGURES = {
    "accelerator": {
        "engine_s": ("engine_vs_diffusers", ("engine", "median")),
        "flax_pipeline_s": ("engine_vs_diffusers", ("reference", "median")),
        "engine_over_flax": ("engine_vs_diffusers", ("ratio",)),
        "engine_s_beside_torch": ("peer_torch", ("engine", "median_s")),
        "torch_eager_s": ("peer_torch", ("modes", "eager", "median_s")),
        "torch_compile_s": ("peer_torch", ("modes", "compile", "median_s")),
        "engine_over_torch_eager": ("peer_torch", ("modes", "eager", "engine_over_mode")),
        "engine_over_torch_compile": ("peer_torch", ("modes", "compile", "engine_over_mode")),
    },
    "step-profile": {
        "step_ms_back_to_back": ("timing", ("back_to_back_ms",)),
        "step_ms_blocked": ("timing", ("blocked_ms_median",)),
        "kernel_ms_per_step": ("profile", ("kernel_ms_per_step",)),
    },
}


#: gpu.md's words for the figures.
LABELS = {
    "engine_s": "engine, s per request (one image)",
    "flax_pipeline_s": "diffusers' Flax pipeline, s per request",
    "engine_over_flax": "engine / Flax pipeline",
    "engine_s_beside_torch": "engine beside the PyTorch peer, s",
    "torch_eager_s": "PyTorch eager, s per request",
    "torch_compile_s": "PyTorch torch.compile, s per request",
    "engine_over_torch_eager": "engine / PyTorch eager, per image",
    "engine_over_torch_compile": "engine / PyTorch compiled, per image",
    "step_ms_back_to_back": "CFG step, ms back to back",
    "step_ms_blocked": "CFG step, ms blocked on each",
    "kernel_ms_per_step": "CFG step, device kernels ms",
}


def headline(stage: Stage, outcome: dict, data: dict, per_device: list[int], levers: str = "") -> tuple[dict, dict]:
    """(figures, missing figures with why) read back from the stage's JSON `data`."""
    status = outcome["status"]
    why = {"finished": "not in {json}", "skipped": "stage skipped: {error}"}.get(status, f"stage {status}: {{error}}")
    figures, absent = {}, {}
    for name, (part, path) in FIGURES[stage.name].items():
        reason = stage.left_out.get(part) or why.format(json=stage.json_name, error=outcome.get("error"))
        value, absent_why = _dig(data, part, path, reason)
        if value is None:
            absent[name] = absent_why
        else:
            figures[name] = value
    if stage.name == "step-profile":
        rows = {row.get("images_per_device"): row for row in data.get("throughput") or []}
        figures["throughput"] = [
            {
                "images_per_device": n,
                "images": rows[n]["images"],
                "request_s": rows[n]["request_s_median"],
                "images_per_s": rows[n]["images_per_s"],
                "peak_gib": rows[n]["peak_bytes_in_use"] / 2**30 if rows[n].get("peak_bytes_in_use") else None,
            }
            for n in per_device
            if n in rows
        ]
        for n in per_device:
            if n not in rows:
                absent[f"throughput at {n} per device"] = why.format(json=stage.json_name, error=outcome.get("error"))
        figures["levers"] = [
            {
                key: row[key]
                for key in (
                    "name",
                    "xla_options",
                    "engine_switches",
                    "request_s_median",
                    "over_base",
                    "max_pixel_difference",
                    "pixels_differing_percent",
                    "error",
                )
                if key in row
            }
            for row in data.get("levers") or []
        ]
        measured = {row["name"] for row in figures["levers"]}
        for name in [BASE, *parse_levers(levers)]:
            if name not in measured:
                absent[f"lever {name}"] = why.format(json=stage.json_name, error=outcome.get("error"))
    return figures, absent


def markdown(summary: dict) -> str:
    """gpu.md: the stages, then the headline figures and what is missing, as read back from the children's JSON."""
    lines = [
        f"# `python -m bench gpu`: {summary['model']} at {summary['size']}², {summary['measured_at']}",
        "",
        f"Budget {summary['budget_s']:.0f} s; took {summary['total_s']:.0f} s.",
        "",
        "| stage | outcome | seconds | deadline s | note |",
        "|---|---|---|---|---|",
    ]
    for stage in summary["stages"]:
        note = stage.get("error") or ""
        deadline = f"{stage['deadline_s']:.0f}" if stage.get("deadline_s") is not None else "—"
        lines.append(f"| {stage['name']} | {stage['status']} | {stage['seconds']:.0f} | {deadline} | {note} |")
    lines += ["", "| figure | value |", "|---|---|"]
    for stage in summary["stages"]:
        for name, value in stage["figures"].items():
            if name not in ("throughput", "levers"):
                lines.append(f"| {LABELS[name]} | {value:.4g} |")
    rows = [row for stage in summary["stages"] for row in stage["figures"].get("throughput", [])]
    if rows:
        lines += [
            "",
            "MLPerf's request (20 steps, CFG 8):",
            "",
            "| images per device | images | s per request | images/s | peak GiB |",
            "|---|---|---|---|---|",
        ]
        for row in rows:
            peak = f"{row['peak_gib']:.1f}" if row["peak_gib"] is not None else "—"
            lines.append(
                f"| {row['images_per_device']} | {row['images']} | {row['request_s']:.3f} | "
                f"{row['images_per_s']:.2f} | {peak} |"
            )
    levers = [row for stage in summary["stages"] for row in stage["figures"].get("levers", [])]
    if levers:
        lines += ["", "Lever sets on the 25-step CFG request (one image per device):", "", *lever_table(levers)]
    absent: dict[str, list[str]] = {}  # why -> the figures it took
    for stage in summary["stages"]:
        for name, why in stage["missing_figures"].items():
            absent.setdefault(why, []).append(name)
    if absent:
        lines += ["", "Not measured:", "", *[f"- {', '.join(names)}: {why}" for why, names in absent.items()]]
    return "\n".join(lines) + "\n"


def run_and_read(stage: Stage, deadline: float, out: Path, per_device: list[int], levers: str = "") -> dict:
    """Run one stage (unless skipped) within `deadline` seconds, then read its headline figures back: its gpu.json
    entry. The stage's JSON from an earlier run is removed first, so a figure read back is this run's."""
    from ..common import progress

    path = out / stage.json_name
    path.unlink(missing_ok=True)
    if stage.skipped:
        progress(f"gpu: stage {stage.name} skipped: nothing it measures can run here")
        outcome = {"status": "skipped", "seconds": 0.0, "error": stage.skipped, "deadline_s": None}
    else:
        progress(f"gpu: stage {stage.name}, {deadline:.0f} s: {shlex.join(stage.command)}")
        outcome = {**run_stage(stage.command, deadline, out / f"{stage.name}.log"), "deadline_s": deadline}
        progress(
            f"gpu: stage {stage.name} {outcome['status']} in {outcome['seconds']:.0f} s"
            + (f": {outcome['error']}" if outcome["error"] else "")
        )
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:  # not the bench's own (it writes whole files): read as nothing measured
        data = {}
    figures, absent = headline(stage, outcome, data, per_device, levers)
    return {
        "name": stage.name,
        "command": stage.command,
        **outcome,
        "json": stage.json_name,
        "left_out": stage.left_out,
        "figures": figures,
        "missing_figures": absent,
    }


def main(argv: list[str]) -> int:
    from ..common import progress
    from ..report.outputs import write_json

    started = time.monotonic()
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    missing = missing_pieces(args)
    for piece, why in missing.items():
        leaves = "every stage" if piece == "engine" else f"stage accelerator's {piece}"
        progress(f"gpu: {piece} missing, {leaves} left out: {why}; {INSTALL[piece]}")
    summary = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": args.model,
        "size": args.size,
        "budget_s": args.budget_s,
        "command": ["python", "-m", "bench", "gpu", *argv],
        "missing": missing,
        "stages": [],
        "total_s": 0.0,
    }
    stages = plan(args, missing)
    for index, stage in enumerate(stages):
        shares = sum(SHARES[later.name] for later in stages[index:] if not later.skipped) or 1.0  # 0: all skipped
        deadline = (args.budget_s - (time.monotonic() - started)) * SHARES[stage.name] / shares
        summary["stages"].append(run_and_read(stage, deadline, out, args.per_device, args.levers))
        summary["total_s"] = time.monotonic() - started
        write_json(summary, out / "gpu.json")  # after each stage, whole: a cut parent keeps the last one
        (out / "gpu.md").write_text(markdown(summary))
    unfinished = [s["name"] for s in summary["stages"] if s["status"] != "finished"]
    progress(
        f"gpu: done in {summary['total_s']:.0f} s: {out / 'gpu.json'}, {out / 'gpu.md'}"
        + (f"; not finished: {', '.join(unfinished)}" if unfinished else "")
    )
    return 1 if unfinished else 0
