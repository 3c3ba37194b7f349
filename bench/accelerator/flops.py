"""Part 5, the hardware limit: FLOPs of SDXL from XLA's cost analysis, and what they imply on known accelerators.

Nothing here needs the SDXL weights or compiles the full model: the real UNet/VAE/text-encoder configurations are
written out below, their parameters are abstract (`jax.eval_shape`), and the FLOPs are XLA's estimate for the lowered
(pre-compile) HLO. XLA's cost analysis counts a while-loop body once, so per-step costs are measured on one step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp

#: Peak dense bf16 FLOP/s of the accelerators people serve SDXL on (vendor data sheets).
PEAK_BF16_FLOPS = {"TPU v5e": 197e12, "TPU v6e": 918e12, "H100 SXM": 989e12, "H200": 989e12}
#: Device kinds (as jax reports them) whose peak bf16 FLOP/s is known, for the fraction-of-peak figure.
PEAK_BY_DEVICE_KIND = {
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H100": 989e12,
    "NVIDIA H200": 989e12,
}
#: Step counts the seconds-per-image figures are given for.
STEP_COUNTS = (20, 25)
#: Public figure for SDXL's UNet at 1024x1024 with classifier-free guidance (batch 2), per step.
PUBLIC_UNET_STEP_TFLOP = 13.5

# SDXL base 1.0's unet/config.json, the fields that shape the network (the rest are diffusers' defaults).
SDXL_UNET_CONFIG = {
    "sample_size": 128,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    "block_out_channels": (320, 640, 1280),
    "layers_per_block": 2,
    "attention_head_dim": (5, 10, 20),
    "transformer_layers_per_block": (1, 2, 10),
    "cross_attention_dim": 2048,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816,
    "use_linear_projection": True,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
}
# SDXL base 1.0's vae/config.json.
SDXL_VAE_CONFIG = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512),
    "layers_per_block": 2,
    "latent_channels": 4,
    "norm_num_groups": 32,
    "sample_size": 1024,
    "scaling_factor": 0.13025,
}
# text_encoder (CLIP ViT-L/14) and text_encoder_2 (OpenCLIP ViT-bigG/14) of SDXL base 1.0.
SDXL_TEXT_CONFIG = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "hidden_act": "quick_gelu",
    "projection_dim": 768,
}
SDXL_TEXT_2_CONFIG = {
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "num_hidden_layers": 32,
    "num_attention_heads": 20,
    "hidden_act": "gelu",
    "projection_dim": 1280,
}


@dataclass(frozen=True)
class AcceleratorLimit:
    """Seconds per image one accelerator would need at 100% of its peak bf16 FLOP/s."""

    name: str  # accelerator, e.g. "TPU v5e"
    peak_flops: float  # peak dense bf16 FLOP/s from the vendor's data sheet
    seconds_per_image: dict[int, float]  # steps -> seconds per 1024x1024 image (UNet steps + VAE decode + encoders)


@dataclass(frozen=True)
class FlopsResult:
    """FLOPs of SDXL base at 1024x1024 (XLA cost analysis of the lowered HLO) and the hardware limits they imply."""

    unet_step_flops_batch2: float  # one UNet call on a CFG batch of 2 (conditional + unconditional), 128x128 latents
    unet_step_flops_per_image: float  # the same, per image (one image needs one batch-2 call per step)
    vae_decode_flops_per_image: float  # one VAE decode of 128x128x4 latents to 1024x1024x3 pixels
    text_encoders_flops_per_image: float  # both CLIP encoders on 2 x 77 tokens (prompt + negative); 0 if skipped
    public_unet_step_tflop: float  # the public figure quoted for comparison (batch 2, per step)
    flops_per_image: dict[int, float]  # steps -> total FLOPs per image
    limits: list[AcceleratorLimit]  # seconds per image at 100% of peak, per accelerator
    analysis_s: float  # seconds this part took (tracing and lowering only; nothing compiled)


def lowered_flops(fn, *abstract_args) -> float:
    """XLA's FLOP estimate for `fn` on abstract arguments, from the lowered HLO (no compilation)."""
    analysis = jax.jit(fn).lower(*abstract_args).cost_analysis()
    if isinstance(analysis, list | tuple):  # older JAX returned one dict per computation
        analysis = analysis[0]
    return float(analysis["flops"])


def _as_bf16(tree):
    """Abstract parameters in bfloat16, as the engine serves them on TPU/GPU."""
    return jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, jnp.bfloat16), tree)


def sdxl_networks(dtype) -> dict:
    """SDXL base 1.0's UNet, VAE and both text encoders from the configs above, as the engine builds its networks
    (pipeline/device/nets/); no weights."""
    from ..engine import network

    clip = {"vocab_size": 49408, "max_position_embeddings": 77}
    return {
        "unet": network("unet", SDXL_UNET_CONFIG, dtype),
        "vae": network("vae", SDXL_VAE_CONFIG, dtype),
        "text_encoder": network("text_encoder", {**clip, **SDXL_TEXT_CONFIG}, dtype),
        "text_encoder_2": network("text_encoder_2", {**clip, **SDXL_TEXT_2_CONFIG}, dtype),
    }


