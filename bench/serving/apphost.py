"""Part `apphost`: the app's own time per request at 1024² (8 images, 3 steps) through gradio_client, with and
without live previews: the client's wall time minus the engine's time of that very call (its status line's figure).

    python -m bench --only apphost --runs 7

The app is the real one (web.page.layout.build_page with the app's default history: browsers keep their own) around the
real generator's rules, sizes and result type; only the device work stands in: `DeviceTimeEngine` sleeps a fixed
device time per step (as a TPU's steps, which leave the host's cores free) and returns photo-like 1024² pixels
(bench/serving/fullsize.synthetic_pixels with grain: ~660 KiB JPEGs, as the tiny checkpoint's noisy images make), with a
preview every 2 steps as host/loop.py makes them. The tiny checkpoint
itself at 1024² costs minutes per image on 2 CPU cores, so the real device work would drown the host's few hundred
milliseconds in its own spread, and compete with them for the same cores where a TPU would not.

Each round calls, in turn, /generate (previews streamed), /generate with previews=False and /generate_png, every
image fetched as a script with `download_files` gets them (gradio_client fetches each file of each streamed message
one by one, previews included, and a streamed answer's twice: once streamed, once as the result), and the two
/generate calls again from a client that fetches nothing (`download_files=False`): the server's part alone.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, fields

import numpy as np

from ..common import Progress, Stats, progress, timed
from .fullsize import synthetic_pixels

PROMPT = "a lighthouse on a cliff at dawn, dramatic sky"
SIZE = 1024
IMAGES = 8
STEPS = 3
#: Device seconds per step the stand-in sleeps (an SDXL CFG step on a v5e-8 is ~0.1 s).
DEVICE_STEP_S = 0.1
#: Grain (standard deviation, levels) over the photo-like pixels: the gallery's JPEGs come out ~660 KiB each, as the
#: tiny checkpoint's 1024² images do (issue 35 measured 674 KiB).
GRAIN = 34
#: The ways an API caller can ask: label -> (endpoint, extra API arguments, whether the client fetches the images).
CALLS = {
    "previews": ("/generate", {"previews": True}, True),
    "no previews": ("/generate", {"previews": False}, True),
    "previews, nothing fetched": ("/generate", {"previews": True}, False),
    "no previews, nothing fetched": ("/generate", {"previews": False}, False),
    "png": ("/generate_png", {}, True),
}


class DeviceTimeEngine:
    """The real generator for everything the page reads (rules, sizes, config); its device work stood in for by
    `DEVICE_STEP_S` per step and synthetic pixels, its result built as `Generator.generate` builds it."""

    def __init__(self, generator, images: np.ndarray):
        self._generator = generator
        self._images = images  # uint8 [B, H, W, 3]
        scale = generator.programs.modules.vae_scale_factor
        self._previews = np.ascontiguousarray(images[:, ::scale, ::scale])  # [B, h, w, 3]: what a preview brings
        self.engine_s: list[float] = []  # each call's total_s, as the status line shows it

    def __getattr__(self, name: str):
        return getattr(self._generator, name)

    def generate(self, request, on_step=None, should_stop=None, gate=None, on_preview=None):
        from ..engine import GenerationResult, describe
        from ..engine import image_files as image_io

        started = time.perf_counter()
        for step in range(1, request.steps + 1):
            time.sleep(DEVICE_STEP_S)
            if on_step is not None:
                on_step(step, request.steps)
            if on_preview is not None and step % 2 == 0 and step < request.steps:
                on_preview(step, request.steps, self._previews)
        seeds = [request.seed + i for i in range(len(self._images))]
        height, width = request.size
        parameters = [
            describe(
                prompt=request.styled_prompt,
                negative_prompt=request.styled_negative_prompt,
                seed=s,
                steps=request.steps,
                guidance_scale=request.guidance_scale,
                height=height,
                width=width,
                model=self.config.model,
                unet=None,
                dtype=self.config.dtype,
                sampler="Euler",
            )
            for s in seeds
        ]
        images = image_io.to_pil(self._images, parameters)
        total_s = time.perf_counter() - started
        self.engine_s.append(total_s)
        values = {
            "images": images,
            "seeds": seeds,
            "prompt": request.styled_prompt,
            "negative_prompt": request.styled_negative_prompt,
            "truncated": "",
            "parameters": parameters,
            "timings": {"total_s": total_s},
            "steps": request.steps,
            "sampler": "Euler",
        }
        return GenerationResult(**{f.name: values[f.name] for f in fields(GenerationResult) if f.name in values})


def grainy_pixels(count: int, size: int) -> np.ndarray:
    """uint8 [count, size, size, 3]: photo-like pixels with `GRAIN`."""
    photo = synthetic_pixels(count, size, "photo").astype(np.float32)
    grain = np.random.default_rng(1).normal(0, GRAIN, photo.shape)
    return np.clip(photo + grain, 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class AppHostCost:
    """Client wall time minus the engine's time of the same call, per way of calling (seconds)."""

    size: int  # image side
    images: int  # images per request
    steps: int  # steps per request
    device_step_s: float  # the stand-in's device seconds per step
    overhead: dict[str, Stats]  # label of CALLS -> the app's own seconds per call
    cpu: dict[str, Stats]  # label of CALLS -> CPU seconds of this process (server and client) per call: the work,
    # whatever else the machine runs
    wall: dict[str, Stats]  # label of CALLS -> client wall seconds per call
    fetched_bytes: dict[str, float]  # label of CALLS -> bytes of the answer's images (median)
    load_average: tuple[float, float, float]  # the machine's load at the end


