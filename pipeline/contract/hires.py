"""The hires fix's rules without JAX: its upscalers by A1111's names, its sizes and A1111's step rule.

A1111's hires fix (`modules/processing.py`, `StableDiffusionProcessingTxt2Img.sample_hr_pass`) draws the picture at
the request's size, upscales it by `hires_scale` and redraws it as image to image at the larger size with fresh
noise. Its second pass runs `sd_samplers_common.setup_img2img_steps` with the hires steps given explicitly:

    requested = hires_steps or steps
    schedule  = int(requested / min(denoise, 0.999))      the sampler's sigmas are made for this many steps
    t_enc     = requested - 1;  sigmas[schedule - t_enc - 1:]   the last `requested` steps of them run

so the hires steps run on a schedule of steps ÷ denoise (`second_pass_steps`).
"""

from __future__ import annotations

from .errors import InvalidInput

#: A1111's latent upscalers (`shared.latent_upscale_modes`): torch.nn.functional.interpolate's mode and antialias.
LATENT_UPSCALERS: dict[str, tuple[str, bool]] = {
    "Latent": ("bilinear", False),
    "Latent (antialiased)": ("bilinear", True),
    "Latent (bicubic)": ("bicubic", False),
    "Latent (bicubic antialiased)": ("bicubic", True),
    "Latent (nearest)": ("nearest", False),
    "Latent (nearest-exact)": ("nearest-exact", False),
}
#: A1111's pixel upscalers this engine has (decode, PIL resize, encode), by PIL's filter name.
PIXEL_UPSCALERS: dict[str, str] = {"Lanczos": "LANCZOS", "Nearest": "NEAREST"}
#: Every hires upscaler offered, A1111's default ("Latent") first.
UPSCALERS: tuple[str, ...] = (*LATENT_UPSCALERS, *PIXEL_UPSCALERS)
#: The most a server may scale by (4× SDXL's 1024² is already 16 M pixels a picture).
MAX_SCALE = 4.0
#: A1111's cap on the denoising strength in the step rule (`setup_img2img_steps`).
DENOISE_CAP = 0.999


def second_pass_steps(steps: int, hires_steps: int, denoise: float) -> tuple[int, int]:
    """(schedule, run): A1111's second pass makes its sigmas for `schedule` steps and runs the last `run` of them
    (`hires_steps`, or the first pass's `steps` when 0)."""
    requested = hires_steps or steps
    return int(requested / min(denoise, DENOISE_CAP)), requested


def hires_size(size: tuple[int, int], scale: float, multiple: int) -> tuple[int, int]:
    """(height, width) × `scale`, each side truncated as A1111's `int(width * hr_scale)` and then down to the
    UNet's latent `multiple` (A1111 floors the latents' sides by 8; SDXL's UNet needs whole halvings too)."""
    return tuple(max(multiple, int(side * scale) // multiple * multiple) for side in size)  # type: ignore[return-value]


def parse_scales(text: str) -> tuple[float, ...]:
    """`--hires-scales 1.5,2` -> (1.5, 2.0); each above 1 and at most MAX_SCALE, or one InvalidInput sentence."""
    scales: list[float] = []
    for part in str(text or "").split(","):
        if not part.strip():
            continue
        try:
            scale = float(part.strip())
        except ValueError:
            message = f"Hires scales are numbers, comma-separated (e.g. 1.5,2); got {part.strip()!r}."
            raise InvalidInput(message) from None
        if not 1 < scale <= MAX_SCALE:
            raise InvalidInput(f"Each hires scale must be above 1 and at most {MAX_SCALE:g}; got {part.strip()}.")
        if scale not in scales:
            scales.append(scale)
    return tuple(scales)
