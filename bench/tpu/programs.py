"""`python -m bench tpu`: the served programs compiled by the real TPU compiler on this host (no TPU needed).

    python -m bench tpu                               # SDXL, v5e:2x2, the app's 3 sizes, CFG on/off, xla and splash
    python -m bench tpu --only "step 1024x1024 cfg" --attention splash    # one program (9-15 min here at full size)
    python -m bench tpu --topology v6e:2x2 --kinds step --sizes 1024x1024
    python -m bench tpu --model tiny --sizes 64x64                # the tiny checkpoint's geometry: a minute or two
    python -m bench tpu --kinds merge --lora-rank 32              # the LoRA merge program (a typical kohya LoRA)
    python -m bench tpu --startup                                 # precompiled vs cold start-up (tiny, this CPU)
    python -m bench tpu --only "step_full 1024x1024 cfg" --attention splash --quantize int8    # the int8 UNet
    python -m bench tpu --only "encode cfg" --prompt-windows 1                # CLIP's single 77-token window
    python -m bench tpu --kinds step,step_pag,step_freeu --cfg on --attention splash --sizes 1024x1024  # PAG, FreeU

Needs libtpu (`pip install "jax[tpu]==0.10.2"`, in requirements-dev.txt). `--topology` is any name libtpu knows
(v5e:2x2 = v5e-4, v5e:2x4, v6e:2x2, the multi-host v5e:4x4...); the batch is one image per chip (x
--per-device-batch), weights replicated, as the app serves. SDXL's weights are abstract (shapes only, bf16: nothing
is downloaded); `--model tiny` uses the tiny checkpoint. Each program is compiled with `ServedPrograms.lower(key)
.compile()`, exactly what the server compiles; per program the report gives compile seconds here, HBM per chip
(memory analysis: arguments, temporaries, outputs, generated code) against the chip's HBM, FLOPs and bytes accessed
of the compiled program (cost analysis, per chip; fused Pallas kernels report no FLOPs) and the roofline
max(FLOPs / peak, bytes / bandwidth). Per request it predicts device seconds on the topology (4 images on v5e:2x2)
from the rooflines (the requests below): encode + start + each step's program + decode, a lower bound, at every
size compiled.

Every kind a server runs can be compiled: `step` (a server with --no-speed-levers), `step_full` and `step_shallow`
(DeepCache's whole and shallow UNet; with levers on, the default, every whole-UNet step is a `step_full`),
`halve_text` and `halve_feature` (where guidance ends), `preview`, `encode`, `start`, `decode`, `merge`, and the
whole-UNet step with FreeU and/or perturbed-attention guidance, `step_freeu`, `step_pag`, `step_freeu_pag` (a server
with --freeu-programs / --pag; not compiled unless --kinds names them; with CFG PAG's batch is 3 rows per image:
uncond, cond, perturbed; their rows carry `extras` and stay out of the predicted requests). Rows carry
`prompt_windows` (the programs that read the prompt: --prompt-windows, 3 by default as the server's) and `quantize`
(the UNet's programs: --quantize int8 as `pipeline/device/quantize.py` serves it). The predicted requests follow
the host loop's speed plan (host/planning/speed_plan.py): exact 25 steps, cfg_end 0.5, DeepCache 3, both, Lightning-4,
and MLPerf's 20-step CFG request, whose images/s per chip stand beside Google's MLPerf Inference v4.1 v5e figure
(0.438). An int8 row's roofline keeps its FLOPs at the bf16 peak; the int8 peak (393 TOPS on v5e) gives a second, lower
bound, since the cost analysis does not say which FLOPs ran int8.

Results go to --out/tpu.json (merged with the rows already there, so programs compiled by separate runs add up) and
a table is printed (`--report`: only that, nothing compiled). Only the UNet steps depend on the attention core; the
other programs are compiled once (attention null).

The `merge` kind is the LoRA merge program (ProgramKey("merge"), device/lora.py) for the kernels a typical kohya SDXL
LoRA trains (`kohya_leaves`), at --lora-rank (32) with 4 slots; besides its row, the report adds the HBM a server
offering LoRAs needs per chip beside the 1024x1024 CFG step program (`lora_budget`): the compiler's figures plus the
bytes of the extra kernel copies and slot factors computed from the layout.

`--startup` measures the precompiled start-up instead, on this host's CPU devices with the tiny checkpoint (128x128,
4 steps): `python -m pipeline precompile --topology cpu`, then `python -m pipeline generate` cold (no compilation
cache) and with `--precompiled`, each a fresh process; writes startup.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import time
from dataclasses import astuple
from pathlib import Path

from .image_prompt import ADAPTERS, SHAPES, abstract_tables

SDXL = "sdxl"
TINY = "tiny"
KINDS = (
    "step",
    "decode",
    "encode",
    "start",
    "merge",
    "step_full",
    "step_shallow",
    "halve_text",
    "halve_feature",
    "preview",
    "step_control",
    "cross_kv",
    "step_freeu",
    "step_pag",
    "step_freeu_pag",
    "step_regions2",
    "step_regions4",
    "image_prompt",
    "step_image",
)
#: The bench's names for the whole-UNet step with FreeU and/or PAG (ProgramKey("step", extras=...),
#: device/extras_step.py): a server compiles them only with --freeu-programs / --pag, so the default --kinds leaves
#: them out.
EXTRAS_KINDS = {"step_freeu": ("freeu",), "step_pag": ("pag",), "step_freeu_pag": ("freeu", "pag")}
#: The bench's names for a regional prompt's step blending P parts (ProgramKey("step", windows=P, parts=P),
#: device/regions.py): a server compiles them only for its --region-parts.
REGION_KINDS = {"step_regions2": 2, "step_regions4": 4}
#: An image prompt's programs (--ip-adapter plain|plus, one slot, abstract weights: bench/tpu/image_prompt.py): the
#: `image_prompt` program (the image encoder, the projection, every layer's image keys and values) and the whole-UNet
#: step reading its tokens (ProgramKey.image_tokens: 4 plain, 16 Plus).
IMAGE_PROMPT_KINDS = ("image_prompt", "step_image")
#: The kinds compiled when --kinds is not given: every program a server without --freeu-programs, --pag and
#: --region-parts runs.
DEFAULT_KINDS = tuple(
    kind for kind in KINDS if kind not in EXTRAS_KINDS and kind not in REGION_KINDS and kind not in IMAGE_PROMPT_KINDS
)
#: The full-size SDXL ControlNet (diffusers/controlnet-canny-sdxl-1.0's config): the step_control kind's, one unit.
CONTROLNET_CONFIG = Path(__file__).resolve().parents[2] / "assets" / "controlnet_canny_sdxl_config.json"
#: `--controlnet union`: xinsir's controlnet-union-sdxl-1.0 ProMax, the same network plus its union parts (8 control
#: types, diffusers' `ControlNetUnionModel` sizes for the rest).
UNION_FIELDS = {
    "_class_name": "ControlNetUnionModel",
    "num_control_type": 8,
    "num_trans_channel": 320,
    "num_trans_head": 8,
    "num_trans_layer": 1,
    "num_proj_channel": 320,
}
#: The kinds that run the UNet, so depend on --quantize.
UNET_KINDS = ("step", "step_full", "step_shallow", "step_control")  # a row's "kind": FreeU/PAG steps are "step"
#: Images of up to this many pixels go through the VAE whole (EngineConfig.vae_tile_above's default: 1024²).
VAE_WHOLE_UP_TO = 1024 * 1024
#: The kinds that read the prompt's hidden states, so depend on --prompt-windows.
TEXT_KINDS = ("encode", "step", "step_full", "step_shallow", "step_control", "halve_text", "cross_kv")
#: A common SDXL LoRA rank (kohya's default network_dim is 4..128; 32 is what most shared SDXL LoRAs use).
LORA_RANK = 32
#: int8 x int8 peak per chip (ops/s): v5e 393 TOPS, v6e 1836 TOPS (Google Cloud's TPU pages), twice bf16's.
INT8_PEAK = {"TPU v5 lite": 393e12, "TPU v6 lite": 1836e12}
#: A v5e chip's HBM, the budget when the compiler names no chip size (cost.HBM_PER_CHIP).
HBM_V5E = 16 * 2**30
#: Requests the report predicts: (name, steps, CFG, cfg_end, DeepCache interval); SDXL base's 25 steps at guidance.
REQUESTS = (
    ("SDXL base, 25 steps, CFG (exact)", 25, True, 1.0, 1),
    ("SDXL base, 25 steps, cfg_end 0.5", 25, True, 0.5, 1),
    ("SDXL base, 25 steps, DeepCache 3", 25, True, 1.0, 3),
    ("SDXL base, 25 steps, cfg_end 0.5 + DeepCache 3", 25, True, 0.5, 3),
    ("Lightning-4, 4 steps, no CFG", 4, False, 1.0, 1),
    (CONTROLNET_REQUEST := "SDXL base, 25 steps, CFG, 1 ControlNet", 25, True, 1.0, 1),
)
#: MLPerf Inference's SDXL scenario (20 steps, guidance 8, 1024x1024), beside the published v5e figure.
MLPERF_REQUEST = ("MLPerf SDXL, 20 steps, CFG", 20, True, 1.0, 1)
#: Google's MLPerf Inference v4.1 SDXL entry on TPU v5e x 4 (JAX, bf16, no quantization): images/s per chip.
MLPERF_V5E_IMAGES_PER_S_PER_CHIP = 0.438


def image_prompt_tokens(adapter: str) -> int:
    """The image tokens T a step reads with one image prompt of `adapter`'s kind: 4 (plain) or 16 (Plus)."""
    return SHAPES[adapter][1]["tokens"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench tpu",
        description="Compile the served programs for a TPU topology on this host; HBM, cost, roofline per program.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--topology", default="v5e:2x2", help="TPU topology (default v5e:2x2 = v5e-4; v5e:2x4, v6e:2x2, v5e:4x4...)")
    add("--model", choices=(SDXL, TINY), default=SDXL, help="full-size SDXL (abstract weights) or the tiny checkpoint")
    add(
        "--sizes",
        default=None,
        help="WxH,... (default the app's: 1024x1024,1344x768,768x1344; tiny: the same ratios at ~128 px)",
    )
    add("--cfg", default="on,off", help="classifier-free guidance: on, off or on,off (default on,off)")
    add("--attention", default="xla,splash", help="cores for the step program (default xla,splash)")
    add(
        "--kinds",
        default=",".join(DEFAULT_KINDS),
        help=f"program kinds: {','.join(KINDS)} (default all but the FreeU/PAG and regional steps)",
    )
    add("--only", default=None, help='exact program labels, comma-separated, e.g. "step 1024x1024 cfg,encode cfg"')
    add("--per-device-batch", type=int, default=1, help="images per chip (default 1)")
    add("--prompt-windows", type=int, default=3, help="77-token windows per prompt (default 3, the server's)")
    add("--lora-rank", type=int, default=LORA_RANK, help=f"merge kind: the LoRAs' rank R (default {LORA_RANK})")
    add("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="weights and activations (default bf16)")
    add(
        "--vae-tile-above",
        type=int,
        default=VAE_WHOLE_UP_TO,
        help="the VAE runs in tiles above this many pixels, as the app's option (default 1048576: 1024² whole)",
    )
    add(
        "--quantize",
        choices=("none", "int8"),
        default="none",
        help="int8: the UNet's Dense and Conv layers int8 x int8 (--quantize of the server; default none)",
    )
    add(
        "--cross-attention-cache",
        action="store_true",
        help="the UNet's steps read the text's keys and values from the cross_kv program's table (the server's "
        "--cross-attention-cache); cross_kv is compiled only with it",
    )
    add(
        "--ip-adapter",
        choices=ADAPTERS,
        default=None,
        help="image_prompt and step_image kinds: an IP-Adapter's shapes, plain (ip-adapter_sdxl, ViT-bigG, 4 tokens) "
        "or plus (ip-adapter-plus_sdxl_vit-h, ViT-H, 16 tokens), one image prompt slot (SDXL only)",
    )
    add(
        "--controlnet",
        choices=("canny", "union"),
        default="canny",
        help="step_control kind's network: canny (controlnet-canny-sdxl-1.0) or union (xinsir's ProMax)",
    )
    add("--out", default="bench-results", help="directory of tpu.json (default bench-results/)")
    add("--fresh", action="store_true", help="replace tpu.json instead of merging into it")
    add("--startup", action="store_true", help="only: precompiled vs cold start-up, tiny, this host's CPU devices")
    add("--report", action="store_true", help="only: the table and predictions of --out/tpu.json (nothing compiled)")
    add("--runs", type=int, default=1, help="with --startup: start-ups of each kind (default 1)")
    args = parser.parse_args(argv)
    args.attentions = [a.strip() for a in args.attention.split(",") if a.strip()]
    args.kind_list = [k.strip() for k in args.kinds.split(",") if k.strip()]
    cfgs = {"on": True, "off": False}
    try:
        args.cfgs = [cfgs[c.strip()] for c in args.cfg.split(",") if c.strip()]
    except KeyError:
        parser.error("--cfg takes on, off or on,off")
    if set(args.attentions) - {"xla", "splash", "diffusers"} or not args.attentions:
        parser.error("--attention takes some of xla, splash, diffusers")
    if set(args.kind_list) - set(KINDS):
        parser.error(f"--kinds takes some of {', '.join(KINDS)}")
    args.only_labels = [label.strip() for label in args.only.split(",")] if args.only else None
    if set(IMAGE_PROMPT_KINDS) & set(args.kind_list) and (args.ip_adapter is None or args.model != SDXL):
        parser.error("--kinds image_prompt,step_image need --ip-adapter plain|plus and --model sdxl")
    return args


@functools.cache
def sdxl_model(dtype, quantize: str = "none", controlnet: str = "canny"):
    """SDXL base 1.0's modules from its configs (bench/accelerator/flops.py), abstract weights in `dtype`; nothing
    downloaded. `quantize` "int8": the UNet as `--quantize int8` serves it (pipeline/device/quantize.py), int8
    kernels."""
    import jax
    import jax.numpy as jnp

    from ..accelerator.flops import sdxl_networks
    from ..engine import Modules

    dtype = jnp.dtype(dtype)
    networks = sdxl_networks(dtype)
    unet, vae, texts = networks["unet"], networks["vae"], (networks["text_encoder"], networks["text_encoder_2"])
    key = jax.random.PRNGKey(0)
    shapes = {name: jax.eval_shape(module.init_weights, key) for name, module in networks.items()}
    params = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype), shapes
    )
    if quantize == "int8":
        from ..engine import quantized_unet

        params["unet"] = _abstract_int8_unet_params(unet, dtype)
        unet = quantized_unet(unet)
    nets = (sdxl_controlnet(dtype, controlnet),)
    modules = Modules(texts[0], texts[1], unet, vae, vae_scale_factor=8, controlnets=nets)
    return modules, params


