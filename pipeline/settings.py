"""Settings of the generation engine.

Every field marked *static* is baked into the compiled program: changing it means compiling again, so it is
fixed when the server starts and never comes from a user's request. Everything a user may change per request
(prompt, negative prompt, seed, guidance scale) is a traced argument of the compiled function instead.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The model the product serves, and the Hub revision where its Flax weights live.
SDXL_BASE = "stabilityai/stable-diffusion-xl-base-1.0"
SDXL_BASE_FLAX_REVISION = "refs/pr/95"

#: `model` value that selects the project's own tiny random-weight checkpoint (built once into a cache dir).
TINY_MODEL = "tiny"

#: Shape each model starts with when the user gives no --height/--width/--steps: (height, width, steps).
#: The tiny model's is small enough to start in seconds on a laptop CPU; every other model gets SDXL's own.
SHAPE_DEFAULTS = {TINY_MODEL: (128, 128, 4)}
SDXL_SHAPE = (1024, 1024, 25)


def shape_defaults(model: str) -> tuple[int, int, int]:
    """(height, width, steps) for `model` when the user sets none: one place for the app, the CLI and the engine."""
    return SHAPE_DEFAULTS.get(str(model).strip(), SDXL_SHAPE)


#: Dtypes the engine can run its networks in.
DTYPES = ("bfloat16", "float32")

#: Attention cores of the UNet (see pipeline/attention.py): auto = splash on TPU, cudnn on NVIDIA bf16, xla elsewhere.
ATTENTIONS = ("auto", "xla", "splash", "cudnn", "diffusers")


@dataclass(frozen=True)
class EngineConfig:
    """What `Generator.from_pretrained` was asked for, after defaults were resolved."""

    model: str = SDXL_BASE  # Hub id, local directory in diffusers' layout (Flax or PyTorch safetensors), or "tiny"
    revision: str | None = None  # Hub revision; SDXL base defaults to refs/pr/95 (its Flax weights)
    height: int = 1024  # static: image height in pixels, a multiple of 32 (8 × 2^(UNet down blocks − 1))
    width: int = 1024  # static: image width in pixels, a multiple of 32
    steps: int = 25  # the default denoising steps of a request (each request may ask for 1..100)
    dtype: str = "bfloat16"  # static: dtype of weights and activations; the scheduler state stays float32
    per_device_batch: int = 1  # static: images per device per call
    compilation_cache: bool = True  # use JAX's persistent compilation cache (restarts reuse compiled code)
    variant: str | None = None  # PyTorch weight variant to prefer, e.g. "fp16" (*.fp16.safetensors); Flax has none
    unet: str | None = None  # a whole-UNet .safetensors (path or REPO:FILE) replacing the checkpoint's UNet
    conversion_cache: bool = True  # keep PyTorch weights once converted and cast (<cache root>/converted)
    sizes: tuple[tuple[int, int], ...] = ()  # static: every offered (height, width), each compiled; () = height×width
    progress: bool = True  # report "step k / N" between steps (host side: no program changes)
    attention: str = "xla"  # static: the UNet's attention core after `auto` was resolved (see pipeline/attention.py)
    sampler: str | None = None  # default sampler of a request (A1111 name or id); None = the checkpoint's
    timestep_spacing: str | None = None  # "leading" / "linspace" / "trailing"; None = the checkpoint's
    prediction_type: str | None = None  # static: "epsilon" / "v_prediction"; None = the checkpoint's
    steps_offset: int | None = None  # added to leading timesteps; None = the checkpoint's
    cfg: bool = True  # static: False = guidance-free program (UNet on the prompt only; guidance, negative ignored)
    preset: str | None = None  # the preset (assets/presets.json) these settings came from, if any

    @property
    def shape(self) -> tuple[int, int, int]:
        """The static (height, width, steps) triple that selects a compiled program."""
        return (self.height, self.width, self.steps)
