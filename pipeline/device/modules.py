"""The module objects of one SDXL checkpoint (the project's own, `device/nets/`): stateless, so the weights travel
apart as `params`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Modules:
    """The stateless modules the programs run; the weights travel separately as `params`."""

    text_encoder: Any  # nets/clip.CLIPTextModel
    text_encoder_2: Any  # nets/clip.CLIPTextModelWithProjection
    unet: Any  # nets/unet.UNet2DConditionModel (or its int8 form, device/quantize.py)
    vae: Any  # nets/vae.AutoencoderKL
    vae_scale_factor: int  # 8 for SDXL: pixels per latent
    controlnets: tuple = ()  # the served ControlNets' architectures (nets/controlnet.SDXLControlNet), one per kind
    refiner_unet: Any = None  # the refiner's UNet (5 time ids; checkpoint/refiner_loading.py), None without --refiner
    refiner_text_encoder_2: Any = None  # the refiner's CLIP-G (nets/clip.CLIPTextModelWithProjection)
    image_encoder: Any = None  # an image prompt's CLIP vision encoder (nets/clip_vision.py), None without --ip-adapter
    image_projections: tuple = ()  # each --ip-adapter's projection (nets/image_projection.py), in the flags' order

    @classmethod
    def of(cls, networks) -> Modules:
        """From a checkpoint's `checkpoint/networks.Networks`."""
        return cls(
            text_encoder=networks.text_encoder,
            text_encoder_2=networks.text_encoder_2,
            unet=networks.unet,
            vae=networks.vae,
            vae_scale_factor=networks.vae_scale_factor,
        )