def sdxl_controlnet(dtype, kind: str = "canny"):
    """The full-size SDXL ControlNet module, canny's or the union's (random weights: only its shapes are
    compiled)."""
    import json

    import jax.numpy as jnp

    from ..engine import controlnet_module

    config = json.loads(CONTROLNET_CONFIG.read_text())
    return controlnet_module({**config, **UNION_FIELDS} if kind == "union" else config, jnp.dtype(dtype).name)


@functools.cache
def tiny_model(dtype):
    """The tiny checkpoint as the app loads it, and its weights' shapes (abstract: a topology's devices hold none)."""
    import jax

    from ..engine import load_model

    loaded = load_model("tiny", dtype=dtype)
    return loaded, jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), loaded.params)


def kohya_leaves(shapes) -> list[tuple[str, ...]]:
    """The kernels a typical full SDXL LoRA trains, out of every kernel a LoRA may touch (`LoraTargets.shapes`).

    kohya's sd-scripts (networks/lora.py, what most shared SDXL LoRAs are trained with) wraps the Linear layers of
    the UNet's Transformer2DModel blocks and of the text encoders' CLIPAttention and CLIPMLP; convolutions (ResNet
    blocks, down/upsamplers: LoCon's `conv_dim`), time and label embeddings and TE2's text_projection are left out
    by default. In the Flax trees that is: UNet kernels under an `attentions_<i>` module (proj_in, proj_out and each
    transformer block's attn1/attn2 to_q, to_k, to_v, to_out_0 and ff net_0.proj, net_2), and text-encoder kernels
    under `self_attn` (q_proj, k_proj, v_proj, out_proj) or `mlp` (fc1, fc2). SDXL base: 722 UNet + 72 TE1 + 192
    TE2 kernels, the bulk of the UNet's and the text encoders' weights, so the layout is close to the worst case.
    """
    chosen = []
    for leaf in shapes:
        if leaf[0] == "unet":
            keep = any(part.startswith("attentions_") for part in leaf[1:])
        else:
            keep = "self_attn" in leaf or "mlp" in leaf
        if keep:
            chosen.append(leaf)
    return chosen


