"""The bench's one door into the engine (`pipeline`): every engine name the bench uses, and the few helpers that
stand for several of them.

Why a door: the bench measures the engine from outside, and where it has to reach inside (a served program compiled
for a TPU topology, the networks built from SDXL's configs, the old fused loop rebuilt from the device's pieces) the
names are listed here once, by what the bench does with them, instead of spread over thirty modules. A name that
moves inside the engine breaks this table, not the parts; tests/system/test_import_circles.py checks that no other
bench module imports `pipeline`.

Nothing is imported until a name is first asked for (`from bench.engine import Generator` inside a function, or an
attribute of this module; PEP 562's module `__getattr__`, as `pipeline/__init__.py` does): `python -m bench` sets the
JAX platform and the CPU device count before JAX is first imported, and most of these names import JAX.
"""

from __future__ import annotations

import argparse
import importlib

#: Each name the bench may import from here -> (the engine's module, the name there; None: the module itself).
_HOME = {
    # The engine as the app builds it: its settings, the generator, a result, the one input error.
    "EngineConfig": ("pipeline.config", "EngineConfig"),
    "shape_defaults": ("pipeline.config", "shape_defaults"),
    "xla_option_pairs": ("pipeline.config", "xla_option_pairs"),
    "Generator": ("pipeline.generator", "Generator"),
    "GenerationResult": ("pipeline.generator", "GenerationResult"),
    "prepare": ("pipeline.generator", "prepare"),
    "build_programs": ("pipeline.generator", "build_programs"),
    "sampler_of": ("pipeline.generator", "sampler_of"),
    "InvalidInput": ("pipeline.contract.errors", "InvalidInput"),
    "check_xla_options": ("pipeline.host.compiling.compiler_options", "check"),
    # Requests as the page makes them: fields, presets, styles, samplers, the `parameters` text, image files.
    "FIELD": ("pipeline.contract.fields", "FIELD"),
    "get_preset": ("pipeline.contract.presets", "get_preset"),
    "load_styles": ("pipeline.contract.styles", "load_styles"),
    "LCM_MAX_STEPS": ("pipeline.contract.sampler_names", "LCM_MAX_STEPS"),
    "second_pass_steps": ("pipeline.contract.hires", "second_pass_steps"),
    "describe": ("pipeline.contract.parameters", "describe"),
    "parse_request": ("pipeline.contract.request", "parse_request"),
    "Plot": ("pipeline.contract.xyz_plot", "Plot"),
    "run_plot": ("pipeline.contract.xyz_run", "run_plot"),
    "image_files": ("pipeline.contract.image_files", None),
    # Checkpoints: the loader, and the ControlNet and upscaler files a part builds or loads on its own.
    "LoadedModel": ("pipeline.checkpoint.loading", "LoadedModel"),
    "load_model": ("pipeline.checkpoint.loading", "load_model"),
    "resolve_model": ("pipeline.checkpoint.loading", "resolve_model"),
    "load_converted": ("pipeline.checkpoint.convert", "load_converted"),
    "ControlNetWeights": ("pipeline.checkpoint.controlnet_loading", "ControlNetWeights"),
    "controlnet_module": ("pipeline.checkpoint.controlnet_loading", "controlnet_module"),
    "shape_params": ("pipeline.device.nets.controlnet", "shape_params"),
    "load_upscaler": ("pipeline.checkpoint.upscaler_loading", "load_upscaler"),
    "TiledUpscaler": ("pipeline.host.upscale_tiles", "TiledUpscaler"),
    # The served programs, compiled apart from a generator (bench tpu, the per-program profile, the LoRA merge).
    "ProgramKey": ("pipeline.host.compiling.programs", "ProgramKey"),
    "ServedPrograms": ("pipeline.host.compiling.programs", "ServedPrograms"),
    "KINDS": ("pipeline.host.compiling.programs", "KINDS"),
    "program_keys": ("pipeline.host.compiling.programs", "program_keys"),
    "windows_key": ("pipeline.host.compiling.programs", "windows_key"),
    "speed_plan": ("pipeline.host.planning.speed_plan", "speed_plan"),
    "Modules": ("pipeline.device.modules", "Modules"),
    # IP-Adapters with abstract weights (bench tpu --ip-adapter): the encoder, the projection, the served tables.
    "CLIPVisionConfig": ("pipeline.device.nets.clip_vision", "CLIPVisionConfig"),
    "CLIPVisionModelWithProjection": ("pipeline.device.nets.clip_vision", "CLIPVisionModelWithProjection"),
    "ImageProjectionConfig": ("pipeline.device.nets.image_projection", "ImageProjectionConfig"),
    "image_projection": ("pipeline.device.nets.image_projection", "image_projection"),
    "init_projection": ("pipeline.device.nets.image_projection", "init_projection"),
    "IPAdapterWeights": ("pipeline.checkpoint.ip_adapter_loading", "IPAdapterWeights"),
    "ImageEncoderWeights": ("pipeline.checkpoint.ip_adapter_loading", "ImageEncoderWeights"),
    "cross_attention_paths": ("pipeline.checkpoint.ip_adapter_loading", "cross_attention_paths"),
    "ImagePromptTables": ("pipeline.host.image_prompt_tables", "ImagePromptTables"),
    "quantized_unet": ("pipeline.device.quantize", "quantized_unet"),
    "lora_targets": ("pipeline.checkpoint.lora", "lora_targets"),
    "COMPONENTS": ("pipeline.device.lora", "COMPONENTS"),
    "SLOTS": ("pipeline.device.lora", "SLOTS"),
    "MergeLayout": ("pipeline.device.lora", "MergeLayout"),
    "topology_devices": ("pipeline.host.compiling.aot", "topology_devices"),
    "quiet_start": ("pipeline.platform", "quiet_start"),
    "CompileCounter": ("pipeline.host.compiling.compile_cache", "CompileCounter"),
    "configure_compilation_cache": ("pipeline.host.compiling.compile_cache", "configure_compilation_cache"),
    # Attention cores and the mesh, for programs the bench builds around the engine's bodies.
    "attention": ("pipeline.device.attention", None),
    "hooked": ("pipeline.device.attention", "hooked"),
    "resolve_attention": ("pipeline.device.attention", "resolve"),
    "ATTENTIONS": ("pipeline.device.cores", "ATTENTIONS"),
    "DATA_AXIS": ("pipeline.device.sharding", "DATA_AXIS"),
    "batch_sharded": ("pipeline.device.sharding", "batch_sharded"),
    "data_mesh": ("pipeline.device.sharding", "data_mesh"),
    # The loop on the host: sampler plans, previews, prompts read into tokens, the text cache.
    "SamplerConfig": ("pipeline.host.planning.sampler_plan", "SamplerConfig"),
    "PREVIEW_EVERY": ("pipeline.host.loop", "PREVIEW_EVERY"),
    "local_rows": ("pipeline.host.loop", "local_rows"),
    "latents_to_rgb": ("pipeline.device.preview", "latents_to_rgb"),
    "ExtraRows": ("pipeline.host.planning.tokens", "ExtraRows"),
    "extra_capacity": ("pipeline.host.planning.tokens", "extra_capacity"),
    "tokenize": ("pipeline.host.planning.tokens", "tokenize"),
    "TextCache": ("pipeline.host.text_cache", "TextCache"),
    # The fused loop the host loop replaced (bench/cpu/fused.py), rebuilt from the device's own bodies.
    "sampler_update": ("pipeline.device.sampler_update", None),
    "initial_latents": ("pipeline.device.denoise", "initial_latents"),
    "time_ids": ("pipeline.device.denoise", "time_ids"),
    "encode_each": ("pipeline.device.text", "encode_each"),
    "decode": ("pipeline.device.vae", "decode"),
    "to_uint8": ("pipeline.device.vae", "to_uint8"),
    # The engine service's wire format (the page -> engine hop).
    "RemoteResult": ("pipeline.service.wire", "RemoteResult"),
    "result_line": ("pipeline.service.wire", "result_line"),
}


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = home
    imported = importlib.import_module(module)
    return imported if attribute is None else getattr(imported, attribute)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})


