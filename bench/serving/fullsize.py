"""Parts `hostpath` and `fullsize`: the serving path at 1024², from device pixels to the user's screen (issue 19).

`hostpath` needs no model: synthetic uint8 pixels go through the app's own code (PIL images with their `parameters`,
then the outbox), timing what a request's answer waits for: before, every image as a PNG (level 1, parallel threads,
as the app did); after, the gallery's JPEGs (the PNGs are queued to a background pool, timed apart). Two kinds of
pixels: photo-like (smooth colour fields plus fine grain, as SDXL images are) and pure noise (the worst case for any
codec, and what the tiny random-weight model draws).

`fullsize` is end to end through `gradio_client` on the tiny checkpoint at 1024²: client wall time per call, fetching
every image included, minus the engine's time inside that same call, and bytes fetched per call; `/generate` (after:
JPEGs) against `/generate_png` (before: PNGs on the request's path, as the app answered until issue 19).
"""

from __future__ import annotations

import io
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..common import Progress, Stats, progress, timed

#: Device seconds of one SDXL-Lightning-4 request on a TPU v5e-4 (4 images at 1024², 4 steps, no CFG): from the
#: published 2.33 s for 20 Euler steps with CFG, scaled by UNet work (shared design.md, "The host path at full size").
LIGHTNING4_V5E4_DEVICE_S = 0.3
#: Images per request on a v5e-4: one per chip.
V5E4_IMAGES = 4
PROMPT = "a lighthouse on a cliff at dawn, dramatic sky, highly detailed"
#: A parameters text as long as a typical styled request's.
PARAMETERS = (
    "cinematic still a lighthouse on a cliff at dawn, dramatic sky, highly detailed . emotional, harmonious, "
    "vignette, highly detailed, high budget, bokeh, cinemascope, moody, epic, gorgeous, film grain, grainy\n"
    "Negative prompt: anime, cartoon, graphic, text, painting, crayon, graphite, abstract, glitch, deformed, "
    "mutated, ugly, disfigured\nSteps: 4, Sampler: Euler, CFG scale: 0, Seed: 1234, Size: 1024x1024, "
    "Model: stabilityai/stable-diffusion-xl-base-1.0, UNet: sdxl_lightning_4step_unet.safetensors, Dtype: bfloat16, "
    "Timestep spacing: trailing"
)


@dataclass(frozen=True)
class EncodeFigure:
    """One codec on one 1024² image, one thread."""

    content: str  # "photo-like" or "noise"
    codec: str  # e.g. "JPEG q90 (gallery)"
    ms: Stats  # milliseconds to encode one image in memory (wall)
    cpu_ms: Stats  # the same in CPU time of the encoding thread (what other load on the box does not inflate)
    kb: float  # encoded size in KB (1000 bytes)


@dataclass(frozen=True)
class RequestPath:
    """Device pixels of one request -> the files its answer points to, as the app writes them."""

    content: str  # "photo-like" or "noise"
    images: int  # images per request
    before_ms: Stats  # PNGs written on the request's path (parallel threads, level 1): the app before issue 19
    before_cpu_ms: Stats  # CPU time of the process meanwhile (every thread)
    before_kb_per_image: float  # PNG bytes per image sent to the browser, in KB
    after_ms: Stats  # gallery JPEGs written on the request's path (the PNGs queued, not waited for)
    after_cpu_ms: Stats  # CPU time of the process meanwhile (every thread)
    after_kb_per_image: float  # JPEG bytes per image sent to the browser, in KB
    background_png_ms: Stats  # after: from queueing the PNGs to the last one written (off the request's path)
    after_busy_ms: Stats  # after, requests back to back: the previous request's PNGs still being written meanwhile


@dataclass(frozen=True)
class HostPathResult:
    """The host path at 1024² and its projected share of a Lightning-4 request on a TPU v5e-4."""

    size: int  # image side in pixels
    cpu_count: int  # cores the encoders' threads could use
    codecs: list[EncodeFigure]  # per image, per codec, per content
    requests: list[RequestPath]  # per content, a v5e-4 request's images
    device_s: float  # device seconds of the projected request (LIGHTNING4_V5E4_DEVICE_S)
    before_share: float  # photo-like: before_ms / (device + before_ms): the host's share of the request's time
    after_share: float  # photo-like: after_ms / (device + after_ms)
    target_ms_per_image: float  # the target: at most this per image from device pixels to the answer
    target_kb_per_image: float  # and at most this many KB per image sent to the browser