def app_host_cost(runs: int = 7, calls: dict | None = None, say: Progress = progress) -> AppHostCost:
    """Serve the stand-in at 1024², 8 images, and time each of `calls` (default CALLS) in turn, `runs` rounds."""
    import os
    from pathlib import Path

    from web.history.tab import History
    from web.page.layout import build_page

    from ..common import free_port
    from ..engine import Generator
    from .app import make_client

    generator = Generator.from_pretrained("tiny", height=SIZE, width=SIZE, steps=STEPS, dtype="float32")
    if generator.num_images != IMAGES:
        raise RuntimeError(f"apphost needs {IMAGES} devices (--cpu-devices {IMAGES}); got {generator.num_images}")
    engine = DeviceTimeEngine(generator, grainy_pixels(IMAGES, SIZE))
    data = tempfile.mkdtemp(prefix="sdxl-bench-apphost-")
    history = History.for_server(data, logins=False, max_entries=None)  # the app's default
    page = build_page(engine, history=history).launch(port=free_port(), prevent_thread_lock=True, quiet=True)
    downloads = tempfile.mkdtemp(prefix="sdxl-bench-apphost-dl-")
    calls = CALLS if calls is None else calls
    overhead: dict[str, list[float]] = {label: [] for label in calls}
    wall: dict[str, list[float]] = {label: [] for label in calls}
    fetched: dict[str, list[float]] = {label: [] for label in calls}
    cpu: dict[str, list[float]] = {label: [] for label in calls}
    try:
        clients = {True: make_client(page.local_url, downloads), False: make_client(page.local_url, False)}
        for endpoint, extra, fetch in calls.values():  # warm: Gradio's first call of each endpoint sets things up
            clients[fetch].predict(prompt=PROMPT, seed=0, randomize_seed=False, api_name=endpoint, **extra)
        for run in range(runs):
            for label, (endpoint, extra, fetch) in calls.items():
                cpu_started = time.process_time()
                seconds, (gallery, _, _) = timed(
                    lambda e=endpoint, x=extra, c=clients[fetch], s=run: c.predict(
                        prompt=PROMPT, seed=100 + s, randomize_seed=False, api_name=e, **x
                    )
                )
                cpu[label].append(time.process_time() - cpu_started)
                wall[label].append(seconds)
                overhead[label].append(seconds - engine.engine_s[-1])
                files = (Path(item["image"]) for item in gallery) if fetch else ()
                fetched[label].append(float(sum(path.stat().st_size for path in files)))
            say(
                f"apphost: round {run + 1}/{runs}: "
                + ", ".join(
                    f"{label} {overhead[label][-1] * 1000:.0f} ms (CPU {cpu[label][-1] * 1000:.0f})" for label in calls
                )
            )
    finally:
        page.close()
        history.close()
        shutil.rmtree(downloads, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
    return AppHostCost(
        size=SIZE,
        images=IMAGES,
        steps=STEPS,
        device_step_s=DEVICE_STEP_S,
        overhead={label: Stats.of(values) for label, values in overhead.items()},
        cpu={label: Stats.of(values) for label, values in cpu.items()},
        wall={label: Stats.of(values) for label, values in wall.items()},
        fetched_bytes={label: Stats.of(values).median for label, values in fetched.items()},
        load_average=os.getloadavg(),
    )


def markdown(cost: AppHostCost | None) -> list[str]:
    """The results.md section."""
    if cost is None:
        return []
    return [
        f"## The app's own time per request at {cost.size}² ({cost.images} images, {cost.steps} steps)",
        "",
        "Client wall time through gradio_client minus the engine's time of that call (device work stood in for: "
        f"{cost.device_step_s * 1000:.0f} ms per step). Load average at the end: "
        + ", ".join(f"{x:.1f}" for x in cost.load_average)
        + ".",
        "",
        "| call | the app's time | client wall | CPU (server + client) | images fetched |",
        "|---|---|---|---|---|",
        *[
            f"| {label} | {cost.overhead[label].range_text(1000, 0)} ms | {cost.wall[label].range_text(1000, 0)} ms | "
            f"{cost.cpu[label].range_text(1000, 0)} ms | {cost.fetched_bytes[label] / 2**20:.2f} MiB |"
            for label in cost.overhead
        ],
        "",
    ]
