"""The X/Y/Z plot (A1111's most used script, built in): up to three axes, each a setting and its values, and every
cell of the plot one ordinary request with those values.

    plot = Plot.of(x="Steps: 4,6", y="CFG Scale: 3,5")          # the CLI's and the page's spelling
    plot = Plot.of_script_args([4, "4,6", [], 6, "3,5", ...])    # A1111 1.10's API: `script_args`, axis by index
    cells = plot.cells(given, parse, model="tiny", most=64)      # every cell's request checked before any runs

An axis is named by A1111's label ("CFG Scale", "Prompt S/R", "Checkpoint name") or, through A1111's API, by its
index in A1111 1.10's txt2img list (`A1111_AXES`); the axes A1111 has no entry for (LoRA weight, ControlNet weight,
Hires upscale) follow that list, as an extension's axes do. Values are A1111's: comma-separated (quoted as CSV when a
value holds a comma), numbers also as ranges: `1-5` (every whole number), `1-5 (+2)` (a step), `1-3 [3]` (a count,
evenly spaced). A plot of more cells than the server makes (`--xyz-max-cells`) is refused in one sentence before
any request is checked. The engine never sees a plot: `xyz_run.py` runs its cells as the requests they are.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidInput
from .fields import FIELD, echo
from .request import LORA_TAG, Request

#: A1111 1.10's txt2img axes, in its order (scripts/xyz_grid.py's `axis_options` without the img2img-only ones):
#: the API's `script_args` name an axis by its index here.
A1111_AXES: tuple[str, ...] = (
    "Nothing",
    "Seed",
    "Var. seed",
    "Var. strength",
    "Steps",
    "Hires steps",
    "CFG Scale",
    "Prompt S/R",
    "Prompt order",
    "Sampler",
    "Hires sampler",
    "Checkpoint name",
    "Negative Guidance minimum sigma",
    "Sigma Churn",
    "Sigma min",
    "Sigma max",
    "Sigma noise",
    "Schedule type",
    "Schedule min sigma",
    "Schedule max sigma",
    "Schedule rho",
    "Skip Early CFG",
    "Beta schedule alpha",
    "Beta schedule beta",
    "Eta",
    "Clip skip",
    "Denoising",
    "Initial noise multiplier",
    "Extra noise",
    "Hires upscaler",
    "VAE",
    "Styles",
    "UniPC Order",
    "Face restore",
    "Token merging ratio",
    "Token merging ratio high-res",
    "Always discard next-to-last sigma",
    "SGM noise multiplier",
    "Refiner checkpoint",
    "Refiner switch at",
    "RNG source",
    "FP8 mode",
    "Size",
)
#: The axes this server adds where A1111 has none (its LoRA and ControlNet weights are extensions' or prompt edits):
#: their indices follow A1111's list.
OWN_AXES: tuple[str, ...] = ("LoRA weight", "ControlNet weight", "Hires upscale")
#: A1111's `script_args` for the X/Y/Z plot, in 1.10's order (`Script.ui`'s return, `Script.run`'s parameters).
SCRIPT_ARGS: tuple[str, ...] = (
    "x_type",
    "x_values",
    "x_values_dropdown",
    "y_type",
    "y_values",
    "y_values_dropdown",
    "z_type",
    "z_values",
    "z_values_dropdown",
    "draw_legend",
    "include_lone_images",
    "include_sub_grids",
    "no_fixed_seeds",
    "vary_seeds_x",
    "vary_seeds_y",
    "vary_seeds_z",
    "margin_size",
    "csv_mode",
)
#: The script's name in A1111's API (`script_name`, any case).
SCRIPT_NAME = "x/y/z plot"
#: Cells a plot may have unless the server says otherwise (`--xyz-max-cells`).
MAX_CELLS = 64
#: The letters of the three axes, in order.
LETTERS = ("X", "Y", "Z")

Given = dict[str, Any]  # a request's fields as `parse_request` takes them (the entry point's own spelling)


@dataclass(frozen=True)
class Axis:
    """One kind of axis: how its values are read and how a value sets a cell's fields."""

    label: str  # A1111's label (this server's own where A1111 has none)
    kind: type  # int, float or str: numbers take ranges
    apply: Callable[[Given, Any, Sequence[Any], Mapping[str, Any]], None]  # (fields, value, all values, context)
    named: bool = True  # the grid says "Steps: 4" (A1111's format_value_add_label); False: the value alone

    def text(self, value: Any) -> str:
        """The value as the grid's label says it (A1111 rounds floats to 8 places)."""
        shown = f"{round(value, 8):g}" if isinstance(value, float) else str(value)
        return f"{self.label}: {shown}" if self.named else shown