@dataclass(frozen=True)
class FullSizeResult:
    """End to end through gradio_client at 1024² on the tiny checkpoint: the app's cost over the engine's."""

    model: str  # checkpoint
    size: int  # image side in pixels
    steps: int  # denoising steps (few: the engine's time is subtracted anyway)
    images: int  # images per request (devices used)
    engine: Stats  # seconds of the engine inside each timed API call (Generator.generate's total_s)
    after: Stats  # seconds per /generate call (JPEGs), every image fetched
    before: Stats  # seconds per /generate_png call (PNGs on the request's path, as before), every image fetched
    after_overhead: Stats  # seconds per /generate call minus that call's own engine time
    before_overhead: Stats  # seconds per /generate_png call minus that call's own engine time
    gradio_floor: Stats  # seconds per call of a do-nothing echo endpoint, same box, same moment: Gradio's own cost
    after_bytes: float  # bytes fetched per /generate call (median)
    before_bytes: float  # bytes fetched per /generate_png call (median)
    compiles_added: int  # XLA compilations while timing (must be 0)


def synthetic_pixels(count: int, size: int, content: str, seed: int = 0) -> np.ndarray:
    """uint8 [count, size, size, 3]: photo-like (smooth fields, edges, fine grain) or uniform noise."""
    rng = np.random.default_rng(seed)
    if content == "noise":
        return rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    out = np.empty((count, size, size, 3), np.uint8)
    for i in range(count):
        a, b, c = rng.uniform(2, 9, 3)
        field = np.stack(
            [
                128 + 80 * np.sin(a * x + 2 * y + i),
                128 + 70 * np.cos(b * y - 3 * x * y),
                110 + 60 * np.sin(c * x * y + 1) + 40 * (((x - 0.5) ** 2 + (y - 0.6) ** 2) < 0.05),  # a disc: an edge
            ],
            -1,
        )
        out[i] = np.clip(field + rng.normal(0, 6, field.shape), 0, 255).astype(np.uint8)
    return out


#: The codecs the host-path part compares: label -> (PIL format, save options); the first is the gallery's.
CODECS = {
    "JPEG q90 (gallery)": ("JPEG", {"quality": 90}),
    "JPEG q92": ("JPEG", {"quality": 92}),
    "WebP q90, method 0 (fastest)": ("WEBP", {"quality": 90, "method": 0}),
    "WebP q90 (default method 4)": ("WEBP", {"quality": 90}),
    "PNG level 1 (the app before)": ("PNG", {"compress_level": 1}),
    "PNG default level 6": ("PNG", {}),
}


def _encode_ms(image, codec: str, runs: int) -> tuple[Stats, Stats, float]:
    image_format, save_options = CODECS[codec]
    times, cpu, size = [], [], 0
    for _ in range(runs):
        buffer = io.BytesIO()
        started, cpu_started = time.perf_counter(), time.thread_time()
        image.save(buffer, image_format, **save_options)
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.thread_time() - cpu_started) * 1000)
        size = buffer.tell()
    return Stats.of(times), Stats.of(cpu), size / 1000


