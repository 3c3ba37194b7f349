"""Regenerate tests/fixtures/lora/ (small LoRA files for the tiny geometry) and their reference images.

Needs torch, so it runs only in the separate fixture environment, never in CI or at run time:

    /work/torchenv/bin/python scripts/make_lora_fixtures.py

What it writes:
- tests/fixtures/lora/*.safetensors, LoRAs for tests/fixtures/tiny-pt, with factors of the shapes a PEFT-trained
  LoRA of each targeted layer has (torch-seeded random values, large enough to change the image by many levels):
  - kohya_sgm: kohya/A1111 names in SGM spelling (`lora_unet_input_blocks_4_1_…`), UNet attention + both text
    encoders (`lora_te1_`, `lora_te2_`), float16, an `.alpha` per module (alpha 4 at rank 8: scale 0.5);
  - kohya_diffusers: kohya names in diffusers spelling (`lora_unet_down_blocks_1_attentions_0_…`), bfloat16, no
    `.alpha` (alpha = rank), UNet + TE1, rank 4;
  - peft: saved by diffusers' `StableDiffusionXLPipeline.save_lora_weights` with `lora_adapter_metadata` (rank 4,
    lora_alpha 8, one module's alpha from an `alpha_pattern`), float32, UNet + TE2;
  - locon: kohya SGM names, conv layers of the resnets (3x3 conv1/conv2, 1x1 skip_connection), the down- and
    upsamplers' 3x3 convs, the resnets' time_emb_proj, float16, rank 4, alpha 2;
  - refusals: loha (LyCORIS hada_*), lokr (lokr_*), dora (dora_scale), sd15 (SD 1.5 block names and widths),
    sdxl_size (SGM names with SDXL base's widths, which the tiny model does not have), truncated (kohya_sgm cut
    short), corrupt (no safetensors header).
- tests/fixtures/lora-expected.npz + .json: PEFT's own change to every layer per case (`get_delta_weight` summed
  over the active adapters after `set_adapters`), as three numbers per layer: Σ D, Σ D² and Σ D · cos(o + 2i + 3h
  + 5w) over its PyTorch-layout indices (a layout-sensitive probe), so mapping, scale and layout are checked apart
  from the images; and images from diffusers' PyTorch `StableDiffusionXLPipeline` on tiny-pt
  (float32, 64x64, Euler leading, CFG 6.5), with `load_lora_weights` + `set_adapters`, for: no LoRA, each file at
  weight 1, kohya_sgm 0.8 with peft -0.6 at once, and kohya_sgm with text-encoder weight 0.5 and UNet weight 1.2.
  The initial noise is the engine's for the seed (`pipeline.device.denoise.initial_latents`), passed as `latents=`.
  The manifest also lists, per file, the modules diffusers put a LoRA layer on (an independent check of mapping).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FIXTURES = REPO / "tests" / "fixtures"
CHECKPOINT = FIXTURES / "tiny-pt"
OUT = FIXTURES / "lora"
SIZE = 64
STEPS = 3
GUIDANCE = 6.5
SEED = 7
PROMPT = "a cozy cabin in a snowy forest, warm light"
TORCH_SEED = 27
#: How far each LoRA pushes its layers: the change's spread relative to the layer's own weights. At 0.8 the PEFT
#: file moved the image by 18 levels on average and the engine's image differed from PyTorch's by up to 3 levels:
#: diffusers' Flax GEGLU uses tanh-approximate GELU, PyTorch's the exact one (with PyTorch's GEGLU switched to tanh
#: the two agreed within 1 level), and strong LoRAs push more activations where the two differ. 0.5 keeps the
#: images within 1 level and each LoRA still changes them by many levels.
GAIN = 0.5

ATTENTION = (
    "attn1.to_q",
    "attn1.to_k",
    "attn1.to_v",
    "attn1.to_out.0",
    "attn2.to_q",
    "attn2.to_k",
    "attn2.to_v",
    "attn2.to_out.0",
    "ff.net.0.proj",
    "ff.net.2",
)
TEXT = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "mlp.fc1", "mlp.fc2")

#: (case name, {file stem: weight or {component: weight}}); "base" has no LoRA.
CASES = [
    ("base", {}),
    ("kohya_sgm", {"kohya_sgm": 1.0}),
    ("kohya_diffusers", {"kohya_diffusers": 1.0}),
    ("peft", {"peft": 1.0}),
    ("locon", {"locon": 1.0}),
    ("kohya_sgm_and_negative_peft", {"kohya_sgm": 0.8, "peft": -0.6}),
    ("kohya_sgm_te_0.5_unet_1.2", {"kohya_sgm": {"unet": 1.2, "text_encoder": 0.5, "text_encoder_2": 0.5}}),
]


# ---- factors of the shapes a PEFT LoRA of a layer has -------------------------------------------------------------


def factors(module: torch.nn.Module, rank: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(down, up) in PyTorch's layout: Linear [r, in] / [out, r]; Conv2d [r, in, kh, kw] / [out, r, 1, 1]."""
    weight = module.weight.detach()
    fan_in = weight[0].numel()
    if isinstance(module, torch.nn.Conv2d):
        down_shape, up_shape = (rank, *weight.shape[1:]), (weight.shape[0], rank, 1, 1)
    else:
        down_shape, up_shape = (rank, weight.shape[1]), (weight.shape[0], rank)
    down = torch.randn(down_shape, generator=generator) / fan_in**0.5
    # delta = up @ down has entries of spread sqrt(rank) · s / sqrt(fan_in); match GAIN × the weights' spread.
    s = GAIN * weight.std().item() * fan_in**0.5 / rank**0.5
    up = torch.randn(up_shape, generator=generator) * s
    return down, up


