"""Part 6: write every figure as results.json, the tables as results.md, and a bar chart as chart.png (PIL only)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, is_dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from ..common import Stats

CHART_WIDTH = 960
BAR_HEIGHT = 26
COLORS = {
    "engine": (109, 40, 217),
    "reference": (148, 163, 184),
    "app": (37, 99, 235),
    "cold": (234, 88, 12),
    "warm": (22, 163, 74),
}


def to_jsonable(value):
    """Dataclasses -> dicts, NaN/inf -> None, keys -> strings (JSON has no NaN)."""
    if is_dataclass(value):
        value = asdict(value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(results: dict, path: Path) -> Path:
    """Every figure, machine and package versions included. Written whole, then renamed into place: a bench killed
    while writing (`python -m bench gpu` cuts a stage at its deadline) leaves the last complete file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(to_jsonable(results), indent=2) + "\n")
    partial.replace(path)
    return path


def _thread_table(ref) -> list[str]:
    """The timed calls' CPU ms by thread group on each side (none where the platform has no per-thread times)."""
    if not ref.engine_cpu_ms_by_thread or not ref.reference_cpu_ms_by_thread:
        return []
    groups = [group for group in ref.engine_cpu_ms_by_thread if group in ref.reference_cpu_ms_by_thread]
    engine, reference = ref.engine_cpu_ms_by_thread, ref.reference_cpu_ms_by_thread
    return [
        "| CPU ms per call (mean), by thread | engine | reference |",
        "|---|---|---|",
        *[f"| {group} | {engine[group]:.1f} | {reference[group]:.1f} |" for group in groups],
        f"| all | {sum(engine[g] for g in groups):.1f} | {sum(reference[g] for g in groups):.1f} |",
        "",
    ]


def _ms(stats: Stats) -> str:
    return stats.range_text(1000, 0) + " ms"


def _verdict(ok: bool) -> str:
    return "✅ met" if ok else "❌ missed"


