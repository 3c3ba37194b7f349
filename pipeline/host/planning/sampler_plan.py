"""Samplers: timesteps, sigmas and per-step coefficients as diffusers' PyTorch schedulers compute them.

diffusers' Flax scheduler falls short for few-step SDXL: it refuses `trailing` spacing (SDXL-Lightning, Turbo),
always adds 1 for `leading` whatever `steps_offset` says, and truncates fractional `linspace` timesteps. So every
table is computed here on the host, per request, exactly as PyTorch's `EulerDiscreteScheduler`,
`EulerAncestralDiscreteScheduler` and `DPMSolverMultistepScheduler` (dpmsolver++, order 2, midpoint, with or without
Karras sigmas) compute theirs, and each sampler is written as per-step coefficients of one update

    x' = a·x + b·D + c·D_prev + d·noise          (D = the denoised prediction, D_prev the previous step's)

so one compiled step program serves every sampler and every step count (`plan`). Latents stay in the Euler
schedulers' "variance exploding" scale (x = x0 + sigma·noise); DPM-Solver's variance-preserving update is the same
update in that scale (its sample is x / sqrt(sigma^2 + 1), which is exactly what the UNet is fed). The step itself
runs on device in float32. Guidance follows diffusers: g <= 1 means the conditional prediction alone.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np

from ...contract.errors import InvalidInput
from ...contract.sampler_names import (
    AUTOMATIC,
    PREDICTION_TYPES,
    SAMPLERS,
    SPACINGS,
    check_steps,
    resolve,
    sampler_id,
    sampler_label,
)
from . import solvers

logger = logging.getLogger(__name__)


BETA_SCHEDULES = ("linear", "scaled_linear")
#: diffusers scheduler class -> our sampler (the checkpoint's own choice is the default).
_CLASS_SAMPLER = {
    "EulerDiscreteScheduler": "euler",
    "EulerAncestralDiscreteScheduler": "euler_ancestral",
    "DPMSolverMultistepScheduler": "dpmpp_2m",
}
#: Config options the engine cannot honour: (key, the value it must have).
_UNSUPPORTED = (
    ("use_karras_sigmas", False),
    ("use_exponential_sigmas", False),
    ("use_beta_sigmas", False),
    ("rescale_betas_zero_snr", False),
    ("timestep_type", "discrete"),
    ("final_sigmas_type", "zero"),
    ("interpolation_type", "linear"),
    ("trained_betas", None),
)


@dataclass(frozen=True)
class SamplerConfig:
    """How the denoising loop samples. Every field is static: it selects (and is baked into) the compiled program."""

    sampler: str = "euler"  # the default per request (SAMPLERS; a request may pick another): the checkpoint's
    timestep_spacing: str = "leading"  # "leading" (SDXL base), "linspace" or "trailing" (Lightning, Turbo)
    steps_offset: int = 1  # added to `leading` timesteps (SDXL base: 1)
    prediction_type: str = "epsilon"  # static: what the UNet predicts, "epsilon" or "v_prediction"
    cfg: bool = True  # static: False = guidance-free program (UNet on the conditional half only)
    num_train_timesteps: int = 1000  # the training noise schedule's length
    beta_start: float = 0.00085  # first beta of the training schedule
    beta_end: float = 0.012  # last beta
    beta_schedule: str = "scaled_linear"  # "scaled_linear" (SDXL) or "linear"
    set_alpha_to_one: bool = True  # DDIM and LCM: their final step lands on x0 (True) or on training step 0
    clip_sample: bool | None = None  # DDIM and LCM clip x0 to ±clip_sample_range (None: each one's default)
    clip_sample_range: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "sampler", sampler_id(self.sampler))
        for name, allowed in (
            ("sampler", SAMPLERS),
            ("timestep_spacing", SPACINGS),
            ("prediction_type", PREDICTION_TYPES),
            ("beta_schedule", BETA_SCHEDULES),
        ):
            if getattr(self, name) not in allowed:
                label, value = name.replace("_", " "), getattr(self, name)
                raise InvalidInput(f"Unsupported {label} {value!r}; choose one of: {', '.join(allowed)}.")
        if not isinstance(self.cfg, bool):
            raise InvalidInput(f"cfg must be true or false; got {self.cfg!r}.")
        if isinstance(self.steps_offset, bool) or not isinstance(self.steps_offset, int) or self.steps_offset < 0:
            raise InvalidInput(f"steps_offset must be a whole number >= 0; got {self.steps_offset!r}.")

    @classmethod
    def from_scheduler_config(cls, config: dict, **overrides) -> SamplerConfig:
        """A checkpoint's `scheduler_config.json` (+ overrides whose value is not None); refuses what we cannot run.

        A config written by diffusers' Flax scheduler has no `steps_offset`: that scheduler always adds 1 to
        `leading` timesteps, so 1 is what such a checkpoint was made with. PyTorch configs default to 0, as there.
        """
        class_name = str(config.get("_class_name", "EulerDiscreteScheduler"))
        is_flax = class_name.startswith("Flax")
        base = class_name.removeprefix("Flax")
        karras = base == "DPMSolverMultistepScheduler" and bool(config.get("use_karras_sigmas"))
        for key, required in _UNSUPPORTED:
            if karras and key == "use_karras_sigmas":
                continue  # DPM++ 2M Karras: a sampler this engine runs
            value = config.get(key, required)
            if value not in (required, None) or (required is None and value is not None):
                raise InvalidInput(
                    f"The checkpoint's scheduler sets {key}={value!r}, which this engine cannot honour "
                    f"(it supports {key}={required!r})."
                )
        sampler = _CLASS_SAMPLER.get(base)
        if sampler == "dpmpp_2m" and karras:
            sampler = "dpmpp_2m_karras"
        if sampler is None:
            sampler = "euler"
            if "sampler" not in overrides or overrides["sampler"] is None:
                logger.warning("scheduler %s is not served; sampling with Euler on its noise schedule", class_name)
        values = {
            "sampler": sampler,
            "timestep_spacing": config.get("timestep_spacing", "linspace"),
            "steps_offset": int(config.get("steps_offset", 1 if is_flax else 0)),
            "prediction_type": config.get("prediction_type", "epsilon"),
            "num_train_timesteps": int(config.get("num_train_timesteps", 1000)),
            "beta_start": float(config.get("beta_start", 0.0001)),
            "beta_end": float(config.get("beta_end", 0.02)),
            "beta_schedule": config.get("beta_schedule", "linear"),
            "set_alpha_to_one": bool(config.get("set_alpha_to_one", True)),
            "clip_sample": None if config.get("clip_sample") is None else bool(config["clip_sample"]),
            "clip_sample_range": float(config.get("clip_sample_range", 1.0)),
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise InvalidInput(f"Unknown sampler setting(s): {', '.join(sorted(unknown))}.")
        return cls(**values)

    def with_overrides(self, **overrides) -> SamplerConfig:
        """This config with the non-None overrides applied (and checked)."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def schedule(self, steps: int) -> Schedule:
        """The Euler timestep/sigma table for `steps` steps (host numpy; see `compute_schedule`)."""
        return compute_schedule(self, steps)

    def plan(self, steps: int, sampler: str | None = None, schedule_type: str | None = None, first: int = 0) -> Plan:
        """Per-step coefficients of `sampler` (default: this config's) for `steps` steps; see `plan`."""
        return plan(self, steps, sampler, schedule_type, first)

    @property
    def label(self) -> str:
        """Short human-readable name of the default sampler, e.g. "Euler a" (PNG parameters, header)."""
        return sampler_label(self.sampler, self.prediction_type)


