"""`python -m pipeline precompile`: every program a server with these settings runs, compiled for a topology's
devices (a TPU topology needs libtpu, not a TPU) and written to a directory a server loads with `--precompiled`.
With `--merge-requests`, the smaller calls' programs too, each size in its own folder (`aot.call_size_directory`).

The programs are built by the generator's own `build_programs` from the same `EngineConfig` (same modules, weight
shapes, attention core resolved for the topology's platform, the checkpoint's sampler config with the config's
overrides), so a server started with the same options finds each one. The weights are read for their shapes only.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .checkpoint.controlnet_loading import load_controlnets
from .checkpoint.ip_adapter_loading import load_ip_adapters
from .checkpoint.loading import load_model
from .checkpoint.refiner_loading import load_refiner
from .config import EngineConfig
from .device.modules import Modules
from .device.sharding import data_mesh
from .generator import (
    build_programs,
    for_platform,
    latent_multiple,
    merged_program_keys,
    read_loras,
    sampler_of,
    served_params,
    served_program_keys,
    with_refiner,
)
from .host.compiling.aot import call_size_directory, save_precompiled, topology_devices
from .host.compiling.compile_cache import configure_compilation_cache
from .host.image_prompt_tables import ImagePromptTables
from .host.planning.controlnet_plan import ServedControlNets
from .host.planning.sampler_plan import SamplerConfig

logger = logging.getLogger(__name__)


def precompile(config: EngineConfig, *, topology: str, out: str | Path, progress=logger.info) -> dict:
    """Compile every program of a server with `config` for `topology`'s devices into `out`; the manifest."""
    configure_compilation_cache(False)  # every executable compiled here (see host/compiling/aot.save_precompiled)
    devices = topology_devices(topology)
    config = for_platform(config, devices[0].platform)
    loaded = load_model(
        config.model, dtype=config.dtype, revision=config.revision, variant=config.variant, unet=config.unet
    )
    sampler = sampler_of(loaded, config)
    _, layout = read_loras(loaded, config)  # the merge program's shapes come from the LoRA files
    nets = load_controlnets(config.controlnets, config.dtype, variant=config.variant) if config.controlnets else []
    # architectures only: nothing placed on the topology
    controlnets = ServedControlNets.of(nets, loaded, units=config.controlnet_units)
    refiner = (
        load_refiner(config.refiner, loaded, dtype=config.dtype, variant=config.variant) if config.refiner else None
    )
    adapters = ImagePromptTables(
        tuple(load_ip_adapters(config.ip_adapters, loaded.networks.unet.config, config.dtype)), config.ip_slots
    )
    programs_params = adapters.with_weights(with_refiner(served_params(loaded, config), refiner))
    mesh = data_mesh(devices)
    programs = build_programs(
        loaded, config, programs_params, mesh, sampler, layout, controlnets.archs, refiner, adapters
    )
    multiple = latent_multiple(Modules.of(loaded.networks))
    lora, control_sets, refined = layout is not None, controlnets.sets, refiner is not None
    keys = served_program_keys(
        config,
        sampler.cfg,
        multiple,
        lora=lora,
        control_sets=control_sets,
        refiner=refined,
        image_tokens=programs.image_tokens,  # --ip-adapter: the image_prompt program and each base step's twin
    )
    progress(
        f"precompiling {len(keys)} programs for {topology} ({len(devices)} x {devices[0].device_kind}), "
        f"{config.dtype}, {config.attention} attention, {programs.batch} images per call"
    )
    settings = manifest_settings(config, sampler)
    manifest = save_precompiled(programs, keys, out, topology=topology, settings=settings, progress=progress)
    for n in config.merge_call_sizes[:-1]:  # --merge-requests: the smaller calls' text-to-image programs
        smaller = build_programs(loaded, config, programs_params, mesh, sampler, layout, images_per_device=n)
        calls = merged_program_keys(config, sampler.cfg)
        progress(f"precompiling {len(calls)} programs of the merged calls of {n} image(s) per device")
        save_precompiled(
            smaller,
            calls,
            call_size_directory(out, n),
            topology=topology,
            settings={**settings, "per_device_batch": n},
            progress=progress,
        )
    return manifest


def manifest_settings(config: EngineConfig, sampler: SamplerConfig) -> dict:
    """What the manifest says the server was asked for (informational: each program's own entry is what a server
    loading it checks)."""
    return {
        "model": config.model,
        "sizes": [list(s) for s in config.offered_sizes],
        "dtype": config.dtype,
        "per_device_batch": config.per_device_batch,
        "attention": config.attention,
        "cfg": sampler.cfg,
        "prediction_type": sampler.prediction_type,
        "xla_options": [list(pair) for pair in config.xla_options],
        "cross_attention_cache": config.cross_attention_cache,
    }
