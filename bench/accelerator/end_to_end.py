"""`python -m bench accelerator`: the engine at full size on this host's accelerator, measured end to end.

    python -m bench accelerator                                   # GPU / TPU: SDXL-shaped weights, 1024², 25 steps
    python -m bench accelerator --parts engine,requests           # leave out the ControlNet and int8 parts
    python -m bench accelerator --model tiny --size 64 --steps 2 --runs 1 --parts engine,requests   # CPU smoke test
    python -m bench accelerator --parts engine --peer torch       # and diffusers' PyTorch pipeline, eager + compiled
    python -m bench accelerator --parts "" --peer torch           # the PyTorch pipeline alone (no reference venv)

What the CPU figures cannot say: how the engine does where the device is fast. The weights have SDXL base 1.0's
architectures (bench/accelerator/flops.py's configs; with `controlnet`, diffusers/controlnet-canny-sdxl-1.0's) and
random values made on the device: nothing is downloaded, and the time of a program does not depend on its weights'
values. The
tokenizers are the tiny checkpoint's, trained here from its corpus (their ids fall inside SDXL's vocabulary; a
prompt's length in tokens is all a program sees of it). Every local device, one image on each, as the app serves
(on one GPU: one image per request, per-chip figures).

Parts, in this order (each adds its figures to --out/accelerator.json as soon as it ends, so a run cut short keeps
what it measured):
- `engine`: the generator built as the app builds it (speed levers on, previews off, --prompt-windows as given),
  its start-up (every served program compiled), then diffusers' `FlaxStableDiffusionXLPipeline` (in the reference
  venv's worker process, with its own random weights of the same shapes; with --model tiny the same checkpoint),
  called as the SDXL-on-JAX blog calls it, interleaved with the engine (bench/cpu/reference.py): engine / diffusers,
  and each of the engine's programs' time per request (blocking on each). With `--peer torch`, then diffusers'
  PyTorch `StableDiffusionXLPipeline`, eager (SDPA) and `torch.compile`d, interleaved with the engine's same request
  (bench/accelerator/torch_peer.py; skipped in one line where `--torch-python` cannot import torch): `peer_torch`.
- `requests`: `Generator.generate` wall time per request kind: 25 steps exact, cfg_end 0.5, DeepCache 3, both, 4 steps
  without CFG (a Lightning-4 request's shape), MLPerf's 20 steps with CFG (images/s per chip).
- `controlnet`: the same generator serving one full-size ControlNet: a 25-step request with a control image, and the
  ControlNet step program's time beside the plain step's.
- `int8`: a second generator with `--quantize int8` (and the levers off): its step program and request time
  beside bf16's.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

SDXL = "sdxl"
TINY = "tiny"
PARTS = ("engine", "requests", "controlnet", "int8")
#: --warm-up: every served program at start-up (the app's), or only the programs the measured requests run.
WARM_UPS = ("all", "request")
PROMPT = "a photo of an astronaut riding a horse on the moon, highly detailed"
NEGATIVE = "blurry, low quality"
#: Request kinds the `requests` part times: (label, fields beyond prompt/negative/seed).
REQUESTS = (
    ("25 steps, CFG 5 (exact)", {"steps": 25, "guidance_scale": 5.0}),
    ("25 steps, cfg_end 0.5", {"steps": 25, "guidance_scale": 5.0, "cfg_end": 0.5}),
    ("25 steps, DeepCache 3", {"steps": 25, "guidance_scale": 5.0, "deepcache": 3}),
    ("25 steps, cfg_end 0.5 + DeepCache 3", {"steps": 25, "guidance_scale": 5.0, "cfg_end": 0.5, "deepcache": 3}),
    ("4 steps, no CFG (Lightning-4's shape)", {"steps": 4, "guidance_scale": 0.0}),
    ("20 steps, CFG 8 (MLPerf's request)", {"steps": 20, "guidance_scale": 8.0}),
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench accelerator",
        description="The engine at full size on this host's accelerator: start-up, engine vs diffusers, requests.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--model", choices=(SDXL, TINY), default=SDXL, help="SDXL's architectures (default) or the tiny checkpoint's")
    add("--size", type=int, default=1024, help="image side in pixels (default 1024)")
    add("--steps", type=int, default=25, help="steps of the engine-vs-diffusers calls (default 25)")
    add("--runs", type=int, default=3, help="timed calls per figure (default 3)")
    add(
        "--parts",
        default=",".join(PARTS),
        help=f'some of {",".join(PARTS)} (default all, in that order); none ("") with --peer torch: the peer alone',
    )
    add("--attention", default="auto", help="the engine's attention core (default auto: cudnn on GPU, splash on TPU)")
    add("--prompt-windows", type=int, default=1, help="77-token windows compiled (default 1: fewer programs)")
    add("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bfloat16, float32 on CPU")
    add("--out", default="bench-results", help="directory of accelerator.json (default bench-results/)")
    add("--cpu-devices", type=int, default=0, help="virtual CPU devices when XLA_FLAGS is unset (default 0)")
    add("--peer", choices=("torch",), default=None, help="also time diffusers' PyTorch pipeline (eager, compiled)")
    add(
        "--warm-up",
        choices=WARM_UPS,
        default="all",
        help="all: every served program compiled and run at start-up, "
        "as the app does (default); request: only what the measured requests run, compiled by their untimed first "
        "calls (a shorter GPU run: python -m bench gpu)",
    )
    add("--torch-python", default=sys.executable, help="the python of the PyTorch pipeline's worker (default: this)")
    args = parser.parse_args(argv)
    args.part_list = [p.strip() for p in args.parts.split(",") if p.strip()]
    if set(args.part_list) - set(PARTS) or not (args.part_list or args.peer):
        parser.error(f"--parts takes some of {', '.join(PARTS)} (none only with --peer)")
    if args.size % 64 or args.size < 64 or min(args.steps, args.runs) < 1:
        parser.error("--size must be a multiple of 64; --steps and --runs at least 1")
    return args


def random_like(shapes, dtype, seed: int = 0):
    """Random arrays of the shapes of `shapes` (a tree of ShapeDtypeStructs), made on the default device in `dtype`.

    Kernels and embeddings ~ N(0, 1/fan_in), biases 0, norm scales 1, so activations keep a sane size through a
    network of billions of parameters. One small program per distinct shape (the standard deviation is an argument):
    a few hundred for SDXL, where compiling diffusers' whole `init_weights` would take minutes.
    """
    import jax
    import jax.numpy as jnp

    @functools.partial(jax.jit, static_argnums=(1,))
    def normal(key, shape, std):
        return (jax.random.normal(key, shape, jnp.float32) * std).astype(dtype)

    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    made = []
    for index, (path, leaf) in enumerate(leaves):
        name = str(getattr(path[-1], "key", ""))
        if name == "bias":
            made.append(jnp.zeros(leaf.shape, dtype))
        elif name == "scale":
            made.append(jnp.ones(leaf.shape, dtype))
        else:
            fan_in = math.prod(leaf.shape[:-1]) or 1
            key = jax.random.fold_in(jax.random.PRNGKey(seed), index)
            made.append(normal(key, tuple(leaf.shape), jnp.float32(fan_in**-0.5)))
    return jax.block_until_ready(jax.tree_util.tree_unflatten(treedef, made))


def full_size_model(model: str, dtype: str):
    """A `LoadedModel` with SDXL's architectures (or the tiny checkpoint's) and random weights on the device, and
    the tiny checkpoint's tokenizers and scheduler config (SDXL's Euler)."""
    import dataclasses

    import jax

    from ..engine import LoadedModel, load_model

    started = time.perf_counter()
    loaded = load_model("tiny", dtype=dtype)
    if model == TINY:
        return LoadedModel(loaded.networks, jax.device_put(loaded.params), loaded.source, loaded.load_s, 0.0)
    from ..tpu.programs import sdxl_model

    modules, shapes = sdxl_model(dtype)
    networks = dataclasses.replace(
        loaded.networks,
        unet=modules.unet,
        vae=modules.vae,
        text_encoder=modules.text_encoder,
        text_encoder_2=modules.text_encoder_2,
    )
    params = {name: random_like(tree, dtype, seed) for seed, (name, tree) in enumerate(sorted(shapes.items()))}
    return LoadedModel(networks, params, "random SDXL-shaped weights", time.perf_counter() - started, 0.0)


def full_size_controlnet(model: str, dtype: str, loaded):
    """One ControlNet with random weights: diffusers/controlnet-canny-sdxl-1.0's architecture (the tiny UNet's
    `from_unet` shape with --model tiny)."""
    from ..engine import ControlNetWeights, controlnet_module, shape_params
    from ..tpu.programs import CONTROLNET_CONFIG

    started = time.perf_counter()
    config = json.loads(CONTROLNET_CONFIG.read_text()) if model == SDXL else loaded.networks.unet_config
    module = controlnet_module(config, dtype)
    params = random_like(shape_params(module), dtype, seed=7)
    size = sum(leaf.nbytes for leaf in _leaves(params))
    return ControlNetWeights("canny", module, params, "random", size, time.perf_counter() - started, False)


def _leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def engine(loaded, args, dtype: str, nets=(), **settings):
    """A generator over `loaded` as the app builds one, warmed up: (generator, its warm-up timings). The executable
    store is off: a program JAX's cache already holds would be compiled a second time to be stored. With
    `--warm-up request` nothing is compiled here (timings {}): each request's untimed first call compiles its own.
    The text cache is off: every timed call repeats one text, which the peers encode every call, and so does the
    engine here (the same work per call; a served engine encodes a repeated text once: host/text_cache.py)."""
    from ..engine import EngineConfig, Generator, prepare

    config = EngineConfig(
        model=loaded.source,
        height=args.size,
        width=args.size,
        steps=args.steps,
        dtype=dtype,
        attention=args.attention,
        prompt_windows=args.prompt_windows,
        previews=False,
        executable_cache=False,
        text_cache=0,
        **settings,
    )
    config = prepare(config)  # as Generator.load does before it loads a checkpoint
    generator = Generator(loaded, config, None, list(nets))  # every local device, as diffusers' pmap uses them
    return generator, generator.warmup() if args.warm_up == "all" else {}


def time_requests(generator, requests, runs: int, say) -> list[dict]:
    """Median wall seconds of `runs` calls of each request (after one untimed call), and its programs' times."""
    from ..common import Stats, timed
    from ..cpu.program_times import ProgramTimer

    rows = []
    for label, fields in requests:
        request = generator.request(PROMPT, negative_prompt=NEGATIVE, seed=0, **fields)
        generator.generate(request)
        seconds = [timed(lambda request=request: generator.generate(request))[0] for _ in range(runs)]
        with ProgramTimer(generator.programs, block=True) as timer:
            generator.generate(request)
        stats = Stats.of(seconds)
        rows.append(
            {
                "request": label,
                "fields": {k: v for k, v in fields.items() if k != "controlnets"},
                "seconds": seconds,
                "median_s": stats.median,
                "images_per_s": generator.num_images / stats.median,
                "programs_ms": {k: v * 1e3 for k, v in timer.per_program().items()},
            }
        )
        say(
            f"  {label}: {stats.median:.3f} s per request ({', '.join(f'{s:.3f}' for s in seconds)}); programs "
            + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in timer.per_program().items())
        )
    return rows


