"""One request contract: every field a request may set, checked once where it enters.

    rules = generator.rules                                   # what this server accepts and assumes
    request = parse_request("a cat", seed=7, steps=30, rules=rules)   # page, API, CLI and Python call this
    result = generator.generate(request)                      # the engine runs it as it is

The page, the API, the CLI and Python code all build a `Request` with `parse_request`; nothing below that edge checks
a field again. On several processes the leader sends `request.to_dict()` and the followers rebuild it with
`Request.from_dict` (trusted data, not checked twice). A new per-request input is a field here, its check in
`parse_request`, the page's control and the engine stage that uses it.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import math
import pathlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from .config import EngineConfig
from .errors import InvalidInput
from .fields import (
    DEFAULT_CFG_END,
    DEFAULT_DEEPCACHE,
    check_cfg_end,
    check_choice,
    check_deepcache,
    check_guidance,
    check_shape,
    check_size,
    check_steps,
    check_style,
    clean_text,
    resolve_seed,
)
from .host.plan import SAMPLER_NAMES, sampler_label
from .image_inputs import prepare_image_inputs
from .styles import DEFAULT_STYLE, Style, apply_style, load_styles

#: A request's default guidance scale (a preset may set another: `EngineConfig.guidance_scale`).
DEFAULT_GUIDANCE = 5.0
#: LoRAs one request may apply at once (the merge program's slots).
MAX_LORAS = 4
#: A LoRA's weight is taken from this range (A1111's UI offers -2..2; trained files go beyond a little).
LORA_WEIGHT_LIMIT = 10.0
#: Strength of an image request that names none (A1111's default denoising strength for image to image).
DEFAULT_STRENGTH = 0.75
#: A1111's prompt tag: <lora:NAME>, <lora:NAME:WEIGHT> or <lora:NAME:TE_WEIGHT:UNET_WEIGHT> (te=/unet= allowed).
LORA_TAG = re.compile(r"<lora:([^:<>]+)(?::([^:<>]*))?(?::([^:<>]*))?>", re.IGNORECASE)


@dataclass(frozen=True)
class RequestRules:
    """What a server accepts, and what it assumes for the fields a request leaves out (from its static settings)."""

    sizes: tuple[tuple[int, int], ...] = ((1024, 1024),)  # compiled (height, width) sizes, the default first
    steps: int = 25  # steps of a request that names none
    sampler: str | None = None  # sampler (A1111 name) of a request that names none; None = the checkpoint's
    guidance_scale: float = DEFAULT_GUIDANCE  # guidance of a request that names none
    cfg: bool = True  # False: the guidance-free program runs; negative prompt and guidance are ignored
    levers: bool = True  # cfg_end and deepcache are offered (their programs compiled: not with --no-speed-levers)
    loras: tuple[str, ...] = ()  # the LoRAs offered, by name (--lora-dir)
    styles: Mapping[str, Style] = field(default_factory=load_styles)  # the style templates offered

    @classmethod
    def of(cls, config: EngineConfig) -> RequestRules:
        """The rules a server with `config` will have, known before the model loads (the sampler's default is the
        checkpoint's unless the config sets one: None until then)."""
        sampler = sampler_label(config.sampler) if config.sampler else None  # an id or a name -> the name
        # The files of --lora-dir by name; the engine then offers those it could read (`Generator.rules`).
        directory = pathlib.Path(config.lora_dir) if config.lora_dir else None
        loras = tuple(sorted(p.stem for p in directory.glob("*.safetensors"))) if directory and directory.is_dir() \
            else ()  # fmt: skip
        return cls(
            sizes=config.offered_sizes, steps=config.steps, sampler=sampler, guidance_scale=config.guidance_scale,
            cfg=config.cfg, levers=config.speed_levers, loras=loras,
        )  # fmt: skip


@dataclass(frozen=True)
class Request:
    """One generation request, checked: the engine runs it as it is, and followers receive it as data."""

    prompt: str  # the user's prompt, cleaned (before the style template)
    negative_prompt: str = ""  # the user's negative prompt, cleaned ("" = none; "" when the server has no CFG)
    style: str = DEFAULT_STYLE  # a name from the server's styles
    seed: int = 0  # image i uses seed (seed + i) mod 2**32; already drawn when the user asked for a random one
    guidance_scale: float = DEFAULT_GUIDANCE  # 0..20; <= 1 means no guidance (0 when the server has no CFG)
    size: tuple[int, int] = (1024, 1024)  # (height, width): one of the server's compiled sizes
    steps: int = 25  # denoising steps, 1..100
    sampler: str | None = None  # A1111's name of the sampler; None = the server's default (its checkpoint's)
    cfg_end: float = DEFAULT_CFG_END  # guidance on the first ⌈cfg_end × steps⌉ steps only (1 = every step)
    deepcache: int = DEFAULT_DEEPCACHE  # DeepCache's N: the whole UNet every N steps, the shallow part between
    loras: tuple[tuple[str, float, float], ...] = ()  # (name, text-encoder weight, UNet weight): up to MAX_LORAS
    init_image: bytes | None = None  # PNG of the picture to start from, fitted to `size` (None: text to image)
    mask_image: bytes | None = None  # PNG of the repaint mask at `size`, 255 = repaint (None: the whole picture)
    strength: float = 1.0  # with a picture: how much of it is redrawn, 0 < s <= 1 (int(steps × s) steps run)
    styled_prompt: str = ""  # what the text encoders read: the prompt in the style's template, LoRA tags removed
    written_prompt: str = ""  # what the images' parameters say: the styled prompt with every LoRA's tag, as A1111
    styled_negative_prompt: str = ""  # the style's negative words joined with the user's

    def to_dict(self) -> dict:
        """Plain JSON-able data (what the leader publishes to the followers): pictures as base64 PNG."""
        data = dataclasses.asdict(self)
        for name in ("init_image", "mask_image"):
            data[name] = None if data[name] is None else base64.b64encode(data[name]).decode("ascii")
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Request:
        """Rebuild a request the leader checked and published: trusted, so nothing is checked again."""
        values = dict(data)
        values["size"] = tuple(values["size"])  # JSON has no tuples
        values["loras"] = tuple(tuple(lora) for lora in values.get("loras", ()))
        for name in ("init_image", "mask_image"):
            values[name] = None if values.get(name) is None else base64.b64decode(values[name])
        return cls(**values)

    def pictures(self) -> tuple[np.ndarray, np.ndarray | None] | None:
        """The picture uint8 [H, W, 3] and the repaint mask bool [H, W] (None: the whole picture); None without."""
        if self.init_image is None:
            return None
        pixels = np.asarray(Image.open(io.BytesIO(self.init_image)).convert("RGB"))
        mask = None if self.mask_image is None else np.asarray(Image.open(io.BytesIO(self.mask_image))) >= 128
        return pixels, mask


def parse_request(
    prompt: object,
    negative_prompt: object = "",
    style: object = DEFAULT_STYLE,
    guidance_scale: object = None,
    seed: object = 0,
    randomize_seed: bool = False,
    *,
    size: object = None,  # (height, width), or text: 'WxH' or the page's '1344×768 (16:9)'
    steps: object = None,
    sampler: object = None,
    cfg_end: object = DEFAULT_CFG_END,
    deepcache: object = DEFAULT_DEEPCACHE,
    loras: object = None,
    init_image: object = None,
    mask_image: object = None,
    strength: object = None,
    rules: RequestRules | None = None,
    check_prompt: Callable[[str], None] | None = None,
) -> Request:
    """Check every field in the order a user would fix them and return the `Request`; one `InvalidInput` otherwise.

    None means the server's default (`rules`) for guidance, size, steps and sampler. `check_prompt` is a server's
    own policy on the user's prompt (a word filter): it sees the cleaned prompt only, never the style's template or
    the negative prompt, and raises InvalidInput to refuse. LoRAs come from A1111's tags in the prompt and from
    `loras`, a list of [name, weight] or [name, text-encoder weight, UNet weight]. `init_image` (and `mask_image`,
    white = repaint): a file path, bytes or a PIL image (image_inputs.py), fitted to the size; `strength` (default
    DEFAULT_STRENGTH) only counts with a picture.
    """
    rules = rules or RequestRules()
    text = clean_text(prompt, field="prompt")
    if not text:
        raise InvalidInput("Please enter a prompt.")
    negative = clean_text(negative_prompt, field="negative prompt")
    style_name = check_style(style, rules.styles)
    if check_prompt is not None:
        check_prompt(text)
    guidance = check_guidance(rules.guidance_scale if guidance_scale is None else guidance_scale)
    resolved_seed = resolve_seed(seed, randomize=bool(randomize_seed))
    height, width = _size(size, rules.sizes)
    checked_steps = check_steps(rules.steps if steps is None else steps)
    sampler = rules.sampler if sampler is None else sampler
    sampler_name = None if sampler is None else check_choice(sampler, SAMPLER_NAMES, "sampler")
    guided_part, interval = check_cfg_end(cfg_end), check_deepcache(deepcache)
    if not rules.levers and (guided_part, interval) != (DEFAULT_CFG_END, DEFAULT_DEEPCACHE):
        raise InvalidInput("This server runs every step whole and guided (started with --no-speed-levers): "
                           "cfg_end and deepcache must be 1.")  # fmt: skip
    if not rules.cfg:  # the guidance-free program reads neither (the page hides both, the API says so)
        negative, guidance, guided_part = "", 0.0, DEFAULT_CFG_END
    chosen = _loras(text, loras, rules.loras)
    pictures = prepare_image_inputs(
        init_image, mask_image, DEFAULT_STRENGTH if strength is None else strength, height=height, width=width,
        steps=checked_steps,
    )  # fmt: skip
    template = rules.styles[style_name]
    styled, styled_negative = apply_style(template, text, negative) if isinstance(template, Style) else (text, negative)
    if not rules.cfg:
        styled_negative = ""
    tagged = {name.lower() for name, *_ in _tags(text)}
    written = " ".join([styled, *(_tag(choice) for choice in chosen if choice[0].lower() not in tagged)])
    return Request(
        prompt=text,
        negative_prompt=negative,
        style=style_name,
        seed=resolved_seed,
        guidance_scale=guidance,
        size=(height, width),
        steps=checked_steps,
        sampler=sampler_name,
        cfg_end=guided_part,
        deepcache=interval,
        loras=chosen,
        init_image=None if pictures is None else _png(pictures.pixels),
        mask_image=None if pictures is None or pictures.repaint is None else _png(pictures.repaint * np.uint8(255)),
        strength=1.0 if pictures is None else pictures.strength,
        styled_prompt=" ".join(LORA_TAG.sub(" ", styled).split()),
        styled_negative_prompt=" ".join(styled_negative.split()),
        written_prompt=" ".join(written.split()),
    )


def _png(array: np.ndarray) -> bytes:
    """An image array as PNG bytes (compression level 1: fast, lossless)."""
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def _tags(text: str) -> list[tuple[str, float, float]]:
    """The LoRAs A1111's tags in `text` ask for: (name as written, text-encoder weight, UNet weight)."""
    found = []
    for match in LORA_TAG.finditer(text):
        name, first, second = match.group(1).strip(), match.group(2), match.group(3)
        te = _weight(first, name, "te") if first not in (None, "") else 1.0
        unet = _weight(second, name, "unet") if second not in (None, "") else te
        found.append((name, te, unet))
    return found


def _weight(text: object, name: str, prefix: str = "") -> float:
    """A LoRA weight from a tag's text ("0.8", "te=0.8") or an API number; one sentence when it is not one."""
    value = text
    if isinstance(text, str):
        value = text.strip()
        if prefix and value.lower().startswith(f"{prefix}="):
            value = value[len(prefix) + 1 :]
        try:
            value = float(value)
        except ValueError:
            value = text
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)) or not (
        -LORA_WEIGHT_LIMIT <= float(value) <= LORA_WEIGHT_LIMIT
    ):  # fmt: skip
        raise InvalidInput(
            f"The weight of LoRA {_quote(name)} must be a number from {-LORA_WEIGHT_LIMIT:g} to "
            f"{LORA_WEIGHT_LIMIT:g}; got {_quote(text)}."
        )
    return float(value)


