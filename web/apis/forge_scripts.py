"""Forge's built-in FreeU and perturbed-attention guidance scripts, as its API clients send them in
`alwayson_scripts`, onto the field table's `freeu` and `pag_scale`.

Forge's clients send each script by its title with its `ui()` values in order (A1111 matches titles without regard
to case): "FreeU Integrated" (older "FreeU Integrated (SD 1.x, SD 2.x, SDXL)") with [enabled, b1, b2, s1, s2,
start, end], and "PerturbedAttentionGuidance Integrated" with [enabled, scale] (later Forge adds attenuation, start
step, end step). The engine runs diffusers' FreeU and PAG on every step: Forge's step window and attenuation are not
offered, and a payload that moves them is told so in one sentence.
"""

from __future__ import annotations

from typing import Any

from pipeline.contract.errors import InvalidInput

#: Forge's titles, lower case.
FREEU_TITLES = ("freeu integrated", "freeu integrated (sd 1.x, sd 2.x, sdxl)")
PAG_TITLES = ("perturbedattentionguidance integrated", "perturbedattentionguidance integrated (sd1.x, sd2.x, sdxl)")
#: The values of Forge's step window (start, end) and PAG's attenuation that change nothing.
WHOLE_WINDOW = (0.0, 1.0)


def _args(value: object) -> list:
    """A script's values: {"args": [...]} as A1111's API takes them, or the list itself."""
    args = value.get("args") if isinstance(value, dict) else value
    return list(args) if isinstance(args, list | tuple) else []


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number; got {value!r:.40}.")
    return float(value)


def forge_scripts(scripts: dict) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the fields Forge's FreeU and PAG scripts in `scripts` set, the titles they were sent under)."""
    given: dict[str, Any] = {}
    used = []
    for title, value in scripts.items():
        name = str(title).strip().lower()
        if name not in FREEU_TITLES + PAG_TITLES:
            continue
        used.append(str(title))
        args = _args(value)
        if not args or not args[0]:  # not enabled
            continue
        if name in FREEU_TITLES:
            factors = [_number(x, "A FreeU factor") for x in args[1:5]]
            if len(args) > 5 and tuple(_number(x, "FreeU's start and end") for x in args[5:7]) != WHOLE_WINDOW:
                raise InvalidInput("FreeU runs on every step here: leave Forge's FreeU start at 0 and end at 1.")
            given["freeu"] = ",".join(f"{x:g}" for x in factors)
        else:
            if len(args) > 2 and (
                _number(args[2], "PAG's attenuation") != 0
                or tuple(_number(x, "PAG's start and end") for x in args[3:5]) not in (WHOLE_WINDOW, ())
            ):
                raise InvalidInput(
                    "PAG runs on every step at one scale here: leave Forge's attenuation at 0, its start at 0 and "
                    "its end at 1."
                )
            given["pag_scale"] = _number(args[1], "PAG's scale") if len(args) > 1 else 3.0  # Forge's default
    return given, tuple(used)
