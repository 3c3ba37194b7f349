"""Samplers: timesteps and sigmas as diffusers' PyTorch Euler schedulers compute them, and the Euler steps.

diffusers' Flax scheduler falls short for few-step SDXL: it refuses `trailing` spacing (SDXL-Lightning, Turbo),
always adds 1 for `leading` whatever `steps_offset` says, and truncates fractional `linspace` timesteps. Steps are
static, so the whole table is computed here on the host, once per program, exactly as PyTorch's
`EulerDiscreteScheduler` / `EulerAncestralDiscreteScheduler.set_timesteps` do, and baked into the compiled program
as constants. The step itself (`scale_model_input`, Euler or Euler-ancestral, epsilon or v-prediction) runs on
device in float32. Guidance follows diffusers: g <= 1 means the conditional prediction alone.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .validation import InvalidInput

logger = logging.getLogger(__name__)

SAMPLERS = ("euler", "euler_ancestral")
SPACINGS = ("leading", "linspace", "trailing")
PREDICTION_TYPES = ("epsilon", "v_prediction")
BETA_SCHEDULES = ("linear", "scaled_linear")
#: diffusers scheduler class -> our sampler (the checkpoint's own choice is the default).
_CLASS_SAMPLER = {"EulerDiscreteScheduler": "euler", "EulerAncestralDiscreteScheduler": "euler_ancestral"}
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
#: Stream id folded into an image's key for its ancestral noise (its initial noise uses the key itself).
ANCESTRAL_STREAM = 1


@dataclass(frozen=True)
class SamplerConfig:
    """How the denoising loop samples. Every field is static: it selects (and is baked into) the compiled program."""

    sampler: str = "euler"  # static: "euler" or "euler_ancestral" (SDXL-Turbo's)
    timestep_spacing: str = "leading"  # static: "leading" (SDXL base), "linspace" or "trailing" (Lightning, Turbo)
    steps_offset: int = 1  # static: added to `leading` timesteps (SDXL base: 1)
    prediction_type: str = "epsilon"  # static: what the UNet predicts, "epsilon" or "v_prediction"
    cfg: bool = True  # static: False = guidance-free program (UNet on the conditional half only)
    num_train_timesteps: int = 1000  # static: the training noise schedule's length
    beta_start: float = 0.00085  # static: first beta of the training schedule
    beta_end: float = 0.012  # static: last beta
    beta_schedule: str = "scaled_linear"  # static: "scaled_linear" (SDXL) or "linear"

    def __post_init__(self) -> None:
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
        for key, required in _UNSUPPORTED:
            value = config.get(key, required)
            if value not in (required, None) or (required is None and value is not None):
                raise InvalidInput(
                    f"The checkpoint's scheduler sets {key}={value!r}, which this engine cannot honour "
                    f"(it supports {key}={required!r})."
                )
        is_flax = class_name.startswith("Flax")
        base = class_name.removeprefix("Flax")
        sampler = _CLASS_SAMPLER.get(base)
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
        """The timestep/sigma table for `steps` steps (host numpy; see `compute_schedule`)."""
        return compute_schedule(self, steps)

    @property
    def label(self) -> str:
        """Short human-readable name, e.g. "Euler a, trailing" (PNG parameters, header)."""
        name = "Euler a" if self.sampler == "euler_ancestral" else "Euler"
        return name + (", v-prediction" if self.prediction_type == "v_prediction" else "")


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


def compute_schedule(config: SamplerConfig, steps: int) -> Schedule:
    """Timesteps and sigmas as `EulerDiscreteScheduler.set_timesteps` (PyTorch) computes them for `config`."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= config.num_train_timesteps:
        raise InvalidInput(f"Steps must be between 1 and {config.num_train_timesteps}; got {steps!r}.")
    n = config.num_train_timesteps
    if config.timestep_spacing == "linspace":
        timesteps = np.linspace(0, n - 1, steps, dtype=np.float32)[::-1].copy()
    elif config.timestep_spacing == "leading":
        step_ratio = n // steps
        timesteps = (np.arange(0, steps) * step_ratio).round()[::-1].copy().astype(np.float32)
        timesteps += config.steps_offset
    else:  # trailing
        step_ratio = n / steps
        timesteps = np.arange(n, 0, -step_ratio).round().copy().astype(np.float32)
        timesteps -= 1
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