@dataclass(frozen=True)
class Schedule:
    """The constants one compiled program samples with (float32, as PyTorch's schedulers hold them)."""

    timesteps: np.ndarray  # float32 [steps]: what the UNet is told
    sigmas: np.ndarray  # float32 [steps + 1]: noise level before each step, then 0
    init_noise_sigma: float  # standard deviation of the initial latents
    sigmas_up: np.ndarray  # float32 [steps]: fresh noise added per ancestral step
    sigmas_down: np.ndarray  # float32 [steps]: where the ancestral step's deterministic part lands


def train_sigmas(config: SamplerConfig) -> np.ndarray:
    """sqrt((1 - alpha_bar) / alpha_bar) per training timestep, computed in float32 as torch does: [T]."""
    n = config.num_train_timesteps
    if config.beta_schedule == "scaled_linear":
        betas = np.linspace(config.beta_start**0.5, config.beta_end**0.5, n, dtype=np.float32) ** 2
    else:
        betas = np.linspace(config.beta_start, config.beta_end, n, dtype=np.float32)
    alphas_cumprod = np.cumprod((1.0 - betas).astype(np.float32), dtype=np.float32)
    return (((1 - alphas_cumprod) / alphas_cumprod) ** 0.5).astype(np.float32)


def trailing_timesteps(n: int, steps: int) -> np.ndarray:
    """`steps` timesteps n - 1, n - 1 - n/steps, ... ("trailing" spacing), int64 [steps].

    diffusers writes `np.arange(n, 0, -n / steps).round() - 1`, the same values, except that the float stop can let
    one more, near-zero timestep in (-1 after the shift: 62 timesteps for 61 steps at n = 1000; also 103, 121, 122
    steps): it then runs a step more than asked, at a timestep outside the training range. Here: the steps asked.
    """
    delta = (n - n / steps) - n  # what np.arange steps by (its second value less its first), rounding included
    return (n + np.arange(steps) * delta).round().astype(np.int64) - 1