def unet_attention_modules(unet) -> list[str]:
    names = [n for n, _ in unet.named_modules()]
    return [n for n in names if n.endswith(ATTENTION) or (".attentions." in n and n.endswith(("proj_in", "proj_out")))]


def unet_conv_modules(unet) -> list[str]:
    resnet = ("conv1", "conv2", "conv_shortcut", "time_emb_proj")
    sampler = ("downsamplers.0.conv", "upsamplers.0.conv")
    names = [name for name, _ in unet.named_modules()]
    return [n for n in names if (".resnets." in n and n.endswith(resnet)) or n.endswith(sampler)]


def text_modules(encoder) -> list[str]:
    return [n for n, _ in encoder.named_modules() if n.endswith(TEXT)]


# ---- names: kohya SGM (written independently of pipeline/checkpoint/lora.py), kohya diffusers, PEFT ------------------


def sgm_name(module: str, layers_per_block: int, up_attention: list[bool]) -> str:
    """diffusers UNet module name -> SGM name as kohya writes it for SDXL (dots, before `_` joining)."""
    resnet = {
        "conv1": "in_layers.2",
        "conv2": "out_layers.3",
        "time_emb_proj": "emb_layers.1",
        "conv_shortcut": "skip_connection",
    }
    p = module.split(".")
    n = layers_per_block
    if p[0] == "down_blocks":
        b, kind, j = int(p[1]), p[2], int(p[3])
        if kind == "downsamplers":
            return f"input_blocks.{(b + 1) * (n + 1)}.0.op"
        index = 1 + b * (n + 1) + j
        return (
            f"input_blocks.{index}.0.{resnet['.'.join(p[4:])]}"
            if kind == "resnets"
            else f"input_blocks.{index}.1.{'.'.join(p[4:])}"
        )
    if p[0] == "mid_block":
        kind, j = p[1], int(p[2])
        index = {("resnets", 0): 0, ("attentions", 0): 1, ("resnets", 1): 2}[(kind, j)]
        inner = resnet[".".join(p[3:])] if kind == "resnets" else ".".join(p[3:])
        return f"middle_block.{index}.{inner}"
    if p[0] == "up_blocks":
        b, kind, j = int(p[1]), p[2], int(p[3])
        if kind == "upsamplers":
            return f"output_blocks.{b * (n + 1) + n}.{2 if up_attention[b] else 1}.conv"
        index = b * (n + 1) + j
        return (
            f"output_blocks.{index}.0.{resnet['.'.join(p[4:])]}"
            if kind == "resnets"
            else f"output_blocks.{index}.1.{'.'.join(p[4:])}"
        )
    raise ValueError(module)


def kohya_state(pairs: dict[str, tuple], prefix: str, name_of, dtype, alpha: float | None) -> dict[str, torch.Tensor]:
    """kohya's tensors for {diffusers module name: (down, up)}: `prefix` + name_of(module) with dots as `_`."""
    state = {}
    for module, (down, up) in pairs.items():
        key = prefix + name_of(module).replace(".", "_")
        state[f"{key}.lora_down.weight"] = down.to(dtype).contiguous()
        state[f"{key}.lora_up.weight"] = up.to(dtype).contiguous()
        if alpha is not None:
            state[f"{key}.alpha"] = torch.tensor(alpha, dtype=dtype)
    return state


