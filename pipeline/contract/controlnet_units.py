"""A request's ControlNet units: which ControlNet, its control map, weight, window and preprocessor.

Each unit is checked once at the request's edge and kept as data: the map is preprocessed (`canny`) and fitted to
the request's size there, so the engine, the followers and the engine service receive the finished map as PNG and
nothing runs twice. Weight and window become one number per step and ControlNet (`step_scales`: diffusers'
`controlnet_keep` x `controlnet_conditioning_scale`), an argument of the compiled step: nothing compiles per request.

Canny is OpenCV's `cv2.Canny` (opencv-python-headless): the map SDXL's canny ControlNets were trained on and what
A1111's ControlNet extension and diffusers' docs compute (scikit-image's `feature.canny` smooths first and thresholds
differently, so its maps differ from the ones the models expect). Tile is A1111's `tile_resample`: the picture shrunk
by a rate and brought back to size, a blurred copy. The other union types' preprocessors (openpose, depth, hed, ...)
need models no offline package provides: their maps are given as pictures (`none`).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

import numpy as np
from PIL import Image

from .errors import InvalidInput
from .fields import echo
from .image_inputs import fit, open_image, to_rgb

#: ControlNets one request may use at once (each one is a ControlNet call per step).
MAX_CONTROLNETS = 2
PREPROCESSORS = ("none", "canny", "tile")
CANNY_LOW, CANNY_HIGH = 100, 200  # A1111's and diffusers' docs' defaults
TILE_RATE, TILE_MAX_RATE = 1.0, 8.0  # A1111's tile_resample "Down Sampling Rate": its default and its slider's end
#: A ControlNet Union's (xinsir's ProMax) control types -> its task index (xinsir's model card, diffusers' docs).
CONTROL_TYPES = {
    "openpose": 0,
    "depth": 1,
    "hed": 2,
    "pidi": 2,
    "scribble": 2,
    "ted": 2,
    "softedge": 2,
    "canny": 3,
    "lineart": 3,
    "anime_lineart": 3,
    "mlsd": 3,
    "normal": 4,
    "segment": 5,
    "tile": 6,
    "repaint": 7,
}
#: sd-webui-controlnet's `union_control_type` names (lower case, "_" for " ") that differ from the above.
A1111_CONTROL_TYPES = {
    "soft_edge": "softedge",
    "hard_edge": "canny",
    "normal_map": "normal",
    "segmentation": "segment",
    "inpaint": "repaint",
    "unknown": "",
}


@dataclass(frozen=True)
class ControlUnit:
    """One ControlNet of a request, checked: the map is final (preprocessed, fitted to the request's size)."""

    name: str  # one of the server's ControlNets
    image: bytes  # PNG of the control map, uint8 RGB at the request's size
    weight: float = 1.0  # A1111's "Control Weight", diffusers' controlnet_conditioning_scale: 0..2
    start: float = 0.0  # first fraction of the steps it acts on (control_guidance_start)
    end: float = 1.0  # last fraction (control_guidance_end)
    module: str = "none"  # the preprocessor that made the map from the given picture
    low: int = CANNY_LOW  # canny's thresholds (module "canny")
    high: int = CANNY_HIGH
    control_type: str = ""  # a union ControlNet's condition type (CONTROL_TYPES); "" for a plain ControlNet
    rate: float = TILE_RATE  # tile's down-sampling rate (module "tile")

    def to_dict(self) -> dict:
        return {**asdict(self), "image": base64.b64encode(self.image).decode("ascii")}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ControlUnit:
        return cls(**{**data, "image": base64.b64decode(data["image"])})

    def pixels(self) -> np.ndarray:
        """The map: uint8 [H, W, 3]."""
        return np.asarray(Image.open(io.BytesIO(self.image)).convert("RGB"))


def canny(pixels: np.ndarray, low: int, high: int) -> np.ndarray:
    """OpenCV's Canny edges of an RGB picture as a white-on-black RGB map: uint8 [H, W, 3]."""
    import cv2  # optional: canny only; the engine's packages alone (pipeline/installed.py) lack it

    edges = cv2.Canny(np.ascontiguousarray(pixels), low, high)  # [H, W] 0/255
    return np.repeat(edges[:, :, None], 3, axis=2)


def tile(pixels: np.ndarray, rate: float) -> np.ndarray:
    """A1111's `tile_resample`: the picture shrunk by `rate` (OpenCV's area filter), then brought back to its size
    (bicubic, as the extension resizes a map and xinsir's tile example does): a blurred copy for a tile ControlNet."""
    import cv2  # optional: tile only; the engine's packages alone (pipeline/installed.py) lack it

    height, width = pixels.shape[:2]
    if rate < 1.1:  # A1111 returns the picture as it is below 1.1
        return pixels
    small = cv2.resize(pixels, (max(1, int(width / rate)), max(1, int(height / rate))), interpolation=cv2.INTER_AREA)
    return cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)