def _loras(text: str, explicit: object, offered: tuple[str, ...]) -> tuple[tuple[str, float, float], ...]:
    """The request's LoRAs: the prompt's tags, then `explicit` ([name, weight] or [name, te, unet] items)."""
    asked = _tags(text)
    if explicit not in (None, "", [], ()):
        if not isinstance(explicit, list | tuple):
            raise InvalidInput("loras must be a list of [name, weight] pairs, e.g. [[\"my-style\", 0.8]].")
        for item in explicit:
            if not isinstance(item, list | tuple) or len(item) not in (2, 3) or not isinstance(item[0], str):
                raise InvalidInput(f"Each item of loras must be [name, weight] or [name, te, unet]; got {_quote(item)}."
                                   )  # fmt: skip
            name = item[0].strip()
            if not name:  # an unused row of the page's picker
                continue
            te = _weight(item[1], name)
            asked.append((name, te, _weight(item[2], name) if len(item) == 3 else te))
    if not asked:
        return ()
    if not offered:
        raise InvalidInput("No LoRAs are offered (they come from --lora-dir DIR).")
    by_name = {name.lower(): name for name in offered}
    chosen = []
    for name, te, unet in asked:
        if name.lower() not in by_name:
            raise InvalidInput(f"Unknown LoRA {_quote(name)}; the LoRAs offered: {', '.join(offered)}.")
        if any(existing == by_name[name.lower()] for existing, _, _ in chosen):
            raise InvalidInput(f"LoRA {_quote(name)} is asked for twice; give it once, with one weight.")
        chosen.append((by_name[name.lower()], te, unet))
    if len(chosen) > MAX_LORAS:
        raise InvalidInput(f"At most {MAX_LORAS} LoRAs at once; got {len(chosen)}.")
    return tuple(chosen)


def _tag(choice: tuple[str, float, float]) -> str:
    """A1111's tag for a LoRA given through `loras` (the parameters then read back with the same LoRAs)."""
    name, te, unet = choice
    return f"<lora:{name}:{te:g}>" if te == unet else f"<lora:{name}:{te:g}:{unet:g}>"


def _quote(value: object) -> str:
    """A user value for a message: text in quotes, anything else as written; at most 40 characters."""
    text = " ".join((value if isinstance(value, str) else repr(value)).split())
    text = text[:39] + "…" if len(text) > 40 else text
    return f"'{text}'" if isinstance(value, str) else text


def _size(size: object, sizes: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """(height, width) of a request: None = the default size; text = 'WxH' or the page's label; else a pair."""
    if size is None or isinstance(size, str):
        return check_size(size, sizes)
    height, width = size if isinstance(size, tuple | list) and len(size) == 2 else (size, None)
    check_shape(height, width, sizes)
    return int(height), int(width)