def markdown(results: dict) -> str:
    """The tables of results.md (the journal, bench/HISTORY.md, quotes them)."""
    setup, machine = results["setup"], results["machine"]
    lines = [
        "# sdxl-jax benchmark",
        "",
        f"Model `{setup['model']}`, {setup['height']}x{setup['width']}, {setup['steps']} steps, {setup['dtype']}, "
        f"{machine['device_count']} × {machine['device_kind']} ({machine['jax_backend']}); "
        f"{setup['runs']} runs per figure, medians with (min–max).",
        f"Machine: {machine['uname']}; {machine['cpu_count']} CPUs; load average at start "
        f"{machine['load_average_at_start']}. Measured {results['measured_at']}, total bench time "
        f"{results.get('bench_s', float('nan')):.0f} s.",
        "Packages: " + ", ".join(f"{k} {v}" for k, v in machine["packages"].items()),
        "",
    ]
    if reference_packages := machine.get("reference_packages"):  # the reference venv's (bench/reference_venv.py)
        lines[-1:-1] = ["Reference venv: " + ", ".join(f"{k} {v}" for k, v in reference_packages.items())]
    if failed := results.get("failed"):  # bench/parts.py: recorded, and the other parts ran
        lines += ["## Parts that failed (the others ran)", ""]
        lines += [f"- **{name}**: {entry['error']} (raised at {entry['at']})" for name, entry in failed.items()]
        lines += [""]
    if (ref := results.get("reference")) is not None:
        lines += [
            "## Engine vs diffusers' FlaxStableDiffusionXLPipeline (per call, PIL images out)",
            "",
            "| | per call | images/s |",
            "|---|---|---|",
            f"| engine `Generator.generate` | {_ms(ref.engine)} | {ref.engine_images_per_s:.2f} |",
            f"| reference `pipeline(..., jit=True)` | {_ms(ref.reference)} | {ref.reference_images_per_s:.2f} |",
            f"| **ratio engine / reference** | **{ref.ratio:.2f}** (target ≤ {ref.target_ratio}) | "
            f"{_verdict(ref.meets_target)} |",
            "",
            f"Host-side part of each call (everything but the compiled program and its transfers): engine "
            f"{_ms(ref.engine_host)}, reference {_ms(ref.reference_host)}. Engine / reference of each interleaved "
            f"pair: {ref.pair_ratios.range_text(digits=2)}; in process CPU seconds: {ref.cpu_ratio:.2f} (the calls "
            f"repeat one text, which the engine encodes once: --text-cache; with a new text each call "
            f"{ref.new_text_cpu_ratio:.2f}).",
            "",
            "| engine program (each call blocked on, its text encoded) | ms per call |",
            "|---|---|",
            *[f"| {label} | {seconds * 1000:.1f} |" for label, seconds in ref.engine_programs.items()],
            f"| a call with every program blocked on | {ref.engine_programs_s * 1000:.1f} |",
            f"| reference: host (inputs, replicate, PIL) / its pmapped program | {ref.reference_host.median * 1000:.1f}"
            f" / {(ref.reference.median - ref.reference_host.median) * 1000:.1f} |",
            "",
            *_thread_table(ref),
            f"{ref.images_per_call} images per call; the reference loaded in {ref.reference_load_s:.1f} s and its "
            f"first call (pmap compile) took {ref.reference_first_call_s:.1f} s.",
            "",
        ]
    if (st := results.get("startup")) is not None:
        rows = [
            ("imports (+ start, exit)", "imports_s"),
            ("load", "load_s"),
            ("cast", "cast_s"),
            ("replicate", "replicate_s"),
            ("compile", "compile_s"),
            ("first run", "first_run_s"),
            ("**process start → first image**", "first_image_s"),
            ("process wall (incl. 2nd call, PNGs)", "process_wall_s"),
        ]
        lines += [
            "## Start-up: new process → first image (`python -m pipeline generate`)",
            "",
            "| phase | cold cache (s) | warm cache (s) |",
            "|---|---|---|",
            *[f"| {label} | {getattr(st.cold, key):.2f} | {getattr(st.warm, key):.2f} |" for label, key in rows],
            f"| **ratio warm / cold** | **{st.ratio:.0%}** (target ≤ {st.target_ratio:.0%}) | "
            f"{_verdict(st.meets_target)} |",
            "",
            f"The web app (`python app.py`, until it prints its URL: loaded, compiled, warmed up, serving): "
            f"{st.app_cold_ready_s:.1f} s with an empty compilation cache, {st.app_warm_ready_s:.1f} s with JAX's "
            f"warm cache ({st.app_warm_ready_s / st.app_cold_ready_s:.0%}), {st.app_executables_ready_s:.1f} s with "
            f"this host's executables too ({st.app_executables_ready_s / st.app_cold_ready_s:.0%}; medians):",
            "",
            "| app start | ready (s) | load (s) | programs phase (s) | traced + lowered | XLA compile or cache read "
            "| loaded whole | first run (s) |",
            "|---|---|---|---|---|---|---|---|",
            *[_app_restart_row(start) for start in st.app],
            "",
        ]
    if (sv := results.get("serving")) is not None:
        lines += [
            "## Through the Gradio app (`gradio_client`, `/generate`)",
            "",
            "| | per call |",
            "|---|---|",
            f"| engine only | {_ms(sv.engine)} |",
            f"| through the app (HTTP, queue, gallery JPEGs, download) | {_ms(sv.app)} |",
            f"| … of which: the same call without downloading the images | {_ms(sv.app_no_download)} |",
            f"| for scale: writing the same images as PNGs (off the answer's path) | {_ms(sv.png_save)} |",
            f"| for scale: an echo endpoint through Gradio's queue and gradio_client | {_ms(sv.gradio_floor)} |",
            f"| **serving overhead** | **{sv.overhead:+.1%}** (target ≤ {sv.target_overhead:.0%}) "
            f"{_verdict(sv.meets_target)} |",
            "",
            f"Queue size {sv.queue_size}, concurrency limit 2; {sv.compiles_added} compilations during this part.",
            "",
            "| clients | requests | ok | failed | rejected (queue full) | requests/s | images/s | p50 (s) | p95 (s) |",
            "|---|---|---|---|---|---|---|---|---|",
            *[
                f"| {lr.clients} | {lr.requests} | {lr.succeeded} | {lr.failed} | {lr.rejected} | "
                f"{lr.requests_per_s:.2f} | {lr.images_per_s:.1f} | {lr.latency.median:.2f} | {lr.latency.p95:.2f} |"
                for lr in sv.load
            ],
            "",
        ]
    if (rc := results.get("recompiles")) is not None:
        lines += [
            "## Recompilations",
            "",
            f"{rc.requests} random requests (prompts of 1–90 words, {rc.truncated_prompts} over 77 tokens; negative "
            f"prompts, styles, guidance, seeds) through the engine: **{rc.compiles_added} compilations** "
            f"({_verdict(rc.compiles_added == 0)}); per call {_ms(rc.per_call)}.",
            "",
        ]
    if (fl := results.get("flops")) is not None:
        lines += [
            "## Hardware limit: SDXL base at 1024x1024 (XLA cost analysis of the lowered HLO, bf16)",
            "",
            "| component | TFLOP |",
            "|---|---|",
            f"| UNet, one step, CFG batch 2 (= per image per step) | {fl.unet_step_flops_batch2 / 1e12:.2f} "
            f"(public figure ≈ {fl.public_unet_step_tflop}) |",
            f"| VAE decode, per image | {fl.vae_decode_flops_per_image / 1e12:.2f} |",
            f"| both text encoders, prompt + negative | {fl.text_encoders_flops_per_image / 1e12:.3f} |",
            *[f"| **total per image, {s} steps** | **{f / 1e12:.1f}** |" for s, f in fl.flops_per_image.items()],
            "",
            "Seconds per image at 100% of peak dense bf16 FLOP/s (one chip; a lower bound no real run reaches):",
            "",
            "| accelerator | peak TFLOP/s | " + " | ".join(f"{s} steps (s)" for s in fl.flops_per_image) + " |",
            "|---|---|" + "---|" * len(fl.flops_per_image),
            *[
                f"| {lim.name} | {lim.peak_flops / 1e12:.0f} | "
                + " | ".join(f"{sec:.3f}" for sec in lim.seconds_per_image.values())
                + " |"
                for lim in fl.limits
            ],
            "",
        ]
    if (ac := results.get("achieved")) is not None:
        peak = (
            "unknown (no published peak for this device)"
            if ac.peak_flops_per_s is None
            else (f"{ac.peak_flops_per_s / 1e12:.0f} TFLOP/s → {ac.fraction_of_peak:.1%} of peak")
        )
        lines += [
            f"On this machine the engine's compiled program does {ac.flops_per_call / 1e9:.1f} GFLOP per call "
            f"(XLA: {ac.compiled_flops_reported / 1e9:.2f} GFLOP per device with the loop body once, plus "
            f"{ac.unet_step_flops_per_device / 1e9:.2f} GFLOP per extra UNet step) in {ac.seconds_per_call:.3f} s: "
            f"**{ac.achieved_flops_per_s / 1e9:.1f} GFLOP/s** on {ac.device_count} × {ac.device_kind}; peak {peak}.",
            "",
        ]
    if (hl := results.get("hostloop")) is not None:
        lines += [
            f"## The loop on the host: ms per denoising step ({hl.size}, {hl.steps} steps, {hl.devices} devices)",
            "",
            "| loop | per call (median) | per step |",
            "|---|---|---|",
            f"| fused `fori_loop` program (before) | {_ms(hl.fused_call)} | {hl.fused_step_ms:.1f} ms |",
            f"| host loop, one compiled step per step | {_ms(hl.host_loop_call)} | {hl.host_loop_step_ms:.1f} ms |",
            f"| **difference** | | **{hl.difference:+.1%}** (target within ±{hl.target:.0%}) "
            f"{_verdict(hl.meets_target)} |",
            "",
            f"Compilations while timing: {hl.compiles_while_timing}.",
            "",
        ]
    if (sp := results.get("stop")) is not None:
        lines += [
            "## Stop: `job.cancel()` -> devices free -> the next request",
            "",
            f"Cancelled at step {sp.cancelled_at_step} of {sp.steps} (client-side progress, which lags); the engine "
            f"stopped after dispatching {sp.engine_stopped_after} steps. A step takes {_ms(sp.step_s)}.",
            "",
            "| from `cancel()` to | ms |",
            "|---|---|",
            f"| `cancel()` answered (gradio_client's POST /cancel) | {_ms(sp.cancel_answered)} |",
            f"| the engine deciding to stop (before its next step) | {_ms(sp.cancel_to_stop_seen)} |",
            f"| ↳ then the one step it had queued finishing | +{_ms(sp.stop_seen_to_devices_free)} |",
            f"| the devices free (the stopped request's last queued step done) | {_ms(sp.cancel_to_devices_free)} |",
            f"| the next request's first step queued on the devices | {_ms(sp.cancel_to_next_first_step_queued)} |",
            f"| that step's result ready | {_ms(sp.cancel_to_next_first_step_ready)} |",
            "",
            f"Cancel -> next request's first step: **{sp.in_step_times:.2f} step times** (target ≤ {sp.target:g}) "
            f"{_verdict(sp.meets_target)}.",
            "",
        ]
        if sp.missed:  # tries whose cancel came too late to measure anything (a loaded machine), sent again
            lines += [f"{len(sp.missed)} tries measured nothing and were made again: {'; '.join(sp.missed)}.", ""]
    if (sw := results.get("samplers")) is not None:
        lines += [
            f"## Steps and samplers per request: {sw.requests} requests (steps 1..{sw.max_steps} × "
            f"{len(sw.samplers)} sampler / schedule type pairs): **{sw.compiles_added} compilations** in "
            f"{sw.seconds:.0f} s",
            "",
            "| sampler | host ms per step (its plan, 25 steps) | wall ms per UNet call (sweep, this engine) |",
            "|---|---|---|",
            *(
                f"| {name} | {cost:.3f} | {sw.wall_ms_per_row.get(name, float('nan')):.1f} |"
                for name, cost in sw.plan_ms_per_step.items()
            ),
            "",
        ]
    if (ws := results.get("sizes")) is not None:
        lines += [
            f"## App start-up, cold vs warm compilation cache (`python app.py {' '.join(ws.args)}`)",
            "",
            "| | cold | warm |",
            "|---|---|---|",
            f"| launch -> serving (s) | {ws.cold.ready_s:.1f} | {ws.warm.ready_s:.1f} |",
            f"| XLA compilation, all programs (s) | {ws.cold.xla_compile_s:.1f} | {ws.warm.xla_compile_s:.1f} |",
            f"| XLA compilation, served programs (s) | {ws.cold.served_compile_s:.1f} | "
            f"{ws.warm.served_compile_s:.1f} |",
            f"| served programs from the cache | {ws.cold.served_hits}/{ws.cold.served_programs} | "
            f"{ws.warm.served_hits}/{ws.warm.served_programs} |",
            f"| tracing (s) | {ws.cold.tracing_s:.1f} | {ws.warm.tracing_s:.1f} |",
            f"| lowering to MLIR (s) | {ws.cold.lowering_s:.1f} | {ws.warm.lowering_s:.1f} |",
            *[
                f"| {phase} (s) | {ws.cold.phases.get(phase, float('nan')):.2f} | "
                f"{ws.warm.phases.get(phase, float('nan')):.2f} |"
                for phase in ("load", "cast", "replicate", "compile", "first run")
            ],
            "",
            f"Warm XLA seconds / cold: **{ws.compile_ratio:.0%}** (target ≤ {ws.target:.0%}, every served program a "
            f"cache hit) {_verdict(ws.meets_target)}; entries JAX would not cache: {ws.warm.not_cached}.",
            "",
        ]
    if (fs := results.get("fewstep")) is not None:
        expected = (
            ""
            if fs.expected_flops_ratio is None
            else (f"; expected at 1024² on an accelerator, from the flops part: {fs.expected_flops_ratio:.1f}×")
        )
        lines += [
            f"## Few-step: SDXL base recipe vs SDXL-Lightning-4 (`{fs.model}`, {fs.width}×{fs.height})",
            "",
            "| recipe | per image | compile (once) |",
            "|---|---|---|",
            f"| {fs.base_label} | {_ms(fs.base)} | {fs.base_compile_s:.1f} s |",
            f"| {fs.lightning_label} | {_ms(fs.lightning)} | {fs.lightning_compile_s:.1f} s |",
            f"| **ratio** | **{fs.ratio:.2f}×** faster per image (UNet evaluations: {fs.unet_evaluations_ratio:g}×"
            f"{expected}) | compilations while timing: {fs.compiles_during_runs} |",
            "",
        ]
    if (mg := results.get("merging")) is not None:
        lines += [
            f"## Merged requests (`--merge-requests`, `{mg.model}`, {mg.width}×{mg.height}, {mg.steps} steps)",
            "",
            f"{mg.clients} clients, {mg.requests_per_round} requests per round, {mg.images_per_request} images each.",
            "",
            "| engine | requests/s (median of rounds) | latency per request (median) |",
            "|---|---|---|",
            f"| alone (a call per request) | {mg.alone_requests_per_s.median:.2f} | "
            f"{mg.alone_latency_s.median:.3f} s |",
            f"| merged ({mg.slots} per call; {mg.merged_requests_per_call:.2f} on average) | "
            f"{mg.merged_requests_per_s.median:.2f} | {mg.merged_latency_s.median:.3f} s |",
            f"| **merged / alone** | **{mg.speedup:.2f}×** | compilations while timing: {mg.compiles_during_runs} |",
            "",
            "Merged calls by requests in them: "
            + ", ".join(f"{n}: {count}" for n, count in mg.merged_calls_by_size.items())
            + ".",
            "",
            "| one request at a time (the devices idle) | latency (median) |",
            "|---|---|",
            *(f"| {name} | {stats.median:.3f} s |" for name, stats in mg.lone_latency_s.items()),
            "",
        ]
    if (sk := results.get("soak")) is not None:
        lines += [
            "## Soak",
            "",
            "| requests | clients | ok | failed | rejected | p50 (s) | p95 (s) | req/s | RSS before → after (MiB) "
            "| compilations |",
            "|---|---|---|---|---|---|---|---|---|---|",
            f"| {sk.requests} | {sk.clients} | {sk.succeeded} | {sk.failures} | {sk.rejections} | "
            f"{sk.latency.median:.2f} | {sk.latency.p95:.2f} | {sk.requests_per_s:.2f} | "
            f"{sk.rss_before_mb:.0f} → {sk.rss_after_mb:.0f} ({sk.rss_growth_mb:+.0f}) | {sk.compiles_added} |",
            "",
        ]
    if results.get("hostpath") is not None or results.get("fullsize") is not None:
        from ..serving.fullsize import markdown as fullsize_markdown

        lines += fullsize_markdown(results.get("hostpath"), results.get("fullsize"))
    if any(results.get(part) is not None for part in ("lora", "img2img", "levers")):
        from ..features.lora_img2img_levers import markdown as features_markdown

        lines += features_markdown(results.get("lora"), results.get("img2img"), results.get("levers"))
    if results.get("previews") is not None or results.get("preview_host") is not None:
        from ..features.previews import markdown as previews_markdown

        lines += previews_markdown(results.get("previews"), results.get("preview_host"))
    if results.get("history") is not None:
        from ..features.history import markdown as history_markdown

        lines += history_markdown(results["history"])
    if results.get("apphost") is not None:
        from ..serving.apphost import markdown as apphost_markdown

        lines += apphost_markdown(results["apphost"])
    if results.get("controlnet") is not None:
        from ..features.controlnet import markdown as controlnet_markdown

        lines += controlnet_markdown(results["controlnet"])
    if results.get("refiner") is not None:
        from ..features.refiner import markdown as refiner_markdown

        lines += refiner_markdown(results["refiner"])
    if results.get("hires") is not None:
        from ..features.hires import markdown as hires_markdown

        lines += hires_markdown(results["hires"])
    if results.get("service") is not None:
        from ..serving.service import markdown as service_markdown

        lines += service_markdown(results["service"])
    return "\n".join(lines)


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def _panel(draw, top: int, title: str, bars: list[tuple[str, float, float, float, tuple]], unit: str) -> int:
    """One titled group of horizontal bars (label, median, min, max, colour) on a shared scale; returns the next y."""
    title_font, font = _font(18), _font(14)
    draw.text((20, top), title, fill=(15, 23, 42), font=title_font)
    top += 32
    left, right = 320, CHART_WIDTH - 110
    scale = max(hi for _, _, _, hi, _ in bars) or 1.0
    for label, median, lo, hi, color in bars:
        draw.text((20, top + 5), label, fill=(30, 41, 59), font=font)
        end = left + (right - left) * median / scale
        draw.rectangle([left, top, max(left + 1, end), top + BAR_HEIGHT], fill=color)
        if hi > lo:  # min–max whisker
            x0, x1 = left + (right - left) * lo / scale, left + (right - left) * hi / scale
            mid = top + BAR_HEIGHT // 2
            draw.line([x0, mid, x1, mid], fill=(15, 23, 42), width=2)
            draw.line([x0, mid - 6, x0, mid + 6], fill=(15, 23, 42), width=2)
            draw.line([x1, mid - 6, x1, mid + 6], fill=(15, 23, 42), width=2)
        draw.text(
            (max(end, left + (right - left) * hi / scale) + 8, top + 5),
            f"{median:.3g} {unit}",
            fill=(15, 23, 42),
            font=font,
        )
        top += BAR_HEIGHT + 12
    return top + 16


