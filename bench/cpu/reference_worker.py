"""diffusers' own FlaxStableDiffusionXLPipeline in a process of its own, called as Hugging Face's SDXL-on-JAX blog
calls it; bench/cpu/reference.py times the engine against it.

Run by bench/cpu/reference.py with the reference venv's python (bench/reference_venv.py), as a file:
`.venv-reference/bin/python bench/cpu/reference_worker.py`. Standalone on purpose: it imports jax, flax, numpy, PIL,
diffusers and transformers only (never `pipeline` or `bench`), the libraries that venv has. bench/cpu/reference.py
imports its `thread_cpu_seconds` (stdlib only) to split the engine's CPU seconds the same way.

JSON lines: stdin takes requests, stdout gives one answer to each (anything the libraries print goes to stderr).
- `{"load": {"mode": "checkpoint", "path": DIR, "dtype": D}}`: the pipeline from a Flax checkpoint folder.
- `{"load": {"mode": "sdxl", "dtype": D, "unet": {...}, "vae": {...}, "text_encoder": {...}, "text_encoder_2":
  {...}, "tokenizer": DIR, "tokenizer_2": DIR, "scheduler_config": {...}}}`: SDXL's architectures from these configs
  with random weights made here (N(0, 1/fan_in), biases 0, norm scales 1; a program's time does not depend on its
  weights' values), the tokenizers from those folders, the Euler scheduler from that config.
  Either way the params are cast as the blog casts them (bf16 except the scheduler's state, or all f32) and
  replicated once. Answer: `{"load_s": S, "devices": N, "packages": {name: version}}`.
- `{"call": {"prompt", "negative_prompt", "seed", "guidance_scale", "steps", "height", "width"}}` (and optionally
  `"save": PATH`: the pipeline's float pixels [N, H, W, 3] saved there with numpy, for a test): one user-visible
  call, PIL images out.
  Answer: `{"images": N, "wall_s": S, "host_s": S, "cpu_s": S, "threads": {GROUP: S}}`: the call's wall seconds,
  the part of them outside the pipeline (inputs before, PIL after), this process's CPU seconds during the call and
  those CPU seconds by thread group (`thread_cpu_seconds`; {} off Linux).
- A failed request is answered `{"error": "Type: message"}`; after a failed load the worker exits. It exits when
  stdin closes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from importlib import metadata

#: Packages whose versions the load's answer reports (the bench records them beside the main venv's).
PACKAGES = ("jax", "jaxlib", "flax", "diffusers", "transformers", "huggingface-hub", "numpy", "pillow")


#: How `thread_cpu_seconds` names its groups: the thread that called (Python's main thread), XLA:CPU's intra-op
#: pool (its threads are named tf_XLAEigen), and every other thread (unnamed ones are the runtime's, e.g. PjRt's
#: per-device execution threads, which inherit the process's name).
THREAD_GROUPS = ("main", "XLA Eigen pool", "other")


def thread_cpu_seconds() -> dict[str, float]:
    """This process's CPU seconds so far by thread group (`THREAD_GROUPS`), from /proc/self/task: where a call's CPU
    seconds go, subtracted before and after it. The engine's bench side reads it too (bench/cpu/reference.py). Threads
    that ended are gone from /proc, so short-lived ones are missed; {} where /proc has no tasks (not Linux)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    groups = dict.fromkeys(THREAD_GROUPS, 0.0)
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return {}
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat, open(f"/proc/self/task/{tid}/comm") as comm:
                fields, name = stat.read().rsplit(")", 1)[1].split(), comm.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        seconds = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        group = "main" if int(tid) == os.getpid() else "XLA Eigen pool" if name.startswith("tf_XLAEigen") else "other"
        groups[group] += seconds
    return groups