def _field(name: str) -> Callable[[Given, Any, Sequence[Any], Mapping[str, Any]], None]:
    def apply(given: Given, value: Any, values: Sequence[Any], context: Mapping[str, Any]) -> None:
        given[name] = value

    return apply


def _seed(given: Given, value: int, values: Sequence[Any], context: Mapping[str, Any]) -> None:
    given.update(seed=value, randomize_seed=False)


def _prompt_sr(given: Given, value: str, values: Sequence[Any], context: Mapping[str, Any]) -> None:
    """A1111's Prompt S/R: the first value, searched in the prompt and the negative prompt, replaced by this one."""
    search = values[0]
    prompt, negative = str(given.get("prompt") or ""), str(given.get("negative_prompt") or "")
    if search not in prompt and search not in negative:
        raise InvalidInput(f"Prompt S/R did not find {echo(search)} in the prompt or the negative prompt.")
    given.update(prompt=prompt.replace(search, value), negative_prompt=negative.replace(search, value))


def _checkpoint(given: Given, value: str, values: Sequence[Any], context: Mapping[str, Any]) -> None:
    """A checkpoint the server has loaded (its one model): a plot compares settings, never loads weights."""
    model = str(context.get("model") or "")
    if value.strip().split(" [")[0] != model:
        raise InvalidInput(f"Checkpoint {echo(value)} is not loaded; this server serves '{model}' only.")


def _lora_weight(given: Given, value: float, values: Sequence[Any], context: Mapping[str, Any]) -> None:
    """Every LoRA the request names (its prompt's tags and `loras`) at this weight, text encoders and UNet alike."""
    prompt = str(given.get("prompt") or "")
    tagged = LORA_TAG.sub(lambda match: f"<lora:{match.group(1)}:{value:g}>", prompt)
    listed = [[item[0], value, value] for item in given.get("loras") or [] if item and str(item[0]).strip()]
    if tagged == prompt and not listed:
        raise InvalidInput("The LoRA weight axis needs a LoRA in the request (a <lora:NAME:WEIGHT> tag or loras).")
    given.update(prompt=tagged, loras=listed)


def _control_weight(given: Given, value: float, values: Sequence[Any], context: Mapping[str, Any]) -> None:
    """Every ControlNet unit of the request at this weight."""
    units = given.get("controlnets")
    units = [units] if isinstance(units, Mapping) else list(units or [])
    if not units:
        raise InvalidInput("The ControlNet weight axis needs a ControlNet unit in the request.")
    given["controlnets"] = [{**unit, "weight": value} if isinstance(unit, Mapping) else unit for unit in units]


def _denoising(given: Given, value: float, values: Sequence[Any], context: Mapping[str, Any]) -> None:
    """A1111's Denoising (its `denoising_strength`): the picture's strength, else the hires fix's second pass's."""
    given["strength" if given.get("init_image") is not None else "hires_denoise"] = value