def _app_restart_row(start) -> str:
    """One app start: its phases and where its programs came from (bench/cpu/startup.AppRestart)."""
    phase, p = start.phases.get, start.programs.get
    return (
        f"| {start.kind} | {start.ready_s:.1f} | {phase('load', 0):.1f} | {phase('compile', 0):.1f} "
        f"| {p('traced', 0):.0f} in {p('trace_s', 0):.1f} s | {p('compiled', 0):.0f} compiled, "
        f"{p('cached', 0):.0f} from the cache, {p('xla_s', 0):.1f} s | {p('loaded', 0):.0f} in "
        f"{p('load_s', 0):.1f} s | {phase('first run', 0):.1f} |"
    )


def chart(results: dict, path: Path) -> Path | None:
    """Horizontal bars: per-call latency (engine, reference, through the app) and cold vs warm start-up."""
    panels = []
    ref, sv, st = results.get("reference"), results.get("serving"), results.get("startup")
    latency = []
    if ref is not None:
        latency.append(("engine generate()", ref.engine, COLORS["engine"]))
        latency.append(("diffusers reference pipeline", ref.reference, COLORS["reference"]))
    if sv is not None:
        latency.append(("through the app (gradio_client)", sv.app, COLORS["app"]))
    if latency:
        bars = [(label, s.median, s.min, s.max, color) for label, s, color in latency]
        panels.append((f"Per-call latency, {results['setup']['shape']} (median; whisker = min-max)", bars, "s"))
    if st is not None:
        bars = [
            (
                "cold cache: start -> first image",
                st.cold.first_image_s,
                st.cold.first_image_s,
                st.cold.first_image_s,
                COLORS["cold"],
            ),
            (
                "warm cache: start -> first image",
                st.warm.first_image_s,
                st.warm.first_image_s,
                st.warm.first_image_s,
                COLORS["warm"],
            ),
            ("cold: compile phase", st.cold.compile_s, st.cold.compile_s, st.cold.compile_s, COLORS["cold"]),
            ("warm: compile phase", st.warm.compile_s, st.warm.compile_s, st.warm.compile_s, COLORS["warm"]),
        ]
        panels.append((f"Start-up, new process (warm/cold = {st.ratio:.0%})", bars, "s"))
    if not panels:
        return None
    height = 24 + sum(48 + len(bars) * (BAR_HEIGHT + 12) for _, bars, _ in panels)
    image = Image.new("RGB", (CHART_WIDTH, height), "white")
    draw = ImageDraw.Draw(image)
    top = 20
    for title, bars, unit in panels:
        top = _panel(draw, top, title, bars, unit)
    image.save(path)
    return path