def merge_layout(model: str, dtype: str, rank: int = LORA_RANK):
    """The merge program's layout for a typical full LoRA on `model` (`kohya_leaves`), rank `rank`, SLOTS slots:
    the layout the server would build from LoRA files touching exactly those kernels."""
    from ..accelerator.flops import SDXL_UNET_CONFIG
    from ..engine import COMPONENTS, SLOTS, MergeLayout, lora_targets

    if model == TINY:
        loaded, params = tiny_model(dtype)
        unet_config = loaded.networks.unet_config
    else:
        _, params = sdxl_model(dtype)
        unet_config = dict(SDXL_UNET_CONFIG)
    targets = lora_targets(unet_config, {c: params[c] for c in COMPONENTS})
    leaves = sorted(kohya_leaves(targets.shapes), key=lambda leaf: (COMPONENTS.index(leaf[0]), leaf))
    shapes = tuple(tuple(targets.shapes[leaf]) for leaf in leaves)
    return MergeLayout(leaves=tuple(leaves), shapes=shapes, rank=rank, slots=SLOTS, factor_dtype=dtype)


def served_programs(
    model: str,
    dtype: str,
    mesh,
    attention: str,
    per_device_batch: int = 1,
    layout=None,
    prompt_windows: int = 3,
    quantize: str = "none",
    vae_tile_above: int = VAE_WHOLE_UP_TO,
    cross_attention_cache: bool = False,
    ip_adapter: str | None = None,
    controlnet: str = "canny",
):
    """The served programs on `mesh`: the tiny checkpoint's built by the generator's own `build_programs` (its
    sampler config, prediction type and tokenizer length), SDXL's from its configs with abstract weights.
    `layout`: the LoRA merge's `MergeLayout` (`merge_layout`), needed by ProgramKey("merge") only; `ip_adapter`
    (SDXL only): one IP-Adapter of that kind served with one image prompt slot (bench/tpu/image_prompt.py);
    `controlnet` (SDXL only): the step_control kind's network, canny's or the union's."""
    from ..engine import EngineConfig, ServedPrograms, build_programs, controlnet_module, sampler_of

    if model == TINY:
        loaded, params = tiny_model(dtype)
        config = EngineConfig(
            model=TINY,
            dtype=dtype,
            per_device_batch=per_device_batch,
            attention=attention,
            prompt_windows=prompt_windows,
            quantize=quantize,
            vae_tile_above=vae_tile_above,
            cross_attention_cache=cross_attention_cache,
        )
        if quantize == "int8":
            params = {**params, "unet": _abstract_int8_unet_params(loaded.networks.unet, dtype)}
        net = controlnet_module(loaded.networks.unet_config, dtype)  # ControlNetModel.from_unet's shape
        return build_programs(loaded, config, params, mesh, sampler_of(loaded, config), layout, (net,))
    modules, params = sdxl_model(dtype, quantize, controlnet)
    slots = 0
    if ip_adapter is not None:
        tables = abstract_tables(ip_adapter, params["unet"], modules.unet.config, dtype)
        modules = dataclasses.replace(modules, **tables.modules(dtype))
        params, slots = tables.with_weights(params), tables.slots
    return ServedPrograms(
        modules,
        params,
        mesh,
        ip_slots=slots,
        per_device_batch=per_device_batch,
        attention=attention,
        lora_layout=layout,
        prompt_windows=prompt_windows,
        levers=True,
        vae_tile_above=vae_tile_above,
        cross_attention_cache=cross_attention_cache,
        rows_per_call=EngineConfig.steps_per_call,  # the served default
    )


