"""diffusers' module objects of one SDXL checkpoint: stateless, so the weights travel apart as `params`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Modules:
    """diffusers' stateless module objects; the weights travel separately as `params`."""

    text_encoder: Any  # FlaxCLIPTextModel
    text_encoder_2: Any  # FlaxCLIPTextModelWithProjection
    unet: Any  # FlaxUNet2DConditionModel
    vae: Any  # FlaxAutoencoderKL
    scheduler: Any  # FlaxEulerDiscreteScheduler (its state lives in params["scheduler"])
    vae_scale_factor: int  # 8 for SDXL: pixels per latent
    controlnets: tuple = ()  # the served ControlNets' architectures (device/controlnet.SDXLControlNet), one per kind

    @classmethod
    def of(cls, pipeline) -> Modules:
        return cls(
            text_encoder=pipeline.text_encoder,
            text_encoder_2=pipeline.text_encoder_2,
            unet=pipeline.unet,
            vae=pipeline.vae,
            scheduler=pipeline.scheduler,
            vae_scale_factor=pipeline.vae_scale_factor,
        )
