"""diffusers' PyTorch `StableDiffusionXLPipeline` in a process of its own, eager and compiled; `python -m bench
accelerator --peer torch` times the engine against it (bench/accelerator/torch_peer.py).

Run as a file by a python that has torch, diffusers and transformers (`--torch-python`, default the bench's own):
`python bench/accelerator/torch_worker.py`. Standalone on purpose: it imports torch, diffusers and transformers only
(never `pipeline`, `bench` or jax), so torch stays out of everything the app and CI import.

The networks: diffusers' `UNet2DConditionModel` and `AutoencoderKL`, transformers' `CLIPTextModel` and
`CLIPTextModelWithProjection`, built from the configs the load request gives (SDXL base 1.0's, or the tiny
checkpoint's config.json files) with PyTorch's own random init, made on the device and cast to the engine's dtype:
nothing is downloaded, and a program's time does not depend on its weights' values. The tokenizers are the tiny
checkpoint's (as the engine's: its ids fall inside SDXL's vocabulary, and a prompt's length in tokens is all a
program sees of it); the prompts go in as text, so each call tokenizes and encodes as a user's call does. The
scheduler is diffusers' `EulerDiscreteScheduler` from the engine's scheduler config.

Two pipelines of their own weights, one per mode, so the modes can be interleaved:
- `eager`: diffusers' default attention processor (`AttnProcessor2_0`: PyTorch's SDPA), nothing else changed.
- `compile`: as diffusers' "speed up inference" docs do: `fuse_qkv_projections()`, the UNet and the VAE in
  channels_last, `torch.compile(unet, mode="default", fullgraph=True)` and `vae.decode = torch.compile(vae.decode)`.
  The compile happens in the first call (the parent makes its warm-up calls untimed).

JSON lines: stdin takes requests, stdout gives one answer to each (anything the libraries print goes to stderr).
- `{"load": {"dtype": D, "modes": [...], "unet": {...}, "vae": {...}, "text_encoder": {...}, "text_encoder_2":
  {...}, "tokenizer": DIR, "tokenizer_2": DIR, "scheduler_config": {...}}}`. Answer: `{"load_s": S, "devices": 1,
  "device": NAME, "packages": {name: version}}`.
- `{"call": {"mode", "prompt", "negative_prompt", "seed", "guidance_scale", "steps", "height", "width"}}`: one
  user-visible call, one PIL image out. Answer: `{"images": 1, "wall_s": S, "cpu_s": S}` (wall seconds between two
  device synchronisations, and this process's CPU seconds).
- A failed request is answered `{"error": "Type: message"}`; after a failed load the worker exits. It exits when
  stdin closes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from importlib import metadata

#: Packages whose versions the load's answer reports.
PACKAGES = ("torch", "diffusers", "transformers", "numpy", "pillow")
MODES = ("eager", "compile")


def device_and_dtype(dtype: str):
    """CUDA when torch sees a GPU, else the CPU; the engine's dtype name as torch's."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu"), getattr(torch, dtype)


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_pipeline(spec: dict, device, dtype, seed: int):
    """diffusers' SDXL pipeline with the architectures `spec` gives and random weights (the module docstring)."""
    import inspect

    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    torch.manual_seed(seed)
    with torch.device(device):  # parameters made and initialised on the device: no host copy of 2.6 B of them
        texts = [
            cls(
                CLIPTextConfig(**{"vocab_size": 49408, "max_position_embeddings": 77, "eos_token_id": 2, **spec[name]})
            )  # eos 2: as SDXL's config.json files say (the tiny's own wins)
            for cls, name in ((CLIPTextModel, "text_encoder"), (CLIPTextModelWithProjection, "text_encoder_2"))
        ]
        unet = UNet2DConditionModel.from_config(_known(UNet2DConditionModel, spec["unet"]))
        vae = AutoencoderKL.from_config(_known(AutoencoderKL, spec["vae"]))
    accepted = inspect.signature(EulerDiscreteScheduler).parameters
    scheduler = EulerDiscreteScheduler(**{k: v for k, v in spec["scheduler_config"].items() if k in accepted})
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=texts[0],
        text_encoder_2=texts[1],
        unet=unet,
        scheduler=scheduler,
        tokenizer=CLIPTokenizer.from_pretrained(spec["tokenizer"]),
        tokenizer_2=CLIPTokenizer.from_pretrained(spec["tokenizer_2"]),
    )
    pipe.to(device=device, dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _known(cls, config: dict) -> dict:
    """`config` without the Flax-only fields (split_head_dim, use_memory_efficient_attention, ...) and with lists
    for tuples (the JSON request gives lists already)."""
    import inspect

    accepted = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in config.items() if k in accepted}


def compile_pipeline(pipe) -> None:
    """diffusers' "speed up inference" recipe: fused QKV, channels_last, the UNet and the VAE's decode compiled."""
    import torch

    pipe.fuse_qkv_projections()
    pipe.unet.to(memory_format=torch.channels_last)
    pipe.vae.to(memory_format=torch.channels_last)
    pipe.unet = torch.compile(pipe.unet, mode="default", fullgraph=True)
    pipe.vae.decode = torch.compile(pipe.vae.decode)


def load(spec: dict) -> dict:
    """One pipeline per mode in `spec["modes"]`, each with its own weights."""
    import torch

    device, dtype = device_and_dtype(spec["dtype"])
    if device.type == "cpu":  # as XLA:CPU runs the engine (flush to zero): random weights make slow subnormals
        torch.set_flush_denormal(True)
    modes = list(spec.get("modes", MODES))
    if set(modes) - set(MODES) or not modes:
        raise ValueError(f"modes must be some of {', '.join(MODES)}; got {modes}")
    pipes = {}
    with torch.no_grad():  # the fused projections' new parameters need no graph
        for seed, mode in enumerate(modes):
            pipes[mode] = build_pipeline(spec, device, dtype, seed)
            if mode == "compile":
                compile_pipeline(pipes[mode])
    return pipes


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def call(pipes: dict, request: dict) -> dict:
    import torch

    pipe = pipes[request["mode"]]
    device = pipe.unet.device
    generator = torch.Generator(device).manual_seed(request["seed"])
    synchronize(device)
    cpu = time.process_time()
    started = time.perf_counter()
    with torch.inference_mode():
        images = pipe(
            prompt=request["prompt"],
            negative_prompt=request["negative_prompt"],
            num_inference_steps=request["steps"],
            guidance_scale=request["guidance_scale"],
            height=request["height"],
            width=request["width"],
            generator=generator,
            num_images_per_prompt=1,
            output_type="pil",
        ).images
    synchronize(device)
    return {"images": len(images), "wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu}


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

    pipes = None
    for line in requests:
        if not line.strip():
            continue
        message = json.loads(line)
        try:
            if "load" in message:
                started = time.perf_counter()
                pipes = load(message["load"])
                answer(
                    {
                        "load_s": time.perf_counter() - started,
                        "devices": 1,
                        "device": device_name(),
                        "packages": package_versions(),
                    }
                )
            elif "call" in message and pipes is not None:
                answer(call(pipes, message["call"]))
            else:
                answer({"error": f"ValueError: expected a load, then calls; got {sorted(message)}"})
        except Exception as exc:  # the parent reports it in one sentence and ends this process
            lines = str(exc).strip().splitlines()  # the first line: the sentence; the rest is advice or detail
            answer({"error": f"{type(exc).__name__}: {lines[0] if lines else 'no message'}"})
            if pipes is None:
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