def compute_schedule(config: SamplerConfig, steps: int) -> Schedule:
    """Timesteps and sigmas as `EulerDiscreteScheduler.set_timesteps` (PyTorch) computes them for `config`."""
    _check_steps(config, steps)
    n = config.num_train_timesteps
    if config.timestep_spacing == "linspace":
        timesteps = np.linspace(0, n - 1, steps, dtype=np.float32)[::-1].copy()
    elif config.timestep_spacing == "leading":
        step_ratio = n // steps
        timesteps = (np.arange(0, steps) * step_ratio).round()[::-1].copy().astype(np.float32)
        timesteps += config.steps_offset
    else:  # trailing
        timesteps = trailing_timesteps(n, steps).astype(np.float32)
    table = train_sigmas(config)
    sigmas = np.interp(timesteps, np.arange(0, len(table)), table)
    sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
    init_noise_sigma = _init_noise_sigma(sigmas, config.timestep_spacing)
    sigma_from, sigma_to = sigmas[:-1], sigmas[1:]
    sigmas_up = ((sigma_to**2 * (sigma_from**2 - sigma_to**2) / sigma_from**2) ** 0.5).astype(np.float32)
    sigmas_down = ((sigma_to**2 - sigmas_up**2).clip(min=0) ** 0.5).astype(np.float32)
    return Schedule(timesteps.astype(np.float32), sigmas, init_noise_sigma, sigmas_up, sigmas_down)


#: Columns of a plan's coefficient table: what the step program is told for one step. With the history H
#: [B, 4, 4, h, w] (H[0] = the last step's D, H[1..3] the last three entries e, newest first):
#:     x' = a·x + b·D + c·H[0] + h1·H[1] + h2·H[2] + h3·H[3] + d·noise,   e = p·x + q·D,   H' = [D, e, H[1], H[2]]
COEFFICIENTS = (
    "timestep",
    "sigma",
    "x",
    "denoised",
    "previous",
    "noise",
    "history1",
    "history2",
    "history3",
    "keep_x",
    "keep_denoised",
    "clip",
    "unclipped",
)
# (clip > 0: D is clipped to ±clip first, and "unclipped" weighs the D before clipping: DDIM, LCM)
#: Arrays the step's history holds (`COEFFICIENTS`): the last D and three entries.
HISTORY = 4


