"""`python -m bench`: measure the engine, its start-up, the app around it, and the hardware limit.

    python -m bench                                  # tiny checkpoint, 128x128, 4 steps, float32: a few minutes
    python -m bench --only reference,flops           # some parts
    python -m bench --model stabilityai/stable-diffusion-xl-base-1.0 --height 1024 --width 1024 --steps 25 \\
        --dtype bfloat16 --cpu-devices 0            # on a TPU/GPU host
    python -m bench unet --attention xla,splash --height 1024 --width 1024   # UNet step per attention core
    python -m bench accelerator                      # the engine at 1024² on this host's GPU/TPU, vs diffusers
    python -m bench step-profile                     # the 1024² CFG step's device time by op category (profiler)
    python -m bench gpu                              # both, and the PyTorch peer, in one 8.5-minute budget
    python -m bench --only hostpath,fullsize         # the serving path at 1024²: host path, then end to end (minutes)
    python -m bench --only apphost                   # the app's own time per 1024² request, with and without previews
    python -m bench --only lora,img2img,levers,previews,history   # what the request features cost (minutes)
    python -m bench --only service                   # two engine services: the page->engine hop, failover (minutes)
    python -m bench --only reference --check        # exit 1 when engine / diffusers is over the guard's threshold
    python -m bench.reference_venv                   # make .venv-reference, where diffusers' pipeline runs (README)
    python -m bench.accelerator.device_site          # .device/site.tar.xz: what `bench gpu` needs on a lent GPU

Devices: when XLA_FLAGS is unset, the host CPU is split into `--cpu-devices` virtual devices (default 8, 0 = leave
it alone) so the 8-way sharding of a TPU v5e-8 runs on a laptop; that flag only affects JAX's CPU platform. When
JAX_PLATFORMS is unset and no accelerator device node (/dev/accel*, /dev/vfio/*, /dev/nvidia*) exists, JAX is told
to use the CPU (skipping its slow probe for absent accelerators). Both are set here, before JAX is first imported.
Outputs go to --out (default bench-results/): results.json (every figure), results.md (tables), chart.png.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from pathlib import Path

if __name__ == "__main__":  # before the imports below: run before `pip install`, one sentence, not a traceback
    from .engine import require_engine_installed

    require_engine_installed("python -m bench")  # the engine's packages: a lent GPU machine has no gradio

from .common import configure_platform, progress  # noqa: E402
from .cpu.reference import CHECK_RATIO  # noqa: E402
from .features.lora_img2img_levers import LORA_FIXTURES  # noqa: E402
from .parts import run_parts  # noqa: E402

PARTS = (
    "reference",
    "startup",
    "app",
    "recompiles",
    "flops",
    "soak",
    "hostloop",
    "stop",
    "samplers",
    "sizes",
    "fewstep",
    "hostpath",
    "fullsize",
    "lora",
    "img2img",
    "levers",
    "previews",
    "history",
    "apphost",
    "controlnet",
    "service",
    "refiner",
    "hires",
    "merging",
)
DEFAULT_PARTS = (
    "reference",
    "startup",
    "app",
    "recompiles",
    "flops",
    "hostloop",
    "stop",
    "fewstep",
    "hostpath",
    "img2img",
)
#: Parts that run on the bench's shared engine (loaded and warmed up once, before the first of them).
ENGINE_PARTS = {
    "reference",
    "app",
    "recompiles",
    "soak",
    "hostloop",
    "stop",
    "samplers",
    "img2img",
    "levers",
    "previews",
    "history",
    "service",
}


#: The bench's own defaults for the engine's options it takes (pipeline/options.py marks them BENCH): the tiny
#: checkpoint at a size and step count a laptop CPU runs in minutes, split into 8 devices like a TPU v5e-8.
#: The bench's engine: the tiny checkpoint at 128², 4 steps, on 8 CPU devices; its calls are nobody's to follow step by
#: step, so each runs its steps in one call as diffusers' pipeline does (`--steps-per-call`, device/step_block.py)
ENGINE_DEFAULTS = {
    "model": "tiny",
    "height": 128,
    "width": 128,
    "steps": 4,
    "dtype": "float32",
    "cpu_devices": 8,
    "steps_per_call": 4,
}


def build_parser() -> argparse.ArgumentParser:
    """The bench's command line: the engine's options from their one declaration, then the bench's own."""
    from .engine import bench_parser

    parser = bench_parser(  # --model, --height, --width, --steps, --dtype, --cpu-devices
        ENGINE_DEFAULTS,
        prog="python -m bench",
        description="Measure the engine, its start-up, the app around it, and the hardware limit. "
        "The engine's options can also be set by the environment variable in brackets; the flag wins.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--runs", type=int, default=5, help="timed calls per latency figure (default 5)")
    add(
        "--check",
        nargs="?",
        type=float,
        const=CHECK_RATIO,
        default=None,
        metavar="RATIO",
        help=f"exit 1 when the reference part's engine / diffusers ratio of CPU seconds per call is over RATIO "
        f"(default {CHECK_RATIO}): the regression guard CI runs",
    )
    add(
        "--startup-runs",
        type=int,
        default=2,
        help="warm app restarts of each kind in the startup part, interleaved after one cold start (default 2)",
    )
    add(
        "--merge-slots",
        type=int,
        default=4,
        metavar="N",
        help="the merging part's --images-per-device: requests one merged call holds (default 4)",
    )
    add("--out", default="bench-results", help="output directory (default bench-results/)")
    add(
        "--only",
        default=",".join(DEFAULT_PARTS),
        help=f"comma-separated parts of {', '.join(PARTS)} (default {','.join(DEFAULT_PARTS)})",
    )
    add("--clients", default="1,4,16", help="concurrency levels for the app part (default 1,4,16)")
    add("--requests-per-client", type=int, default=8, help="requests each client sends (default 8)")
    add(
        "--max-requests",
        type=int,
        default=32,
        help="cap on requests per concurrency level; fewer per client when exceeded (default 32)",
    )
    add("--queue-size", type=int, default=20, help="the app's queue size (default 20, the app's default)")
    add("--recompile-requests", type=int, default=100, help="random requests in the recompile part (default 100)")
    add("--loop-steps", type=int, default=20, help="steps per timed call in the hostloop part (default 20)")
    add("--no-text-flops", action="store_true", help="skip costing the SDXL text encoders in the flops part")
    add("--soak-requests", type=int, default=200, help="requests in the soak part (default 200)")
    add("--soak-clients", type=int, default=16, help="concurrent clients in the soak part (default 16)")
    add("--feature-steps", type=int, default=20, help="steps per request in the levers and previews parts (default 20)")
    add(
        "--lora-fixtures",
        default=str(LORA_FIXTURES),
        metavar="DIR",
        help="LoRA directory of the lora part's own engine (default tests/fixtures/lora; the other parts' engine "
        "offers none)",
    )
    add("--lora-rounds", type=int, default=10, help="rounds of LoRA sets A, A, B, B, none (default 10)")
    add(
        "--preview-size",
        type=int,
        default=1024,
        help="image side of the previews part's synthetic host cost, a multiple of 8 (default 1024)",
    )
    add("--history-adds", type=int, default=20, help="timed adds per kind in the history part (default 20)")
    add("--history-entries", type=int, default=1000, help="one user's entries when listing (20..1000, default 1000)")
    add("--history-size", type=int, default=1024, help="image side of the history part's added requests (default 1024)")
    add("--history-calls", type=int, default=20, help="timed /history calls in the history part (default 20)")
    add(
        "--history-database-url",
        metavar="URL",
        help="the history part's rows in this empty PostgreSQL database, not SQLite (default: SQLite)",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The bench's options, checked; `args.config` is the engine's EngineConfig they describe."""
    from .engine import bench_config

    parser = build_parser()
    args = parser.parse_args(argv)
    args.config = bench_config(parser, args)
    args.parts = [part.strip() for part in args.only.split(",") if part.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    try:
        args.client_counts = [int(c) for c in args.clients.split(",") if c.strip()]
    except ValueError:
        parser.error("--clients takes comma-separated whole numbers, e.g. 1,4,16")
    if args.runs < 1 or any(c < 1 for c in args.client_counts) or args.requests_per_client < 1:
        parser.error("--runs, --clients and --requests-per-client must be at least 1")
    counts = ("feature_steps", "lora_rounds", "history_adds", "history_entries", "history_size", "history_calls")
    if any(getattr(args, name) < 1 for name in counts):
        parser.error("--feature-steps, --lora-rounds and the --history-* numbers must be at least 1")
    if args.history_entries > 1000 or args.history_entries < 20:
        parser.error("--history-entries must be from 20 (the deletes timed) to 1000 (one /history page)")
    if args.check is not None and "reference" not in args.parts:
        parser.error("--check guards the reference part's ratio: add reference to --only")
    if args.check is not None and args.check <= 0:
        parser.error("--check takes a positive ratio, e.g. --check 1.15")
    if args.preview_size < 8 or args.preview_size % 8:
        parser.error("--preview-size must be a positive multiple of 8")
    return args


def load_engine(args: argparse.Namespace, results: dict):
    """The engine the in-process parts share: loaded and warmed up once, its start-up timings in `results`."""
    from .engine import Generator

    progress(f"loading {args.model} and compiling {results['setup']['shape']} ...")
    generator = Generator.load(args.config)
    warm = generator.warmup()
    results["engine_startup"] = {**generator.load_timings, **warm}
    progress(
        f"engine ready: {generator.device_summary}, {generator.num_images} images per call, "
        f"compile {warm['compile_s']:.1f} s, first run {warm['first_run_s']:.2f} s"
    )
    return generator


def _reference(args: argparse.Namespace, results: dict, generator) -> None:
    from .accelerator.flops import achieved_flops
    from .cpu.reference import engine_vs_reference

    progress(f"part 1/5 engine vs reference ({args.runs} interleaved runs) ...")
    ref = results["reference"] = engine_vs_reference(generator, args.runs, worker=args.early_reference)
    results["machine"]["reference_packages"] = ref.reference_packages  # diffusers' venv is not this one
    progress(
        f"engine {ref.engine.median:.3f} s vs reference {ref.reference.median:.3f} s: ratio {ref.ratio:.2f} "
        f"(pairs {ref.pair_ratios.min:.2f}–{ref.pair_ratios.max:.2f}; CPU seconds {ref.cpu_ratio:.2f}, "
        f"{ref.new_text_cpu_ratio:.2f} with a new text each call)"
    )
    parts = ", ".join(f"{label} {seconds * 1000:.1f}" for label, seconds in ref.engine_programs.items())
    progress(
        f"engine's programs, ms per call (each blocked on): {parts}; reference: host "
        f"{ref.reference_host.median * 1000:.1f}, pipeline "
        f"{(ref.reference.median - ref.reference_host.median) * 1000:.1f}"
    )
    if ref.engine_cpu_ms_by_thread and ref.reference_cpu_ms_by_thread:
        progress(
            "CPU ms per call by thread, engine / reference: "
            + ", ".join(
                f"{group} {ms:.1f} / {ref.reference_cpu_ms_by_thread.get(group, 0.0):.1f}"
                for group, ms in ref.engine_cpu_ms_by_thread.items()
            )
        )
    if args.check is not None:  # the guard's verdict is the ratio; the FLOP figure compiles programs of its own (7 s)
        return
    device_s = [
        generator.generate(generator.request("a photo of a cat", seed=i)).timings["device_s"] for i in range(args.runs)
    ]
    results["achieved"] = achieved_flops(generator, sorted(device_s)[len(device_s) // 2])
    progress(f"achieved {results['achieved'].achieved_flops_per_s / 1e9:.1f} GFLOP/s on this device")


def _startup(args: argparse.Namespace, results: dict, generator) -> None:
    from .cpu.startup import startup

    progress("part 2/5 start-up, cold and warm compilation cache (two subprocesses) ...")
    st = results["startup"] = startup(
        args.model, args.height, args.width, args.steps, args.dtype, runs=args.startup_runs
    )
    progress(f"start-up: cold {st.cold.first_image_s:.1f} s, warm {st.warm.first_image_s:.1f} s ({st.ratio:.0%})")
    progress(
        f"start-up: app ready in {st.app_cold_ready_s:.1f} s cold, {st.app_warm_ready_s:.1f} s warm, "
        f"{st.app_executables_ready_s:.1f} s warm with this host's executables"
    )


def _app(args: argparse.Namespace, results: dict, generator) -> None:
    from .serving.app import through_the_app

    progress("part 3/5 through the app ...")
    results["serving"] = through_the_app(
        generator,
        runs=args.runs,
        client_counts=args.client_counts,
        requests_per_client=args.requests_per_client,
        max_requests=args.max_requests,
        queue_size=args.queue_size,
    )


def _recompiles(args: argparse.Namespace, results: dict, generator) -> None:
    from .cpu.recompiles import recompiles

    progress(f"part 4/5 recompiles ({args.recompile_requests} random requests) ...")
    rc = results["recompiles"] = recompiles(generator, args.recompile_requests)
    progress(f"recompiles: {rc.compiles_added} compilations in {rc.requests} requests")


def _flops(args: argparse.Namespace, results: dict, generator) -> None:
    from .accelerator.flops import measure_flops

    progress("part 5/5 hardware limit (XLA cost analysis of the real SDXL, nothing compiled) ...")
    results["flops"] = measure_flops(include_text=not args.no_text_flops, progress=progress)


def _soak(args: argparse.Namespace, results: dict, generator) -> None:
    from .serving.soak import soak

    progress(f"soak: {args.soak_requests} requests from {args.soak_clients} clients ...")
    results["soak"] = soak(
        generator, requests=args.soak_requests, clients=args.soak_clients, queue_size=args.queue_size
    )


def _hostloop(args: argparse.Namespace, results: dict, generator) -> None:
    from .cpu.hostloop import host_loop_cost

    progress(f"hostloop: ms per step, host loop vs fused loop ({args.runs} interleaved runs) ...")
    results["hostloop"] = host_loop_cost(generator, args.loop_steps, args.runs)


def _stop(args: argparse.Namespace, results: dict, generator) -> None:
    from .cpu.hostloop import STOP_STEPS, stop_latency

    progress(f"stop: job.cancel() at step 2 of {STOP_STEPS} -> next request's first step ({args.runs} runs) ...")
    results["stop"] = stop_latency(generator, args.runs)


def _samplers(args: argparse.Namespace, results: dict, generator) -> None:
    from .cpu.hostloop import sampler_sweep

    progress("samplers: steps 1..50 x every sampler and schedule type, counting compilations ...")
    results["samplers"] = sampler_sweep(generator)


def _sizes(args: argparse.Namespace, results: dict, generator) -> None:
    from .cpu.hostloop import warm_start

    progress("sizes: app start-up, 3 sizes, progress on, cold then warm cache (JAX_LOG_COMPILES=1) ...")
    results["sizes"] = warm_start(args.steps, args.dtype)


def _fewstep(args: argparse.Namespace, results: dict, generator) -> None:
    from .cpu.fewstep import base_vs_lightning

    progress(f"fewstep: base (25 steps, CFG) vs lightning-4 (4 steps, no CFG) per image ({args.runs} runs) ...")
    results["fewstep"] = base_vs_lightning(
        args.model, args.height, args.width, args.dtype, args.runs, flops=results.get("flops")
    )


def _merging(args: argparse.Namespace, results: dict, generator) -> None:
    from .cpu.merging import merged_serving

    progress(f"merging: requests/s alone vs merged, {args.merge_slots} per call ({args.runs} rounds each) ...")
    results["merging"] = merged_serving(args, args.merge_slots, args.runs)


def _hostpath(args: argparse.Namespace, results: dict, generator) -> None:
    from .serving.fullsize import host_path

    progress(f"hostpath: device pixels -> answer at 1024², synthetic pixels ({args.runs} runs) ...")
    results["hostpath"] = host_path(runs=args.runs)


def _fullsize(args: argparse.Namespace, results: dict, generator) -> None:
    from .serving.fullsize import full_size

    progress("fullsize: /generate vs /generate_png at 1024² through gradio_client (tiny checkpoint) ...")
    results["fullsize"] = full_size(model=args.model, runs=min(args.runs, 5), dtype=args.dtype)  # ~20 s a call


def _lora(args: argparse.Namespace, results: dict, generator) -> None:
    from .features.lora_img2img_levers import lora_switching

    progress(f"lora: merge compile, then {args.lora_rounds} rounds of LoRA sets A, A, B, B, none ...")
    results["lora"] = lora_switching(args.config, args.lora_rounds, args.lora_fixtures)


def _img2img(args: argparse.Namespace, results: dict, generator) -> None:
    from .features.lora_img2img_levers import image_inputs_cost

    progress(f"img2img: text to image vs image to image (0.5, 1.0) vs inpainting ({args.runs} runs) ...")
    results["img2img"] = image_inputs_cost(generator, args.runs)


def _controlnet(args: argparse.Namespace, results: dict, generator) -> None:
    from .features.controlnet import controlnet_cost

    progress(f"controlnet: requests with 0, 1 and 2 ControlNets ({args.runs} runs) ...")
    results["controlnet"] = controlnet_cost(args.config, args.runs)


def _refiner(args: argparse.Namespace, results: dict, generator) -> None:
    from .features.refiner import refiner_cost

    progress(f"refiner: requests with refiner_switch 1, 0.8 and 0.5 ({args.runs} runs) ...")
    results["refiner"] = refiner_cost(args.config, args.runs)


def _hires(args: argparse.Namespace, results: dict, generator) -> None:
    from .features.hires import hires_cost

    progress(f"hires: requests without and with a ×2 second pass, the refiner, both ({args.runs} runs) ...")
    results["hires"] = hires_cost(args.config, args.runs)


def _levers(args: argparse.Namespace, results: dict, generator) -> None:
    from .features.lora_img2img_levers import speed_levers

    progress(f"levers: cfg_end x deepcache at {args.feature_steps} steps ({args.runs} runs) ...")
    results["levers"] = speed_levers(generator, args.feature_steps, args.runs)


def _previews(args: argparse.Namespace, results: dict, generator) -> None:
    from .features.previews import preview_host_cost, previews_on_off

    progress(f"previews: engine with vs without previews at {args.feature_steps} steps ({args.runs} runs) ...")
    results["previews"] = previews_on_off(generator, args.feature_steps, args.runs)
    progress(f"previews: host work per preview at {args.preview_size}², synthetic ...")
    results["preview_host"] = preview_host_cost(args.preview_size)


def _history(args: argparse.Namespace, results: dict, generator) -> None:
    from .features.history import history_cost

    progress(
        f"history: the store ({args.history_adds} adds per kind, {args.history_entries} entries), then "
        f"/history ({args.history_calls} calls) ..."
    )
    results["history"] = history_cost(
        generator,
        adds=args.history_adds,
        entries=args.history_entries,
        size=args.history_size,
        calls=args.history_calls,
        database_url=args.history_database_url,
    )


def _apphost(args: argparse.Namespace, results: dict, generator) -> None:
    from .serving.apphost import app_host_cost

    progress(
        f"apphost: the app's own time per request at 1024², 8 images, with and without previews "
        f"({args.runs} rounds) ..."
    )
    results["apphost"] = app_host_cost(args.runs)


def _service(args: argparse.Namespace, results: dict, generator) -> None:
    from .serving.service import service_cost

    progress(f"service: two engine processes, the hop, requests/s, a killed engine ({args.runs} runs) ...")
    results["service"] = service_cost(generator, args, args.runs, Path(args.out) / "service")


#: Each part's measurement, in the order they run: (args, results, the shared engine or None) -> None; each
#: puts its figures in `results`.
MEASURES = {
    "reference": _reference,
    "startup": _startup,
    "app": _app,
    "recompiles": _recompiles,
    "flops": _flops,
    "soak": _soak,
    "hostloop": _hostloop,
    "stop": _stop,
    "samplers": _samplers,
    "sizes": _sizes,
    "fewstep": _fewstep,
    "merging": _merging,
    "hostpath": _hostpath,
    "fullsize": _fullsize,
    "lora": _lora,
    "img2img": _img2img,
    "controlnet": _controlnet,
    "refiner": _refiner,
    "hires": _hires,
    "levers": _levers,
    "previews": _previews,
    "history": _history,
    "apphost": _apphost,
    "service": _service,
}


def run(args: argparse.Namespace) -> dict:
    """Run the selected parts in order, one engine shared by the in-process parts; return every result.

    A part that raises is recorded in `results["failed"]` with its error (bench/parts.py) and the next part runs; an
    engine that does not load is recorded as "engine", and the parts that need it as not run.
    """
    from .common import machine_info

    started = time.perf_counter()
    results: dict = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "setup": {
            "model": args.model,
            "height": args.height,
            "width": args.width,
            "steps": args.steps,
            "dtype": args.dtype,
            "runs": args.runs,
            "parts": args.parts,
            "shape": f"{args.height}x{args.width}, {args.steps} steps, {args.dtype}",
        },
    }
    machine = results["machine"]
    progress(
        f"{machine['device_count']} × {machine['device_kind']} on {machine['processor']} "
        f"({machine['cpu_count']} CPUs, load {machine['load_average_at_start']}); "
        f"parts: {', '.join(args.parts)}"
    )
    engine: dict = {}  # the shared engine, once loaded

    def measure(name: str):
        def call() -> None:
            generator = engine.get("generator")
            if name in ENGINE_PARTS and generator is None:
                raise RuntimeError("not run: the bench's engine did not load (see the engine's failure)")
            MEASURES[name](args, results, generator)

        return call

    steps = [("engine", lambda: engine.update(generator=load_engine(args, results)))]
    steps = steps if ENGINE_PARTS & set(args.parts) else []
    args.early_reference = None
    if args.check is not None:  # the guard: diffusers' pipeline loads in its venv while the engine compiles here
        from .cpu.reference import ReferenceWorker, load_reference

        progress("starting diffusers' pipeline in the reference venv, beside the engine's compile ...")
        with contextlib.suppress(Exception):  # no venv, no model: the parts fail with the reason, as without --check
            args.early_reference = ReferenceWorker(load_reference(args.config.model, args.config.dtype)).start()
    try:
        results["failed"] = run_parts([*steps, *[(name, measure(name)) for name in MEASURES if name in args.parts]])
    finally:
        if args.early_reference is not None:
            args.early_reference.close(kill=True)  # the reference part closed it already, unless it never ran
    results["bench_s"] = time.perf_counter() - started
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["unet"]:  # `python -m bench unet ...`: the UNet step per attention core (bench/accelerator/unet.py)
        from .accelerator.unet import main as unet_main

        return unet_main(argv[1:])
    if argv[:1] == ["accelerator"]:  # `python -m bench accelerator ...`: the engine at full size on this host's chip
        from .accelerator.end_to_end import main as accelerator_main

        return accelerator_main(argv[1:])
    if argv[:1] == ["step-profile"]:  # `python -m bench step-profile ...`: the CFG step's device time by op category
        from .accelerator.step_profile import main as step_profile_main

        return step_profile_main(argv[1:])
    if argv[:1] == ["gpu"]:  # `python -m bench gpu ...`: accelerator and step-profile in one budget
        from .accelerator.gpu import main as gpu_main

        return gpu_main(argv[1:])
    if argv[:1] == ["tpu"]:  # `python -m bench tpu ...`: served programs compiled for a TPU topology
        from .tpu.programs import main as tpu_main

        return tpu_main(argv[1:])
    if argv[:1] == ["tpu-second-pass"]:  # the refiner and the 2048² hires pass for v5e (bench/tpu/second_pass.py)
        from .tpu.second_pass import main as second_pass_main

        return second_pass_main(argv[1:])
    args = parse_args(argv)
    configure_platform(args.cpu_devices)
    # Gradio 6.17 trips Starlette's own deprecation of a status-code name on every request: noise, not ours.
    warnings.filterwarnings("ignore", message=".*HTTP_422_UNPROCESSABLE_ENTITY.*")
    from .report.outputs import chart, markdown, write_json

    results = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(results, out / "results.json")
    (out / "results.md").write_text(markdown(results) + "\n")
    if "soak" in results:
        from .serving.soak import write_soak_json

        write_soak_json(results["soak"], out / "soak.json")
    chart_path = chart(results, out / "chart.png")
    progress(
        f"done in {results['bench_s']:.0f} s: {out / 'results.json'}, {out / 'results.md'}"
        + (f", {chart_path}" if chart_path else "")
    )
    status = 0
    if failed := results["failed"]:
        print(
            f"bench: {len(failed)} part(s) failed ({', '.join(failed)}); each one's error is in "
            f'{out / "results.json"} under "failed", the other parts\' figures beside it',
            file=sys.stderr,
        )
        status = 1
    if args.check is not None:
        from .cpu.reference import check_ratio

        if "reference" not in results:
            print("bench check FAILED: the reference part measured nothing (see its failure)", file=sys.stderr)
            return 1
        failure = check_ratio(results["reference"], args.check)
        if failure:
            print(f"bench check FAILED: {failure}", file=sys.stderr)
            return 1
        progress(
            f"bench check passed: engine / diffusers = {results['reference'].cpu_ratio:.2f} in CPU seconds <= "
            f"{args.check:g} (wall {results['reference'].ratio:.2f})"
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
