"""Samplers and schedule types by A1111's names, and which combinations make sense: what users, the field table, the
presets and the engine's sampler plans share.

A1111 (1.9 and later), Forge and ComfyUI pick a sampler and a schedule type apart ("DPM++ 2M" + "Karras"); A1111's
older combined names ("DPM++ 2M Karras") are still taken. Each name maps to the diffusers PyTorch scheduler A1111's
names map to (`host/planning/sampler_plan.py` computes it); a schedule type is a scheduler option: `use_karras_sigmas`,
`use_exponential_sigmas`, or `timestep_spacing="trailing"` (SGM Uniform); "Automatic" keeps the checkpoint's own.
Kept free of JAX and numpy (the page and the presets import it).
"""

from __future__ import annotations

from .errors import InvalidInput

#: A1111's sampler names (what the page, the API and the CLI take) -> the ids used here. The combined names at the
#: end are A1111's older ones: a sampler with its schedule type.
SAMPLER_NAMES = {
    "Euler": "euler",
    "Euler a": "euler_ancestral",
    "DPM++ 2M": "dpmpp_2m",
    "DPM++ 2M Karras": "dpmpp_2m_karras",
    "DPM++ 2M SDE": "dpmpp_2m_sde",
    "UniPC": "unipc",
    "DDIM": "ddim",
    "Heun": "heun",
    "LMS": "lms",
    "LCM": "lcm",
    "DPM++ 2M SDE Karras": "dpmpp_2m_sde_karras",
    "DPM++ 2M SDE Exponential": "dpmpp_2m_sde_exponential",
    "LMS Karras": "lms_karras",
}
SAMPLERS = tuple(SAMPLER_NAMES.values())
#: A1111's schedule types: "Automatic" = the checkpoint's own (its spacing, no Karras or exponential sigmas).
SCHEDULE_TYPES = ("Automatic", "Karras", "Exponential", "SGM Uniform")
AUTOMATIC = "Automatic"
#: A combined name's parts: its base sampler and its schedule type.
COMBINED = {
    "dpmpp_2m_karras": ("dpmpp_2m", "Karras"),
    "dpmpp_2m_sde_karras": ("dpmpp_2m_sde", "Karras"),
    "dpmpp_2m_sde_exponential": ("dpmpp_2m_sde", "Exponential"),
    "lms_karras": ("lms", "Karras"),
}
#: The schedule types each base sampler's diffusers scheduler has (the others are refused).
SCHEDULES_OF = {
    "euler": SCHEDULE_TYPES,
    "euler_ancestral": (AUTOMATIC, "SGM Uniform"),  # EulerAncestralDiscreteScheduler has no Karras/exponential
    "dpmpp_2m": SCHEDULE_TYPES,
    "dpmpp_2m_sde": SCHEDULE_TYPES,
    "unipc": SCHEDULE_TYPES,
    "ddim": (AUTOMATIC, "SGM Uniform"),  # DDIMScheduler: timesteps only
    "heun": SCHEDULE_TYPES,
    "lms": SCHEDULE_TYPES,
    "lcm": (AUTOMATIC,),  # LCMScheduler: its own timesteps (skipping over 50 original steps)
}
SPACINGS = ("leading", "linspace", "trailing")
PREDICTION_TYPES = ("epsilon", "v_prediction")
#: LCM's timesteps are picked among its 50 original ones (LCMScheduler's original_inference_steps).
LCM_MAX_STEPS = 50


def sampler_id(name: str) -> str:
    """A sampler's id from its A1111 name (any case) or its id; one line listing the names otherwise."""
    text = str(name).strip()
    if text in SAMPLERS:
        return text
    for label, ident in SAMPLER_NAMES.items():
        if text.lower() == label.lower():
            return ident
    raise InvalidInput(f"Unknown sampler {name!r}; choose one of: {', '.join(SAMPLER_NAMES)}.")


def sampler_label(sampler: str, prediction_type: str = "epsilon") -> str:
    """A1111's name of a sampler id, e.g. "DPM++ 2M Karras" (+ ", v-prediction" where it applies)."""
    name = next(label for label, ident in SAMPLER_NAMES.items() if ident == sampler_id(sampler))
    return name + (", v-prediction" if prediction_type == "v_prediction" else "")


def schedule_type(name: str | None) -> str:
    """A schedule type as A1111 spells it (any case; None: Automatic), or one sentence listing them."""
    if name is None:
        return AUTOMATIC
    for option in SCHEDULE_TYPES:
        if str(name).strip().lower() == option.lower():
            return option
    raise InvalidInput(f"Unknown schedule type {name!r}; choose one of: {', '.join(SCHEDULE_TYPES)}.")


def resolve(sampler: str, schedule: str | None = None) -> tuple[str, str]:
    """(base sampler id, schedule type) of a sampler and a schedule type; a combination that makes no sense (a
    combined name with another schedule type, or a schedule type the sampler's scheduler does not have) is refused
    in one sentence."""
    ident, schedule = sampler_id(sampler), schedule_type(schedule)
    if ident in COMBINED:
        base, own = COMBINED[ident]
        if schedule not in (AUTOMATIC, own):
            raise InvalidInput(
                f"{sampler_label(ident)} already has the {own} schedule type; pick "
                f"{sampler_label(base)} to use {schedule}."
            )
        return base, own
    if schedule not in SCHEDULES_OF[ident]:
        allowed = " or ".join(SCHEDULES_OF[ident])
        raise InvalidInput(f"{sampler_label(ident)} has no {schedule} schedule type; choose {allowed}.")
    return ident, schedule


def check_steps(sampler: str, steps: int) -> None:
    """Steps a sampler cannot run, in one sentence (LCM picks its timesteps among 50)."""
    if sampler_id(sampler) == "lcm" and steps > LCM_MAX_STEPS:
        raise InvalidInput(f"LCM runs at most {LCM_MAX_STEPS} steps; got {steps}.")