def preprocess(
    pixels: np.ndarray, module: str, low: int = CANNY_LOW, high: int = CANNY_HIGH, rate: float = TILE_RATE
) -> np.ndarray:
    """The control map a preprocessor makes of a picture (uint8 [H, W, 3]); "none": the picture is the map."""
    if module == "tile":
        return tile(pixels, rate)
    return canny(pixels, low, high) if module == "canny" else pixels


def number_field(item: Mapping, key: str, default: float, low: float, high: float, name: str) -> float:
    """`item[key]` (None or absent: `default`), a number in [low, high]; else InvalidInput naming it as `name`."""
    value = item.get(key, default)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= float(value) <= high:
        raise InvalidInput(f"{name} must be a number between {low:g} and {high:g}; got {echo(value)}.")
    return float(value)


def _number(item: Mapping, key: str, default: float, low: float, high: float, called: str) -> float:
    return number_field(item, key, default, low, high, f"ControlNet {called}")


def image_source(value: object, what: str = "A ControlNet image") -> object:
    """A unit's image as `open_image` takes it. Text is base64 (a `data:` URL or bare, as A1111's API sends
    images), never a path: a request must not read the server's files. Python callers may pass a `pathlib.Path`,
    bytes, a PIL image or an array. `what` names the image in the sentence that refuses it."""
    refusal = f"{what} must be a picture's bytes in base64 (or a data: URL)."
    if isinstance(value, str):
        text = value.split(",", 1)[1] if value.startswith("data:") else value
        try:
            return base64.b64decode(text, validate=True)
        except ValueError:
            raise InvalidInput(refusal) from None
    if isinstance(value, Mapping):
        raise InvalidInput(refusal)
    return value


def control_type_of(item: Mapping, name: str, module: str, unions: tuple[str, ...]) -> str:
    """A unit's `control_type`: required of a union ControlNet (canny's map says canny by itself), refused for a
    plain one; sd-webui-controlnet's names ("Hard Edge", "Normal Map", "Tile") taken in any case."""
    given = str(item.get("control_type") or "").strip().lower().replace(" ", "_")
    given = A1111_CONTROL_TYPES.get(given, given)
    if name not in unions:
        if given:
            raise InvalidInput(f"ControlNet {name} is not a union model: it takes no control_type ({echo(given)}).")
        return ""
    given = given or (module if module in CONTROL_TYPES else "")
    choices = ", ".join(CONTROL_TYPES)
    if not given:
        raise InvalidInput(f"ControlNet {name} is a union model: give each unit a control_type, one of: {choices}.")
    if given not in CONTROL_TYPES:
        raise InvalidInput(f"Unknown control type {echo(given)}; choose one of: {choices}.")
    return given


def parse_unit(
    item: object, offered: tuple[str, ...], height: int, width: int, unions: tuple[str, ...] = ()
) -> ControlUnit:
    """One `{name, image, weight, start, end, preprocessor, low, high, rate, control_type}` checked into a ControlUnit
    (`unions`: the offered ControlNets that are union models)."""
    if not isinstance(item, Mapping):
        raise InvalidInput(f"Each item of controlnets must be an object with name and image; got {echo(item)}.")
    name = item.get("name") or (offered[0] if len(offered) == 1 else None)
    if not offered:
        raise InvalidInput("This server has no ControlNet (start it with --controlnet PATH).")
    if name not in offered:
        raise InvalidInput(f"Unknown ControlNet {echo(name)}; choose one of: {', '.join(offered)}.")
    if item.get("image") is None:
        raise InvalidInput(f"ControlNet {name} needs a control image.")
    module = str(item.get("preprocessor") or item.get("module") or "none").strip().lower()
    if module not in PREPROCESSORS:
        choices = ", ".join(PREPROCESSORS)
        raise InvalidInput(f"Unknown ControlNet preprocessor {echo(module)}; choose one of: {choices}.")
    weight = _number(item, "weight", 1.0, 0.0, 2.0, "weight")
    start = _number(item, "start", 0.0, 0.0, 1.0, "start")
    end = _number(item, "end", 1.0, 0.0, 1.0, "end")
    if start >= end:
        raise InvalidInput(f"ControlNet start ({start:g}) must be below its end ({end:g}).")
    control_type = control_type_of(item, name, module, unions)
    low = int(_number(item, "low", CANNY_LOW, 1, 255, "low threshold"))
    high = int(_number(item, "high", CANNY_HIGH, 1, 255, "high threshold"))
    rate = _number(item, "rate", TILE_RATE, TILE_RATE, TILE_MAX_RATE, "tile down-sampling rate")
    picture = fit(
        to_rgb(open_image(image_source(item["image"]), what="control image"), what="control image"), height, width
    )
    control_map = preprocess(np.asarray(picture), module, low, high, rate)
    buffer = io.BytesIO()
    Image.fromarray(control_map).save(buffer, format="PNG", compress_level=1)
    return ControlUnit(name, buffer.getvalue(), weight, start, end, module, low, high, control_type, rate)


