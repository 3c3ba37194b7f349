"""`python -m bench step-profile`: where the 1024² CFG UNet step's device time goes, by op category (issue 46).

    python -m bench step-profile                                   # GPU: SDXL-shaped weights, 1024², bf16
    python -m bench step-profile --model tiny --size 64 --calls 3  # CPU smoke test (XLA:CPU's thunks, not kernels)
    python -m bench step-profile --levers 'nomerge:xla_gpu_dot_merger_threshold_mb=0' --throughput 8

The engine is built as `python -m bench accelerator` builds it (bf16 on an accelerator, one image per device,
`--attention auto`, `--prompt-windows 1`, speed levers on, previews off), but only the programs a 25-step CFG request
runs are compiled: the request runs once, and the step program it calls most (`step_full ... cfg`) is kept with the
arguments of its first call. That program is then timed alone (calls blocked on one by one; and back to back, as
the host loop queues them), and `--calls` back-to-back calls run under `jax.profiler.trace` with a Perfetto trace.

The trace's device events (GPU: the kernels on each `Stream` line of a `/device:` process; a host without such a
process: its XLA thunk events) are summed per category. **The categories come from kernel names alone, by the
heuristic rules of CATEGORIES below** (first match wins, on the kernel's name and the HLO op the profiler gives it):
a cuDNN convolution that XLA names `fusion` lands in the category of whatever its name says. The top kernels are
listed by name so a reader can check the rules against what ran.

Then, with `--levers`, the same 25-step CFG request on a fresh engine and on an engine per set of XLA options
(`--xla-option`, host/compiling/compiler_options.py) and engine switches (`ENGINE_LEVERS`: `--cross-attention-cache`)
over the same weights, timed in interleaved rounds: seconds per request,
the ratio, and the pixels' distance from the engine's without them. Then, with `--throughput`, MLPerf's request
per images-per-device value.

Outputs in --out: step_profile.json (per category: ms per step, % of the kernels' time, kernels per step; the top
kernels; the step's wall time; the program's FLOPs from XLA's cost analysis and TFLOP/s at that wall time),
step_profile.md (the table), and the trace (trace.json.gz) when --keep-trace is given and it is under 16 MiB.
Partial results are written as each phase ends.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import statistics
import time
from pathlib import Path

#: MLPerf Inference's SDXL request (the throughput rows): 20 steps, guidance 8.
MLPERF_STEPS, MLPERF_GUIDANCE = 20, 8.0
#: The request the levers are timed on, the accelerator bench's headline one: 25 steps, guidance 5.
REQUEST_STEPS, REQUEST_GUIDANCE = 25, 5.0
#: The engine switches (EngineConfig fields, off in the base engine here) a `--levers` set may turn on, by name.
ENGINE_LEVERS = ("cross_attention_cache",)
#: The lever rows' name for the engine without --levers' options.
BASE = "base"
#: Heuristic rules, first match wins, applied to "<kernel name> <hlo op>" in lower case. Order matters: cuDNN's
#: flash attention kernels say "fprop" (as its convolutions do), and its convolution kernels say "gemm"
#: ("implicit_gemm"), so attention is tried before convolution and convolution before matrix products; "convert"
#: is not a convolution; XLA's Triton "softmax" fusions are the row reductions of norms (attention's softmax runs
#: inside cuDNN's kernel); cuDNN's nchwToNhwc / nhwcToNchw kernels are layout changes. The GPU names here are what
#: cuDNN, cuBLAS (its Hopper "nvjet" kernels too) and XLA:GPU's fusions are known to be called, not read off a trace
#: of this engine: the top kernels in step_profile.json are there to check them against.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("attention", r"sdpa|fmha|flash|attention"),
    ("copies and layout", r"nchwtonhwc|nhwctonchw|transform_kernel|memcpy|memset"),
    ("convolution", r"conv(?!ert)|fprop|dgrad|wgrad|implicit_gemm|implicit_precomp|winograd"),
    ("matrix products", r"gemm|\bdot|dot_|dot\.|matmul|cublas|cutlass|xmma|wgmma|nvjet|triton_dot"),
    ("norms (reductions)", r"reduc|norm|softmax|mean|variance"),
    ("copies and layout", r"transpose|copy|concat|\bpad|slice|bitcast|gather|scatter|broadcast|reverse|dynamic_update"),
    ("element-wise", r"loop_|fusion|elementwise|add|multiply|subtract|divide|convert|exp|tanh|logistic|select|erf"),
)
OTHER = "other"
#: The order the tables list categories in: the issue's.
ORDER = (
    *("convolution", "matrix products", "attention", "norms (reductions)", "element-wise", "copies and layout"),
    OTHER,
)
#: Thread lines of a device process that repeat the kernels' time at a coarser grain (the profiler's derived lines).
DERIVED_LINES = ("xla modules", "xla ops", "steps", "source", "framework", "tensorflow ops", "launch stats")


def categorise(name: str, hlo_op: str = "") -> str:
    """The category of one kernel by CATEGORIES' rules."""
    text = f"{name} {hlo_op}".lower()
    for category, pattern in CATEGORIES:
        if re.search(pattern, text):
            return category
    return OTHER


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench step-profile",
        description="The CFG UNet step's device time by op category, from a Perfetto trace of back-to-back calls.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--model", choices=("sdxl", "tiny"), default="sdxl", help="SDXL's architectures (default) or the tiny one's")
    add("--size", type=int, default=1024, help="image side in pixels (default 1024)")
    add("--calls", type=int, default=20, help="step calls traced, and timed each way (default 20)")
    add("--attention", default="auto", help="the engine's attention core (default auto: cudnn on GPU)")
    add("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bfloat16, float32 on CPU")
    add("--top", type=int, default=25, help="kernels listed by total time (default 25)")
    add("--keep-trace", action="store_true", help="copy the trace to --out/trace.json.gz when under 16 MiB")
    add("--out", default="bench-results", help="directory of step_profile.json/.md (default bench-results/)")
    add("--cpu-devices", type=int, default=0, help="virtual CPU devices when XLA_FLAGS is unset (default 0)")
    add(
        "--throughput",
        default="",
        help="after the profile: images per device to time MLPerf's request at, "
        "comma-separated (e.g. 1,2,4,8; default none)",
    )
    add("--runs", type=int, default=2, help="timed requests per --throughput value, after one untimed (default 2)")
    add(
        "--levers",
        default="",
        help="after the profile: lever sets to time the 25-step CFG request with, against the engine without "
        "them, each NAME:OPTION=VALUE[,OPTION=VALUE...], sets separated by ';' (e.g. "
        "'nomerge:xla_gpu_dot_merger_threshold_mb=0'); an engine switch of ENGINE_LEVERS is named bare "
        "('cache:cross_attention_cache'); default none",
    )
    add("--request-runs", type=int, default=3, help="timed 25-step requests per lever set and without (default 3)")
    args = parser.parse_args(argv)
    if args.size % 64 or args.size < 64 or args.calls < 1 or args.top < 1 or args.runs < 1:
        parser.error("--size must be a multiple of 64; --calls, --top and --runs at least 1")
    try:
        args.per_device = [int(n) for n in args.throughput.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--throughput takes whole numbers separated by commas; got {args.throughput!r}")
    if any(n < 1 for n in args.per_device):
        parser.error("--throughput values must be at least 1")
    try:
        args.lever_sets = parse_levers(args.levers)
    except ValueError as exc:
        parser.error(str(exc))
    if args.request_runs < 1:
        parser.error("--request-runs must be at least 1")
    return args


def parse_levers(text: str) -> dict[str, tuple[tuple[str, str], ...]]:
    """'NAME:OPT=V,OPT=V;NAME2:OPT=V,SWITCH' -> {NAME: ((OPT, V), ..., (SWITCH, "true"))}, in order (SWITCH: an engine
    switch of ENGINE_LEVERS); ValueError with one sentence."""
    from ..engine import InvalidInput, xla_option_pairs

    sets: dict[str, tuple[tuple[str, str], ...]] = {}
    for part in filter(None, (part.strip() for part in text.split(";"))):
        name, colon, options = part.partition(":")
        if not colon or not name.strip() or name.strip() in sets or name.strip() == BASE:
            raise ValueError(
                f"--levers takes NAME:OPTION=VALUE,... with names of their own (not {BASE!r}); got {part!r}"
            )
        named = [option.strip() for option in options.split(",") if option.strip()]
        try:
            pairs = xla_option_pairs([option for option in named if option not in ENGINE_LEVERS])
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        pairs += tuple((option, "true") for option in named if option in ENGINE_LEVERS)
        if not pairs:
            raise ValueError(f"--levers: set {name.strip()!r} names no option")
        sets[name.strip()] = pairs
    return sets


class StepCapture:
    """Wraps `programs.compile` for one request: each program's first call's arguments, and calls per label."""

    def __init__(self, programs):
        self.programs = programs
        self.first: dict[str, tuple] = {}  # label -> (compiled program, args, kwargs)
        self.counts: dict[str, int] = {}

    def __enter__(self) -> StepCapture:
        compile_program = self.programs.compile

        def recording(key):
            program = compile_program(key)

            def run(*args, **kwargs):
                self.counts[key.label] = self.counts.get(key.label, 0) + 1
                self.first.setdefault(key.label, (program, args, kwargs))
                return program(*args, **kwargs)

            return run

        self.programs.compile = recording  # the instance's attribute hides the class's method until __exit__
        return self

    def __exit__(self, *exc) -> None:
        del self.programs.compile

    def most_called(self) -> tuple[str, tuple]:
        """The label the request called most (its step) and that program's first call."""
        label = max(self.counts, key=self.counts.get)
        return label, self.first[label]


def trace_events(trace_dir: Path) -> tuple[Path, list[dict]]:
    """The Perfetto trace (`perfetto_trace.json.gz`; else the trace viewer's `<host>.trace.json.gz`, the same
    Chrome trace events) under `trace_dir`, the newest, and its events."""

    def preferred(path: Path) -> tuple:
        return path.name == "perfetto_trace.json.gz", path.stat().st_mtime

    found = sorted(trace_dir.rglob("*trace.json.gz"), key=preferred)
    if not found:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}")
    with gzip.open(found[-1], "rt") as handle:
        data = json.load(handle)
    return found[-1], data["traceEvents"] if isinstance(data, dict) else data


