"""Images: uint8 pixels to PIL images and PNG files that carry how they were made.

The PNG text chunk `parameters` uses the layout most image tools read (AUTOMATIC1111's): the prompt, a
"Negative prompt:" line, then "Key: value" settings.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, PngImagePlugin

PARAMETERS_KEY = "parameters"
#: zlib level for PNGs: 1 encodes ~1.4x faster than Pillow's default 6 for ~10% larger files (measured on
#: 1024x1024 images); encoding 8 of them serially takes about as long as a TPU v5e call, so speed wins.
PNG_COMPRESS_LEVEL = 1


def describe(
    *,
    prompt: str,
    negative_prompt: str,
    seed: int,
    steps: int,
    guidance_scale: float,
    height: int,
    width: int,
    model: str,
    dtype: str,
    sampler: str = "Euler",
    spacing: str | None = None,
) -> str:
    """The `parameters` text of one image."""
    lines = [prompt]
    if negative_prompt:
        lines.append(f"Negative prompt: {negative_prompt}")
    lines.append(
        f"Steps: {steps}, Sampler: {sampler}, CFG scale: {guidance_scale:g}, Seed: {seed}, Size: {width}x{height}, "
        f"Model: {model}, Dtype: {dtype}" + (f", Timestep spacing: {spacing}" if spacing else "")
    )
    return "\n".join(lines)


def to_pil(pixels: np.ndarray, parameters: list[str]) -> list[Image.Image]:
    """uint8 [B, H, W, 3] -> B RGB images, each with its `parameters` in `.info`."""
    images = []
    for array, text in zip(pixels, parameters, strict=True):
        image = Image.fromarray(array)
        image.info[PARAMETERS_KEY] = text
        images.append(image)
    return images


def save_png(image: Image.Image, path: str | Path) -> Path:
    """Write `image` as PNG with its `parameters` text chunk."""
    info = PngImagePlugin.PngInfo()
    if PARAMETERS_KEY in image.info:
        info.add_text(PARAMETERS_KEY, image.info[PARAMETERS_KEY])
    path = Path(path)
    image.save(path, format="PNG", pnginfo=info, compress_level=PNG_COMPRESS_LEVEL)
    return path


def save_pngs(images: list[Image.Image], directory: str | Path, stem: str = "image") -> list[Path]:
    """Write images as `<stem>-00.png`, `<stem>-01.png`, ...: sorting the names gives image order.

    Encoded in parallel threads (zlib releases the GIL): one image per core comes back at once.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    width = max(2, len(str(len(images) - 1)))
    paths = [directory / f"{stem}-{i:0{width}d}.png" for i in range(len(images))]
    workers = max(1, min(len(images), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(save_png, images, paths))