class _FlaxDeprecationFilter(logging.Filter):
    """Drops diffusers' and transformers' "Flax classes are deprecated" notice: the reference is their last Flax
    release on purpose (requirements-reference.txt says why)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "classes are deprecated and will be removed" not in record.getMessage()


def quiet_flax_deprecation() -> None:
    """The notice once per class would fill the bench's output."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_propagation()  # under CI=true transformers also propagates to the root logger
    transformers_logging.disable_propagation()
    for name, library in (("diffusers", diffusers_logging), ("transformers", transformers_logging)):
        for handler in library.get_logger(name).handlers:
            if not any(isinstance(f, _FlaxDeprecationFilter) for f in handler.filters):
                handler.addFilter(_FlaxDeprecationFilter())


def cast(params: dict, dtype: str) -> dict:
    """The blog's cast: bf16 except the scheduler's state; float32 as loaded."""
    import jax
    import jax.numpy as jnp

    if dtype != "bfloat16":
        return params
    scheduler_state = params.pop("scheduler")
    params = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
    params["scheduler"] = scheduler_state
    return params


def load_checkpoint(path: str, dtype: str):
    """diffusers' pipeline and params from a Flax checkpoint folder."""
    import jax.numpy as jnp
    from diffusers import FlaxStableDiffusionXLPipeline

    pipe, params = FlaxStableDiffusionXLPipeline.from_pretrained(path, split_head_dim=True, dtype=getattr(jnp, dtype))
    return pipe, cast(params, dtype)


def random_like(shapes, dtype, seed: int):
    """Random arrays of the shapes of `shapes` (ShapeDtypeStructs) in `dtype`: kernels and embeddings
    N(0, 1/fan_in), biases 0, norm scales 1, so activations keep a sane size; one small program per shape."""
    import functools

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
            key = jax.random.fold_in(jax.random.PRNGKey(seed), index)
            made.append(normal(key, tuple(leaf.shape), jnp.float32((math.prod(leaf.shape[:-1]) or 1) ** -0.5)))
    return jax.tree_util.tree_unflatten(treedef, made)