def device_events(events: list[dict]) -> tuple[list[dict], dict]:
    """The complete events ("ph" X) of the device's kernel lines, and which lines they came from.

    GPU: the `Stream ...` threads of each `/device:` process. Without such threads, a `/device:` process's threads
    but the derived lines (DERIVED_LINES). Without any `/device:` process (XLA:CPU), every complete event carrying an
    `hlo_op` argument (the thunks), else every complete event but the Python tracer's."""
    processes, threads = {}, {}
    for event in events:
        if event.get("ph") == "M" and event.get("name") == "process_name":
            processes[event["pid"]] = str(event.get("args", {}).get("name", ""))
        elif event.get("ph") == "M" and event.get("name") == "thread_name":
            threads[(event["pid"], event.get("tid"))] = str(event.get("args", {}).get("name", ""))
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    devices = {pid for pid, name in processes.items() if "/device:" in name}
    on_device = [e for e in complete if e["pid"] in devices]
    streams = [e for e in on_device if threads.get((e["pid"], e.get("tid")), "").lower().startswith("stream")]
    if streams:
        chosen, rule = streams, "device Stream lines"
    elif on_device:
        chosen = [
            e for e in on_device if not threads.get((e["pid"], e.get("tid")), "").lower().startswith(DERIVED_LINES)
        ]
        rule = "device lines but derived ones"
    else:
        chosen = [e for e in complete if "hlo_op" in e.get("args", {})]
        rule = "host events with an hlo_op (XLA:CPU thunks)"
        if not chosen:
            chosen = [e for e in complete if not str(processes.get(e["pid"], "")).lower().startswith("python")]
            rule = "every complete event"
    lines: dict[str, int] = {}
    for event in chosen:
        line = f"{processes.get(event['pid'], event['pid'])} / {threads.get((event['pid'], event.get('tid')), '?')}"
        lines[line] = lines.get(line, 0) + 1
    return chosen, {"rule": rule, "lines": lines}