def parse_controls(
    value: object,
    offered: tuple[str, ...],
    height: int,
    width: int,
    most: int = MAX_CONTROLNETS,
    unions: tuple[str, ...] = (),
) -> tuple[ControlUnit, ...]:
    """The request's `controlnets` (None or a list of up to `most` units: the server's --controlnet-units), each
    checked; units naming one union ControlNet run as one forward with several conditions."""
    if value is None or value == []:
        return ()
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise InvalidInput("controlnets must be a list of {name, image, weight, start, end, preprocessor} objects.")
    if len(value) > most:
        raise InvalidInput(
            f"At most {most} ControlNet{'s' if most > 1 else ''} per request on this server; got {len(value)}."
        )
    return tuple(parse_unit(item, offered, height, width, unions) for item in value)


def sent_maps(value: object) -> tuple[object, tuple[str | None, ...]]:
    """`controlnets` as `Request.to_dict()` sends them (an engine service's body) -> (the items to check, as
    `parse_controls` takes them; each item's module to record, None for an item to preprocess).

    A unit naming its `module` holds the finished map that module made where the request entered: it is checked like
    any input but not preprocessed again (a canny map edged twice loses its lines), and `with_modules` gives it its
    module back for the record. A unit naming a `preprocessor` instead (a hand-written body) is a picture."""
    items = [value] if isinstance(value, Mapping) else value
    if not isinstance(items, (list, tuple)):
        return value, ()
    modules = tuple(
        str(item["module"] or "none").strip().lower()
        if isinstance(item, Mapping) and "module" in item and "preprocessor" not in item
        else None
        for item in items
    )
    for module in modules:
        if module is not None and module not in PREPROCESSORS:
            choices = ", ".join(PREPROCESSORS)
            raise InvalidInput(f"Unknown ControlNet preprocessor {echo(module)}; choose one of: {choices}.")
    as_maps = [{**item, "module": "none"} if module else item for item, module in zip(items, modules, strict=True)]
    return as_maps, modules


def with_modules(units: tuple[ControlUnit, ...], modules: tuple[str | None, ...]) -> tuple[ControlUnit, ...]:
    """The checked units of `sent_maps`' items, each finished map with the module that made it."""
    if not any(modules):
        return units
    return tuple(replace(unit, module=module) if module else unit for unit, module in zip(units, modules, strict=True))


def step_scales(units: tuple[ControlUnit, ...], steps: int) -> np.ndarray:
    """Per step, each unit's scale: its weight where the step lies in its window, else 0 (diffusers'
    `controlnet_keep`: step i of n acts unless i/n < start or (i+1)/n > end). float32 [steps, len(units)]."""
    scales = np.zeros((steps, len(units)), np.float32)
    for column, unit in enumerate(units):
        scales[acting_steps(unit.start, unit.end, steps), column] = unit.weight
    return scales


def acting_steps(start: float, end: float, steps: int) -> np.ndarray:
    """Which of `steps` a window [start, end] acts on: step i unless i/n < start or (i+1)/n > end (diffusers'
    `controlnet_keep`). bool [steps]."""
    return np.array([not (i / steps < start or (i + 1) / steps > end) for i in range(steps)], bool)


def from_a1111(args: object) -> list[dict]:
    """sd-webui-controlnet's `alwayson_scripts.controlnet.args` -> `controlnets` units (for an A1111-shaped API).

    Each arg: `image` (base64, or {"image": base64} as older clients send), `module`, `model` (its " [hash]" suffix
    dropped), `weight`, `guidance_start`, `guidance_end`, `threshold_a`/`threshold_b` (canny's; `tile_resample`'s
    rate), `union_control_type` (a union model's: "Hard Edge", "Tile", ...; or `control_type`), `enabled` (False:
    skipped). What the engine cannot run (another module, a third unit) is refused by `parse_controls`."""
    if not isinstance(args, (list, tuple)):
        raise InvalidInput("alwayson_scripts.controlnet.args must be a list of ControlNet units.")
    units = []
    for arg in args:
        if not isinstance(arg, Mapping):
            raise InvalidInput(f"Each ControlNet unit must be an object; got {echo(arg)}.")
        if arg.get("enabled", True) is False:
            continue
        image = arg.get("image") or arg.get("input_image")
        image = image.get("image") if isinstance(image, Mapping) else image
        unit = {
            "name": str(arg.get("model") or "").split(" [")[0].strip() or None,
            "image": image,
            "weight": arg.get("weight"),
            "start": arg.get("guidance_start"),
            "end": arg.get("guidance_end"),
            "preprocessor": arg.get("module"),
            "control_type": arg.get("union_control_type") or arg.get("control_type"),
        }
        if str(arg.get("module", "")).lower() == "canny":
            unit.update(low=arg.get("threshold_a"), high=arg.get("threshold_b"))
        if str(arg.get("module", "")).lower() in ("tile_resample", "tile"):  # its threshold_a: the rate (-1: default)
            rate = arg.get("threshold_a")
            unit.update(preprocessor="tile", rate=rate if isinstance(rate, (int, float)) and rate >= 1 else None)
        units.append({key: value for key, value in unit.items() if value is not None})
    return units