def layout_fields(layout, dtype: str) -> dict:
    """A merge row's extra fields: the layout and the bytes per chip (weights replicated) it implies."""
    import numpy as np

    weights = sum(int(np.prod(shape)) for shape in layout.shapes)
    return {
        "lora_rank": layout.rank,
        "lora_slots": layout.slots,
        "lora_kernels": len(layout.leaves),
        "lora_kernels_by_component": {
            c: sum(1 for leaf in layout.leaves if leaf[0] == c) for c in sorted({leaf[0] for leaf in layout.leaves})
        },
        "lora_weights": weights,
        "lora_kernel_bytes": weights * np.dtype(dtype).itemsize,  # one copy of the touched kernels
        "lora_slot_bytes": layout.slot_bytes(),  # one slot's packed factors (the weights' dtype)
    }


def lora_budget(rows: list[dict], topology: str) -> list[dict]:
    """HBM per chip of a server offering LoRAs, beside the 1024x1024 CFG step program, per step attention core.

    Measured by the compiler: the step program's HBM (arguments: the UNet's served weights, i.e. the merged copies
    of its touched kernels), the merge program's peak (arguments: the previous merged kernels, the unmerged
    originals and 4 slots' factors; temporaries; outputs aliased to the donated previous kernels; code) and the
    other resident weights (the arguments of encode cfg and decode 1024x1024: text encoders and VAE) where those
    rows exist. Computed from the layout: `lora_extra` = what offering LoRAs adds to a server without them, one
    more copy of the touched kernels (originals and merged copies, where a server without LoRAs holds one) plus 4
    slots' factors (LoraSets keeps up to --lora-cache = 8 LoRAs placed: each one more slot).

    - `step_upper` = step + merge peak (both compiler): the merge's buffers held beside the step program, an upper
      bound (the UNet's touched kernels are counted in both; merge temporaries never coexist with the step's);
    - `while_step` = step + other weights + lora_extra: what is held while a step runs;
    - `while_merge` = merge peak + the weights outside its arguments (step arguments + other weights - one copy
      of the touched kernels): what is held while a merge runs.
    """
    merges = [r for r in rows if r["kind"] == "merge" and r["topology"] == topology and "lora_kernel_bytes" in r]
    if not merges:
        return []
    merge = merges[-1]
    touched = merge["lora_kernel_bytes"]
    extra = touched + merge["lora_slots"] * merge["lora_slot_bytes"]

    def arguments(label):
        found = [r for r in rows if r["topology"] == topology and r["program"] == label]
        return found[-1]["hbm_bytes"]["arguments"] if found else 0

    others = arguments("encode cfg") + arguments("decode 1024x1024")
    out = []
    for step in rows:
        if step["topology"] != topology or step["program"] != "step 1024x1024 cfg":
            continue
        if step.get("images") != merge.get("images"):
            continue
        limit = step.get("hbm_chip_bytes") or HBM_V5E
        figures = {
            "step_upper_bytes": step["hbm_total_bytes"] + merge["hbm_total_bytes"],
            "while_step_bytes": step["hbm_total_bytes"] + others + extra,
            "while_merge_bytes": merge["hbm_total_bytes"] + step["hbm_bytes"]["arguments"] + others - touched,
        }
        out.append(
            {
                "topology": topology,
                "attention": step["attention"],
                "step_bytes": step["hbm_total_bytes"],
                "merge_peak_bytes": merge["hbm_total_bytes"],
                "other_weights_bytes": others,
                "lora_extra_bytes": extra,
                "hbm_chip_bytes": limit,
                **figures,
                **{k.replace("_bytes", "_fits"): v <= limit for k, v in figures.items()},
            }
        )
    return out


