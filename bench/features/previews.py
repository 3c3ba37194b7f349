"""What live previews cost: per request on the served engine, and on the host per previewed step at 1024².

    python -m bench --only previews     # (a) engine with previews vs one built with previews=False, --feature-steps
                                        # (b) host work per preview at --preview-size (1024²: latents [8, 4, 128, 128])

(a) interleaves `generate` calls of the bench's engine (previews compiled, a `web.page.handlers.LatestPreview` as the
listener, as the page's engine thread has) and of a second engine loaded with `previews=False`, same size and steps.

(b) needs no model: on 8 devices (the bench's CPU split) the preview program (`pipeline.device.preview.
latents_to_rgb` under jit(shard_map), as `host/compiling/programs.py` builds `preview[size]`) runs on batch-split
float32 latents [8, 4, side/8, side/8] (smooth colour fields with fine grain, new ones each time), and the two threads'
work per preview is timed apart:

- the loop thread (`host/loop.py`): dispatching the program and `copy_to_host_async` right after the step that
  made D, then, once the step is done, `local_rows` (the uint8 pixels on the host) and `LatestPreview.put`. The
  wait from the dispatch's return until the result is ready is timed apart (`device`): in the served loop it
  overlaps the next step, which is queued first. On XLA:CPU this small program has (nearly) always run by the time
  the call returns (`device` ~0.01 ms), so there `dispatch` includes the program's run: an upper bound on the
  dispatch of an asynchronous accelerator;
- the page's generator thread (`web/page/handlers.py`): each of the 8 images as a JPEG (quality `PREVIEW_QUALITY`) and
  `RunFiles.content_file`, as `Handlers._preview_file` does; Gradio's own handling of the yielded gallery is not
  included.

A preview comes every `PREVIEW_EVERY` steps, so the per-step cost is the per-preview cost / PREVIEW_EVERY. The share
of a TPU v5e step is computed only against the step rooflines in bench/results/tpu.json (XLA's cost analysis of the
served step program compiled for a v5e, a lower bound on the real step time: the share is an upper bound), never
against an invented step time.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..common import Progress, progress
from .lora_img2img_levers import PROMPT, _size
from .millis import Millis

#: XLA's cost analysis of the served step programs compiled for a TPU v5e-4 (bench/tpu/programs.py; bench/HISTORY.md).
TPU_RESULTS = Path(__file__).resolve().parents[1] / "results" / "tpu.json"
#: The rows of TPU_RESULTS a 1024² preview is compared with: (label, step program kind, size, attention, cfg).
V5E_STEPS = (
    ("v5e step 1024² CFG (splash)", "1024x1024", "splash", True),
    ("v5e step 1024² no CFG (splash)", "1024x1024", "splash", False),
)
#: The bound: host cost per step at most this share of a v5e step (previews must not slow the devices).
TARGET_SHARE = 0.03


# ---- (a) the served engine, previews on vs off -------------------------------------------------------------------


@dataclass(frozen=True)
class PreviewsOnOff:
    size: str
    steps: int
    devices: int
    previews_per_request: int  # previews the listener received per request
    with_previews: Millis  # the bench's engine (previews compiled), a LatestPreview as the listener
    without_previews: Millis  # an engine like it loaded with previews=False
    difference: float  # with / without - 1
    compiles_while_timing: int  # must be 0


def previews_on_off(generator, steps: int, runs: int, say: Progress = progress) -> PreviewsOnOff:
    """Interleaved requests of `generator` (previews compiled) and a second engine without them; medians."""
    from web.page.handlers import LatestPreview

    from ..engine import Generator

    if not generator.config.previews:
        raise ValueError("the previews part needs the bench's engine with previews compiled")
    say("previews: loading a second engine with previews=False ...")
    without = Generator.load(generator.config.replace(previews=False))
    without.warmup()
    latest, received = LatestPreview(), []

    def listener(done: int, total: int, pixels: np.ndarray) -> None:
        received.append(done)
        latest.put(done, total, pixels)

    request = generator.request(PROMPT, seed=11, steps=steps)
    other = without.request(PROMPT, seed=11, steps=steps)
    generator.generate(request, on_preview=listener), without.generate(other)  # untimed
    received.clear()
    times: dict[str, list[float]] = {"on": [], "off": []}
    before = generator.compile_count
    for _ in range(runs):
        started = time.perf_counter()
        generator.generate(request, on_preview=listener)
        times["on"].append(time.perf_counter() - started)
        started = time.perf_counter()
        without.generate(other)
        times["off"].append(time.perf_counter() - started)
    compiles = generator.compile_count - before
    on, off = Millis.of_seconds(times["on"]), Millis.of_seconds(times["off"])
    result = PreviewsOnOff(
        _size(generator),
        steps,
        generator.device_count,
        len(received) // runs,
        on,
        off,
        on.median / off.median - 1,
        compiles,
    )
    say(
        f"previews: {on.median:.0f} ms per request with previews ({result.previews_per_request} each) vs "
        f"{off.median:.0f} ms without ({result.difference:+.1%}), {steps} steps; {compiles} compilations"
    )
    return result


# ---- (b) host work per preview, synthetic ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PreviewHostCost:
    """Host milliseconds per preview of a batch of 8 images, and per denoising step."""

    size: int  # image side in pixels (latents side / 8)
    latents_shape: tuple[int, ...]  # float32 [B, 4, h, w], split over the devices
    devices: int
    repeats: int  # previews timed
    every: int  # a preview every this many steps (host/loop.PREVIEW_EVERY)
    dispatch: Millis  # loop thread: the preview program called + copy_to_host_async
    device: Millis  # after the dispatch returned, until the result is ready (overlaps the next step when served)
    local_rows: Millis  # loop thread: host/loop.local_rows (uint8 [B, h, w, 3] on the host)
    put: Millis  # loop thread: LatestPreview.put
    loop_thread: Millis  # dispatch + local_rows + put
    jpeg: Millis  # page thread: B JPEGs (quality below) from uint8 [h, w, 3]
    content_files: Millis  # page thread: B RunFiles.content_file writes
    page_thread: Millis  # jpeg + content_files
    jpeg_quality: int
    jpeg_kb: float  # median KB of one preview JPEG
    loop_thread_ms_per_step: float  # loop_thread median / every
    page_thread_ms_per_step: float  # page_thread median / every
    host_ms_per_step: float  # both
    v5e_step_ms: dict[str, float]  # the step rooflines compared with (from v5e_source); empty when absent
    share_of_v5e_step: dict[str, float]  # host_ms_per_step / each (an upper bound: a roofline is a lower bound)
    v5e_source: str  # where the v5e step figures come from
    target_share: float


def smooth_latents(rng: np.random.Generator, batch: int, side: int) -> np.ndarray:
    """float32 [batch, 4, side, side]: smooth per-channel fields with fine grain (like an SDXL step's D, roughly in
    [-2, 2]; the projection's clip then sees realistic values), new phases each call."""
    y, x = np.mgrid[0:side, 0:side].astype(np.float32) / side
    phases = rng.uniform(0, 2 * np.pi, (batch, 4, 1, 1)).astype(np.float32)
    fields = np.sin(6 * x + phases) * np.cos(4 * y - phases) * np.float32(1.5)
    return (fields + rng.normal(0, 0.1, fields.shape).astype(np.float32)).astype(np.float32)


def _plain_step(program: dict) -> bool:
    """A served default step's row: one prompt window, no FreeU/PAG extras, no cross-attention cache lever."""
    return (
        program.get("prompt_windows", 1) == 1 and not program.get("extras") and not program.get("cross_attention_cache")
    )


def v5e_steps(path: Path = TPU_RESULTS) -> tuple[dict[str, float], str]:
    """The 1024² step rooflines (ms) of bench/results/tpu.json, and a sentence naming them; ({}, why) without."""
    try:
        programs = json.loads(path.read_text())["programs"]
    except (OSError, ValueError, KeyError) as exc:
        return {}, f"no v5e step figure ({path.name}: {exc})"
    steps = {}
    for label, size, attention, cfg in V5E_STEPS:
        for program in programs:
            if (
                (program.get("kind"), program.get("size"), program.get("attention"), program.get("cfg"))
                == ("step", size, attention, cfg)
                and program.get("roofline_s")
                and _plain_step(program)
            ):
                steps[label] = program["roofline_s"] * 1000
                break
    topology = programs[0].get("topology", "a v5e") if programs else "a v5e"
    source = (
        f"bench/results/{path.name}: the roofline of the served step program compiled for {topology} (XLA's cost "
        "analysis: max(FLOPs / peak, bytes / HBM bandwidth); a lower bound on the step, not a measurement)"
        if steps
        else f"no 1024² step roofline in {path.name}"
    )
    return steps, source


def preview_host_cost(size: int = 1024, repeats: int = 50, say: Progress = progress) -> PreviewHostCost:
    """Time the loop thread's and the page thread's work per preview of 8 images at `size`² (see the docstring)."""
    import jax
    from jax.sharding import PartitionSpec as P
    from PIL import Image

    from web.page.handlers import PREVIEW_QUALITY, LatestPreview
    from web.serving.temp_files import RunFiles

    from ..engine import DATA_AXIS, PREVIEW_EVERY, batch_sharded, data_mesh, latents_to_rgb, local_rows

    batch, side = 8, size // 8
    devices = jax.devices()[:batch]
    if batch % len(devices):
        raise ValueError(f"the preview host part splits {batch} images over the devices; got {len(devices)}")
    mesh = data_mesh(devices)
    sharding = batch_sharded(mesh)
    program = jax.jit(
        jax.shard_map(latents_to_rgb, mesh=mesh, in_specs=P(DATA_AXIS), out_specs=P(DATA_AXIS), check_vma=False)
    )
    rng = np.random.default_rng(0)
    files, latest = RunFiles(), LatestPreview()
    names = ("dispatch", "device", "local_rows", "put", "jpeg", "content_files")
    times: dict[str, list[float]] = {name: [] for name in names}
    sizes: list[int] = []
    try:
        for index in range(repeats + 2):  # the first two compile and warm up: untimed
            latents = jax.device_put(smooth_latents(rng, batch, side), sharding)
            latents.block_until_ready()
            t0 = time.perf_counter()
            shown = program(latents)  # [B, h, w, 3] uint8
            shown.copy_to_host_async()
            t1 = time.perf_counter()
            shown.block_until_ready()
            t2 = time.perf_counter()
            rows = local_rows(shown)
            t3 = time.perf_counter()
            latest.put(2 * index, 2 * repeats, rows)
            t4 = time.perf_counter()
            encoded = []
            for pixels in rows:  # Handlers._preview_file, image by image
                buffer = io.BytesIO()
                Image.fromarray(pixels).save(buffer, format="JPEG", quality=PREVIEW_QUALITY)
                encoded.append(buffer.getvalue())
            t5 = time.perf_counter()
            for data in encoded:
                files.content_file(data, ".jpg")
            t6 = time.perf_counter()
            if index >= 2:
                for name, (a, b) in zip(
                    names, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5), (t5, t6)), strict=True
                ):
                    times[name].append(b - a)
                sizes.extend(len(data) for data in encoded)
    finally:
        files.cleanup()
    stats = {name: Millis.of_seconds(values) for name, values in times.items()}
    loop_thread = Millis.of_seconds(
        [a + b + c for a, b, c in zip(times["dispatch"], times["local_rows"], times["put"], strict=True)]
    )
    page_thread = Millis.of_seconds([a + b for a, b in zip(times["jpeg"], times["content_files"], strict=True)])
    loop_step, page_step = loop_thread.median / PREVIEW_EVERY, page_thread.median / PREVIEW_EVERY
    host_step = loop_step + page_step
    steps, source = v5e_steps() if size == 1024 else ({}, "shares are given at 1024² only")
    result = PreviewHostCost(
        size=size,
        latents_shape=(batch, 4, side, side),
        devices=len(devices),
        repeats=repeats,
        every=PREVIEW_EVERY,
        dispatch=stats["dispatch"],
        device=stats["device"],
        local_rows=stats["local_rows"],
        put=stats["put"],
        loop_thread=loop_thread,
        jpeg=stats["jpeg"],
        content_files=stats["content_files"],
        page_thread=page_thread,
        jpeg_quality=PREVIEW_QUALITY,
        jpeg_kb=float(np.median(sizes)) / 1024,
        loop_thread_ms_per_step=loop_step,
        page_thread_ms_per_step=page_step,
        host_ms_per_step=host_step,
        v5e_step_ms=steps,
        share_of_v5e_step={label: host_step / ms for label, ms in steps.items()},
        v5e_source=source,
        target_share=TARGET_SHARE,
    )
    shares = "; ".join(f"{share:.1%} of the {label} roofline" for label, share in result.share_of_v5e_step.items())
    say(
        f"preview host cost at {size}²: loop thread {loop_thread.median:.2f} ms, page thread "
        f"{page_thread.median:.2f} ms per preview of {batch} -> {host_step:.2f} ms per step"
        + (f" ({shares})" if shares else "")
    )
    return result


