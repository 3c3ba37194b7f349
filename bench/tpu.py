"""`python -m bench tpu`: the served programs compiled by the real TPU compiler on this host (no TPU needed).

    python -m bench tpu                               # SDXL, v5e:2x2, the app's 3 sizes, CFG on/off, xla and splash
    python -m bench tpu --only "step 1024x1024 cfg" --attention splash    # one program (9-15 min here at full size)
    python -m bench tpu --topology v6e:2x2 --kinds step --sizes 1024x1024
    python -m bench tpu --model tiny --sizes 64x64                # the tiny checkpoint's geometry: a minute or two
    python -m bench tpu --startup                                 # precompiled vs cold start-up (tiny, this CPU)

Needs libtpu (`pip install "jax[tpu]==0.10.2"`, in requirements-dev.txt). `--topology` is any name libtpu knows
(v5e:2x2 = v5e-4, v5e:2x4, v6e:2x2, the multi-host v5e:4x4...); the batch is one image per chip (x
--per-device-batch), weights replicated, as the app serves. SDXL's weights are abstract (shapes only, bf16: nothing
is downloaded); `--model tiny` uses the tiny checkpoint. Each program is compiled with `ServedPrograms.lower(key)
.compile()`, exactly what the server compiles; per program the report gives compile seconds here, HBM per chip
(memory analysis: arguments, temporaries, outputs, generated code) against the chip's HBM, FLOPs and bytes accessed
of the compiled program (cost analysis, per chip; fused Pallas kernels report no FLOPs) and the roofline
max(FLOPs / peak, bytes / bandwidth). Per request it predicts device seconds on the topology (4 images on v5e:2x2)
for SDXL base (25 steps, CFG) and Lightning-4 (4 steps, no CFG) from the rooflines: encode + start + steps x step +
decode, a lower bound, at every size compiled. Results go to --out/tpu.json (merged with the rows already there, so
programs compiled by separate runs add up) and a table is printed (`--report`: only that, nothing compiled). Only
the UNet step depends on the attention core; the other programs are compiled once (attention null).

`--startup` measures the precompiled start-up instead, on this host's CPU devices with the tiny checkpoint (128x128,
4 steps): `python -m pipeline precompile --topology cpu`, then `python -m pipeline generate` cold (no compilation
cache) and with `--precompiled`, each a fresh process; writes startup.json.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import time
from pathlib import Path

SDXL = "sdxl"
TINY = "tiny"
KINDS = ("step", "decode", "encode", "start")
#: Requests the report predicts: (name, steps, cfg).
REQUESTS = (("SDXL base, 25 steps, CFG", 25, True), ("Lightning-4, 4 steps, no CFG", 4, False))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench tpu",
        description="Compile the served programs for a TPU topology on this host; HBM, cost, roofline per program.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--topology", default="v5e:2x2", help="TPU topology (default v5e:2x2 = v5e-4; v5e:2x4, v6e:2x2, v5e:4x4...)")
    add("--model", choices=(SDXL, TINY), default=SDXL, help="full-size SDXL (abstract weights) or the tiny checkpoint")
    add("--sizes", default=None,
        help="WxH,... (default the app's: 1024x1024,1344x768,768x1344; tiny: the same ratios at ~128 px)")  # fmt: skip
    add("--cfg", default="on,off", help="classifier-free guidance: on, off or on,off (default on,off)")
    add("--attention", default="xla,splash", help="cores for the step program (default xla,splash)")
    add("--kinds", default=",".join(KINDS), help=f"program kinds (default {','.join(KINDS)})")
    add("--only", default=None, help='exact program labels, comma-separated, e.g. "step 1024x1024 cfg,encode cfg"')
    add("--per-device-batch", type=int, default=1, help="images per chip (default 1)")
    add("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="weights and activations (default bf16)")
    add("--out", default="bench-results", help="directory of tpu.json (default bench-results/)")
    add("--fresh", action="store_true", help="replace tpu.json instead of merging into it")
    add("--startup", action="store_true", help="only: precompiled vs cold start-up, tiny, this host's CPU devices")
    add("--report", action="store_true", help="only: the table and predictions of --out/tpu.json (nothing compiled)")
    add("--runs", type=int, default=1, help="with --startup: start-ups of each kind (default 1)")
    args = parser.parse_args(argv)
    args.attentions = [a.strip() for a in args.attention.split(",") if a.strip()]
    args.kind_list = [k.strip() for k in args.kinds.split(",") if k.strip()]
    cfgs = {"on": True, "off": False}
    try:
        args.cfgs = [cfgs[c.strip()] for c in args.cfg.split(",") if c.strip()]
    except KeyError:
        parser.error("--cfg takes on, off or on,off")
    if set(args.attentions) - {"xla", "splash", "diffusers"} or not args.attentions:
        parser.error("--attention takes some of xla, splash, diffusers")
    if set(args.kind_list) - set(KINDS):
        parser.error(f"--kinds takes some of {', '.join(KINDS)}")
    args.only_labels = [label.strip() for label in args.only.split(",")] if args.only else None
    return args


@functools.cache
def sdxl_model(dtype):
    """SDXL base 1.0's modules from its configs (bench/flops.py), abstract weights in `dtype`; nothing downloaded."""
    import jax
    import jax.numpy as jnp
    from diffusers import FlaxAutoencoderKL, FlaxUNet2DConditionModel
    from transformers import CLIPTextConfig, FlaxCLIPTextModel, FlaxCLIPTextModelWithProjection

    from pipeline.device.modules import Modules

    from .flops import SDXL_TEXT_2_CONFIG, SDXL_TEXT_CONFIG, SDXL_UNET_CONFIG, SDXL_VAE_CONFIG

    dtype = jnp.dtype(dtype)
    unet = FlaxUNet2DConditionModel(**SDXL_UNET_CONFIG, split_head_dim=True, dtype=dtype)
    vae = FlaxAutoencoderKL(**SDXL_VAE_CONFIG, dtype=dtype)
    pairs = ((FlaxCLIPTextModel, SDXL_TEXT_CONFIG), (FlaxCLIPTextModelWithProjection, SDXL_TEXT_2_CONFIG))
    texts = [
        cls(CLIPTextConfig(vocab_size=49408, max_position_embeddings=77, **fields), dtype=dtype, _do_init=False)
        for cls, fields in pairs
    ]
    key = jax.random.PRNGKey(0)
    shapes = {
        "unet": jax.eval_shape(unet.init_weights, key),
        "vae": jax.eval_shape(vae.init_weights, key),
        "text_encoder": jax.eval_shape(lambda k: texts[0].init_weights(k, (1, 77)), key),
        "text_encoder_2": jax.eval_shape(lambda k: texts[1].init_weights(k, (1, 77)), key),
    }
    params = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype), shapes
    )
    modules = Modules(texts[0], texts[1], unet, vae, scheduler=None, vae_scale_factor=8)
    return modules, params