def jobs(args, sizes) -> list[tuple]:
    """(ProgramKey, attention or None) in the order they are compiled: per size, the steps (CFG first) per core,
    then decode and start; the encoders after the first size's."""
    from ..engine import ProgramKey, windows_key

    text = windows_key(args.prompt_windows)  # the text programs' windows (None: one, the plain programs' keys)
    order = []
    for index, (height, width) in enumerate(sizes):
        for kind in ("step", "step_full", "step_shallow", "step_control"):
            if kind in args.kind_list:
                nets = (0,) if kind == "step_control" else None  # one ControlNet unit
                order += [
                    (ProgramKey(kind, height, width, cfg, text, nets), a) for cfg in args.cfgs for a in args.attentions
                ]
        # The whole-UNet step's variants a server compiles only when asked: FreeU/PAG, regions, image tokens.
        variants = [
            {"windows": text, "extras": extras} for kind, extras in EXTRAS_KINDS.items() if kind in args.kind_list
        ]
        variants += [{"windows": p, "parts": p} for kind, p in REGION_KINDS.items() if kind in args.kind_list]
        if "step_image" in args.kind_list:
            variants.append({"windows": text, "image_tokens": image_prompt_tokens(args.ip_adapter)})
        order += [
            (ProgramKey("step", height, width, cfg, **variant), a)
            for variant in variants
            for cfg in args.cfgs
            for a in args.attentions
        ]
        for kind in ("halve_feature", "preview"):
            if kind in args.kind_list:
                order.append((ProgramKey(kind, height, width), None))
        if "decode" in args.kind_list:
            order.append((ProgramKey("decode", height, width), None))
        if "start" in args.kind_list:
            order.append((ProgramKey("start", height, width), None))
        if index == 0 and "encode" in args.kind_list:
            order += [(ProgramKey("encode", cfg=cfg, windows=text), None) for cfg in args.cfgs]
        if index == 0 and "cross_kv" in args.kind_list and args.cross_attention_cache:
            order += [(ProgramKey("cross_kv", cfg=cfg, windows=text), None) for cfg in args.cfgs]
        if index == 0 and "halve_text" in args.kind_list:
            order.append((ProgramKey("halve_text", windows=text), None))
        if index == 0 and "image_prompt" in args.kind_list:
            order.append((ProgramKey("image_prompt"), None))
    if "merge" in args.kind_list:  # one merge program: it depends on the layout, not on the size
        order.append((ProgramKey("merge"), None))
    if args.only_labels is not None:  # those, in the order given ("encode cfg" names it at --prompt-windows' count)

        def named(key) -> str:
            short = ProgramKey(*astuple(key)[:4], extras=key.extras)  # "step 1024x1024 cfg pag" names it too
            return key.label if key.label in args.only_labels else short.label

        order = [(key, a) for key, a in order if named(key) in args.only_labels]
        order.sort(key=lambda job: args.only_labels.index(named(job[0])))
    return order