# ---- results.md -----------------------------------------------------------------------------------------------------


def markdown(on_off: PreviewsOnOff | None, host: PreviewHostCost | None) -> list[str]:
    lines: list[str] = []
    if on_off is not None:
        lines += [
            f"## Live previews: the engine with and without them ({on_off.size}, {on_off.steps} steps, "
            f"{on_off.devices} devices)",
            "",
            "| engine | ms per request, median (p90; min–max) |",
            "|---|---|",
            f"| previews compiled, a `LatestPreview` listening ({on_off.previews_per_request} per request) | "
            f"{on_off.with_previews.text(0)} |",
            f"| loaded with `previews=False` | {on_off.without_previews.text(0)} |",
            f"| **difference** | **{on_off.difference:+.1%}** |",
            "",
            f"{on_off.compiles_while_timing} compilations while timing.",
            "",
        ]
    if host is not None:
        shares = [
            f"| {label} | {host.v5e_step_ms[label]:.1f} | **{share:.2%}** (target ≤ {host.target_share:.0%}) |"
            for label, share in host.share_of_v5e_step.items()
        ]
        lines += [
            f"## Live previews: host work per preview at {host.size}² (latents {list(host.latents_shape)}, "
            f"{host.devices} devices, synthetic)",
            "",
            "| thread | work | ms per preview, median (p90) |",
            "|---|---|---|",
            f"| loop | preview program dispatch + `copy_to_host_async` | {host.dispatch.text(3)} |",
            f"| (devices) | then until the result is ready (served: overlaps the next step; on CPU the run is "
            f"mostly inside the dispatch above) | {host.device.text(3)} |",
            f"| loop | `local_rows` | {host.local_rows.text(3)} |",
            f"| loop | `LatestPreview.put` | {host.put.text(3)} |",
            f"| **loop** | **total** | **{host.loop_thread.text(3)}** |",
            f"| page | {host.latents_shape[0]} JPEGs, quality {host.jpeg_quality} ({host.jpeg_kb:.1f} KB each) | "
            f"{host.jpeg.text(3)} |",
            f"| page | {host.latents_shape[0]} `RunFiles.content_file` | {host.content_files.text(3)} |",
            f"| **page** | **total** | **{host.page_thread.text(3)}** |",
            "",
            f"| per denoising step (a preview every {host.every} steps) | ms |",
            "|---|---|",
            f"| loop thread | {host.loop_thread_ms_per_step:.3f} |",
            f"| page thread | {host.page_thread_ms_per_step:.3f} |",
            f"| **host, both** | **{host.host_ms_per_step:.3f}** |",
            "",
        ]
        if shares:
            lines += ["| host per step / v5e step | roofline ms | share |", "|---|---|---|", *shares, ""]
        lines += [host.v5e_source + ".", ""]
    return lines