#: The axes this server plots, by A1111's label.
AXES: dict[str, Axis] = {
    axis.label: axis
    for axis in (
        Axis("Nothing", str, lambda *_: None),
        Axis("Seed", int, _seed),
        Axis("Steps", int, _field("steps")),
        Axis("CFG Scale", float, _field("guidance_scale")),
        Axis("Prompt S/R", str, _prompt_sr, named=False),
        Axis("Sampler", str, _field("sampler"), named=False),
        Axis("Checkpoint name", str, _checkpoint, named=False),
        Axis("Schedule type", str, _field("schedule_type")),
        Axis("Denoising", float, _denoising),
        Axis("Refiner switch at", float, _field("refiner_switch")),
        Axis("LoRA weight", float, _lora_weight),
        Axis("ControlNet weight", float, _control_weight),
        Axis("Hires upscale", float, _field("hires_scale")),
    )
}
#: Other spellings taken for an axis (the issue's words, the ControlNet extension's label), lower case.
ALIASES = {
    "checkpoint": "Checkpoint name",
    "refiner switch": "Refiner switch at",
    "[controlnet] weight": "ControlNet weight",
    "cfg": "CFG Scale",
    "guidance scale": "CFG Scale",
}


def offered_axes() -> str:
    """The axes a plot takes, as a refusal lists them."""
    return ", ".join(label for label in AXES if label != "Nothing")


def axis_named(name: object) -> Axis:
    """The axis `name` says: A1111's label (any case), an alias, or an index into A1111's list then ours (the API)."""
    if isinstance(name, bool):
        raise InvalidInput(f"Unknown X/Y/Z plot axis {echo(name)}; the axes: {offered_axes()}.")
    if isinstance(name, int | float) and float(name).is_integer():
        labels = A1111_AXES + OWN_AXES
        if not 0 <= int(name) < len(labels):
            raise InvalidInput(f"X/Y/Z plot axis {int(name)} is not one of A1111's 0 to {len(labels) - 1}.")
        name = labels[int(name)]
    text = str(name).strip()
    by_lower = {label.lower(): label for label in AXES} | ALIASES
    if text.lower() in by_lower:
        return AXES[by_lower[text.lower()]]
    if text in A1111_AXES:
        raise InvalidInput(f"The X/Y/Z plot axis {echo(text)} is not offered here; the axes: {offered_axes()}.")
    raise InvalidInput(f"Unknown X/Y/Z plot axis {echo(text)}; the axes: {offered_axes()}.")


# A1111's ranges (scripts/xyz_grid.py): `1-5`, `1-5 (+2)` and `1-3 [3]`, whole numbers or decimals.
_NUMBER = r"[+-]?\s*\d+(?:\.\d*)?"
_STEP_RANGE = re.compile(rf"\s*({_NUMBER})\s*-\s*({_NUMBER})(?:\s*\(([+-]\d+(?:\.\d*)?)\s*\))?\s*")
_COUNT_RANGE = re.compile(rf"\s*({_NUMBER})\s*-\s*({_NUMBER})\s*\[(\d+)\s*\]\s*")


def split_values(text: str) -> list[str]:
    """A1111's value list: comma-separated, a value with a comma in CSV quotes, each stripped; blanks left out."""
    rows = csv.reader(io.StringIO(text), skipinitialspace=True)
    return [value.strip() for row in rows for value in row if value.strip()]


def read_values(axis: Axis, text: object, most: int) -> list[Any]:
    """The values an axis's text gives, ranges expanded; no more than `most` (a range is counted before it is made)."""
    items = [str(item) for item in text] if isinstance(text, list | tuple) else split_values(str(text or ""))
    values: list[Any] = []
    for item in items:
        values += _expanded(axis, item, most - len(values)) if axis.kind is not str else [item]
        if len(values) > most:
            raise _too_many(len(values), most)
    if not values:
        raise InvalidInput(f"The X/Y/Z plot axis {axis.label} has no values; give them as 'a, b, c'.")
    return values


