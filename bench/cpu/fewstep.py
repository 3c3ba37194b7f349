"""Few-step serving: time per image of SDXL base's recipe against SDXL-Lightning-4's, same checkpoint and size.

    python -m bench --only fewstep                                # tiny checkpoint, the bench's size
    python -m bench --only fewstep,flops --model stabilityai/stable-diffusion-xl-base-1.0 --height 1024 \\
        --width 1024 --dtype bfloat16 --cpu-devices 0             # on a TPU/GPU host

base = the `sdxl-base` preset's sampler settings (25 Euler steps, leading, CFG: the UNet on a batch of 2 per image);
lightning-4 = the `lightning-4step` preset's (4 Euler steps, trailing, the guidance-free program: batch 1). Both run
the bench's checkpoint: a Lightning UNet has SDXL's architecture, so its step costs what the base UNet's step costs
and only the number and batch of UNet calls differ (no 5 GB UNet download is needed to time it). The two programs
are compiled once each, then calls alternate so drift on a shared machine hits both alike.

The ratio to expect: 12.5x fewer UNet evaluations per image (25 x 2 against 4 x 1). The text encoders and the VAE
decode cost the same per image in both, so the time ratio is lower; with the flops part's XLA cost analysis of SDXL
at 1024x1024 (when it ran in the same bench) the expected ratio on an accelerator is computed from FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common import Progress, Stats, progress

PROMPT = "a photo of an astronaut riding a horse on the moon"
UNET_EVALUATIONS_RATIO = (25 * 2) / (4 * 1)  # base: 25 steps x CFG batch 2; lightning-4: 4 steps x batch 1


@dataclass(frozen=True)
class FewStep:
    """Seconds per image of the two recipes on one checkpoint, size and device set."""

    model: str  # the checkpoint both programs run
    height: int  # image height of both
    width: int  # image width of both
    images_per_call: int  # devices x per-device batch
    base_label: str  # e.g. "sdxl-base: 25 steps, Euler, leading spacing, CFG"
    lightning_label: str  # e.g. "lightning-4step: 4 steps, Euler, trailing spacing, no CFG"
    base_compile_s: float  # compiling the base program (once, at start-up)
    lightning_compile_s: float  # compiling the guidance-free program (once)
    base: Stats  # seconds per image, base recipe (call time / images per call)
    lightning: Stats  # seconds per image, lightning-4 recipe
    ratio: float  # base / lightning medians: how many times faster lightning-4 makes an image here
    unet_evaluations_ratio: float  # 12.5: UNet image-evaluations per image, base / lightning-4
    expected_flops_ratio: float | None  # (25 U2 + V + T) / (4 U2/2 + V + T/2) at 1024 px from the flops part; None
    compiles_during_runs: int  # compilations while timing (must be 0)


def _generator(model: str, height: int, width: int, dtype: str, preset_name: str):
    """A warmed-up generator with `preset_name`'s sampler settings (steps, sampler, spacing, CFG) on `model`."""
    from ..engine import Generator, get_preset

    preset = get_preset(preset_name)
    generator = Generator.from_pretrained(
        model,
        height=height,
        width=width,
        dtype=dtype,
        steps=preset.steps,
        sampler=preset.sampler,
        timestep_spacing=preset.timestep_spacing,
        cfg=preset.cfg,
        preset=preset.name,
    )
    return generator, generator.warmup()["compile_s"], preset.guidance_scale


def _label(generator) -> str:
    sampler, steps = generator.sampler, generator.config.steps
    cfg = "CFG" if sampler.cfg else "no CFG"
    return f"{generator.config.preset}: {steps} steps, {sampler.label}, {sampler.timestep_spacing} spacing, {cfg}"


def expected_ratio(flops) -> float | None:
    """Expected base / lightning-4 time ratio from the flops part's SDXL figures at 1024x1024 (compute-bound)."""
    if flops is None:
        return None
    unet2, vae = flops.unet_step_flops_batch2, flops.vae_decode_flops_per_image
    text = flops.text_encoders_flops_per_image  # prompt + negative; the guidance-free program encodes the prompt only
    return (25 * unet2 + vae + text) / (4 * unet2 / 2 + vae + text / 2)


def base_vs_lightning(
    model: str, height: int, width: int, dtype: str, runs: int, flops=None, say: Progress = progress
) -> FewStep:
    """Time per image of both recipes on `model` at height x width (interleaved runs, after one warm-up each).

    Holds both programs' weights on the devices at once (two copies; the bench's own generator is a third when other
    parts run too): on a chip with little memory run this part alone.
    """
    from ..engine import CompileCounter

    base, base_compile_s, base_guidance = _generator(model, height, width, dtype, "sdxl-base")
    fast, fast_compile_s, fast_guidance = _generator(model, height, width, dtype, "lightning-4step")
    say(f"fewstep: compiled base in {base_compile_s:.1f} s, lightning-4 in {fast_compile_s:.1f} s")
    compiles_before = CompileCounter.compiles()
    base_s, fast_s = [], []
    for i in range(runs):
        for generator, guidance, times in ((base, base_guidance, base_s), (fast, fast_guidance, fast_s)):
            request = generator.request(PROMPT, seed=i, guidance_scale=guidance)
            times.append(generator.generate(request).timings["total_s"] / generator.num_images)
    base_stats, fast_stats = Stats.of(base_s), Stats.of(fast_s)
    ratio = base_stats.median / fast_stats.median
    expected = expected_ratio(flops)
    say(
        f"fewstep: base {base_stats.median:.3f} s vs lightning-4 {fast_stats.median:.3f} s per image: {ratio:.2f}x"
        + (f" (expected on an accelerator at 1024 px: {expected:.1f}x)" if expected else "")
    )
    return FewStep(
        model=model,
        height=height,
        width=width,
        images_per_call=base.num_images,
        base_label=_label(base),
        lightning_label=_label(fast),
        base_compile_s=base_compile_s,
        lightning_compile_s=fast_compile_s,
        base=base_stats,
        lightning=fast_stats,
        ratio=ratio,
        unet_evaluations_ratio=UNET_EVALUATIONS_RATIO,
        expected_flops_ratio=expected,
        compiles_during_runs=CompileCounter.compiles() - compiles_before,
    )
