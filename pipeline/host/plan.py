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

from ..errors import InvalidInput

logger = logging.getLogger(__name__)

#: A1111's sampler names (what the page, the API and the CLI take) -> the ids used here.
SAMPLER_NAMES = {
    "Euler": "euler",
    "Euler a": "euler_ancestral",
    "DPM++ 2M": "dpmpp_2m",
    "DPM++ 2M Karras": "dpmpp_2m_karras",
}
SAMPLERS = tuple(SAMPLER_NAMES.values())
SPACINGS = ("leading", "linspace", "trailing")
PREDICTION_TYPES = ("epsilon", "v_prediction")
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

    def plan(self, steps: int, sampler: str | None = None) -> Plan:
        """Per-step coefficients of `sampler` (default: this config's) for `steps` steps; see `plan`."""
        return plan(self, steps, sampler)

    @property
    def label(self) -> str:
        """Short human-readable name of the default sampler, e.g. "Euler a" (PNG parameters, header)."""
        return sampler_label(self.sampler, self.prediction_type)


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
    max_sigma = sigmas.max()
    if config.timestep_spacing in ("linspace", "trailing"):
        init_noise_sigma = float(max_sigma)
    else:
        init_noise_sigma = float(np.float32((max_sigma**2 + 1) ** 0.5))
    sigma_from, sigma_to = sigmas[:-1], sigmas[1:]
    sigmas_up = ((sigma_to**2 * (sigma_from**2 - sigma_to**2) / sigma_from**2) ** 0.5).astype(np.float32)
    sigmas_down = ((sigma_to**2 - sigmas_up**2).clip(min=0) ** 0.5).astype(np.float32)
    return Schedule(timesteps.astype(np.float32), sigmas, init_noise_sigma, sigmas_up, sigmas_down)


#: Columns of a plan's coefficient table: what the step program is told for one step.
COEFFICIENTS = ("timestep", "sigma", "x", "denoised", "previous", "noise")


@dataclass(frozen=True)
class Plan:
    """One request's sampling: which sampler, how many steps, and the step program's arguments for each step."""

    sampler: str  # sampler id (SAMPLERS)
    steps: int  # denoising steps
    init_sigma: float  # initial latents = standard-normal noise × init_sigma
    timesteps: np.ndarray  # float32 [steps]: what the UNet is told at each step
    sigmas: np.ndarray  # float32 [steps + 1]: noise level before each step, then the final one (0)
    coefficients: np.ndarray  # float32 [steps, 6]: COEFFICIENTS per step (x' = a·x + b·D + c·D_prev + d·noise)

    @property
    def label(self) -> str:
        return sampler_label(self.sampler)


def _check_steps(config: SamplerConfig, steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= config.num_train_timesteps:
        raise InvalidInput(f"Steps must be between 1 and {config.num_train_timesteps}; got {steps!r}.")


def dpm_schedule(config: SamplerConfig, steps: int, karras: bool) -> tuple[np.ndarray, np.ndarray]:
    """Timesteps and sigmas as PyTorch's `DPMSolverMultistepScheduler.set_timesteps` computes them.

    Its spacings differ from the Euler schedulers' (`leading` divides by steps + 1); Karras sigmas (rho 7) span the
    training sigmas, and their timesteps are the log-sigma interpolation, rounded.
    """
    _check_steps(config, steps)
    n = config.num_train_timesteps  # lambda_min_clipped = -inf: nothing is clipped
    if config.timestep_spacing == "linspace":
        timesteps = np.linspace(0, n - 1, steps + 1).round()[::-1][:-1].copy().astype(np.int64)
    elif config.timestep_spacing == "leading":
        step_ratio = n // (steps + 1)
        timesteps = (np.arange(0, steps + 1) * step_ratio).round()[::-1][:-1].copy().astype(np.int64)
        timesteps += config.steps_offset
    else:  # trailing
        timesteps = trailing_timesteps(n, steps)
    table = train_sigmas(config)  # float32 [T]
    log_table = np.log(table)
    if karras:
        sigma_min, sigma_max = float(table[0]), float(table[-1])
        ramp = np.linspace(0, 1, steps)
        rho = 7.0
        sigmas = (sigma_max ** (1 / rho) + ramp * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho))) ** rho
        timesteps = _sigma_to_t(sigmas, log_table).round()
    else:
        sigmas = np.interp(timesteps, np.arange(0, len(table)), table)
    sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
    return timesteps.astype(np.float32), sigmas