def load_sdxl(spec: dict):
    """diffusers' pipeline with the architectures `spec` gives and random weights (see the module docstring)."""
    import inspect

    import jax
    import jax.numpy as jnp
    from diffusers import (
        FlaxAutoencoderKL,
        FlaxEulerDiscreteScheduler,
        FlaxStableDiffusionXLPipeline,
        FlaxUNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTokenizer, FlaxCLIPTextModel, FlaxCLIPTextModelWithProjection

    compute = getattr(jnp, spec["dtype"])
    texts = [
        cls(
            CLIPTextConfig(**{"vocab_size": 49408, "max_position_embeddings": 77, "eos_token_id": 2, **spec[name]}),
            dtype=compute,
            _do_init=False,
        )  # eos 2: as SDXL's config.json files say
        for cls, name in ((FlaxCLIPTextModel, "text_encoder"), (FlaxCLIPTextModelWithProjection, "text_encoder_2"))
    ]
    accepted = inspect.signature(FlaxEulerDiscreteScheduler).parameters
    scheduler = FlaxEulerDiscreteScheduler(**{k: v for k, v in spec["scheduler_config"].items() if k in accepted})
    unet = FlaxUNet2DConditionModel(**{**spec["unet"], "split_head_dim": True}, dtype=compute)
    vae = FlaxAutoencoderKL(**spec["vae"], dtype=compute)
    pipe = FlaxStableDiffusionXLPipeline(
        text_encoder=texts[0],
        text_encoder_2=texts[1],
        vae=vae,
        unet=unet,
        scheduler=scheduler,
        tokenizer=CLIPTokenizer.from_pretrained(spec["tokenizer"]),
        tokenizer_2=CLIPTokenizer.from_pretrained(spec["tokenizer_2"]),
    )
    key = jax.random.PRNGKey(0)
    shapes = {
        "text_encoder": jax.eval_shape(lambda: texts[0].init_weights(key, (1, 77))),
        "text_encoder_2": jax.eval_shape(lambda: texts[1].init_weights(key, (1, 77))),
        "unet": jax.eval_shape(lambda: unet.init_weights(key)),
        "vae": jax.eval_shape(lambda: vae.init_weights(key)),
    }
    params = {name: random_like(tree, compute, seed) for seed, (name, tree) in enumerate(sorted(shapes.items()))}
    return pipe, {**params, "scheduler": scheduler.create_state()}  # the scheduler state in float32


def reference_call(pipe, p_params, *, prompt, negative_prompt, seed, guidance_scale, steps, height, width):
    """One user-visible call, exactly as the SDXL-on-JAX blog writes it: (PIL images, seconds outside the pipeline
    call: the inputs before, PIL after, the pipeline's float pixels [N, H, W, 3])."""
    import jax
    import numpy as np
    from flax.jax_utils import replicate

    started = time.perf_counter()
    prompt_ids = replicate(pipe.prepare_inputs(prompt))
    neg_prompt_ids = replicate(pipe.prepare_inputs(negative_prompt))
    rng = jax.random.split(jax.random.PRNGKey(seed), jax.device_count())
    prepared = time.perf_counter()
    images = pipe(
        prompt_ids,
        p_params,
        rng,
        num_inference_steps=steps,
        height=height,
        width=width,
        guidance_scale=guidance_scale,
        neg_prompt_ids=neg_prompt_ids,
        jit=True,
    ).images
    images = images.reshape((images.shape[0] * images.shape[1],) + images.shape[-3:])
    pixels = np.array(images)
    converted = time.perf_counter()
    pil_images = pipe.numpy_to_pil(pixels)
    return pil_images, (prepared - started) + (time.perf_counter() - converted), pixels


def call(pipe, p_params, request: dict) -> dict:
    import numpy as np

    save = request.pop("save", None)
    threads = thread_cpu_seconds()
    cpu = time.process_time()
    started = time.perf_counter()
    images, host_s, pixels = reference_call(pipe, p_params, **request)
    wall_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu
    threads = {group: seconds - threads[group] for group, seconds in thread_cpu_seconds().items()}
    if save:
        np.save(save, pixels)
    return {"images": len(images), "wall_s": wall_s, "host_s": host_s, "cpu_s": cpu_s, "threads": threads}


def load(spec: dict):
    import jax
    import numpy as np
    from flax.jax_utils import replicate

    quiet_flax_deprecation()
    if spec["mode"] == "checkpoint":
        pipe, params = load_checkpoint(spec["path"], spec["dtype"])
    elif spec["mode"] == "sdxl":
        pipe, params = load_sdxl(spec)
    else:
        raise ValueError(f"unknown mode {spec['mode']!r}")
    if jax.default_backend() == "cpu":  # flax's replicate stacks a device array with a program per shape (125 for the
        # tiny model: 13 s of the worker's 20 s load), a host array with NumPy: the same arrays, placed the same way
        params = jax.tree_util.tree_map(np.asarray, params)
    return pipe, replicate(params), jax.device_count()


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def serve(requests, answers) -> int:
    """Answer `requests` (lines) on `answers` until they end: the load first, then calls."""

    def answer(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    pipe = p_params = None
    for line in requests:
        if not line.strip():
            continue
        message = json.loads(line)
        try:
            if "load" in message:
                started = time.perf_counter()
                pipe, p_params, devices = load(message["load"])
                answer({"load_s": time.perf_counter() - started, "devices": devices, "packages": package_versions()})
            elif "call" in message and pipe is not None:
                answer(call(pipe, p_params, message["call"]))
            else:
                answer({"error": f"ValueError: expected a load, then calls; got {sorted(message)}"})
        except Exception as exc:  # the parent reports it in one sentence and ends this process
            lines = str(exc).strip().splitlines()  # the first line: the sentence; the rest is advice or detail
            answer({"error": f"{type(exc).__name__}: {lines[0] if lines else 'no message'}"})
            if pipe is None:
                return 1
    return 0


def main() -> int:
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run as a file, its folder (bench/) led the path: no bench module may shadow a library's
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")  # the answers' own channel
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # whatever the libraries print goes to stderr
    return serve(sys.stdin, answers)


if __name__ == "__main__":
    sys.exit(main())