def _expanded(axis: Axis, item: str, room: int) -> list[Any]:
    """One value, or the numbers its range gives (A1111's rules: a step range includes its end, a count range is
    evenly spaced, whole numbers truncated)."""
    number = int if axis.kind is int else float
    if step_range := _STEP_RANGE.fullmatch(item):
        start, end = (float(step_range.group(i).replace(" ", "")) for i in (1, 2))
        step = float(step_range.group(3)) if step_range.group(3) else 1.0
        count = math.floor((end - start) / step) + 1 if step else -1
        if step == 0 or count < 1:
            raise InvalidInput(f"The range {echo(item)} of {axis.label} gives no values.")
        if count > room:
            raise _too_many(count, room)
        values = [start + i * step for i in range(count)]
    elif count_range := _COUNT_RANGE.fullmatch(item):
        start, end = (float(count_range.group(i).replace(" ", "")) for i in (1, 2))
        count = int(count_range.group(3))
        if count > room:
            raise _too_many(count, room)
        values = np.linspace(start, end, count).tolist()
    else:
        try:
            return [number(item)]
        except ValueError:
            raise InvalidInput(f"{axis.label} takes numbers; got {echo(item)}.") from None
    return [int(value) if number is int else round(value, 8) for value in values]


def _too_many(count: int, most: int) -> InvalidInput:
    return InvalidInput(
        f"The X/Y/Z plot would have at least {count} cells; this server makes at most {most} (--xyz-max-cells)."
    )


@dataclass(frozen=True)
class PlotAxis:
    """One axis of a plot: its kind, its values, and the text they were given as (what `parameters` records)."""

    axis: Axis
    values: tuple[Any, ...]
    text: str

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.axis.text(value) for value in self.values)


NOTHING = PlotAxis(AXES["Nothing"], ("",), "")


@dataclass(frozen=True)
class Cell:
    """One cell of a plot: where it stands, its values' labels, and the request it is."""

    position: tuple[int, int, int]  # (x, y, z) indices
    labels: tuple[str, str, str]  # each axis's label of its value ("" for an axis left out)
    request: Request

    @property
    def where(self) -> str:
        """The cell as a sentence names it: "Steps: 4, CFG Scale: 3"."""
        return ", ".join(label for label in self.labels if label)