def summarise(events: list[dict], steps: int, top: int) -> dict:
    """Per category and per kernel name: ms per step, share of the kernels' time, kernels per step."""
    by_category: dict[str, list[float]] = {}
    by_kernel: dict[str, dict] = {}
    for event in events:
        name, hlo_op = str(event.get("name", "")), str(event.get("args", {}).get("hlo_op", ""))
        category = categorise(name, hlo_op)
        ms = float(event["dur"]) / 1e3  # trace durations are in microseconds
        by_category.setdefault(category, []).append(ms)
        kernel = by_kernel.setdefault(name, {"name": name, "category": category, "hlo_ops": set(), "ms": 0.0, "n": 0})
        kernel["ms"] += ms
        kernel["n"] += 1
        if hlo_op and len(kernel["hlo_ops"]) < 4:
            kernel["hlo_ops"].add(hlo_op)
    total_ms = sum(sum(v) for v in by_category.values())
    categories = {
        category: {
            "ms_per_step": sum(by_category[category]) / steps,
            "percent": 100 * sum(by_category[category]) / total_ms if total_ms else 0.0,
            "kernels_per_step": len(by_category[category]) / steps,
        }
        for category in ORDER
        if category in by_category
    }
    kernels = sorted(by_kernel.values(), key=lambda k: -k["ms"])[:top]
    top_rows = [
        {
            "name": k["name"],
            "category": k["category"],
            "hlo_ops": sorted(k["hlo_ops"]),
            "ms_per_step": k["ms"] / steps,
            "percent": 100 * k["ms"] / total_ms if total_ms else 0.0,
            "calls_per_step": k["n"] / steps,
        }
        for k in kernels
    ]
    return {
        "kernel_ms_per_step": total_ms / steps,
        "kernels_per_step": len(events) / steps,
        "categories": categories,
        "top_kernels": top_rows,
    }