@dataclass(frozen=True)
class Plan:
    """One request's sampling: which sampler, how many steps, and the step program's arguments for each row (one
    UNet call each: Heun runs two per step but its last)."""

    sampler: str  # sampler id (SAMPLERS), as the request named it (a combined name stays combined)
    steps: int  # denoising steps
    init_sigma: float  # initial latents = standard-normal noise × init_sigma
    timesteps: np.ndarray  # float32 [rows]: what the UNet is told at each row
    sigmas: np.ndarray  # float32 [rows + 1]: noise level before each row, then the final one (0)
    coefficients: np.ndarray  # float32 [rows, 13]: COEFFICIENTS per row
    schedule_type: str = AUTOMATIC  # A1111's schedule type it ran with (a combined name's own)
    order: int = 1  # rows per step (Heun: 2)

    @property
    def label(self) -> str:
        return sampler_label(self.sampler)

    @property
    def rows(self) -> int:
        """UNet calls the loop makes."""
        return len(self.coefficients)


def stacked(plans: list[Plan], block: int) -> Plan:
    """One plan for a call whose images run several plans (a merged call: one per request, each its own sampler and
    schedule, the same number of rows), plan i for images [i·block, (i+1)·block): coefficients [rows, B, 13],
    sigmas [rows + 1, B], timesteps [rows, B], init_sigma [B]. The loop places each row's values as every image's own
    (`loop.Stage.per_image`); the first plan names it."""
    rows = {plan.rows for plan in plans}
    if len(rows) != 1:
        raise ValueError(f"plans run in one call need the same rows; got {sorted(rows)}")

    def per_image(values) -> np.ndarray:  # [k, ...] per plan -> [..., B]: the image axis after the row axis
        each = np.repeat(np.stack([np.asarray(v, np.float32) for v in values]), block, axis=0)  # [B, ...]
        return np.moveaxis(each, 0, 1) if each.ndim > 1 else each

    return dataclasses.replace(
        plans[0],
        init_sigma=per_image([plan.init_sigma for plan in plans]),  # [B]
        timesteps=per_image([plan.timesteps for plan in plans]),  # [rows, B]
        sigmas=per_image([plan.sigmas for plan in plans]),  # [rows + 1, B]
        coefficients=per_image([plan.coefficients for plan in plans]),  # [rows, B, 13]
    )


def _check_steps(config: SamplerConfig, steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= config.num_train_timesteps:
        raise InvalidInput(f"Steps must be between 1 and {config.num_train_timesteps}; got {steps!r}.")


def dpm_schedule(config: SamplerConfig, steps: int, karras: bool, schedule: str = AUTOMATIC):
    """Timesteps and sigmas as PyTorch's `DPMSolverMultistepScheduler.set_timesteps` (and UniPC's, the same
    arithmetic) compute them.

    Its spacings differ from the Euler schedulers' (`leading` divides by steps + 1); Karras sigmas (rho 7) and
    exponential ones span the training sigmas; Karras timesteps are the log-sigma interpolation rounded, exponential
    ones truncated (PyTorch's cast to int64).
    """
    _check_steps(config, steps)
    schedule = "Karras" if karras else schedule
    n = config.num_train_timesteps  # lambda_min_clipped = -inf: nothing is clipped
    spacing = "trailing" if schedule == "SGM Uniform" else config.timestep_spacing
    if spacing == "linspace":
        timesteps = np.linspace(0, n - 1, steps + 1).round()[::-1][:-1].copy().astype(np.int64)
    elif spacing == "leading":
        step_ratio = n // (steps + 1)
        timesteps = (np.arange(0, steps + 1) * step_ratio).round()[::-1][:-1].copy().astype(np.int64)
        timesteps += config.steps_offset
    else:  # trailing
        timesteps = trailing_timesteps(n, steps)
    table = train_sigmas(config)  # float32 [T]
    log_table = np.log(table)
    if schedule in ("Karras", "Exponential"):
        sigmas = _converted(schedule, float(table[-1]), float(table[0]), steps)
        timesteps = _sigma_to_t(sigmas, log_table)
        timesteps = timesteps.round() if schedule == "Karras" else np.trunc(timesteps)
    else:
        sigmas = np.interp(timesteps, np.arange(0, len(table)), table)
    sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
    return timesteps.astype(np.float32), sigmas


def _converted(schedule: str, sigma_max: float, sigma_min: float, steps: int) -> np.ndarray:
    """Karras (rho 7) or exponential sigmas from sigma_max down to sigma_min: diffusers' `_convert_to_karras` and
    `_convert_to_exponential`, float64 [steps]."""
    if schedule == "Karras":
        rho, ramp = 7.0, np.linspace(0, 1, steps)
        return (sigma_max ** (1 / rho) + ramp * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho))) ** rho
    return np.exp(np.linspace(np.log(sigma_max), np.log(sigma_min), steps))