class _Fallbacks(logging.Handler):
    """Collects attention.py's fallback lines (which shapes a core hands to xla, and why) while a program traces."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def compile_one(programs, key, attention, topology, progress) -> dict:
    """Compile one program; its row of tpu.json."""
    from ..engine import attention as attention_core
    from .cost import HBM_PER_CHIP, compiled_cost

    device_kind = next(iter(programs.mesh.devices.flat)).device_kind
    handler = _Fallbacks()
    attention_core.reset_fallback_log()  # each program's own fallbacks, not only the first program's
    log = logging.getLogger(attention_core.__name__)
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)  # collected into the row (and counted in the progress line), not printed
    log.propagate = False
    started = time.perf_counter()
    try:
        lowered = programs.lower(key)
        lower_s = time.perf_counter() - started
        compiled = lowered.compile()
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
    compile_s = time.perf_counter() - started
    cost = compiled_cost(compiled)
    hbm = HBM_PER_CHIP.get(device_kind)
    row = {
        "program": key.label,
        "kind": key.kind,
        "topology": topology,
        "device_kind": device_kind,
        "chips": int(programs.mesh.devices.size),
        "images": programs.batch,
        "size": f"{key.width}x{key.height}" if key.height else None,
        "attention": attention,
        "cfg": key.cfg,
        "compile_s": round(compile_s, 1),
        "lower_s": round(lower_s, 1),
        "hbm_bytes": cost.hbm_bytes,
        "hbm_total_bytes": cost.hbm_total,
        "hbm_chip_bytes": hbm,
        "fits": None if hbm is None else cost.hbm_total <= hbm,
        "flops": cost.flops,
        "bytes_accessed": cost.bytes_accessed,
        "roofline_s": cost.roofline_s(device_kind),
        "fallbacks": handler.lines,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    roof = f"{row['roofline_s'] * 1e3:.2f} ms" if row["roofline_s"] is not None else "n/a"
    progress(
        f"tpu: {key.label} [{attention or '-'}] compiled in {compile_s:.0f} s: HBM {cost.hbm_total / 2**30:.2f} "
        f"GiB per chip, {cost.flops / 1e12:.3f} TFLOP, {cost.bytes_accessed / 1e9:.2f} GB, roofline {roof}"
        + (f"; {len(handler.lines)} fallback(s)" if handler.lines else "")
    )
    return row


def int8_roofline(row: dict) -> float | None:
    """An int8 row's roofline with its FLOPs at the int8 peak (the compiler's cost analysis does not split int8 from
    bf16 work: this is the bound if all counted FLOPs ran int8 x int8; `roofline_s` keeps them at the bf16 peak)."""
    from .cost import HBM_BANDWIDTH

    kind = row.get("device_kind")
    if row.get("quantize") != "int8" or kind not in INT8_PEAK:
        return None
    return max(row["flops"] / INT8_PEAK[kind], row["bytes_accessed"] / HBM_BANDWIDTH[kind])


def predictions(rows: list[dict], topology: str, size: str = "1024x1024") -> list[dict]:
    """Predicted device seconds per request on `topology` at `size` from the programs' rooflines (a lower bound:
    device only, no host, no dispatch gaps), per attention core, --quantize and prompt windows compiled.

    Each request runs the programs its speed plan names (host/planning/speed_plan.py, as the host loop runs them):
    encode, start, per step the whole-UNet (`step_full`, or `step` where only that was compiled) or the shallow step,
    CFG or not, the halving programs where guidance ends, decode."""
    from ..engine import speed_plan

    def find(kind, cfg, attention, quantize, windows, at=size):
        found = [
            row
            for row in rows
            if row["topology"] == topology
            and row["kind"] == kind
            and row["size"] == at
            and (cfg is None or row["cfg"] == cfg)
            and (attention is None or row["attention"] == attention)
            and (kind not in UNET_KINDS or row.get("quantize", "none") == quantize)
            and (kind not in TEXT_KINDS or row.get("prompt_windows", 1) == windows)
            and not row.get("cross_attention_cache")  # the plain steps' requests (the lever's rows stand apart)
            and not row.get("extras")  # nor FreeU's and PAG's steps
            and not row.get("regions")  # nor a regional prompt's
            and not row.get("image_tokens")  # nor an image prompt's
            and not row.get("controlnet")  # nor the union's ControlNet step (the request names canny's)
        ]
        return found[-1] if found else None  # the newest

    out = []
    variants = sorted(
        {
            (row["attention"], row.get("quantize", "none"), row.get("prompt_windows", 1))
            for row in rows
            if row["kind"] in UNET_KINDS
            and row["topology"] == topology
            and row["size"] == size
            and not row.get("regions")  # a regional step's P windows are not a variant of the plain requests
            and not row.get("image_tokens")  # nor an image prompt's step
        }
    )
    for name, steps, cfg, cfg_end, deepcache in (*REQUESTS, MLPERF_REQUEST):
        plan = speed_plan(steps, cfg_end, deepcache, cfg=cfg)
        for attention, quantize, windows in variants:
            parts = {
                "encode": [find("encode", cfg, None, quantize, windows, at=None)],
                "start": [find("start", None, None, quantize, windows)],
                "decode": [find("decode", None, None, quantize, windows)],
            }
            for planned in plan.schedule:
                if planned.drop_uncond:
                    parts.setdefault("halve_text", []).append(find("halve_text", None, None, quantize, windows, None))
                if planned.halve_feature:
                    parts.setdefault("halve_feature", []).append(find("halve_feature", None, None, quantize, windows))
                kind = "step_full" if planned.full else "step_shallow"
                kind = "step_control" if name == CONTROLNET_REQUEST else kind  # every step under the control
                row = find(kind, planned.cfg, attention, quantize, windows)
                if row is None and planned.full and kind != "step_control":  # never a ControlNet-free step for it
                    row = find("step", planned.cfg, attention, quantize, windows)
                label = f"{kind} {'cfg' if planned.cfg else 'no-cfg'}"
                parts.setdefault(label, []).append(row)
            missing = sorted(
                {k for k, found in parts.items() for row in found if row is None or row["roofline_s"] is None}
            )
            seconds = None if missing else sum(row["roofline_s"] for found in parts.values() for row in found)
            at_int8 = None
            if not missing and quantize == "int8":
                at_int8 = sum(int8_roofline(row) or row["roofline_s"] for found in parts.values() for row in found)
            step_rows = [row for k, found in parts.items() if k.startswith("step") for row in found if row]
            images = step_rows[0]["images"] if step_rows else None
            chips = step_rows[0]["chips"] if step_rows else None
            per_chip = images / seconds / chips if seconds and images and chips else None
            out.append(
                {
                    "request": name,
                    "steps": steps,
                    "cfg": cfg,
                    "cfg_end": cfg_end,
                    "deepcache": deepcache,
                    "attention": attention,
                    "quantize": quantize,
                    "prompt_windows": windows,
                    "topology": topology,
                    "size": size,
                    "images": images,
                    "predicted_s": seconds,
                    "images_per_s_per_chip": per_chip,
                    "predicted_int8_peak_s": at_int8,
                    "programs": {k: len(found) for k, found in parts.items()},
                    "missing": missing,
                }
            )
    return out


def all_predictions(rows: list[dict], topology: str) -> list[dict]:
    """`predictions` at every size with a step program compiled for `topology`."""
    sizes = sorted({r["size"] for r in rows if r["kind"] in UNET_KINDS and r["topology"] == topology})
    return [p for size in sizes for p in predictions(rows, topology, size)]


def table(rows: list[dict], requests: list[dict], budgets: list[dict] | None = None) -> str:
    """The markdown table of programs, the predictions and the LoRA budget lines."""
    lines = [
        "| program | topology | attention | compile s | HBM/chip GiB (args + temp + out + code) | of chip | "
        "TFLOP | GB accessed | roofline ms |",
        "|---|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        hbm = row["hbm_bytes"]
        parts = " + ".join(f"{hbm[k] / 2**30:.2f}" for k in ("arguments", "temporaries", "outputs", "code"))
        share = f"{row['hbm_total_bytes'] / row['hbm_chip_bytes']:.0%}" if row.get("hbm_chip_bytes") else "n/a"
        roof = f"{row['roofline_s'] * 1e3:.2f}" if row["roofline_s"] is not None else "n/a"
        if int8_roofline(row):
            roof += f" ({int8_roofline(row) * 1e3:.2f} at the int8 peak)"
        name = row["program"] + (f" w{row['prompt_windows']}" if row.get("prompt_windows") else "")
        name += " int8" if row.get("quantize") == "int8" else ""
        name += " (--cross-attention-cache)" if row.get("cross_attention_cache") else ""
        lines.append(
            f"| {name} | {row['topology']} | {row['attention'] or '-'} | {row['compile_s']:.0f} | "
            f"{row['hbm_total_bytes'] / 2**30:.2f} ({parts}) | {share} | {row['flops'] / 1e12:.3f} | "
            f"{row['bytes_accessed'] / 1e9:.2f} | {roof} |"
        )
    if requests:
        lines += [
            "",
            "| request (predicted: roofline, device only) | topology | size | attention | quantize | "
            "windows | images | predicted s | images/s per chip |",
            "|---|---|---|---|---|---:|---:|---:|---:|",
        ]
        for req in requests:
            value = f"{req['predicted_s']:.2f}" if req["predicted_s"] is not None else f"missing {req['missing']}"
            if req.get("predicted_int8_peak_s"):
                value += f" ({req['predicted_int8_peak_s']:.2f} at the int8 peak)"
            rate = req.get("images_per_s_per_chip")
            rate = f"{rate:.3f}" if rate else "-"
            if req["request"] == MLPERF_REQUEST[0] and req.get("images_per_s_per_chip"):
                rate += f" (MLPerf v4.1 v5e: {MLPERF_V5E_IMAGES_PER_S_PER_CHIP})"
            lines.append(
                f"| {req['request']} | {req['topology']} | {req['size']} | {req['attention']} | "
                f"{req.get('quantize', 'none')} | {req.get('prompt_windows', 1)} | {req['images']} | "
                f"{value} | {rate} |"
            )
    merges = [r for r in rows if r["kind"] == "merge" and "lora_kernel_bytes" in r]
    if merges:
        m = merges[-1]
        lines += [
            "",
            f"LoRA merge layout: {m['lora_kernels']} kernels {m['lora_kernels_by_component']}, "
            f"{m['lora_weights'] / 1e9:.3f} G weights = {m['lora_kernel_bytes'] / 2**30:.2f} GiB per copy; "
            f"rank {m['lora_rank']}, {m['lora_slots']} slots x {m['lora_slot_bytes'] / 2**20:.1f} MiB "
            "(factors in the weights' dtype)",
        ]
    gib = 2**30

    def fit(b, name):
        return (
            f"{b[name + '_bytes'] / gib:.2f} GiB ({'fits' if b[name + '_fits'] else 'does NOT fit'} "
            f"{b['hbm_chip_bytes'] / gib:.0f} GiB)"
        )

    for b in budgets or []:
        lines += [
            f"LoRA HBM per chip, {b['topology']}, step 1024x1024 cfg [{b['attention']}] (compiler) "
            f"{b['step_bytes'] / gib:.2f} GiB, merge peak (compiler) {b['merge_peak_bytes'] / gib:.2f} GiB, other "
            f"weights (compiler: encode, decode arguments) {b['other_weights_bytes'] / gib:.2f} GiB, LoRA extra "
            f"(computed: 2nd copy of the touched kernels + slots) {b['lora_extra_bytes'] / gib:.2f} GiB:",
            f"  step + merge peak (upper bound) {fit(b, 'step_upper')}; while a step runs {fit(b, 'while_step')}; "
            f"while a merge runs {fit(b, 'while_merge')}",
        ]
    return "\n".join(lines)


def startup(runs: int, progress) -> dict:
    """Process start-up to the first image: cold (compiles everything, no cache) vs loading precompiled executables."""
    import json
    import subprocess
    import sys
    import tempfile

    from ..common import Stats

    shape = ["--model", "tiny", "--height", "128", "--width", "128"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def run(*extra) -> dict:
        command = [sys.executable, "-m", "pipeline", *extra]
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - started
        return {"wall_s": wall, **(json.loads(done.stdout) if "--json" in extra else {})}

    with tempfile.TemporaryDirectory() as directory:
        progress("startup: precompile --topology cpu (tiny, 128x128) ...")
        built = run("precompile", "--topology", "cpu", *shape, "--out", directory)
        results: dict = {"precompile_s": built["wall_s"], "cold": [], "precompiled": []}
        for index in range(runs):
            for name, extra in (("cold", ()), ("precompiled", ("--precompiled", directory))):
                summary = run(
                    "generate",
                    *shape,
                    "--prompt",
                    "a lighthouse",
                    "--no-compilation-cache",
                    "--out",
                    str(Path(directory) / "images"),
                    "--json",
                    *extra,
                )
                timings = summary["timings"]
                row = {
                    "wall_s": summary["wall_s"],
                    "process_s": summary["process_s"],
                    "compiles": summary["compiles"],
                    "compile_s": timings["compile_s"],
                    "load_s": timings["load_s"],
                    "first_run_s": timings["first_run_s"],
                }
                results[name].append(row)
                progress(
                    f"startup {index + 1}/{runs} {name}: process {row['wall_s']:.1f} s, compile "
                    f"{row['compile_s']:.1f} s, first run {row['first_run_s']:.1f} s, {row['compiles']} XLA "
                    f"compilations (loading the tiny model compiles a few small programs)"
                )
    for name in ("cold", "precompiled"):
        results[f"{name}_wall_s"] = Stats.of([r["wall_s"] for r in results[name]])
        results[f"{name}_compile_s"] = Stats.of([r["compile_s"] for r in results[name]])
    return results


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.report:
        import json

        from ..report.outputs import write_json

        path = Path(args.out) / "tpu.json"
        results = json.loads(path.read_text())
        rows = [r for r in results["programs"] if r.get("model") == args.model and r["topology"] == args.topology]
        results["requests"] = all_predictions(rows, args.topology)
        results["lora_budget"] = lora_budget(rows, args.topology)
        write_json(results, path)
        print(table(rows, results["requests"], results["lora_budget"]))
        return 0
    if args.startup:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        from ..common import machine_info, progress
        from ..report.outputs import write_json

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        results = {"machine": machine_info(), "startup": startup(args.runs, progress)}
        path = write_json(results, out / "startup.json")
        st = results["startup"]
        progress(
            f"startup: cold {st['cold_wall_s'].median:.1f} s vs precompiled {st['precompiled_wall_s'].median:.1f}"
            f" s to the first image (compile {st['cold_compile_s'].median:.1f} s vs "
            f"{st['precompiled_compile_s'].median:.1f} s): {path}"
        )
        return 0
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the topology API needs no TPU; skip the probe for one
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # other processes may hold libtpu too
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from ..common import machine_info, progress
    from ..engine import data_mesh, offered_sizes, quiet_start, topology_devices
    from ..report.outputs import write_json
    from .cost import libtpu_available

    quiet_start()
    from ..engine import configure_compilation_cache

    configure_compilation_cache(False)  # a topology's compile-only client cannot use JAX's persistent cache
    if not libtpu_available():
        progress('tpu: libtpu is not installed: pip install "jax[tpu]==0.10.2" (requirements-dev.txt has it)')
        return 2
    sizes = offered_sizes(args.sizes, tiny=args.model == TINY)
    devices = topology_devices(args.topology)
    progress(
        f"tpu: {args.topology}: {len(devices)} x {devices[0].device_kind}; model {args.model} ({args.dtype}), "
        f"sizes {', '.join(f'{w}x{h}' for h, w in sizes)}"
    )
    mesh = data_mesh(devices)
    programs = {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tpu.json"
    rows: list[dict] = []
    if path.exists() and not args.fresh:
        import json

        rows = json.loads(path.read_text()).get("programs", [])
    todo = jobs(args, sizes)
    layout = None
    if any(key.kind == "merge" for key, _ in todo):
        layout = merge_layout(args.model, args.dtype, args.lora_rank)
    progress(
        f"tpu: {len(todo)} program(s) to compile: "
        + ", ".join(f"{k.label}" + (f" [{a}]" if a else "") for k, a in todo)
    )
    for key, attention in todo:
        core = attention or args.attentions[0]
        if core not in programs:
            programs[core] = served_programs(
                args.model,
                args.dtype,
                mesh,
                core,
                args.per_device_batch,
                layout,
                args.prompt_windows,
                args.quantize,
                args.vae_tile_above,
                args.cross_attention_cache,
                args.ip_adapter,
                args.controlnet,
            )
        row = compile_one(programs[core], key, attention, args.topology, progress)
        row["model"] = args.model
        row["prompt_windows"] = args.prompt_windows if key.kind in TEXT_KINDS else None
        row["quantize"] = args.quantize if key.kind in UNET_KINDS else None
        if key.extras:
            row["extras"] = list(key.extras)  # a FreeU/PAG step: the label names it; the predictions leave it out
        if key.parts is not None:  # a regional step: its text is P windows, one per part; the predictions leave it out
            row["regions"], row["prompt_windows"] = key.parts, key.windows
        prompted = key.kind == "image_prompt" or key.image_tokens is not None
        row["ip_adapter"] = args.ip_adapter if prompted else None  # which adapter's shapes (the predictions skip it)
        if key.image_tokens is not None:
            row["image_tokens"] = key.image_tokens
        row["controlnet"] = args.controlnet if key.kind == "step_control" and args.controlnet != "canny" else None
        if args.cross_attention_cache and key.kind in UNET_KINDS:
            row["cross_attention_cache"] = True  # its rows beside the plain step's, not in place of them
        if key.kind in ("decode", "encode_image") and args.vae_tile_above != VAE_WHOLE_UP_TO:
            row["vae_tile_above"] = args.vae_tile_above  # a tiled VAE where the default runs it whole
        if key.kind == "merge":
            row.update(layout_fields(layout, args.dtype))
        same = (
            "program",
            "topology",
            "attention",
            "model",
            "images",
            "prompt_windows",
            "quantize",
            "cross_attention_cache",
            "ip_adapter",
            "controlnet",
        )
        rows = [r for r in rows if any(r.get(k) != row.get(k) for k in same)] + [row]
        mine = [r for r in rows if r.get("model") == args.model]
        results = {
            "machine": machine_info(),
            "programs": rows,
            "requests": all_predictions(mine, args.topology),
            "lora_budget": lora_budget(mine, args.topology),
        }
        write_json(results, path)  # after every program: a long run keeps what it measured
    mine = [r for r in rows if r.get("model") == args.model]
    requests = all_predictions(mine, args.topology)
    print(table([r for r in mine if r["topology"] == args.topology], requests, lora_budget(mine, args.topology)))
    progress(f"done: {path}")
    return 0


def _abstract_int8_unet_params(unet, dtype):
    """The quantized UNet's parameter tree as shapes (no weights): int8 kernels, their scales and the rest in
    `dtype`: what a TPU topology's compile reads (`--quantize int8`)."""
    import jax
    import jax.numpy as jnp

    from ..engine import quantized_unet

    shapes = jax.eval_shape(quantized_unet(unet).init_weights, jax.random.PRNGKey(0))
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype), shapes
    )