@functools.cache
def tiny_model(dtype):
    """The tiny checkpoint as the app loads it, and its weights' shapes (abstract: a topology's devices hold none)."""
    import jax

    from pipeline.checkpoint.loading import load_model

    loaded = load_model("tiny", dtype=dtype)
    return loaded, jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), loaded.params)


def served_programs(model: str, dtype: str, mesh, attention: str, per_device_batch: int = 1):
    """The served programs on `mesh`: the tiny checkpoint's built by the generator's own `build_programs` (its
    sampler config, prediction type and tokenizer length), SDXL's from its configs with abstract weights."""
    from pipeline.config import EngineConfig
    from pipeline.generator import build_programs, sampler_of
    from pipeline.host.programs import ServedPrograms

    if model == TINY:
        loaded, params = tiny_model(dtype)
        config = EngineConfig(model=TINY, dtype=dtype, per_device_batch=per_device_batch, attention=attention)
        return build_programs(loaded, config, params, mesh, sampler_of(loaded, config))
    modules, params = sdxl_model(dtype)
    return ServedPrograms(modules, params, mesh, per_device_batch=per_device_batch, attention=attention)


def jobs(args, sizes) -> list[tuple]:
    """(ProgramKey, attention or None) in the order they are compiled: per size, the steps (CFG first) per core,
    then decode and start; the encoders after the first size's."""
    from pipeline.host.programs import ProgramKey

    order = []
    for index, (height, width) in enumerate(sizes):
        if "step" in args.kind_list:
            order += [(ProgramKey("step", height, width, cfg), a) for cfg in args.cfgs for a in args.attentions]
        if "decode" in args.kind_list:
            order.append((ProgramKey("decode", height, width), None))
        if "start" in args.kind_list:
            order.append((ProgramKey("start", height, width), None))
        if index == 0 and "encode" in args.kind_list:
            order += [(ProgramKey("encode", cfg=cfg), None) for cfg in args.cfgs]
    if args.only_labels is not None:  # those, in the order given
        order = [(key, a) for key, a in order if key.label in args.only_labels]
        order.sort(key=lambda job: args.only_labels.index(job[0].label))
    return order