@dataclass(frozen=True)
class Plot:
    """Up to three axes (X across, Y down, one grid per Z value)."""

    x: PlotAxis = NOTHING
    y: PlotAxis = NOTHING
    z: PlotAxis = NOTHING

    @property
    def axes(self) -> tuple[PlotAxis, PlotAxis, PlotAxis]:
        return self.x, self.y, self.z

    @property
    def size(self) -> int:
        return len(self.x.values) * len(self.y.values) * len(self.z.values)

    @classmethod
    def of(cls, x: str | None = None, y: str | None = None, z: str | None = None, *, most: int = MAX_CELLS) -> Plot:
        """The plot of "LABEL: values" texts (the CLI's `--xyz-x "Steps: 4,6"`); None or "" leaves an axis out."""
        pairs = []
        for letter, text in zip(LETTERS, (x, y, z), strict=True):
            if not text or not str(text).strip():
                pairs.append(("Nothing", ""))
                continue
            label, colon, values = str(text).partition(":")
            if not colon:
                raise InvalidInput(f"The plot's {letter} axis is 'LABEL: values' (as 'Steps: 4,6'); got {echo(text)}.")
            pairs.append((label, values))
        return cls.of_pairs(pairs, most=most)

    @classmethod
    def of_pairs(cls, pairs: Sequence[tuple[object, object]], *, most: int = MAX_CELLS) -> Plot:
        """The plot of (axis, values) per X, Y, Z: an axis by label or index, its values as text or a list. The
        cells are counted, and a plot past `most` refused, before any is made."""
        axes = []
        for name, values in pairs:
            axis = axis_named(name)
            if axis.label == "Nothing":
                axes.append(NOTHING)
                continue
            text = ",".join(map(str, values)) if isinstance(values, list | tuple) else str(values or "").strip()
            axes.append(PlotAxis(axis, tuple(read_values(axis, values, most)), text))
        plot = cls(*axes, *[NOTHING] * (3 - len(axes)))
        if plot.size > most:
            raise InvalidInput(
                f"The X/Y/Z plot has {plot.size} cells; this server makes at most {most} (--xyz-max-cells)."
            )
        if plot.size == 1 and all(axis is NOTHING for axis in plot.axes):
            raise InvalidInput("The X/Y/Z plot needs at least one axis, as 'Steps: 4,6'.")
        return plot

    @classmethod
    def of_script_args(cls, args: object, *, most: int = MAX_CELLS) -> Plot:
        """The plot of A1111 1.10's `script_args` (`SCRIPT_ARGS`' order): each axis's type (an index into its list,
        or a label) and its values, the text, else (a choice axis on A1111's page) the dropdown's list."""
        if not isinstance(args, list | tuple) or len(args) < 2:
            raise InvalidInput(
                "script_args for the X/Y/Z plot is A1111's list: [x_type, x_values, x_values_dropdown, y_type, ...]."
            )
        given = dict(zip(SCRIPT_ARGS, args, strict=False))
        pairs = []
        for letter in "xyz":
            values = given.get(f"{letter}_values")
            dropdown = given.get(f"{letter}_values_dropdown")
            if not (isinstance(values, str) and values.strip()) and isinstance(dropdown, list | tuple) and dropdown:
                values = list(dropdown)
            pairs.append((given.get(f"{letter}_type", 0) or 0, values))
        return cls.of_pairs(pairs, most=most)

    def cells(
        self, given: Given, parse: Callable[[Given], Request], *, model: str = "", seed: int | None = None
    ) -> list[Cell]:
        """Every cell's request, X fastest, then Y, then Z (A1111's order): `given` (the request's fields) with the
        cell's values set, X's first, checked by `parse` (the entry point's `parse_request`). A request asking for
        a random seed gets one, drawn once for the whole plot (`seed`: that one), as A1111 fixes it; a Seed axis of
        -1 draws one per value. A refused cell refuses the plot, naming the cell."""
        base = dict(given)
        if base.get("randomize_seed"):
            base.update(seed=secrets.randbelow(FIELD["seed"].high + 1) if seed is None else seed, randomize_seed=False)
        axes = [self._fixed_seeds(axis) for axis in self.axes]
        context = {"model": model}
        cells = []
        for iz, z in enumerate(axes[2].values):
            for iy, y in enumerate(axes[1].values):
                for ix, x in enumerate(axes[0].values):
                    fields = dict(base)
                    labels = tuple(
                        axis.axis.text(value) if axis is not NOTHING else ""
                        for axis, value in zip(axes, (x, y, z), strict=True)
                    )
                    cell_name = ", ".join(label for label in labels if label)
                    try:
                        for axis, value in zip(axes, (x, y, z), strict=True):
                            axis.axis.apply(fields, value, axis.values, context)
                        request = parse(fields)
                    except InvalidInput as exc:
                        raise in_cell(exc, cell_name) from None
                    cells.append(Cell((ix, iy, iz), labels, request))
        return cells

    @staticmethod
    def _fixed_seeds(axis: PlotAxis) -> PlotAxis:
        """A Seed axis's -1 values as random seeds, drawn now (A1111's fix_axis_seeds)."""
        if axis.axis.label != "Seed" or -1 not in axis.values:
            return axis
        high = FIELD["seed"].high
        values = tuple(secrets.randbelow(high + 1) if value == -1 else value for value in axis.values)
        return dataclasses.replace(axis, values=values)

    def settings(self) -> dict[str, str]:
        """What A1111 adds to a plot grid's `parameters`: "Script: X/Y/Z plot", then each axis's type and values."""
        settings = {"Script": "X/Y/Z plot"}
        for letter, axis in zip(LETTERS, self.axes, strict=True):
            if axis is not NOTHING:
                settings[f"{letter} Type"] = axis.axis.label
                settings[f"{letter} Values"] = axis.text
        return settings


def in_cell(exc: InvalidInput, where: str) -> InvalidInput:
    """A cell's refusal as the plot's: the cell named, the sentence kept (a page still says its labels)."""
    if not exc.template:
        return InvalidInput(f"The plot's cell {where} is refused: {exc}")
    return InvalidInput.naming(
        "The plot's cell {where} is refused: " + exc.template, exc.names, **{**exc.values, "where": where}
    )