def lever_table(rows: list[dict]) -> list[str]:
    """`--levers`' rows as a markdown table (step_profile.md's and gpu.md's): the base (no ratio), each set, and a
    set XLA refused with its error."""
    lines = [
        "| set | XLA options, engine switches | s per request (median) | of base | max pixel difference | "
        "values differing |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        switches = [f"`--{name.replace('_', '-')}`" for name in row.get("engine_switches", [])]
        options = ", ".join([f"`{name}={value}`" for name, value in row["xla_options"]] + switches) or "—"
        if "error" in row:
            lines.append(f"| {row['name']} | {options} | {row['error']} | | | |")
        elif "over_base" not in row:
            lines.append(f"| {row['name']} | {options} | {row['request_s_median']:.3f} | 1 | — | — |")
        else:
            lines.append(
                f"| {row['name']} | {options} | {row['request_s_median']:.3f} | {row['over_base']:.3f} | "
                f"{row['max_pixel_difference']} | {row['pixels_differing_percent']:.2f} % |"
            )
    return lines


def markdown(results: dict) -> str:
    """The category table and the top kernels, as bench/README quotes them."""
    profile = results.get("profile", {})
    timing = results.get("timing", {})
    lines = [
        f"# The CFG step by op category: {results.get('program', '?')} on {results.get('device_kind', '?')}",
        "",
        f"{results.get('model')} at {results.get('size')}², {results.get('dtype')}, attention "
        f"{results.get('attention')}; {results.get('calls')} calls traced; jax {results.get('jax')}, "
        f"flax {results.get('flax')}; {results.get('measured_at')}.",
        "",
    ]
    if timing:
        lines += [
            f"Step wall time: {timing['blocked_ms_median']:.2f} ms blocked on each call (median), "
            f"{timing['back_to_back_ms']:.2f} ms per call back to back; "
            f"{results.get('tflop', 0):.2f} TFLOP per step (XLA's cost analysis) = "
            f"{results.get('tflops_back_to_back', 0):.0f} TFLOP/s back to back.",
            "",
        ]
    if profile:
        lines += [
            f"Device kernels: {profile['kernel_ms_per_step']:.2f} ms per step in "
            f"{profile['kernels_per_step']:.0f} kernels ({profile['source']['rule']}). Categories by kernel "
            "name (heuristic; bench/accelerator/step_profile.py CATEGORIES).",
            "",
            "| category | ms per step | % of kernel time | kernels per step |",
            "|---|---|---|---|",
        ]
        for category, row in profile["categories"].items():
            lines.append(
                f"| {category} | {row['ms_per_step']:.2f} | {row['percent']:.1f} | {row['kernels_per_step']:.0f} |"
            )
        lines += ["", "| kernel (top by time) | category | ms per step | % | calls per step |", "|---|---|---|---|---|"]
        for row in profile["top_kernels"]:
            name = row["name"] if len(row["name"]) <= 90 else row["name"][:87] + "..."
            lines.append(
                f"| `{name}` | {row['category']} | {row['ms_per_step']:.3f} | {row['percent']:.1f} | "
                f"{row['calls_per_step']:.0f} |"
            )
    if results.get("levers"):
        lines += [
            "",
            f"Lever sets on the {REQUEST_STEPS}-step request (CFG {REQUEST_GUIDANCE:g}, one image per "
            "device), each an engine on the same weights:",
            "",
            *lever_table(results["levers"]),
        ]
    if results.get("throughput"):
        lines += [
            "",
            f"MLPerf's request ({MLPERF_STEPS} steps, CFG {MLPERF_GUIDANCE:g}) by images per device:",
            "",
            "| images per device | images | s per request (median) | images/s | peak memory GiB |",
            "|---|---|---|---|---|",
        ]
        for row in results["throughput"]:
            peak = row.get("peak_bytes_in_use")
            lines.append(
                f"| {row['images_per_device']} | {row['images']} | {row['request_s_median']:.3f} | "
                f"{row['images_per_s']:.2f} | {peak / 2**30:.1f} |"
                if peak
                else f"| {row['images_per_device']} | {row['images']} | {row['request_s_median']:.3f} | "
                f"{row['images_per_s']:.2f} | — |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    from ..common import configure_platform

    args = parse_args(argv)
    configure_platform(args.cpu_devices)
    import jax

    from ..common import machine_info, progress
    from ..report.outputs import write_json
    from .end_to_end import NEGATIVE, PROMPT, _leaves, full_size_model

    device = jax.devices()[0]
    dtype = args.dtype or ("float32" if device.platform == "cpu" else "bfloat16")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import flax

        flax_version = flax.__version__
    except ImportError:
        flax_version = None
    results: dict = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "device_kind": device.device_kind,
        "devices": jax.device_count(),
        "jax": jax.__version__,
        "flax": flax_version,
        "model": args.model,
        "size": args.size,
        "dtype": dtype,
        "attention": args.attention,
        "prompt_windows": 1,
        "calls": args.calls,
        "category_rules": [list(rule) for rule in CATEGORIES],
    }

    def save(**values) -> None:
        results.update(values)
        write_json(results, out / "step_profile.json")
        (out / "step_profile.md").write_text(markdown(results))

    progress(f"step-profile: {args.model} at {args.size}² on {device.device_kind} ({dtype}); making weights ...")
    loaded = full_size_model(args.model, dtype)
    progress(
        f"step-profile: {sum(x.size for x in _leaves(loaded.params)) / 1e9:.2f} B parameters in {loaded.load_s:.1f} s"
    )
    from ..engine import EngineConfig, Generator, prepare

    config = prepare(
        EngineConfig(
            model=loaded.source,
            height=args.size,
            width=args.size,
            steps=25,
            dtype=dtype,
            attention=args.attention,
            prompt_windows=1,
            previews=False,
            executable_cache=False,
            text_cache=0,
            cross_attention_cache=False,  # an ENGINE_LEVERS switch: off in the base, which the levers are timed beside
        )
    )
    # As accelerator.engine builds it (speed levers on: EngineConfig's default; every call encodes its text), without
    # its warm-up of every served program: the request below compiles only the programs it runs.
    generator = Generator(loaded, config, None, [])
    request = generator.request(
        PROMPT, negative_prompt=NEGATIVE, seed=0, steps=REQUEST_STEPS, guidance_scale=REQUEST_GUIDANCE
    )
    started = time.perf_counter()
    with StepCapture(generator.programs) as capture:
        generator.generate(request)
    label, (program, call_args, call_kwargs) = capture.most_called()
    first_s = time.perf_counter() - started
    progress(f"step-profile: first request (compiles included) {first_s:.1f} s; calls {capture.counts}")
    flops = _flops(program)
    save(program=label, request_calls=capture.counts, first_request_s=first_s, tflop=flops / 1e12 if flops else None)

    def call():
        return program(*call_args, **call_kwargs)

    for _ in range(3):  # warm: allocator, autotuning caches
        jax.block_until_ready(call())
    blocked = []
    for _ in range(args.calls):
        began = time.perf_counter()
        jax.block_until_ready(call())
        blocked.append(time.perf_counter() - began)
    began = time.perf_counter()
    outs = [call() for _ in range(args.calls)]
    jax.block_until_ready(outs)
    back_to_back = (time.perf_counter() - began) / args.calls
    del outs
    timing = {
        "blocked_ms": [s * 1e3 for s in blocked],
        "blocked_ms_median": statistics.median(blocked) * 1e3,
        "back_to_back_ms": back_to_back * 1e3,
    }
    save(
        timing=timing,
        tflops_back_to_back=flops / back_to_back / 1e12 if flops else None,
        tflops_blocked=flops / statistics.median(blocked) / 1e12 if flops else None,
    )
    progress(
        f"step-profile: {label}: {timing['blocked_ms_median']:.2f} ms blocked, {timing['back_to_back_ms']:.2f} "
        f"ms back to back" + (f", {flops / back_to_back / 1e12:.0f} TFLOP/s" if flops else "")
    )

    trace_dir = out / "trace"
    shutil.rmtree(trace_dir, ignore_errors=True)
    began = time.perf_counter()
    with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
        outs = [call() for _ in range(args.calls)]
        jax.block_until_ready(outs)
    traced_ms = (time.perf_counter() - began) / args.calls * 1e3
    del outs
    path, events = trace_events(trace_dir)
    chosen, source = device_events(events)
    profile = {
        **summarise(chosen, args.calls, args.top),
        "source": source,
        "traced_ms_per_call": traced_ms,
        "trace_bytes": path.stat().st_size,
    }
    save(profile=profile)
    if args.keep_trace and path.stat().st_size < 16 * 2**20:
        shutil.copy(path, out / "trace.json.gz")
    shutil.rmtree(trace_dir, ignore_errors=True)
    for category, row in profile["categories"].items():
        progress(
            f"  {category}: {row['ms_per_step']:.2f} ms per step ({row['percent']:.1f} %), "
            f"{row['kernels_per_step']:.0f} kernels"
        )
    del capture, generator  # the kept step program and its arguments are small beside a batch-8 engine
    if args.lever_sets:
        save(levers=levers(loaded, config, args.lever_sets, args.request_runs, save))
    if args.per_device:
        save(throughput=throughput(loaded, config, args.per_device, args.runs, save))
    progress(f"done: {out / 'step_profile.json'}")
    return 0


def throughput(loaded, config, per_device: list[int], runs: int, save) -> list[dict]:
    """MLPerf's request (20 steps, CFG 8) at each images-per-device value: an engine per value on the same weights
    (its programs compiled by its first, untimed request), then the median of `runs` requests; images/s counts every
    device's images. The device's peak memory (where the backend reports it) is read after each value's requests:
    the peak since start, so a row's figure is the largest of it and the rows before it."""
    import dataclasses
    import gc

    import jax

    from ..common import progress
    from ..engine import Generator
    from .end_to_end import NEGATIVE, PROMPT

    rows: list[dict] = []
    for n in per_device:
        generator = Generator(loaded, dataclasses.replace(config, per_device_batch=n), None, [])
        request = generator.request(
            PROMPT, negative_prompt=NEGATIVE, seed=0, steps=MLPERF_STEPS, guidance_scale=MLPERF_GUIDANCE
        )
        began = time.perf_counter()
        generator.generate(request)
        first_s = time.perf_counter() - began
        times = []
        for _ in range(runs):
            began = time.perf_counter()
            result = generator.generate(request)
            times.append(time.perf_counter() - began)
        median = statistics.median(times)
        stats = jax.devices()[0].memory_stats() or {}
        images = len(result.images)
        row = {
            "images_per_device": n,
            "images": images,
            "first_request_s": first_s,
            "request_s": times,
            "request_s_median": median,
            "images_per_s": images / median,
            "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
            "bytes_limit": stats.get("bytes_limit"),
        }
        rows.append(row)
        save(throughput=rows)
        peak = row["peak_bytes_in_use"]
        progress(
            f"step-profile: {n} per device: {median:.3f} s per request, {row['images_per_s']:.2f} images/s"
            + (f", peak memory {peak / 2**30:.1f} GiB" if peak else "")
            + f" (first {first_s:.1f} s)"
        )
        del generator, result
        gc.collect()
    return rows


def levers(loaded, config, sets: dict, runs: int, save) -> list[dict]:
    """The 25-step CFG request (seed 0) on a fresh engine with `config` (the base) and on one per lever set,
    all over the same weights (each compiled by its first, untimed request), then `runs` rounds, each timing one
    request of every engine in turn (base, set 1, set 2, ...): the median per engine, its ratio to the base's, and
    how far its pixels are from the base's (max difference in 8-bit levels, share of values that differ).

    Interleaved, and the base built as the sets are, because on the H200 (2026-11-28) timing each engine's requests
    in a block after its compile made whichever set came first about 15 % slower than the base, whatever its
    options, and on this CPU the profiled engine ran 3 % ahead of a fresh one with a no-op option (bench/HISTORY.md).
    A set XLA refuses is a row with its error; the others still run."""
    import numpy as np

    from ..common import progress
    from ..engine import Generator, InvalidInput, check_xla_options
    from .end_to_end import NEGATIVE, PROMPT

    def request(generator):
        return generator.request(
            PROMPT, negative_prompt=NEGATIVE, seed=0, steps=REQUEST_STEPS, guidance_scale=REQUEST_GUIDANCE
        )

    def pixels(result) -> np.ndarray:
        return np.stack([np.asarray(image) for image in result.images]).astype(np.int16)

    engines: dict[str, tuple] = {}
    rows: dict[str, dict] = {}
    images: dict[str, np.ndarray] = {}
    for name, given in {BASE: (), **sets}.items():
        options = tuple(pair for pair in given if pair[0] not in ENGINE_LEVERS)
        switches = {pair[0]: True for pair in given if pair[0] in ENGINE_LEVERS}
        rows[name] = {"name": name, "xla_options": [list(pair) for pair in options], "engine_switches": list(switches)}
        try:
            check_xla_options(options)
        except InvalidInput as exc:
            rows[name]["error"] = str(exc)
            progress(f"step-profile: {name}: {exc}")
            continue
        # the base too is a fresh engine, built as each set's is
        engines[name] = (
            Generator(loaded, config.replace(xla_options=config.xla_options + options, **switches), None, []),
            options,
        )
        began = time.perf_counter()
        images[name] = pixels(engines[name][0].generate(request(engines[name][0])))
        rows[name]["first_request_s"] = time.perf_counter() - began
        progress(f"step-profile: {name} compiled by its first request in {rows[name]['first_request_s']:.1f} s")
    times: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(runs):
        for name, (generator, _) in engines.items():
            began = time.perf_counter()
            generator.generate(request(generator))
            times[name].append(time.perf_counter() - began)
    base_s = statistics.median(times[BASE])
    for name in engines:
        row = rows[name]
        row.update(request_s=times[name], request_s_median=statistics.median(times[name]))
        if name != BASE:
            difference = np.abs(images[name] - images[BASE])
            row.update(
                over_base=row["request_s_median"] / base_s,
                max_pixel_difference=int(difference.max()),
                pixels_differing_percent=float(100 * np.count_nonzero(difference) / difference.size),
            )
            progress(
                f"step-profile: lever {name}: {row['request_s_median']:.3f} s per request "
                f"({row['over_base']:.3f} of {BASE}'s {base_s:.3f}), pixels at most "
                f"{row['max_pixel_difference']} levels from {BASE}'s ({row['pixels_differing_percent']:.2f} % "
                "differ)"
            )
    del engines
    result = list(rows.values())
    save(levers=result)
    return result


def _flops(program) -> float | None:
    """FLOPs of one call by XLA's cost analysis of the compiled program (None where it gives none)."""
    try:
        analysis = program.cost_analysis()
    except Exception:  # some backends have none; the profile stands without it
        return None
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else {}
    flops = (analysis or {}).get("flops")
    return float(flops) if flops else None