def host_path(size: int = 1024, runs: int = 5, images: int = V5E4_IMAGES, say: Progress = progress) -> HostPathResult:
    """Time the app's host path on synthetic pixels: no model, no JAX."""
    import os

    from web.serving.outbox import Outbox

    from ..engine import image_files as image_io

    codecs: list[EncodeFigure] = []
    requests: list[RequestPath] = []
    outbox = Outbox()
    root = Path(tempfile.mkdtemp(prefix="sdxl-bench-hostpath-"))
    try:
        for content in ("photo-like", "noise"):
            pixels = synthetic_pixels(images, size, content)
            one = image_io.to_pil(pixels[:1], [PARAMETERS])[0]
            for codec in CODECS:
                ms, cpu, kb = _encode_ms(one, codec, runs)
                codecs.append(EncodeFigure(content, codec, ms, cpu, kb))
                say(f"hostpath: {content} {codec}: {ms.median:.1f} ms ({cpu.median:.1f} ms CPU), {kb:.0f} KB per image")
            before, after, background, before_cpu, after_cpu = [], [], [], [], []
            before_kb = after_kb = 0.0
            for run in range(runs):
                directory = root / f"{content}-{run}"

                def png_path(d=directory, p=pixels):
                    return image_io.save_pngs(image_io.to_pil(p, [PARAMETERS] * images), d / "before", "x")

                cpu_started = time.process_time()
                seconds, paths = timed(png_path)
                before_cpu.append((time.process_time() - cpu_started) * 1000)
                before.append(seconds * 1000)
                before_kb = sum(p.stat().st_size for p in paths) / images / 1000

                def jpeg_path(d=directory, p=pixels):
                    return outbox.deliver(image_io.to_pil(p, [PARAMETERS] * images), d / "after", "x")

                cpu_started = time.process_time()
                seconds, delivery = timed(jpeg_path)
                after_cpu.append((time.process_time() - cpu_started) * 1000)
                queued = time.perf_counter()
                after.append(seconds * 1000)
                after_kb = sum(p.stat().st_size for p in delivery.gallery) / images / 1000
                for future in delivery.pngs:
                    future.result()
                background.append((time.perf_counter() - queued) * 1000)
            busy, pending = [], []
            for run in range(runs):  # back to back: each answer while the previous request's PNGs are in the pool
                seconds, delivery = timed(
                    lambda d=root / f"{content}-busy-{run}", p=pixels: outbox.deliver(
                        image_io.to_pil(p, [PARAMETERS] * images), d, "x"
                    )
                )
                busy.append(seconds * 1000)
                pending += delivery.pngs
            for future in pending:
                future.result()
            request = RequestPath(
                content,
                images,
                Stats.of(before),
                Stats.of(before_cpu),
                before_kb,
                Stats.of(after),
                Stats.of(after_cpu),
                after_kb,
                Stats.of(background),
                Stats.of(busy),
            )
            requests.append(request)
            say(
                f"hostpath: {content}, {images} images: before (PNGs) {request.before_ms.median:.0f} ms "
                f"({request.before_cpu_ms.median:.0f} ms CPU), "
                f"{before_kb:.0f} KB/image; after (JPEGs) {request.after_ms.median:.1f} ms "
                f"({request.after_cpu_ms.median:.1f} ms CPU), {after_kb:.0f} KB/image; "
                f"PNGs in the background {request.background_png_ms.median:.0f} ms; after, back to back "
                f"{request.after_busy_ms.median:.1f} ms"
            )
    finally:
        outbox.close()
        shutil.rmtree(root, ignore_errors=True)
    photo = requests[0]
    device = LIGHTNING4_V5E4_DEVICE_S
    before_s, after_s = photo.before_ms.median / 1000, photo.after_ms.median / 1000
    return HostPathResult(
        size=size,
        cpu_count=os.cpu_count() or 1,
        codecs=codecs,
        requests=requests,
        device_s=device,
        before_share=before_s / (device + before_s),
        after_share=after_s / (device + after_s),
        target_ms_per_image=15.0,
        target_kb_per_image=400.0,
    )


class _TimedGenerator:
    """The real generator, recording each call's own engine time, so every API call's overhead is its wall time minus
    the engine time of that very call (at 1024² on this CPU the engine's run-to-run spread dwarfs the overhead)."""

    def __init__(self, generator) -> None:
        self._generator = generator
        self.engine_s: list[float] = []

    def generate(self, *args, **kwargs):
        result = self._generator.generate(*args, **kwargs)
        self.engine_s.append(float(result.timings["total_s"]))
        return result

    def __getattr__(self, name):
        return getattr(self._generator, name)


#: Devices (images per request) and steps of the end-to-end part: the tiny checkpoint at 1024² costs about a minute
#: per image on 2 CPU cores (its attention runs over 128x128 = 16384 latent tokens), so one image, one step, no CFG.
FULLSIZE_DEVICES = 1
FULLSIZE_STEPS = 1