def _sigma_to_t(sigma: np.ndarray, log_sigmas: np.ndarray) -> np.ndarray:
    """Fractional training timesteps of `sigma` by interpolating log sigmas (diffusers' `_sigma_to_t`)."""
    log_sigma = np.log(np.maximum(sigma, 1e-10))
    dists = log_sigma - log_sigmas[:, np.newaxis]
    low_idx = np.cumsum((dists >= 0), axis=0).argmax(axis=0).clip(max=log_sigmas.shape[0] - 2)
    high_idx = low_idx + 1
    low, high = log_sigmas[low_idx], log_sigmas[high_idx]
    w = np.clip((low - log_sigma) / (low - high), 0, 1)
    return ((1 - w) * low_idx + w * high_idx).reshape(sigma.shape)


def plan(config: SamplerConfig, steps: int, sampler: str | None = None) -> Plan:
    """Coefficients of every step of `sampler` (default: the config's) over `steps` steps, computed in float64.

    Euler: x' = (s'/s)·x + (1 - s'/s)·D. Euler a: the same towards sigma_down, plus sigma_up·noise. DPM++ 2M
    (dpmsolver++, midpoint, lower order at the first and the final step as diffusers does with final sigma 0):
    with r = s'/s, h = log(s/s'), r0 = h_prev / h, x' = r·x + (1 - r)·(D + (D - D_prev) / (2·r0)).
    """
    sampler = sampler_id(sampler if sampler is not None else config.sampler)
    _check_steps(config, steps)
    if sampler.startswith("dpmpp_2m"):
        timesteps, sigmas = dpm_schedule(config, steps, karras=sampler == "dpmpp_2m_karras")
        init_sigma = float(np.float32((float(sigmas[0]) ** 2 + 1) ** 0.5))  # DPM's sample is x / sqrt(s^2 + 1)
    else:
        schedule = compute_schedule(config, steps)
        timesteps, sigmas, init_sigma = schedule.timesteps, schedule.sigmas, schedule.init_noise_sigma
    s = sigmas.astype(np.float64)
    table = np.zeros((steps, len(COEFFICIENTS)), np.float64)
    table[:, 0], table[:, 1] = timesteps, s[:-1]
    for i in range(steps):
        sigma, sigma_next = s[i], s[i + 1]
        if sampler == "euler_ancestral":
            sigma_up = (sigma_next**2 * (sigma**2 - sigma_next**2) / sigma**2) ** 0.5
            sigma_down = max(sigma_next**2 - sigma_up**2, 0.0) ** 0.5
            ratio, noise = sigma_down / sigma, sigma_up
        else:
            ratio, noise = sigma_next / sigma, 0.0
        second_order = sampler.startswith("dpmpp_2m") and 0 < i < steps - 1
        if second_order:
            h, h_prev = np.log(sigma / sigma_next), np.log(s[i - 1] / sigma)
            half_over_r0 = 0.5 * h / h_prev
            table[i, 2:] = ratio, (1 - ratio) * (1 + half_over_r0), -(1 - ratio) * half_over_r0, noise
        else:
            table[i, 2:] = ratio, 1 - ratio, 0.0, noise
    return Plan(
        sampler=sampler,
        steps=steps,
        init_sigma=float(init_sigma),
        timesteps=np.asarray(timesteps, np.float32),
        sigmas=sigmas.astype(np.float32),
        coefficients=table.astype(np.float32),
    )