def control_request(generator, size: int) -> tuple:
    """The `controlnet` part's request: 25 steps with CFG and one canny map (a drawn square) at weight 1."""
    import numpy as np
    from PIL import Image

    pixels = np.zeros((size, size, 3), np.uint8)
    pixels[size // 4 : 3 * size // 4, size // 4 : 3 * size // 4] = 255
    unit = {"name": "canny", "image": Image.fromarray(pixels), "weight": 1.0, "preprocessor": "canny"}
    return ("25 steps, CFG 5, one ControlNet (canny)", {"steps": 25, "guidance_scale": 5.0, "controlnets": [unit]})


def main(argv: list[str]) -> int:
    from ..common import configure_platform

    args = parse_args(argv)
    if args.peer == "torch":  # JAX takes only what it uses, so the PyTorch worker finds room on the same GPU
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    configure_platform(args.cpu_devices)
    import jax

    from ..common import machine_info, progress
    from ..report.outputs import write_json

    device = jax.devices()[0]
    dtype = args.dtype or ("float32" if device.platform == "cpu" else "bfloat16")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "device_kind": device.device_kind,
        "jax": jax.__version__,
        "model": args.model,
        "size": args.size,
        "steps": args.steps,
        "dtype": dtype,
        "attention": args.attention,
        "prompt_windows": args.prompt_windows,
    }

    def save(part: str, value) -> None:
        results[part] = value
        write_json(results, out / "accelerator.json")

    def attempt(part: str, measure) -> None:
        """One part; a part that fails is recorded with its error and the next one runs (a device lease is short)."""
        try:
            save(part, measure())
        except Exception as exc:  # the bench's own report: what broke, then the remaining parts
            progress(f"accelerator: {part} failed: {type(exc).__name__}: {exc}")
            save(part, {"error": f"{type(exc).__name__}: {exc}"})

    progress(f"accelerator: {args.model} at {args.size}² on {device.device_kind} ({dtype}); making weights ...")
    loaded = full_size_model(args.model, dtype)
    count = sum(leaf.size for leaf in _leaves(loaded.params))
    progress(f"accelerator: {count / 1e9:.2f} B parameters made in {loaded.load_s:.1f} s")
    nets = [full_size_controlnet(args.model, dtype, loaded)] if "controlnet" in args.part_list else []
    generator, warmup = engine(loaded, args, dtype, nets)
    if warmup:
        progress(
            f"accelerator: engine warm in {warmup['compile_s'] + warmup['first_run_s']:.1f} s "
            f"({generator.startup_programs.summary()})"
        )
        save("startup", {**warmup, "programs": [key.label for key in generator.program_keys()]})
    else:
        progress("accelerator: --warm-up request: each request's first, untimed call compiles its programs")
    if "engine" in args.part_list:
        attempt("engine_vs_diffusers", lambda: _compare(generator, loaded, args, dtype, progress))
    if args.peer == "torch":
        _peer_torch(generator, loaded, args, dtype, attempt, save)
    if "requests" in args.part_list:
        attempt("requests", lambda: time_requests(generator, REQUESTS, args.runs, progress))
    if nets:
        control = [control_request(generator, args.size)]
        attempt("controlnet", lambda: time_requests(generator, control, args.runs, progress))
    if "int8" in args.part_list:
        del generator
        attempt("int8", lambda: _int8(loaded, args, dtype, progress))
    progress(f"done: {out / 'accelerator.json'}")
    return 0