def save(state: dict[str, torch.Tensor], name: str, metadata: dict | None = None) -> Path:
    from safetensors.torch import save_file

    path = OUT / f"{name}.safetensors"
    save_file(state, str(path), metadata=metadata)
    canonical_header(path)
    return path


def make_files(pipe) -> dict[str, str]:
    """Write every fixture file; return {file stem: format} for the ones the app accepts."""
    from diffusers import StableDiffusionXLPipeline
    from peft import LoraConfig

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    generator = torch.Generator().manual_seed(TORCH_SEED)
    unet, te1, te2 = pipe.unet, pipe.text_encoder, pipe.text_encoder_2
    n = unet.config.layers_per_block
    up_attention = ["CrossAttn" in t for t in unet.config.up_block_types]
    modules = dict(unet.named_modules())
    te1_modules, te2_modules = dict(te1.named_modules()), dict(te2.named_modules())

    def pairs(names, table, rank):
        return {name: factors(table[name], rank, generator) for name in names}

    sgm = lambda m: sgm_name(m, n, up_attention)  # noqa: E731
    same = lambda m: m  # noqa: E731

    # kohya, SGM names, UNet attention + TE1 + TE2, fp16, alpha 4 at rank 8.
    unet_pairs = pairs(unet_attention_modules(unet), modules, 8)
    state = kohya_state(unet_pairs, "lora_unet_", sgm, torch.float16, 4.0)
    state |= kohya_state(pairs(text_modules(te1), te1_modules, 8), "lora_te1_", same, torch.float16, 4.0)
    state |= kohya_state(pairs(text_modules(te2), te2_modules, 8), "lora_te2_", same, torch.float16, 4.0)
    metadata = {
        "ss_base_model_version": "sdxl_base_v1-0",
        "ss_network_module": "networks.lora",
        "ss_network_dim": "8",
        "ss_network_alpha": "4.0",
    }
    save(state, "kohya_sgm", metadata)
    kohya_sgm_state = state

    # kohya, diffusers names, UNet attention + TE1, bf16, no alpha (alpha = rank), rank 4.
    state = kohya_state(pairs(unet_attention_modules(unet), modules, 4), "lora_unet_", same, torch.bfloat16, None)
    state |= kohya_state(pairs(text_modules(te1), te1_modules, 4), "lora_te1_", same, torch.bfloat16, None)
    save(state, "kohya_diffusers")

    # diffusers/PEFT: save_lora_weights with lora_adapter_metadata (LoraConfig.to_dict(), as diffusers' training
    # scripts pass it); rank 4, lora_alpha 8, one module alpha 2 through alpha_pattern; UNet + TE2.
    unet_names = unet_attention_modules(unet)
    pattern_module = next(m for m in unet_names if m.startswith("mid_block") and m.endswith("attn2.to_k"))
    unet_config = LoraConfig(r=4, lora_alpha=8, target_modules=sorted(unet_names), alpha_pattern={pattern_module: 2})
    te2_names = text_modules(te2)
    te2_config = LoraConfig(r=4, lora_alpha=2, target_modules=sorted(te2_names))

    def peft_layers(names, table):
        out = {}
        for name, (down, up) in pairs(names, table, 4).items():
            out[f"{name}.lora_A.weight"] = down.contiguous()
            out[f"{name}.lora_B.weight"] = up.contiguous()
        return out

    with tempfile.TemporaryDirectory() as tmp:
        StableDiffusionXLPipeline.save_lora_weights(
            tmp,
            unet_lora_layers=peft_layers(unet_names, modules),
            text_encoder_2_lora_layers=peft_layers(te2_names, te2_modules),
            unet_lora_adapter_metadata=_jsonable(unet_config.to_dict()),
            text_encoder_2_lora_adapter_metadata=_jsonable(te2_config.to_dict()),
            weight_name="peft.safetensors",
        )
        shutil.copy(Path(tmp) / "peft.safetensors", OUT / "peft.safetensors")
    canonical_header(OUT / "peft.safetensors")

    # LoCon: kohya SGM names, the resnets' convs (3x3 and 1x1), time_emb_proj, down/upsampler convs; fp16, alpha 2.
    state = kohya_state(pairs(unet_conv_modules(unet), modules, 4), "lora_unet_", sgm, torch.float16, 2.0)
    save(state, "locon", {"ss_network_module": "networks.lora", "ss_network_args": json.dumps({"conv_dim": "4"})})

    # ---- refusals ----
    some = "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q"

    def r(*shape):
        return torch.randn(shape, generator=generator)

    save(
        {
            f"{some}.hada_w1_a": r(64, 4),
            f"{some}.hada_w1_b": r(4, 64),
            f"{some}.hada_w2_a": r(64, 4),
            f"{some}.hada_w2_b": r(4, 64),
            f"{some}.alpha": torch.tensor(4.0),
        },
        "loha",
    )
    save(
        {
            f"{some}.lokr_w1": r(8, 8),
            f"{some}.lokr_w2_a": r(8, 4),
            f"{some}.lokr_w2_b": r(4, 8),
            f"{some}.alpha": torch.tensor(4.0),
        },
        "lokr",
    )
    dora = {k: v for k, v in kohya_sgm_state.items() if k.startswith(some)}
    dora[f"{some}.dora_scale"] = torch.ones(1, 64, dtype=torch.float16)
    save(dora, "dora")
    sd15 = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"
    save(
        {
            f"{sd15}.lora_down.weight": r(4, 320).half(),
            f"{sd15}.lora_up.weight": r(320, 4).half(),
            f"{sd15}.alpha": torch.tensor(4.0).half(),
            "lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight": r(4, 768).half(),
            "lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight": r(768, 4).half(),
        },
        "sd15",
        {"ss_base_model_version": "sd_v1"},
    )
    save(
        {
            f"{some}.lora_down.weight": r(1, 640).half(),
            f"{some}.lora_up.weight": r(640, 1).half(),
            f"{some}.alpha": torch.tensor(1.0).half(),
        },
        "sdxl_size",
    )
    whole = (OUT / "kohya_sgm.safetensors").read_bytes()
    (OUT / "truncated.safetensors").write_bytes(whole[: len(whole) // 2])
    (OUT / "corrupt.safetensors").write_bytes(b"this is not a safetensors file, only text with its suffix\n")
    return {
        "kohya_sgm": "kohya (SGM names)",
        "kohya_diffusers": "kohya (diffusers names)",
        "peft": "diffusers/PEFT",
        "locon": "kohya (SGM names)",
    }


def canonical_header(path: Path) -> None:
    """Rewrite the header with its keys sorted: safetensors writes metadata in hash-map order, which changes from
    run to run; the tensor data (what A1111's hash covers) is untouched."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    assert len(text) <= length, path
    path.write_bytes(data[:8] + text + b" " * (length - len(text)) + data[8 + length :])


def _jsonable(config: dict) -> dict:
    return {k: (sorted(v) if isinstance(v, set) else v.value if hasattr(v, "value") else v) for k, v in config.items()}


# ---- references -----------------------------------------------------------------------------------------------------


def lora_modules(pipe, adapter: str) -> list[str]:
    """ "component.module" for every layer diffusers/PEFT gave a LoRA layer of `adapter`."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    found = []
    for component in ("unet", "text_encoder", "text_encoder_2"):
        for name, module in getattr(pipe, component).named_modules():
            if isinstance(module, BaseTunerLayer) and adapter in getattr(module, "lora_A", {}):
                found.append(f"{component}.{name}")
    return sorted(found)


def _modules_in_file(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as reader:
        keys = list(reader.keys())
    return sum(1 for k in keys if k.endswith(("lora_down.weight", "lora_A.weight")))


def delta_stats(pipe, adapters: list[str], modules: list[str]) -> np.ndarray:
    """float64 [len(modules), 3]: per "component.module", (Σ D, Σ D², Σ D·cos(o + 2i + 3h + 5w)) of PEFT's change
    D = Σ_adapters get_delta_weight(adapter) (set_adapters' weight included), D in PyTorch's layout."""
    out = np.zeros((len(modules), 3))
    for row, qualified in enumerate(modules):
        component, name = qualified.split(".", 1)
        layer = dict(getattr(pipe, component).named_modules())[name]
        delta = sum(
            (layer.get_delta_weight(a).detach().double().numpy() for a in adapters if a in layer.lora_A),
            np.zeros(tuple(layer.get_base_layer().weight.shape)),
        )
        out[row] = (delta.sum(), (delta**2).sum(), (delta * probe(delta.shape)).sum())
    return out


def probe(shape: tuple[int, ...]) -> np.ndarray:
    """cos(o + 2i + 3h + 5w) over a PyTorch-layout [out, in(, kh, kw)] index grid."""
    grids = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij")
    return np.cos(sum(factor * grid for factor, grid in zip((1, 2, 3, 5), grids, strict=False)))


def engine_noise() -> np.ndarray:
    """The engine's initial noise for SEED (before scaling by the scheduler's init sigma): float32 [1, 4, 8, 8]."""
    import jax

    jax.config.update("jax_platforms", "cpu")
    from pipeline.device.denoise import initial_latents

    return np.asarray(initial_latents(np.asarray([SEED], np.uint32), SIZE, SIZE, 8), np.float32)


def render(pipe, latents: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        image = pipe(
            prompt=PROMPT,
            num_inference_steps=STEPS,
            guidance_scale=GUIDANCE,
            height=SIZE,
            width=SIZE,
            latents=torch.from_numpy(latents),
            output_type="np",
        ).images  # float32 [1, 64, 64, 3] in [0, 1]
    return np.asarray(image, np.float32)


def main() -> None:
    import diffusers
    import peft
    import transformers
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(str(CHECKPOINT), torch_dtype=torch.float32)
    formats = make_files(pipe)
    latents = engine_noise()
    arrays = {"latents": latents}
    arrays["base"] = render(pipe, latents)
    modules = {}
    for stem in formats:
        pipe.load_lora_weights(str(OUT), weight_name=f"{stem}.safetensors", adapter_name=stem)
        modules[stem] = lora_modules(pipe, stem)
        in_file = _modules_in_file(OUT / f"{stem}.safetensors")
        assert len(modules[stem]) == in_file, f"diffusers put {len(modules[stem])} of {stem}'s {in_file} layers"
    cases = [{"name": "base", "loras": {}}]
    every = sorted({m for names in modules.values() for m in names})
    for name, loras in CASES[1:]:
        pipe.set_adapters(list(loras), adapter_weights=list(loras.values()))
        arrays[name] = render(pipe, latents)
        arrays[f"delta/{name}"] = delta_stats(pipe, list(loras), every)
        levels = np.abs(np.round(arrays[name] * 255) - np.round(arrays["base"] * 255))
        print(f"{name}: differs from no LoRA by up to {levels.max():.0f} levels, {levels.mean():.1f} on average")
        assert levels.mean() > 5, f"{name} barely changes the image"
        cases.append({"name": name, "loras": loras})
    pipe.disable_lora()
    again = np.abs(np.round(render(pipe, latents) * 255) - np.round(arrays["base"] * 255))
    print(f"LoRAs disabled: differs from the first image by up to {again.max():.0f} levels")
    assert again.max() <= 1, "disabling the LoRAs did not give the first image back"
    manifest = {
        "what": "diffusers' PyTorch StableDiffusionXLPipeline on tests/fixtures/tiny-pt (float32) with "
        "load_lora_weights + set_adapters, the engine's initial noise for the seed",
        "prompt": PROMPT,
        "negative_prompt": None,
        "guidance_scale": GUIDANCE,
        "steps": STEPS,
        "sampler": "euler",
        "timestep_spacing": "leading",
        "timesteps": [float(t) for t in pipe.scheduler.timesteps],
        "seed": SEED,
        "height": SIZE,
        "width": SIZE,
        "latents": "npz key 'latents', float32 [1, 4, 8, 8]: initial_latents(seed), before the init sigma",
        "images": "npz key = case name, float32 [1, 64, 64, 3] in [0, 1]",
        "cases": cases,
        "formats": formats,
        "modules": modules,
        "delta_modules": every,
        "deltas": "npz key 'delta/<case>', float64 [len(delta_modules), 3]: per layer (sum D, sum D^2, "
        "sum D * cos(o + 2i + 3h + 5w)) of PEFT's change in PyTorch's layout [out, in(, kh, kw)]",
        "refused": ["loha", "lokr", "dora", "sd15", "sdxl_size", "truncated", "corrupt"],
        "versions": {
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
        },
    }
    np.savez_compressed(FIXTURES / "lora-expected.npz", **arrays)
    (FIXTURES / "lora-expected.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f.stat().st_size for f in OUT.iterdir())
    print(f"wrote {len(list(OUT.iterdir()))} files ({total / 1e6:.2f} MB) under {OUT} and the references")


if __name__ == "__main__":
    main()
