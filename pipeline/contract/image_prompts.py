"""A request's image prompts (IP-Adapter): which adapter, the picture, its scale and step window.

Each slot is checked once at the request's edge and kept as data, as a ControlNet unit is: the picture as PNG
(shrunk to at most `KEPT_SIDE` on its long side: the encoder reads 224 pixels), so the engine, the followers and the
engine service receive the same bytes. The engine turns it into CLIP's pixels (`clip_pixels`: CLIPImageProcessor's
resize, centre crop and normalisation, exactly) and each slot's scale and window into the numbers its steps read.
Several slots on one adapter concatenate their tokens, as diffusers does with several images for one adapter.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image

from .controlnet_units import acting_steps, image_source, number_field
from .errors import InvalidInput
from .fields import echo
from .image_inputs import open_image, to_rgb

#: The most image prompts a server may take per request (--ip-slots: Fooocus has 4).
MAX_IP_SLOTS = 4
DEFAULT_SCALE = 0.6  # Fooocus' and Forge's default weight
MAX_SCALE = 2.0
#: A picture's long side as the request keeps it (CLIP reads a 224-pixel centre crop of its short side).
KEPT_SIDE = 1024
#: CLIPImageProcessor's defaults (OpenAI CLIP's mean and std), as diffusers' load_ip_adapter builds it.
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)


@dataclass(frozen=True)
class ImagePrompt:
    """One image prompt of a request, checked."""

    adapter: str  # one of the server's IP-Adapters
    image: bytes  # PNG of the picture, uint8 RGB (long side at most KEPT_SIDE)
    scale: float = DEFAULT_SCALE  # diffusers' set_ip_adapter_scale: 0..2
    start: float = 0.0  # first fraction of the steps it acts on (as a ControlNet unit's)
    end: float = 1.0  # last fraction

    def to_dict(self) -> dict:
        return {**asdict(self), "image": base64.b64encode(self.image).decode("ascii")}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ImagePrompt:
        return cls(**{**data, "image": base64.b64decode(data["image"])})

    def pixels(self) -> np.ndarray:
        """The picture: uint8 [H, W, 3]."""
        return np.asarray(Image.open(io.BytesIO(self.image)).convert("RGB"))


def clip_pixels(picture: np.ndarray, size: int) -> np.ndarray:
    """CLIPImageProcessor(size=size, crop_size=size) on uint8 [H, W, 3]: the short side to `size` (PIL bicubic, the
    long side int(size x long / short)), the centre `size` x `size` crop, [0, 1], normalised -> float32 [3, s, s]."""
    height, width = picture.shape[:2]
    short, long = min(height, width), max(height, width)
    other = int(size * long / short)
    new_height, new_width = (size, other) if height <= width else (other, size)
    resized = np.asarray(Image.fromarray(picture).resize((new_width, new_height), Image.Resampling.BICUBIC))
    top, left = (new_height - size) // 2, (new_width - size) // 2
    crop = resized[top : top + size, left : left + size].astype(np.float64) * (1 / 255)
    normalised = (crop.astype(np.float32) - CLIP_MEAN) / CLIP_STD
    return np.ascontiguousarray(normalised.transpose(2, 0, 1), np.float32)


def parse_image_prompt(item: object, offered: tuple[str, ...]) -> ImagePrompt:
    """One `{image, adapter, scale, start, end}` checked into an ImagePrompt (the adapter may be left out when the
    server has one)."""
    if not isinstance(item, Mapping):
        raise InvalidInput(f"Each image prompt must be an object with an image; got {echo(item)}.")
    if not offered:
        raise InvalidInput("This server has no IP-Adapter (start it with --ip-adapter PATH) for image prompts.")
    adapter = item.get("adapter") or item.get("name") or (offered[0] if len(offered) == 1 else None)
    if adapter not in offered:
        raise InvalidInput(f"Unknown IP-Adapter {echo(adapter)}; choose one of: {', '.join(offered)}.")
    if item.get("image") is None:
        raise InvalidInput("An image prompt needs an image.")
    scale = number_field(item, "scale", DEFAULT_SCALE, 0.0, MAX_SCALE, "An image prompt's scale")
    start = number_field(item, "start", 0.0, 0.0, 1.0, "An image prompt's start")
    end = number_field(item, "end", 1.0, 0.0, 1.0, "An image prompt's end")
    if start >= end:
        raise InvalidInput(f"An image prompt's start ({start:g}) must be below its end ({end:g}).")
    source = image_source(item["image"], "An image prompt's image")
    picture = to_rgb(open_image(source, what="image prompt"), what="image prompt")
    picture.thumbnail((KEPT_SIDE, KEPT_SIDE), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", compress_level=1)
    return ImagePrompt(str(adapter), buffer.getvalue(), scale, start, end)


def parse_image_prompts(value: object, offered: tuple[str, ...], most: int) -> tuple[ImagePrompt, ...]:
    """The request's `ip_images` (None or a list of up to `most` slots: the server's --ip-slots), each checked."""
    if value is None or value == []:
        return ()
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise InvalidInput("ip_images must be a list of {image, adapter, scale, start, end} objects.")
    if len(value) > most:
        raise InvalidInput(f"At most {most} image prompt{'s' if most > 1 else ''} per request here; got {len(value)}.")
    return tuple(parse_image_prompt(item, offered) for item in value)


#: sd-webui-controlnet's IP-Adapter preprocessors (its units with these modules are image prompts here).
A1111_MODULES = ("ip-adapter_clip_sdxl", "ip-adapter_clip_sdxl_plus_vith", "ip-adapter_clip_sdxl_plus_vitg")


def split_ip_units(args: object) -> tuple[list[dict], object]:
    """sd-webui-controlnet's `alwayson_scripts.controlnet.args` -> (its IP-Adapter units as `ip_images` items, the
    other units as given). An IP-Adapter unit: `module` one of A1111_MODULES (or any "ip-adapter..."), `model` the
    adapter (its " [hash]" dropped), `image`, `weight`, `guidance_start`, `guidance_end`; `enabled` False: skipped."""
    if not isinstance(args, (list, tuple)):
        return [], args
    prompts, others = [], []
    for arg in args:
        module = str(arg.get("module") or "").strip().lower() if isinstance(arg, Mapping) else ""
        if not module.startswith("ip-adapter"):
            others.append(arg)
            continue
        if arg.get("enabled", True) is False:
            continue
        image = arg.get("image") or arg.get("input_image")
        image = image.get("image") if isinstance(image, Mapping) else image
        item = {
            "adapter": str(arg.get("model") or "").split(" [")[0].strip() or None,
            "image": image,
            "scale": arg.get("weight"),
            "start": arg.get("guidance_start"),
            "end": arg.get("guidance_end"),
        }
        prompts.append({key: value for key, value in item.items() if value is not None})
    return prompts, others


def windows(prompts: tuple[ImagePrompt, ...], steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Each slot's first step and the step after its last, int32 [S] each: the steps where a ControlNet unit of the
    same start and end would act (`controlnet_units.step_scales`; a window with none: first = stop = 0)."""
    acting = [acting_steps(prompt.start, prompt.end, steps) for prompt in prompts]  # bool [steps] each
    first = np.array([np.argmax(column) if column.any() else 0 for column in acting], np.int32)
    stop = np.array([len(column) - np.argmax(column[::-1]) if column.any() else 0 for column in acting], np.int32)
    return first, stop