def full_size(
    model: str = "tiny",
    size: int = 1024,
    steps: int = FULLSIZE_STEPS,
    runs: int = 3,
    devices: int = FULLSIZE_DEVICES,
    dtype: str = "float32",
    say: Progress = progress,
) -> FullSizeResult:
    """Serve the checkpoint at size² on `devices` devices and call both endpoints through gradio_client in turn."""
    import jax

    from ..engine import Generator
    from .app import close_app, gradio_floor, launch_app, make_client

    say(f"fullsize: loading {model} at {size}x{size}, {steps} step(s), no CFG, on {devices} device(s) ...")
    real = Generator.from_pretrained(
        model, height=size, width=size, steps=steps, dtype=dtype, devices=jax.devices()[:devices], cfg=False
    )
    warm = real.warmup()
    say(f"fullsize: compiled in {warm['compile_s']:.1f} s, first run {warm['first_run_s']:.1f} s")
    generator = _TimedGenerator(real)
    compiles_before = real.compile_count
    page = launch_app(generator, queue_size=8)
    downloads = tempfile.mkdtemp(prefix="sdxl-bench-fullsize-")
    api = {"prompt": PROMPT, "randomize_seed": False}
    times: dict[str, list[float]] = {"engine": [], "after": [], "before": []}
    overheads: dict[str, list[float]] = {"after": [], "before": []}
    fetched: dict[str, list[float]] = {"after": [], "before": []}
    try:
        client = make_client(page.local_url, downloads)
        client.predict(**api, seed=0, api_name="/generate_png")  # the first call of the app pays Gradio's set-up
        for run in range(runs):
            seed = 100 + run
            for name, endpoint in (("after", "/generate"), ("before", "/generate_png")):
                seconds, (gallery, _, _) = timed(lambda e=endpoint, s=seed: client.predict(**api, seed=s, api_name=e))
                engine_s = generator.engine_s[-1]
                times[name].append(seconds)
                times["engine"].append(engine_s)
                overheads[name].append(seconds - engine_s)
                fetched[name].append(float(sum(Path(item["image"]).stat().st_size for item in gallery)))
                say(
                    f"fullsize: run {run + 1}/{runs} {endpoint}: {seconds:.2f} s, engine {engine_s:.2f} s, "
                    f"overhead {(seconds - engine_s) * 1000:.0f} ms, {fetched[name][-1] / 1e6:.2f} MB fetched"
                )
    finally:
        close_app(page)
        shutil.rmtree(downloads, ignore_errors=True)
    floor = gradio_floor(runs)
    say(f"fullsize: Gradio's own floor (echo endpoint via gradio_client) {floor.median * 1000:.0f} ms per call")
    stats = {name: Stats.of(values) for name, values in times.items()}
    return FullSizeResult(
        model=model,
        size=size,
        steps=steps,
        images=real.num_images,
        engine=stats["engine"],
        after=stats["after"],
        before=stats["before"],
        after_overhead=Stats.of(overheads["after"]),
        before_overhead=Stats.of(overheads["before"]),
        gradio_floor=floor,
        after_bytes=Stats.of(fetched["after"]).median,
        before_bytes=Stats.of(fetched["before"]).median,
        compiles_added=real.compile_count - compiles_before,
    )


def markdown(host: HostPathResult | None, full: FullSizeResult | None) -> list[str]:
    """The results.md section of both parts."""
    lines: list[str] = []
    if host is not None:
        lines += [
            f"## Host path at {host.size}² (synthetic pixels, {host.cpu_count} cores)",
            "",
            "| pixels | codec | ms per image (one thread) | CPU ms | KB per image |",
            "|---|---|---|---|---|",
            *[
                f"| {c.content} | {c.codec} | {c.ms.range_text(1, 1)} | {c.cpu_ms.median:.1f} | {c.kb:.0f} |"
                for c in host.codecs
            ],
            "",
            "| pixels | images | before: PNGs on the path (CPU) | KB/image | after: JPEGs on the path (CPU) | KB/image "
            "| PNGs in the background | after, back to back (previous PNGs encoding) |",
            "|---|---|---|---|---|---|---|---|",
            *[
                f"| {r.content} | {r.images} | {r.before_ms.range_text(1, 0)} ms ({r.before_cpu_ms.median:.0f}) | "
                f"{r.before_kb_per_image:.0f} | {r.after_ms.range_text(1, 1)} ms ({r.after_cpu_ms.median:.1f}) | "
                f"{r.after_kb_per_image:.0f} | {r.background_png_ms.median:.0f} ms | "
                f"{r.after_busy_ms.range_text(1, 1)} ms |"
                for r in host.requests
            ],
            "",
            f"Projected on a Lightning-4 request on a TPU v5e-4 ({host.device_s:g} s on the devices, 4 images): the "
            f"host path is {host.before_share:.0%} of the request's time before, {host.after_share:.0%} after "
            f"(targets: ≤ {host.target_ms_per_image:g} ms and ≤ {host.target_kb_per_image:g} KB per image).",
            "",
        ]
    if full is not None:
        lines += [
            f"## End to end at {full.size}² through gradio_client (`{full.model}`, {full.images} images, "
            f"{full.steps} steps)",
            "",
            "| | per call | over the engine | fetched per call |",
            "|---|---|---|---|",
            f"| the engine inside those calls | {full.engine.range_text(1, 2)} s | | |",
            f"| before: `/generate_png` (PNGs on the path) | {full.before.range_text(1, 2)} s | "
            f"{full.before_overhead.range_text(1000, 0)} ms | {full.before_bytes / 1e6:.2f} MB |",
            f"| after: `/generate` (JPEGs) | {full.after.range_text(1, 2)} s | "
            f"{full.after_overhead.range_text(1000, 0)} ms | {full.after_bytes / 1e6:.2f} MB |",
            f"| for scale: an echo endpoint through Gradio and gradio_client | {full.gradio_floor.range_text(1000, 0)} "
            "ms | | |",
            "",
            f"{full.compiles_added} compilations while timing.",
            "",
        ]
    return lines
