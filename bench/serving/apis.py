"""What the HTTP APIs add over the engine call: `python -m bench.serving.apis` (tiny model, 128², 8 CPU devices,
2 steps).

Per request of 8 images: the engine's own call (`Generator.generate`), then the same request through the page's
/generate_png (gradio_client), A1111's /sdapi/v1/txt2img and OpenAI's /v1/images/generations (b64_json); the
median of REPEATS each, and the answer's bytes. Then one 1024² image (synthetic pixels) encoded as A1111 and OpenAI
answer it: PNG with its `parameters` chunk, then base64.
"""

from __future__ import annotations

import base64
import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

REPEATS = 5
SIZE = 128


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def median_time(call, repeats: int = REPEATS) -> tuple[float, object]:
    times, answer = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        answer = call()
        times.append(time.perf_counter() - started)
    return statistics.median(times), answer


def encode_1024() -> dict:
    """One 1024² RGB image (noise: the worst case for zlib) as a PNG with parameters, then base64."""
    import io

    import numpy as np
    from PIL import Image, PngImagePlugin

    pixels = np.random.default_rng(0).integers(0, 256, (1024, 1024, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", "a prompt\nSteps: 25, Sampler: Euler, CFG scale: 5, Seed: 1, Size: 1024x1024")

    def png() -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", pnginfo=info)
        return buffer.getvalue()

    png_s, data = median_time(png)
    b64_s, text = median_time(lambda: base64.b64encode(data))
    return {"png_ms": png_s * 1000, "base64_ms": b64_s * 1000, "png_bytes": len(data), "base64_bytes": len(text)}


def main() -> None:
    import requests
    from gradio_client import Client

    from web.apis import ApiAccess, attach_apis
    from web.page.layout import build_page

    from ..engine import Generator, resolve_model
    from .gradio_downloads import tidy_downloads

    engine = Generator.from_pretrained(resolve_model("tiny"), height=SIZE, width=SIZE, steps=2, dtype="float32")
    engine.warmup()
    page = build_page(engine)
    page.launch(port=free_port(), prevent_thread_lock=True, quiet=True, **attach_apis(page, ApiAccess()))
    url = page.local_url.rstrip("/")
    downloads = None
    try:
        fields = {"prompt": "a lighthouse", "seed": 1}
        engine_s, _ = median_time(lambda: engine.generate(engine.request("a lighthouse", seed=1)))
        tidy_downloads()
        downloads = tempfile.mkdtemp(prefix="sdxl-bench-apis-dl-")  # gradio_client's default, $TMPDIR/gradio, stays
        client = Client(page.local_url, verbose=False, download_files=downloads)
        page_s, _ = median_time(lambda: client.predict(**fields, randomize_seed=False, api_name="/generate_png"))
        a1111_s, a1111 = median_time(
            lambda: requests.post(
                f"{url}/sdapi/v1/txt2img", timeout=600, json={**fields, "batch_size": 8, "width": SIZE, "height": SIZE}
            )
        )
        openai_s, openai = median_time(
            lambda: requests.post(
                f"{url}/v1/images/generations", timeout=600, json={**fields, "n": 8, "size": f"{SIZE}x{SIZE}"}
            )
        )
        print(f"engine call, 8 images {SIZE}²: {engine_s * 1000:.0f} ms (median of {REPEATS})")
        for name, seconds, answer in (
            ("page /generate_png", page_s, None),
            ("A1111 txt2img", a1111_s, a1111),
            ("OpenAI generations b64", openai_s, openai),
        ):
            size = f", answer {len(answer.content):,} bytes" if answer is not None else ""
            print(f"{name}: {seconds * 1000:.0f} ms, +{(seconds - engine_s) * 1000:.0f} ms over the engine{size}")
        print("one 1024² image:", {k: round(v, 1) for k, v in encode_1024().items()})
    finally:
        page.close()
        if downloads is not None:
            shutil.rmtree(downloads, ignore_errors=True)


if __name__ == "__main__":
    main()