def _compare(generator, loaded, args, dtype: str, say) -> dict:
    """Engine vs diffusers' pipeline (in the reference venv's worker), replicated as the blog does it: SDXL's shapes
    with the worker's own random weights, or (`--model tiny`) the tiny checkpoint, the same weights."""
    from ..cpu.reference import engine_vs_reference, sdxl_reference
    from ..engine import resolve_model

    # The worker makes its own random weights of the same shapes; the tokenizers are the tiny checkpoint's (as here).
    reference = None if args.model == TINY else sdxl_reference(loaded.networks, dtype, Path(resolve_model(TINY)))
    compared = engine_vs_reference(generator, args.runs, say, reference=reference)
    say(
        f"accelerator: engine {compared.engine.median:.3f} s, diffusers {compared.reference.median:.3f} s per "
        f"request: engine / diffusers = {compared.ratio:.3f}"
    )
    return _plain(compared)


def _peer_torch(generator, loaded, args, dtype: str, attempt, save) -> None:
    """`peer_torch`: the engine against diffusers' PyTorch pipeline, or one line saying why it was skipped."""
    from ..common import progress
    from ..engine import resolve_model
    from .torch_peer import engine_vs_torch, torch_missing, torch_spec

    missing = torch_missing(args.torch_python)
    if missing:
        progress(f"accelerator: --peer torch skipped: {missing}")
        save("peer_torch", {"skipped": missing})
        return
    spec = torch_spec(args.model, dtype, Path(resolve_model(TINY)), loaded.networks.scheduler_config)
    attempt("peer_torch", lambda: engine_vs_torch(generator, spec, args.torch_python, args.runs, progress))


def _int8(loaded, args, dtype: str, say) -> dict:
    """A `--quantize int8` generator (levers off: one step program) and its exact request."""
    int8, warmup = engine(loaded, args, dtype, quantize="int8", speed_levers=False)
    return {"startup": warmup, "requests": time_requests(int8, REQUESTS[:1], args.runs, say)}


def _plain(value):
    """A dataclass of Stats and numbers as JSON-ready dicts."""
    import dataclasses

    return json.loads(json.dumps(dataclasses.asdict(value), default=str))