def euler_schedule(config: SamplerConfig, steps: int, schedule: str = AUTOMATIC) -> Schedule:
    """The Euler schedulers' timesteps and sigmas (`EulerDiscreteScheduler`, `HeunDiscreteScheduler`,
    `LMSDiscreteScheduler`: the same code) with a schedule type: Karras and exponential sigmas span the spaced
    schedule's own first and last sigma; their timesteps are the log-sigma interpolation (fractional)."""
    if schedule == "SGM Uniform":
        config = dataclasses.replace(config, timestep_spacing="trailing")
    spaced = compute_schedule(config, steps)
    if schedule not in ("Karras", "Exponential"):
        return spaced
    sigmas = _converted(schedule, float(spaced.sigmas[0]), float(spaced.sigmas[-2]), steps)
    timesteps = _sigma_to_t(sigmas, np.log(train_sigmas(config))).astype(np.float32)
    sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
    init_noise_sigma = _init_noise_sigma(sigmas, config.timestep_spacing)
    zeros = np.zeros(steps, np.float32)
    return Schedule(timesteps, sigmas, init_noise_sigma, zeros, zeros)


def _sigma_to_t(sigma: np.ndarray, log_sigmas: np.ndarray) -> np.ndarray:
    """Fractional training timesteps of `sigma` by interpolating log sigmas (diffusers' `_sigma_to_t`)."""
    log_sigma = np.log(np.maximum(sigma, 1e-10))
    dists = log_sigma - log_sigmas[:, np.newaxis]
    low_idx = np.cumsum((dists >= 0), axis=0).argmax(axis=0).clip(max=log_sigmas.shape[0] - 2)
    high_idx = low_idx + 1
    low, high = log_sigmas[low_idx], log_sigmas[high_idx]
    w = np.clip((low - log_sigma) / (low - high), 0, 1)
    return ((1 - w) * low_idx + w * high_idx).reshape(sigma.shape)