def bench_parser(defaults: dict, **parser_args) -> argparse.ArgumentParser:
    """The engine's one-line-error parser (pipeline/options.py's `Parser`) with the engine options the bench takes
    (those marked BENCH), each defaulting to its environment variable, then to `defaults`."""
    from pipeline.options import BENCH, Parser, add_options

    parser = Parser(**parser_args)
    add_options(parser, BENCH, defaults=defaults)
    return parser


def bench_config(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The EngineConfig the bench's engine options describe; a bad value (flag or environment variable) is the
    parser's one-line error."""
    from pipeline.config import engine_config
    from pipeline.contract.errors import InvalidInput
    from pipeline.options import BENCH, check_env_choices

    check_env_choices(parser, args, BENCH)
    try:
        return engine_config(args)
    except InvalidInput as exc:
        parser.error(str(exc))


def require_engine_installed(prog: str) -> None:
    """Exit 2 with one line naming the install command when the engine's packages are missing (only the engine's: a
    lent GPU machine has no gradio). Standard library only, so it runs before anything else is imported."""
    from pipeline.installed import ENGINE, require_installed

    require_installed(prog, ENGINE)


def engine_packages_missing() -> list[str]:
    """The engine's requirements this python cannot find (found, not imported)."""
    from pipeline.installed import ENGINE, missing

    return missing(ENGINE)


def network(kind: str, config: dict, dtype):
    """One of the engine's networks (pipeline/device/nets/) from its diffusers config.json fields, no weights: `kind`
    is "unet", "vae", "text_encoder" or "text_encoder_2" (the CLIP encoder with the projection)."""
    import jax.numpy as jnp

    from pipeline.device.nets.clip import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection
    from pipeline.device.nets.unet import UNet2DConditionModel, UNetConfig
    from pipeline.device.nets.vae import AutoencoderKL, VAEConfig

    dtype = jnp.dtype(dtype)
    if kind == "unet":
        return UNet2DConditionModel(UNetConfig.from_dict(config), dtype=dtype)
    if kind == "vae":
        return AutoencoderKL(VAEConfig.from_dict(config), dtype=dtype)
    text = {"text_encoder": CLIPTextModel, "text_encoder_2": CLIPTextModelWithProjection}[kind]
    return text(CLIPTextConfig.from_dict(config), dtype=dtype)


def offered_sizes(text: str | None, tiny: bool) -> list[tuple[int, int]]:
    """The sizes a server offers, (height, width): `text` as `--sizes` reads it, else the default sizes (the tiny
    model's with `tiny`)."""
    from pipeline.contract.sizes import default_sizes, parse_sizes

    return parse_sizes(text) if text else default_sizes(tiny=tiny)


def sampler_schedules() -> list[tuple[str, str]]:
    """Every sampler by its A1111 name with each schedule type it offers, in the page's order."""
    from pipeline.contract.sampler_names import AUTOMATIC, SAMPLER_NAMES, SCHEDULES_OF, resolve

    return [
        (name, schedule)
        for name in SAMPLER_NAMES
        if resolve(name)[1] == AUTOMATIC
        for schedule in SCHEDULES_OF[resolve(name)[0]]
    ]


def vae_tiles(height: int, width: int) -> int:
    """How many tiles the tiled VAE runs over for a `height` x `width` picture (pipeline/device/vae_tiles.py)."""
    from pipeline.device.vae_tiles import OVERLAP, TILE, tile_starts

    return len(tile_starts(height // 8, TILE, OVERLAP)) * len(tile_starts(width // 8, TILE, OVERLAP))


__all__ = [
    *_HOME,
    "bench_parser",
    "bench_config",
    "require_engine_installed",
    "engine_packages_missing",
    "network",
    "offered_sizes",
    "sampler_schedules",
    "vae_tiles",
]