class _Fallbacks(logging.Handler):
    """Collects attention.py's fallback lines (which shapes a core hands to xla, and why) while a program traces."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def compile_one(programs, key, attention, topology, progress) -> dict:
    """Compile one program; its row of tpu.json."""
    from pipeline.device import attention as attention_core
    from pipeline.host.aot import HBM_PER_CHIP, compiled_cost

    device_kind = next(iter(programs.mesh.devices.flat)).device_kind
    handler = _Fallbacks()
    attention_core.reset_fallback_log()  # each program's own fallbacks, not only the first program's
    log = logging.getLogger(attention_core.__name__)
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)  # collected into the row (and counted in the progress line), not printed
    log.propagate = False
    started = time.perf_counter()
    try:
        lowered = programs.lower(key)
        lower_s = time.perf_counter() - started
        compiled = lowered.compile()
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
    compile_s = time.perf_counter() - started
    cost = compiled_cost(compiled)
    hbm = HBM_PER_CHIP.get(device_kind)
    row = {
        "program": key.label,
        "kind": key.kind,
        "topology": topology,
        "device_kind": device_kind,
        "chips": int(programs.mesh.devices.size),
        "images": programs.batch,
        "size": f"{key.width}x{key.height}" if key.height else None,
        "attention": attention,
        "cfg": key.cfg,
        "compile_s": round(compile_s, 1),
        "lower_s": round(lower_s, 1),
        "hbm_bytes": cost.hbm_bytes,
        "hbm_total_bytes": cost.hbm_total,
        "hbm_chip_bytes": hbm,
        "fits": None if hbm is None else cost.hbm_total <= hbm,
        "flops": cost.flops,
        "bytes_accessed": cost.bytes_accessed,
        "roofline_s": cost.roofline_s(device_kind),
        "fallbacks": handler.lines,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    roof = f"{row['roofline_s'] * 1e3:.2f} ms" if row["roofline_s"] is not None else "n/a"
    progress(f"tpu: {key.label} [{attention or '-'}] compiled in {compile_s:.0f} s: HBM {cost.hbm_total / 2**30:.2f} "
             f"GiB per chip, {cost.flops / 1e12:.3f} TFLOP, {cost.bytes_accessed / 1e9:.2f} GB, roofline {roof}"
             + (f"; {len(handler.lines)} fallback(s)" if handler.lines else ""))  # fmt: skip
    return row


def predictions(rows: list[dict], topology: str, size: str = "1024x1024") -> list[dict]:
    """Predicted device seconds per request on `topology` at `size`, per attention core, from the rooflines."""

    def find(kind, cfg=None, attention=None, at=size):
        for row in rows:
            wanted = (
                topology,
                kind,
                at or row["size"],
                row["cfg"] if cfg is None else cfg,
                attention or row["attention"],
            )
            if (row["topology"], row["kind"], row["size"], row["cfg"], row["attention"]) == wanted:
                return row
        return None

    out = []
    attentions = sorted({row["attention"] for row in rows if row["kind"] == "step" and row["topology"] == topology})
    for name, steps, cfg in REQUESTS:
        for attention in attentions:
            parts = {
                "encode": find("encode", cfg, at=None),
                "start": find("start"),
                "step": find("step", cfg, attention),
                "decode": find("decode"),
            }
            missing = [k for k, row in parts.items() if row is None or row["roofline_s"] is None and k != "start"]
            seconds = None
            if not missing:
                start = parts["start"]["roofline_s"] if parts["start"] else 0.0
                seconds = (parts["encode"]["roofline_s"] + start + steps * parts["step"]["roofline_s"]
                           + parts["decode"]["roofline_s"])  # fmt: skip
            images = parts["step"]["images"] if parts["step"] else None
            out.append({"request": name, "steps": steps, "cfg": cfg, "attention": attention, "topology": topology,
                        "size": size, "images": images, "predicted_s": seconds, "missing": missing})  # fmt: skip
    return out


def all_predictions(rows: list[dict], topology: str) -> list[dict]:
    """`predictions` at every size with a step program compiled for `topology`."""
    sizes = sorted({r["size"] for r in rows if r["kind"] == "step" and r["topology"] == topology})
    return [p for size in sizes for p in predictions(rows, topology, size)]


def table(rows: list[dict], requests: list[dict]) -> str:
    """The markdown table of programs and the predictions."""
    lines = [
        "| program | topology | attention | compile s | HBM/chip GiB (args + temp + out + code) | of chip | "
        "TFLOP | GB accessed | roofline ms |",
        "|---|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        hbm = row["hbm_bytes"]
        parts = " + ".join(f"{hbm[k] / 2**30:.2f}" for k in ("arguments", "temporaries", "outputs", "code"))
        share = f"{row['hbm_total_bytes'] / row['hbm_chip_bytes']:.0%}" if row.get("hbm_chip_bytes") else "n/a"
        roof = f"{row['roofline_s'] * 1e3:.2f}" if row["roofline_s"] is not None else "n/a"
        lines.append(f"| {row['program']} | {row['topology']} | {row['attention'] or '-'} | {row['compile_s']:.0f} | "
                     f"{row['hbm_total_bytes'] / 2**30:.2f} ({parts}) | {share} | {row['flops'] / 1e12:.3f} | "
                     f"{row['bytes_accessed'] / 1e9:.2f} | {roof} |")  # fmt: skip
    if requests:
        lines += ["", "| request (roofline, device only) | topology | size | attention | images | predicted s |",
                  "|---|---|---|---|---:|---:|"]  # fmt: skip
        for req in requests:
            value = f"{req['predicted_s']:.2f}" if req["predicted_s"] is not None else f"missing {req['missing']}"
            lines.append(f"| {req['request']} | {req['topology']} | {req['size']} | {req['attention']} | "
                         f"{req['images']} | {value} |")  # fmt: skip
    return "\n".join(lines)


def startup(runs: int, progress) -> dict:
    """Process start-up to the first image: cold (compiles everything, no cache) vs loading precompiled executables."""
    import json
    import subprocess
    import sys
    import tempfile

    from .common import Stats

    shape = ["--model", "tiny", "--height", "128", "--width", "128"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def run(*extra) -> dict:
        command = [sys.executable, "-m", "pipeline", *extra]
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - started
        return {"wall_s": wall, **(json.loads(done.stdout) if "--json" in extra else {})}

    with tempfile.TemporaryDirectory() as directory:
        progress("startup: precompile --topology cpu (tiny, 128x128) ...")
        built = run("precompile", "--topology", "cpu", *shape, "--out", directory)
        results: dict = {"precompile_s": built["wall_s"], "cold": [], "precompiled": []}
        for index in range(runs):
            for name, extra in (("cold", ()), ("precompiled", ("--precompiled", directory))):
                summary = run("generate", *shape, "--prompt", "a lighthouse", "--no-compilation-cache",
                              "--out", str(Path(directory) / "images"), "--json", *extra)  # fmt: skip
                timings = summary["timings"]
                row = {"wall_s": summary["wall_s"], "process_s": summary["process_s"], "compiles": summary["compiles"],
                       "compile_s": timings["compile_s"], "load_s": timings["load_s"],
                       "first_run_s": timings["first_run_s"]}  # fmt: skip
                results[name].append(row)
                progress(f"startup {index + 1}/{runs} {name}: process {row['wall_s']:.1f} s, compile "
                         f"{row['compile_s']:.1f} s, first run {row['first_run_s']:.1f} s, {row['compiles']} XLA "
                         f"compilations (loading the tiny model compiles a few small programs)")  # fmt: skip
    for name in ("cold", "precompiled"):
        results[f"{name}_wall_s"] = Stats.of([r["wall_s"] for r in results[name]])
        results[f"{name}_compile_s"] = Stats.of([r["compile_s"] for r in results[name]])
    return results


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.report:
        import json

        from .report import write_json

        path = Path(args.out) / "tpu.json"
        results = json.loads(path.read_text())
        rows = [r for r in results["programs"] if r.get("model") == args.model and r["topology"] == args.topology]
        results["requests"] = all_predictions(rows, args.topology)
        write_json(results, path)
        print(table(rows, results["requests"]))
        return 0
    if args.startup:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        from .common import machine_info, progress
        from .report import write_json

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        results = {"machine": machine_info(), "startup": startup(args.runs, progress)}
        path = write_json(results, out / "startup.json")
        st = results["startup"]
        progress(f"startup: cold {st['cold_wall_s'].median:.1f} s vs precompiled {st['precompiled_wall_s'].median:.1f}"
                 f" s to the first image (compile {st['cold_compile_s'].median:.1f} s vs "
                 f"{st['precompiled_compile_s'].median:.1f} s): {path}")  # fmt: skip
        return 0
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the topology API needs no TPU; skip the probe for one
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # other processes may hold libtpu too
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from pipeline.device.sharding import data_mesh
    from pipeline.host.aot import libtpu_available, topology_devices
    from pipeline.platform import quiet_start
    from pipeline.sizes import default_sizes, parse_sizes

    from .common import machine_info, progress
    from .report import write_json

    quiet_start()
    from pipeline.host.compilation import configure_compilation_cache

    configure_compilation_cache(False)  # a topology's compile-only client cannot use JAX's persistent cache
    if not libtpu_available():
        progress('tpu: libtpu is not installed: pip install "jax[tpu]==0.10.2" (requirements-dev.txt has it)')
        return 2
    sizes = parse_sizes(args.sizes) if args.sizes else default_sizes(tiny=args.model == TINY)
    devices = topology_devices(args.topology)
    progress(f"tpu: {args.topology}: {len(devices)} x {devices[0].device_kind}; model {args.model} ({args.dtype}), "
             f"sizes {', '.join(f'{w}x{h}' for h, w in sizes)}")  # fmt: skip
    mesh = data_mesh(devices)
    programs = {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tpu.json"
    rows: list[dict] = []
    if path.exists() and not args.fresh:
        import json

        rows = json.loads(path.read_text()).get("programs", [])
    todo = jobs(args, sizes)
    progress(f"tpu: {len(todo)} program(s) to compile: "
             + ", ".join(f"{k.label}" + (f" [{a}]" if a else "") for k, a in todo))  # fmt: skip
    for key, attention in todo:
        core = attention or args.attentions[0]
        if core not in programs:
            programs[core] = served_programs(args.model, args.dtype, mesh, core, args.per_device_batch)
        row = compile_one(programs[core], key, attention, args.topology, progress)
        row["model"] = args.model
        same = ("program", "topology", "attention", "model", "images")
        rows = [r for r in rows if any(r.get(k) != row[k] for k in same)] + [row]
        mine = [r for r in rows if r.get("model") == args.model]
        results = {"machine": machine_info(), "programs": rows, "requests": all_predictions(mine, args.topology)}
        write_json(results, path)  # after every program: a long run keeps what it measured
    requests = all_predictions([r for r in rows if r.get("model") == args.model], args.topology)
    print(table([r for r in rows if r.get("model") == args.model and r["topology"] == args.topology], requests))
    progress(f"done: {path}")
    return 0