def read_scheduler_config(source: str, revision: str | None = None, fallback: dict | None = None) -> dict:
    """The checkpoint's `scheduler/scheduler_config.json` whole (local directory or Hub cache), else `fallback`.

    Read from the local cache only: the loader has just fetched the checkpoint, so this never touches the network.
    diffusers' Flax scheduler keeps only the keys it knows (no `steps_offset`, no `_class_name` of the PyTorch
    scheduler), so its config is the fallback, not the source.
    """
    path = Path(source) / "scheduler" / "scheduler_config.json"
    try:
        if not path.is_file():
            from huggingface_hub import hf_hub_download

            from .loading import default_revision

            path = Path(
                hf_hub_download(
                    source, "scheduler/scheduler_config.json", revision=revision or default_revision(source),
                    local_files_only=True,
                )
            )  # fmt: skip
        config = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
        return config
    except Exception as exc:  # not cached, not JSON...: the loaded scheduler's config is next best
        if fallback is None:
            raise InvalidInput(f"Could not read the scheduler config of {source} ({exc.__class__.__name__}).") from None
        logger.warning("could not read %s (%s); using the loaded scheduler's config", path, exc.__class__.__name__)
        return dict(fallback)


# ---- on device (traced; float32) ---------------------------------------------------------------------------------


def scale_model_input(latents, sigma):
    """The UNet sees latents / sqrt(sigma^2 + 1) (the Euler schedulers' `scale_model_input`)."""
    return latents / ((sigma**2 + 1) ** 0.5)


def guide(noise, guidance, cfg: bool):
    """Classifier-free guidance as diffusers defines it: g <= 1 -> the conditional prediction alone.

    noise: [2b, ...] (unconditional half first) when `cfg`, else [b, ...]; guidance: [b, 1, 1, 1] (traced).
    """
    if not cfg:
        return noise
    import jax.numpy as jnp

    uncond, cond = jnp.split(noise, 2, axis=0)
    return jnp.where(guidance > 1, uncond + guidance * (cond - uncond), cond)


def predicted_original(config: SamplerConfig, model_output, sample, sigma):
    """x0 from the UNet's output: epsilon or v-prediction (as PyTorch's Euler schedulers)."""
    if config.prediction_type == "v_prediction":
        return model_output * (-sigma / (sigma**2 + 1) ** 0.5) + (sample / (sigma**2 + 1))
    return sample - sigma * model_output


def euler_step(config: SamplerConfig, model_output, sample, sigma, sigma_next):
    """One Euler step (s_churn = 0, as diffusers' pipelines call it): float32 latents -> float32 latents."""
    denoised = predicted_original(config, model_output, sample, sigma)
    derivative = (sample - denoised) / sigma
    return sample + derivative * (sigma_next - sigma)


def ancestral_step(config: SamplerConfig, model_output, sample, sigma, sigma_up, sigma_down, noise):
    """One Euler-ancestral step: deterministic step to sigma_down, then fresh noise scaled by sigma_up."""
    denoised = predicted_original(config, model_output, sample, sigma)
    derivative = (sample - denoised) / sigma
    return sample + derivative * (sigma_down - sigma) + noise * sigma_up


def ancestral_keys(seeds):
    """Per-image keys of the ancestral noise: from the image's own seed, so no image depends on the others."""
    import jax

    return jax.vmap(lambda seed: jax.random.fold_in(jax.random.PRNGKey(seed), ANCESTRAL_STREAM))(seeds)


def ancestral_noise(keys, index, shape):
    """Standard-normal noise for step `index` of each image: keys [b] -> float32 [b, *shape]."""
    import jax
    import jax.numpy as jnp

    return jax.vmap(lambda key: jax.random.normal(jax.random.fold_in(key, index), shape, dtype=jnp.float32))(keys)