def ddim_schedule(config: SamplerConfig, steps: int, schedule: str = AUTOMATIC):
    """DDIMScheduler's integer timesteps, their levels and the level each step lands on (that of t - T/steps; after
    the last step training step 0's, or 0 with `set_alpha_to_one`): [steps] each."""
    n = config.num_train_timesteps
    spacing = "trailing" if schedule == "SGM Uniform" else config.timestep_spacing
    if spacing == "linspace":
        timesteps = np.linspace(0, n - 1, steps).round()[::-1].copy().astype(np.int64)
    elif spacing == "leading":
        timesteps = (np.arange(0, steps) * (n // steps)).round()[::-1].copy().astype(np.int64) + config.steps_offset
    else:
        timesteps = trailing_timesteps(n, steps)
    table = train_sigmas(config)
    previous = timesteps - n // steps
    final = 0.0 if config.set_alpha_to_one else float(table[0])
    after = np.array([float(table[t]) if t >= 0 else final for t in previous])  # where each step lands [steps]
    return timesteps.astype(np.float32), table[timesteps].astype(np.float64), after


def lcm_timesteps(config: SamplerConfig, steps: int, original_steps: int = 50) -> np.ndarray:
    """LCMScheduler's timesteps: `steps` of its `original_steps` skipping ones, int64 [steps]."""
    k = config.num_train_timesteps // original_steps
    origin = (np.arange(1, original_steps + 1) * k - 1)[::-1].copy()
    return origin[np.floor(np.linspace(0, len(origin), num=steps, endpoint=False)).astype(np.int64)]


def _rows(config: SamplerConfig, steps: int, base: str, schedule: str, first: int):
    """(timesteps, sigmas, init_sigma, table float64, rows per step) of `base` with `schedule`."""
    if base in ("dpmpp_2m", "dpmpp_2m_sde", "unipc"):
        timesteps, sigmas = dpm_schedule(config, steps, False, schedule)
        s = sigmas.astype(np.float64)
        table = {"dpmpp_2m": solvers.dpmpp_2m, "dpmpp_2m_sde": solvers.dpmpp_2m_sde, "unipc": solvers.unipc}[base](
            s, first
        )
        return timesteps, sigmas, (float(sigmas[0]) ** 2 + 1) ** 0.5, table, 1  # their sample is x / sqrt(s^2 + 1)
    if base == "ddim":
        timesteps, levels, after = ddim_schedule(config, steps, schedule)
        sigmas = np.concatenate([levels, [0.0]])  # the final latents are the sample itself
        return timesteps, sigmas, (float(levels[0]) ** 2 + 1) ** 0.5, solvers.ddim(levels, after), 1
    if base == "lcm":
        timesteps = lcm_timesteps(config, steps)
        sigmas = np.concatenate([train_sigmas(config)[timesteps].astype(np.float64), [0.0]])
        return timesteps, sigmas, (float(sigmas[0]) ** 2 + 1) ** 0.5, solvers.lcm(timesteps, sigmas), 1
    if base == "euler_ancestral":
        config = dataclasses.replace(config, timestep_spacing="trailing") if schedule == "SGM Uniform" else config
        schedule = AUTOMATIC
    spaced = euler_schedule(config, steps, schedule)
    s = spaced.sigmas.astype(np.float64)
    if base == "heun":
        timesteps, sigmas, table = solvers.heun(spaced.timesteps.astype(np.float64), s)
        return timesteps, sigmas, spaced.init_noise_sigma, table, 2
    table = {"euler": solvers.euler, "euler_ancestral": solvers.euler_ancestral, "lms": solvers.lms}[base](s, first)
    return spaced.timesteps, spaced.sigmas, spaced.init_noise_sigma, table, 1


def plan(
    config: SamplerConfig, steps: int, sampler: str | None = None, schedule_type: str | None = None, first: int = 0
) -> Plan:
    """Coefficients of every row of `sampler` (default: the config's) with `schedule_type` (None: Automatic) over
    `steps` steps, computed in float64 (`solvers.py`); a multistep sampler's history starts at step `first` (an
    image request's first step run, as diffusers' `set_begin_index` restarts it).
    """
    sampler = sampler_id(sampler if sampler is not None else config.sampler)
    base, schedule = resolve(sampler, schedule_type)
    _check_steps(config, steps)
    check_steps(base, steps)
    timesteps, sigmas, init_sigma, table, order = _rows(config, steps, base, schedule, first)
    table[:, 0] = timesteps
    # DDIMScheduler clips x0 unless its config says not (SDXL base's does); LCMScheduler only when it says so
    if base in ("ddim", "lcm") and (config.clip_sample if config.clip_sample is not None else base == "ddim"):
        solvers.clip(table, config.clip_sample_range, base == "ddim")
    return Plan(
        sampler=sampler,
        steps=steps,
        init_sigma=float(np.float32(init_sigma)),
        timesteps=np.asarray(timesteps, np.float32),
        sigmas=np.asarray(sigmas, np.float32),
        coefficients=table.astype(np.float32),
        schedule_type=schedule,
        order=order,
    )


def _init_noise_sigma(sigmas: np.ndarray, spacing: str) -> float:
    """The start noise's scale, as diffusers' schedulers set it: the largest sigma with linspace or trailing spacing,
    else sqrt(sigma_max**2 + 1)."""
    max_sigma = sigmas.max()
    if spacing in ("linspace", "trailing"):
        return float(max_sigma)
    return float(np.float32((max_sigma**2 + 1) ** 0.5))