def unet_step_flops(batch: int = 2, latent_size: int = 128) -> float:
    """FLOPs of one SDXL UNet call (bf16) on `batch` latents of latent_size^2."""
    unet = sdxl_networks(jnp.bfloat16)["unet"]
    params = _as_bf16(jax.eval_shape(unet.init_weights, jax.random.PRNGKey(0)))
    sample = jax.ShapeDtypeStruct((batch, 4, latent_size, latent_size), jnp.bfloat16)
    timesteps = jax.ShapeDtypeStruct((batch,), jnp.int32)
    hidden = jax.ShapeDtypeStruct((batch, 77, 2048), jnp.bfloat16)
    added = {
        "text_embeds": jax.ShapeDtypeStruct((batch, 1280), jnp.bfloat16),
        "time_ids": jax.ShapeDtypeStruct((batch, 6), jnp.bfloat16),
    }

    def apply(params, sample, timesteps, hidden, added):
        return unet.apply({"params": params}, sample, timesteps, hidden, added_cond_kwargs=added).sample

    return lowered_flops(apply, params, sample, timesteps, hidden, added)


def vae_decode_flops(latent_size: int = 128) -> float:
    """FLOPs of one SDXL VAE decode (bf16) of a latent_size^2 x 4 latent."""
    vae = sdxl_networks(jnp.bfloat16)["vae"]
    params = _as_bf16(jax.eval_shape(vae.init_weights, jax.random.PRNGKey(0)))
    latents = jax.ShapeDtypeStruct((1, 4, latent_size, latent_size), jnp.bfloat16)

    def decode(params, latents):
        return vae.apply({"params": params}, latents, method=vae.decode).sample

    return lowered_flops(decode, params, latents)


def text_encoder_flops(batch: int = 2) -> float:
    """FLOPs of SDXL's two CLIP text encoders (bf16) on `batch` sequences of 77 tokens (prompt + negative)."""
    total = 0.0
    ids = jax.ShapeDtypeStruct((batch, 77), jnp.int32)
    networks = sdxl_networks(jnp.bfloat16)
    for model in (networks["text_encoder"], networks["text_encoder_2"]):
        params = _as_bf16(jax.eval_shape(model.init_weights, jax.random.PRNGKey(0)))

        def encode(params, ids, model=model):
            return model.apply({"params": params}, ids).hidden_states[-2]

        total += lowered_flops(encode, params, ids)
    return total


def measure_flops(include_text: bool = True, progress=print) -> FlopsResult:
    """FLOPs per step and per image for SDXL base at 1024x1024, and seconds per image at 100% of known peaks."""
    started = time.perf_counter()
    progress("  flops: lowering the SDXL UNet (abstract params, batch 2, 128x128 latents) ...")
    unet2 = unet_step_flops(batch=2)
    progress(f"  flops: UNet step (batch 2) = {unet2 / 1e12:.2f} TFLOP; lowering the VAE decoder ...")
    vae = vae_decode_flops()
    progress(f"  flops: VAE decode = {vae / 1e12:.2f} TFLOP per image")
    text = 0.0
    if include_text:
        text = text_encoder_flops(batch=2)
        progress(f"  flops: text encoders = {text / 1e9:.1f} GFLOP per image")
    per_image = {steps: steps * unet2 + vae + text for steps in STEP_COUNTS}
    limits = [
        AcceleratorLimit(name, peak, {steps: flops / peak for steps, flops in per_image.items()})
        for name, peak in PEAK_BF16_FLOPS.items()
    ]
    return FlopsResult(
        unet_step_flops_batch2=unet2,
        unet_step_flops_per_image=unet2,
        vae_decode_flops_per_image=vae,
        text_encoders_flops_per_image=text,
        public_unet_step_tflop=PUBLIC_UNET_STEP_TFLOP,
        flops_per_image=per_image,
        limits=limits,
        analysis_s=time.perf_counter() - started,
    )


@dataclass(frozen=True)
class AchievedFlops:
    """What the engine's own compiled programs achieve on the device the bench runs on."""

    device_kind: str  # jax's name for the device
    device_count: int  # devices the programs run on
    compiled_flops_reported: float  # XLA's cost analysis of one call's programs, per device: encode + decode + start
    unet_step_flops_per_device: float  # the compiled step program (one UNet call + sampler update), per device
    flops_per_call: float  # every device, whole call: (reported + steps x step) x devices
    seconds_per_call: float  # median device seconds of a generate call
    achieved_flops_per_s: float  # flops_per_call / seconds_per_call
    peak_flops_per_s: float | None  # known peak bf16 FLOP/s of all devices together; None when unknown (CPU)
    fraction_of_peak: float | None  # achieved / peak; None when the peak is unknown


def achieved_flops(generator, seconds_per_call: float) -> AchievedFlops:
    """Achieved FLOP/s of the engine: XLA's cost of its compiled programs for one call / measured seconds."""
    from ..engine import program_keys
    from ..tpu.cost import compiled_cost

    config = generator.config
    flops = {  # one call of each program the engine serves for its first size: encode, start, step, decode
        key.kind: compiled_cost(generator.programs.compile(key)).flops
        for key in program_keys(generator.sizes[:1], generator.sampler.cfg)
    }
    step = flops.pop("step")
    once = sum(flops.values())
    per_call = (once + config.steps * step) * generator.device_count
    achieved = per_call / seconds_per_call
    peak_one = PEAK_BY_DEVICE_KIND.get(generator.device_kind)
    peak = peak_one * generator.device_count if peak_one else None
    return AchievedFlops(
        device_kind=generator.device_kind,
        device_count=generator.device_count,
        compiled_flops_reported=once,
        unet_step_flops_per_device=step,
        flops_per_call=per_call,
        seconds_per_call=seconds_per_call,
        achieved_flops_per_s=achieved,
        peak_flops_per_s=peak,
        fraction_of_peak=achieved / peak if peak else None,
    )
