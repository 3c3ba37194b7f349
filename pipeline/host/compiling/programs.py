"""The served programs: what is compiled, for which static settings, and with which argument shapes.

The host loop (`loop.py`) runs these, each `jit(shard_map(per-device body))` over the 1-D `data` mesh, weights
replicated, batch split:

    merge                the LoRA kernels, 4 slots of factors, weights [4, 3] -> merged kernels (replicated; LoRAs)
    encode[cfg, K]       ids [B, 2, K*77] x2, has_negative [B], windows [B, 2]
                                                  -> hidden [cB, K*77, D], pooled [cB, P], key_lengths [cB]
    cross_kv[cfg, K]     hidden [cB, K*77, D] -> {layer path: (keys, values) [cB, K*77, C]}: the UNet's cross-attention
                         projections of the text, once per request (--cross-attention-cache; device/cross_kv.py)
    image_prompt         pixels [S, 3, s, s], slots [A, S] -> {"keys", "values": {layer path: [2, T, C]}}: an image
                         prompt's tokens through every cross-attention's to_k_ip / to_v_ip (--ip-adapter;
                         device/image_prompt.py), replicated
    encode_image[size]   pixels uint8 [B, H, W, 3], keep [B, H, W]        -> x0 [B, 4, h, w] (a request's picture)
    start[size]          seeds [B], init_sigma [B], x0 [B, 4, h, w], weight [B] -> latents, noise [B, 4, h, w]
    step[size, cfg, K]   latents, history [B, 4, 4, h, w], hidden, pooled, key_lengths, guidance [B], seeds [B],
                         coefficients [B, 13] (each image's plan row), index [], image {x0, noise, repaint, masked},
                         blend_sigma [B]
                                                                  -> latents', history' (its first array: D)
                         (with --cross-attention-cache the base's steps take {"unet", "cross_kv": the table} as weights)
    step[size, cfg, K, extras]   the step with FreeU and/or PAG (--freeu-programs, --pag): + extras [B, 5], each
                         image's FreeU factors and this step's PAG scale (device/extras_step.py)
    step[size, cfg, P, parts P]   a regional prompt's step: + the blend weights ([P, cells] per attention grid,
                         replicated); its text is P windows, one per part (device/regions.py, --region-parts)
    step_control[size, cfg, K, nets]   the step with the request's ControlNets: + maps [B, 3, H, W] each, scales [n]
                                       (+ types int32 [n] where a union ControlNet is among the nets)
    step_full, step_shallow[size, cfg]   the step with DeepCache's feature kept, or used (per-request levers)
    (any base step)[..., T image tokens]   the step reading an image prompt: its weights carry the request's
                         image_prompt table, slot scales and windows (device/image_prompt.py; a request without runs
                         the step without)
    halve_text, halve_feature[size]      a CFG batch's conditional half, when guidance ends (per-request levers)
    preview[size]        a step's history (its D) [B, 4, 4, h, w]         -> uint8 [B, h, w, 3] (live previews)
    refiner_encode[cfg, K]   the encode's arguments (encoder 2's ids read) -> the refiner's hidden, pooled, key_lengths
    refiner_step[size, cfg, K]   the step on the refiner's UNet and text, + aesthetic scores [2] (--refiner)
    upscale[size, from, mode]   the hires fix's latents [B, 4, h, w] at `from` -> [B, 4, H/8, W/8] (torch's modes)
    decode[size]         latents [B, 4, h, w]                             -> uint8 [B, H, W, 3]

(encode_image and decode run in feathered tiles above `vae_tile_above` pixels: device/vae_tiles.py.)

(c = 2 with classifier-free guidance, 1 without; K = the 77-token windows the text is read in: 1, or the server's
`--prompt-windows` N. Both are compiled when N > 1 and each request runs the 1-window programs unless its prompt or
negative prompt needs more: a short prompt never pays for the long prompts' keys.)
Steps, sampler, strength, guidance's end, DeepCache's interval, the LoRA set and the picture are arguments (plan rows,
step indices, arrays), so no request compiles anything. No program contains a host callback, so every one of them
lands in JAX's persistent compilation cache. `ServedPrograms` is used by the generator (compile and run), the TPU
report and the precompiled start-up (`bench tpu`, `python -m pipeline precompile`), which build it on abstract
weights and a TPU topology's mesh.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from ...contract.hires import LATENT_UPSCALERS
from ...device import attention as attention_core
from ...device.controlnet_step import is_union, step_control_local
from ...device.cross_kv import CROSS_KV, cross_kv_local
from ...device.deepcache import conditional_half_local, step_full_local, step_shallow_local
from ...device.denoise import INPAINT_CHANNELS, LATENT_CHANNELS, start_local, step_local
from ...device.extras_step import EXTRAS, step_extras_local
from ...device.image_prompt import IMAGE_PROMPT, image_prompt_local
from ...device.lora import COMPONENTS as LORA_COMPONENTS
from ...device.lora import MergeLayout, get_leaves, merge_donating
from ...device.modules import Modules
from ...device.nets.controlnet import shape_params
from ...device.preview import latents_to_rgb
from ...device.refiner_step import refiner_encode_local, refiner_step_local
from ...device.region_step import regional_step_local
from ...device.sharding import DATA_AXIS, batch_sharded, replicated
from ...device.step_block import ROW_ARGUMENTS, over_rows
from ...device.text import encode_local
from ...device.upscale import upscale_local
from ...device.vae import decode_local
from ...device.vae import encode_local as vae_encode_local
from ...device.vae_tiles import decode_tiled_local, encode_tiled_local
from ..planning.region_plan import attention_grids
from ..planning.sampler_plan import COEFFICIENTS, HISTORY
from ..planning.tokens import extra_capacity
from .compiler_options import compiler_options

#: The program kinds, in the order a request runs them.
KINDS = (
    "merge",
    "encode",
    "cross_kv",
    "image_prompt",
    "refiner_encode",
    "encode_image",
    "start",
    "step",
    "step_control",
    "step_full",
    "step_shallow",
    "refiner_step",
    "halve_text",
    "halve_feature",
    "preview",
    "upscale",
    "decode",
)
#: The base's UNet steps: with --cross-attention-cache their weights carry the request's cross-attention table.
BASE_STEPS = ("step", "step_control", "step_full", "step_shallow")
#: The kinds that read the text's ids or what encode made of them; the others read latents or pixels.
TEXT_KINDS = ("encode", "cross_kv", "refiner_encode", "halve_text")
#: The denoising steps: each takes a step's arguments (`ServedPrograms.abstract_args`), some with more.
STEP_KINDS = (*BASE_STEPS, "refiner_step")
#: How a program's arguments and results lie on the mesh: split over the batch, or whole on every device.
BATCH, ONE = P(DATA_AXIS), P()
#: A step's arguments: weights, latents, history, hidden, pooled, key_lengths, guidance, seeds, the plan rows (each
#: image's: a merged call's requests may run different samplers), the step index, the picture, the blend sigmas.
STEP_SPECS = (ONE, BATCH, BATCH, BATCH, BATCH, BATCH, BATCH, BATCH, BATCH, ONE, BATCH, BATCH)
#: Which weights each kind reads (only these are its arguments).
WEIGHTS = {
    "merge": (),  # the LoRA merge takes the kernels it changes as arguments (host/lora_sets.py)
    "encode": ("text_encoder", "text_encoder_2"),
    "cross_kv": ("unet",),
    "image_prompt": ("image_encoder", "ip_adapters"),
    "encode_image": ("vae",),
    "start": (),
    "step": ("unet",),
    "step_control": ("unet", "controlnets"),  # the request's ControlNets' weights, one tree per unit
    "step_full": ("unet",),
    "step_shallow": ("unet",),
    "refiner_encode": ("refiner_text_encoder_2",),  # the base's text_encoder_2 when the refiner shares it
    "refiner_step": ("refiner_unet",),
    "halve_text": (),
    "halve_feature": (),
    "preview": (),
    "upscale": (),
    "decode": ("vae",),
}


@dataclass(frozen=True, order=True)
class ProgramKey:
    """One compiled program: its kind and the static settings it was compiled for (None = does not depend on it)."""

    kind: str  # one of KINDS
    height: int | None = None  # static: image height in pixels (start, step, decode)
    width: int | None = None  # static: image width in pixels (start, step, decode)
    cfg: bool | None = None  # static: classifier-free guidance on/off (encode, step)
    windows: int | None = None  # static: the text's 77-token windows when more than one (encode, halve_text, steps)
    nets: tuple[int, ...] | None = None  # static: each ControlNet unit's architecture (step_control)
    source: tuple[int, int] | None = None  # static: the (height, width) an upscale starts from
    mode: str | None = None  # static: the upscale's A1111 latent upscaler (contract/hires.LATENT_UPSCALERS)
    extras: tuple[str, ...] = ()  # static: what the step adds to the UNet, "freeu" and/or "pag" (device/extras_step.py)
    parts: int | None = None  # static: a regional prompt's parts, blended in every cross-attention (step)
    image_tokens: int | None = None  # static: an image prompt's tokens T the base step reads (None: no image prompt)

    @property
    def label(self) -> str:
        """e.g. "step 1024x1024 cfg", "encode no-cfg", "decode 1344x768" (width×height), "encode cfg 3 windows"."""
        parts = [self.kind]
        if self.height is not None:
            parts.append(f"{self.width}x{self.height}")
        if self.cfg is not None:
            parts.append("cfg" if self.cfg else "no-cfg")
        if self.windows is not None:
            parts.append(f"{self.windows} windows")
        if self.nets is not None:
            parts.append("controlnets " + "+".join(str(i) for i in self.nets))
        if self.source is not None:
            parts.append(f"from {self.source[1]}x{self.source[0]}")
        if self.mode is not None:
            parts.append(self.mode.replace("Latent", "latent").replace(" (", "-").replace(")", "").replace(" ", "-"))
        parts += self.extras
        if self.parts is not None:
            parts.append(f"{self.parts} regions")
        if self.image_tokens is not None:
            parts.append(f"{self.image_tokens} image tokens")
        return " ".join(parts)

    @property
    def text_windows(self) -> int:
        """The 77-token windows of the text this program reads (1 unless `windows` says more)."""
        return self.windows or 1


def windows_key(windows: int) -> int | None:
    """`ProgramKey.windows` for a text of `windows` 77-token windows: None for one (the plain programs' keys)."""
    return windows if windows > 1 else None


def program_keys(
    sizes: list[tuple[int, int]],
    cfg: bool,
    levers: bool = False,
    lora: bool = False,
    previews: bool = False,
    windows: int = 1,
    control_sets: tuple[tuple[int, ...], ...] = (),
    refiner: bool = False,
    hires: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = (),
    cross_kv: bool = False,
    extras: tuple[str, ...] = (),
    region_parts: tuple[int, ...] = (),
    image_tokens: int | None = None,
) -> list[ProgramKey]:
    """Every program a server offering `sizes` ((height, width) pairs) runs, encode first.

    `levers` (per-request `cfg_end` and `deepcache`): the whole-UNet step keeps DeepCache's feature (`step_full`,
    instead of `step`), a shallow step uses it, and a CFG server also compiles the guidance-free steps and the two
    small programs that keep a CFG batch's conditional half. `lora`: LoRAs are offered (the merge program).
    `previews`: a step's predicted picture as small RGB images, while the request runs. `windows` N > 1: the
    programs that read the text are compiled for one window and for N (a request runs the fewest its text needs).
    `control_sets`: the ControlNet architecture combinations a request may use (`step_control`, per mode and text).
    `refiner`: SDXL's refiner is served: its text encode and its step, per mode and text. `cross_kv`: the text's
    cross-attention keys and values are projected once per request (per mode and text). `hires`: the hires fix's
    (offered size, hires size) pairs: each hires size's image-to-image programs (as an offered size's, without the
    ControlNets' steps; with the refiner's, which runs in the second pass as A1111's) and each pair's latent
    upscales, one per A1111 latent upscaler. `extras`: "freeu" and/or "pag" are offered (--freeu-programs, --pag):
    each combination's whole-UNet step, per mode and text, at each size (a request without them runs the others).
    upscales, one per A1111 latent upscaler. `region_parts`: the part counts P of regional prompts: per size and
    guidance mode a step blending P parts, and the programs reading a text of P windows (`regional_keys`).
    `image_tokens` T: an image prompt is offered (--ip-adapter): its `image_prompt` program, and beside each base step
    (but PAG's and the regional ones) its twin reading T image tokens.
    """
    modes = (cfg, False) if cfg and levers else (cfg,)
    texts = (None, windows) if windows > 1 else (None,)  # ProgramKey.windows of each text length served
    keys = [ProgramKey("merge")] if lora else []
    keys += [ProgramKey("encode", cfg=cfg, windows=k) for k in texts]
    keys += [ProgramKey("cross_kv", cfg=mode, windows=k) for k in texts for mode in modes] if cross_kv else []
    keys += [ProgramKey("refiner_encode", cfg=cfg, windows=k) for k in texts] if refiner else []
    keys += [ProgramKey("halve_text", windows=k) for k in texts] if cfg and levers else []
    for height, width in sizes:
        keys += _size_keys(height, width, cfg, levers, modes, texts, control_sets, refiner, previews, extras)
    targets = [target for target in dict.fromkeys(target for _, target in hires) if target not in sizes]
    if targets:  # the second pass at a size no request asks for: its image-to-image programs only
        keys += [
            key
            for key in program_keys(
                targets, cfg, levers, previews=previews, windows=windows, refiner=refiner, extras=extras
            )
            if key.height is not None
        ]
    keys += [
        ProgramKey("upscale", *target, source=source, mode=mode)
        for source, target in hires
        for mode in LATENT_UPSCALERS
    ]
    keys += regional_keys(sizes, cfg, levers, texts, region_parts, cross_kv)
    return keys + image_prompt_keys(keys, image_tokens)


def image_prompt_keys(keys: list[ProgramKey], image_tokens: int | None) -> list[ProgramKey]:
    """With an image prompt of `image_tokens` T offered: its `image_prompt` program and each base step of `keys`
    reading T tokens (PAG's and the regional steps take none: refused together)."""
    if image_tokens is None:
        return []
    twins = [
        dataclasses.replace(key, image_tokens=image_tokens)
        for key in keys
        if key.kind in BASE_STEPS and key.parts is None and "pag" not in key.extras
    ]
    return [ProgramKey("image_prompt"), *twins]


def regional_keys(
    sizes: list[tuple[int, int]],
    cfg: bool,
    levers: bool,
    texts: tuple[int | None, ...],
    region_parts: tuple[int, ...],
    cross_kv: bool,
) -> list[ProgramKey]:
    """Regional prompts' programs, per part count P: the text of P windows (encode, its cross-attention table and
    halve_text where the served texts lack that length) and per size and guidance mode the step blending P parts
    (the whole UNet: regions take no DeepCache)."""
    modes = (cfg, False) if cfg and levers else (cfg,)
    keys = []
    for parts in region_parts:
        if parts not in texts:
            keys += [ProgramKey("encode", cfg=cfg, windows=parts)]
            keys += [ProgramKey("cross_kv", cfg=mode, windows=parts) for mode in modes] if cross_kv else []
            keys += [ProgramKey("halve_text", windows=parts)] if cfg and levers else []
        keys += [ProgramKey("step", h, w, mode, parts, parts=parts) for h, w in sizes for mode in modes]
    return keys


def _size_keys(
    height: int,
    width: int,
    cfg: bool,
    levers: bool,
    modes: tuple[bool, ...],
    texts: tuple[int | None, ...],
    control_sets: tuple[tuple[int, ...], ...],
    refiner: bool,
    previews: bool,
    extras: tuple[str, ...] = (),
) -> list[ProgramKey]:
    """One offered size's programs, in the order a request runs them (`program_keys`): its picture's encode, the
    start, the steps (per guidance mode in `modes` and text length in `texts`; with `extras`, each combination's
    step), the preview and the decode."""
    keys = [ProgramKey("encode_image", height, width), ProgramKey("start", height, width)]
    if levers:
        keys += [
            ProgramKey(kind, height, width, mode, k)
            for k in texts
            for mode in modes
            for kind in ("step_full", "step_shallow")
        ]
        keys += [ProgramKey("halve_feature", height, width)] if cfg else []
    else:
        keys += [ProgramKey("step", height, width, cfg, k) for k in texts]
    keys += [
        ProgramKey("step", height, width, mode, k, extras=combination)
        for combination in extras_combinations(extras)
        for k in texts
        for mode in modes
    ]
    keys += [
        ProgramKey("step_control", height, width, mode, k, nets)
        for nets in control_sets
        for k in texts
        for mode in modes
    ]
    keys += [ProgramKey("refiner_step", height, width, mode, k) for k in texts for mode in modes] if refiner else []
    keys += [ProgramKey("preview", height, width)] if previews else []
    keys.append(ProgramKey("decode", height, width))
    return keys


def extras_combinations(extras: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Each combination of the offered `extras` a request may turn on ("freeu", "pag", both), in the table's order."""
    return [combination for size in (1, 2) for combination in itertools.combinations(extras, size)]


class ServedPrograms:
    """Builds, lowers and compiles the served programs for one model, mesh and batch.

    `params` may hold real arrays or `jax.ShapeDtypeStruct`s (abstract weights, e.g. for a TPU topology): only
    their shapes, dtypes and shardings are read. Compiled programs are kept, so each is built once.
    """

    def __init__(
        self,
        modules: Modules,
        params,
        mesh: Mesh,
        *,
        per_device_batch: int = 1,
        attention: str = "xla",
        prediction_type: str = "epsilon",
        max_tokens: int = 77,
        prompt_windows: int = 1,
        levers: bool = False,
        lora_layout: MergeLayout | None = None,
        emphasis: str = "original",
        cfg: bool = True,
        refiner_zero_negative: bool = False,
        vae_tile_above: int | None = None,
        xla_options: tuple[tuple[str, str], ...] = (),
        cross_attention_cache: bool = False,
        ip_slots: int = 0,
        rows_per_call: int = 1,
    ):
        self.modules = modules
        self.mesh = mesh
        self.batch = int(mesh.devices.size) * per_device_batch  # B: images per call
        self.attention = attention  # static: part of every program (entered while tracing)
        self.prediction_type = prediction_type  # static: how the step reads the UNet's output
        self.max_tokens = max_tokens  # CLIP's window, 77
        self.prompt_windows = prompt_windows  # static: the most 77-token windows a prompt is read in (N)
        self.levers = levers  # static: the programs of per-request cfg_end and deepcache are served (program_keys)
        self.lora_layout = lora_layout  # static: the LoRA merge's kernels, slots and rank (None: no LoRAs)
        self.emphasis = emphasis  # static: A1111's emphasis mode ("no-norm" skips the rescale; planning/emphasis.py)
        self.cfg = cfg  # static: the server guides (the refiner's text is encoded with its unconditional half)
        self.refiner_zero_negative = refiner_zero_negative  # static: the refiner zeroes an empty negative prompt
        self.vae_tile_above = vae_tile_above  # static: images of more pixels are decoded and encoded in tiles
        self.xla_options = tuple(xla_options)  # static: XLA compiler options of every program (compiler_options.py)
        self.cross_attention_cache = cross_attention_cache  # static: the base's steps read the text's keys and values
        self.ip_slots = ip_slots if modules.image_projections else 0  # static: image prompts per request (S)
        self.rows_per_call = rows_per_call  # static: the most plan rows one step call runs (R; device/step_block.py)
        #: (D1, D2): the text encoders' widths, the rows of a request's embedding tables
        self.text_widths = tuple(
            int(params[name]["text_model"]["embeddings"]["token_embedding"]["embedding"].shape[1])
            for name in ("text_encoder", "text_encoder_2")
        )
        self.inpainting_unet = modules.unet.in_channels == INPAINT_CHANNELS  # static: a 9-channel UNet
        self._params = {
            name: jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated(mesh)), params[name]
            )
            for name in {name for names in WEIGHTS.values() for name in names}
            if name in params
        }
        self._control_params = tuple(_abstract_controlnet(module, mesh) for module in modules.controlnets)
        self._compiled: dict[ProgramKey, jax.stages.Compiled] = {}
        #: (height, width, cfg) -> the shape of the DeepCache feature of that step (`_feature`)
        self._features: dict[tuple[int, int, bool], jax.ShapeDtypeStruct] = {}
        #: (kind, cfg, windows) -> the shapes encode (or refiner_encode) returns (`_encoded`)
        self._text_shapes: dict[tuple[str, bool, int | None], tuple] = {}
        #: (cfg, windows) -> the shapes of the cross-attention table cross_kv returns (`_cross_kv`)
        self._table_shapes: dict[tuple[bool, int | None], dict] = {}

    # ---- what each program is -------------------------------------------------------------------------------------

    def weights(self, key: ProgramKey, params) -> dict:
        """The part of `params` that `key`'s program takes as its first argument."""
        if key.kind == "refiner_encode":  # the refiner's CLIP-G, or the base's where the weights are the same file
            return {"text_encoder_2": params.get("refiner_text_encoder_2", params["text_encoder_2"])}
        chosen = {name: params[name] for name in WEIGHTS[key.kind] if name != "controlnets"}
        if key.kind == "step_control":  # the request's trees (run time), or each unit's architecture's shapes
            chosen["controlnets"] = params.get("controlnets") or tuple(self._control_params[i] for i in key.nets)
        return chosen

    def jitted(self, key: ProgramKey):
        """jit(shard_map(body)) for `key`: each device runs its own images; weights are replicated."""
        if key.kind == "merge":  # replicated in, replicated out: every device merges its own copy of the weights
            body = functools.partial(merge_donating, components=self.lora_layout.components)
            return jax.jit(
                _named(body, "sdxl_merge"), donate_argnums=(0,), keep_unused=True, out_shardings=replicated(self.mesh)
            )
        if key.kind == "image_prompt":  # whole on every device: each step's UNet reads all of it
            body, in_specs, out_specs = functools.partial(image_prompt_local, self.modules), (ONE, ONE, ONE), ONE
        elif key.kind in TEXT_KINDS:
            body, in_specs, out_specs = self._text_body(key)
        elif key.kind in STEP_KINDS:
            body, in_specs, out_specs = self._step_body(key)
        else:
            body, in_specs, out_specs = self._picture_body(key)
        if key.kind in BASE_STEPS and (self.cross_attention_cache or key.image_tokens):  # weights whole, table split
            weights = {name: ONE for name in WEIGHTS[key.kind]} | (
                {CROSS_KV: BATCH} if self.cross_attention_cache else {}
            )
            in_specs = (weights | ({IMAGE_PROMPT: ONE} if key.image_tokens else {}), *in_specs[1:])
        # A regional step needs the hook's cross-attention (no hook with `diffusers`: XLA's core is the reference's)
        kind = "xla" if key.parts is not None and self.attention == "diffusers" else self.attention
        body = _named(attention_core.hooked(body, kind), f"sdxl_{key.kind}")  # JAX's logs name it
        sharded = jax.shard_map(body, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
        # A step reading the cross-attention table leaves the text and its to_k / to_v kernels unread. Kept as
        # arguments (the server holds them anyway): pruned, the TPU compiler made SDXL's step 5x its code (0.43 GiB
        # against 0.08 at 1024², v5e), for the same FLOPs and bytes (bench/HISTORY.md).
        return jax.jit(sharded, keep_unused=self.cross_attention_cache and key.kind in BASE_STEPS)

    def _text_body(self, key: ProgramKey) -> tuple:
        """(per-device body, argument specs, result specs) of a program that reads the text (TEXT_KINDS)."""
        modules, normalize = self.modules, self.emphasis != "no-norm"
        if key.kind == "encode":  # ids, negative ids, has_negative, windows, weights x2, embedding tables x2, clip skip
            body = functools.partial(encode_local, modules, cfg=key.cfg, normalize=normalize)
            return body, (ONE, BATCH, BATCH, BATCH, BATCH, BATCH, BATCH, ONE, ONE, ONE), (BATCH, BATCH, BATCH)
        if key.kind == "cross_kv":  # the text -> each cross-attention layer's keys and values
            return functools.partial(cross_kv_local, modules), (ONE, BATCH), BATCH
        if key.kind == "refiner_encode":  # as encode, with encoder 2's embedding table only
            body = functools.partial(
                refiner_encode_local,
                modules,
                cfg=key.cfg,
                normalize=normalize,
                zero_empty_negative=self.refiner_zero_negative,
            )
            return body, (ONE, BATCH, BATCH, BATCH, BATCH, BATCH, BATCH, ONE), (BATCH, BATCH, BATCH)
        # halve_text: hidden, pooled, key_lengths -> their conditional halves
        return _without_weights(conditional_half_local), (ONE, BATCH, BATCH, BATCH), (BATCH, BATCH, BATCH)

    def _step_body(self, key: ProgramKey) -> tuple:
        """(per-device body, argument specs, result specs) of a denoising step (STEP_KINDS): up to
        `rows_per_call` plan rows (device/step_block.py), how many in its last argument (int32 [], replicated)."""
        body, in_specs, out_specs = self._one_row_body(key)
        per_row = dict(ROW_ARGUMENTS)
        if key.kind == "step_control":  # + the units' scales, [R, n]
            per_row[len(STEP_SPECS) + 1] = 0
        elif key.extras:  # + each image's FreeU factors and PAG scale, [B, R, 5]
            per_row[len(STEP_SPECS)] = 1
        return over_rows(body, self.rows_per_call, per_row), (*in_specs, ONE), out_specs

    def _one_row_body(self, key: ProgramKey) -> tuple:
        """(per-device body, argument specs, result specs) of one row of a denoising step."""
        settings = {"cfg": key.cfg, "prediction_type": self.prediction_type}
        if key.kind == "step_control":  # + each unit's map, the units' scales (+ their types, with a union)
            body = functools.partial(step_control_local, self.modules, **settings, nets=key.nets)
            types = (ONE,) if self._union(key) else ()
            return body, (*STEP_SPECS, tuple(BATCH for _ in key.nets), ONE, *types), (BATCH, BATCH)
        if key.kind == "refiner_step":  # the step's arguments + the aesthetic scores [2] (replicated)
            return functools.partial(refiner_step_local, self.modules, **settings), (*STEP_SPECS, ONE), (BATCH, BATCH)
        if key.extras:  # + each image's FreeU factors and this step's PAG scale [B, 5]
            body = functools.partial(step_extras_local, self.modules, **settings, extra=key.extras)
            return body, (*STEP_SPECS, BATCH), (BATCH, BATCH)
        if key.parts is not None:  # + the blend weights, a tuple of [P, cells] (replicated)
            return functools.partial(regional_step_local, self.modules, **settings), (*STEP_SPECS, ONE), (BATCH, BATCH)
        local = {"step": step_local, "step_full": step_full_local, "step_shallow": step_shallow_local}[key.kind]
        in_specs = (*STEP_SPECS, BATCH) if key.kind == "step_shallow" else STEP_SPECS  # + the kept feature
        out_specs = (BATCH, BATCH, BATCH) if key.kind == "step_full" else (BATCH, BATCH)  # + the feature to keep
        return functools.partial(local, self.modules, **settings), in_specs, out_specs

    def _picture_body(self, key: ProgramKey) -> tuple:
        """(per-device body, argument specs, result specs) of a program on the latents or the pixels."""
        modules = self.modules
        if key.kind == "encode_image":  # a request's picture -> its latents (the VAE posterior's mean)
            body = functools.partial(encode_tiled_local if self.tiled(key) else vae_encode_local, modules)
            return body, (ONE, BATCH, BATCH), BATCH
        if key.kind == "start":  # sigma, weight: each image's
            body = functools.partial(
                _without_weights(start_local),
                height=key.height,
                width=key.width,
                vae_scale_factor=modules.vae_scale_factor,
            )
            return body, (ONE, BATCH, BATCH, BATCH, BATCH), (BATCH, BATCH)
        if key.kind == "halve_feature":
            return _without_weights(conditional_half_local), (ONE, BATCH), BATCH
        if key.kind == "preview":  # a step's history -> its D as uint8 RGB at latent size
            return _without_weights(_latest_to_rgb), (ONE, BATCH), BATCH
        if key.kind == "upscale":  # latents at key.source -> at key's size (the hires fix's latent upscalers)
            mode, antialias = LATENT_UPSCALERS[key.mode]
            scale = modules.vae_scale_factor
            body = functools.partial(
                upscale_local, height=key.height // scale, width=key.width // scale, mode=mode, antialias=antialias
            )
            return _without_weights(body), (ONE, BATCH), BATCH
        if key.kind == "decode":
            body = functools.partial(decode_tiled_local if self.tiled(key) else decode_local, modules)
            return body, (ONE, BATCH), BATCH
        raise ValueError(f"unknown program kind {key.kind!r}")

    def tiled(self, key: ProgramKey) -> bool:
        """Whether `key`'s VAE runs in tiles (device/vae_tiles.py): its image has more than `vae_tile_above` pixels."""
        return (
            self.vae_tile_above is not None
            and key.height is not None
            and (key.height * key.width > self.vae_tile_above)
        )

    def abstract_args(self, key: ProgramKey) -> tuple:
        """Shapes, dtypes and shardings of `key`'s arguments (no data): what `lower` compiles for."""
        if key.kind == "merge":
            return self._merge_args()
        weights = self.weights(key, self._params)
        if key.kind == "image_prompt":  # each slot's pixels, each slot's adapter (one-hot)
            spec, size = self._spec, self.modules.image_encoder.config.image_size
            slots = len(self.modules.image_projections), self.ip_slots
            return weights, spec((self.ip_slots, 3, size, size), np.float32, whole=True), spec(slots, np.float32, True)
        if key.kind in TEXT_KINDS:
            return self._text_args(key, weights)
        if key.kind in STEP_KINDS:
            return self._step_args(key, weights)
        return self._picture_args(key, weights)

    def _spec(self, shape, dtype, whole: bool = False) -> jax.ShapeDtypeStruct:
        """An abstract argument: split over the batch, or (`whole`) replicated."""
        return jax.ShapeDtypeStruct(shape, dtype, sharding=replicated(self.mesh) if whole else batch_sharded(self.mesh))

    def _merge_args(self) -> tuple:
        """The LoRA merge's: the kernels it changes (previous and originals alike), each slot's factors (packed),
        the slots' weights per component [slots, 3]."""
        spec, layout = self._spec, self.lora_layout
        kernels = get_leaves(self._params, layout.leaves)
        factors, slots, dtype = tuple(layout.factor_shapes), layout.slots, layout.dtype  # the packed factors' dtype
        downs = tuple(tuple(spec(down, dtype, whole=True) for down, _ in factors) for _ in range(slots))
        ups = tuple(tuple(spec(up, dtype, whole=True) for _, up in factors) for _ in range(slots))
        return kernels, kernels, downs, ups, spec((slots, len(LORA_COMPONENTS)), np.float32, whole=True)

    def _text_args(self, key: ProgramKey, weights: dict) -> tuple:
        """The arguments of a program that reads the text (TEXT_KINDS)."""
        n, spec = self.batch, self._spec
        if key.kind == "encode":
            ids = spec((n, 2, self.max_tokens * key.text_windows), np.int32)  # [B, 2, K*77]
            emphasis = spec(ids.shape, np.float32)  # [B, 2, K*77]: each token's weight
            rows = extra_capacity(key.text_windows)  # E: the request's embedding table
            tables = [spec((rows, width), np.float32, whole=True) for width in self.text_widths]  # [E, D1], [E, D2]
            skip = spec((), np.int32, whole=True)  # the request's clip_skip: data, not a program
            return weights, ids, ids, spec((n,), np.bool_), spec((n, 2), np.int32), emphasis, emphasis, *tables, skip
        if key.kind == "refiner_encode":  # encode's arguments, with encoder 2's embedding table only, no clip_skip
            text_args = self.abstract_args(ProgramKey("encode", cfg=key.cfg, windows=key.windows))
            return weights, *text_args[1:-3], text_args[-2]
        if key.kind == "halve_text":
            return weights, *self._split(self._encoded(True, key.windows))
        return weights, self._split(self._encoded(key.cfg, key.windows)[0])  # cross_kv: hidden [cB, K*77, D]

    def _latents(self, key: ProgramKey, size: tuple[int, int] | None = None) -> jax.ShapeDtypeStruct:
        """Abstract latents [B, 4, h, w] at `key`'s size (or `size`)."""
        height, width = size or (key.height, key.width)
        scale = self.modules.vae_scale_factor
        return self._spec((self.batch, LATENT_CHANNELS, height // scale, width // scale), np.float32)

    def _history(self, latents) -> jax.ShapeDtypeStruct:
        """The samplers' abstract history [B, 4, 4, h, w] beside `latents`."""
        return self._spec((self.batch, HISTORY, *latents.shape[1:]), np.float32)

    def _picture_args(self, key: ProgramKey, weights: dict) -> tuple:
        """The arguments of a program on the latents or the pixels."""
        n, spec, latents = self.batch, self._spec, self._latents(key)
        if key.kind == "encode_image":
            return weights, spec((n, key.height, key.width, 3), np.uint8), spec((n, key.height, key.width), np.bool_)
        if key.kind == "start":
            return weights, spec((n,), np.uint32), spec((n,), np.float32), latents, spec((n,), np.float32)
        if key.kind == "decode":
            return weights, latents
        if key.kind == "upscale":  # the latents at the size it upscales from
            return weights, self._latents(key, key.source)
        if key.kind == "preview":
            return weights, self._history(latents)
        return weights, self._split(self._feature(key.height, key.width, True))  # halve_feature

    def _step_args(self, key: ProgramKey, weights: dict) -> tuple:
        """A denoising step's arguments (STEP_SPECS), and what each kind takes beyond them."""
        n, rows, spec, latents = self.batch, self.rows_per_call, self._spec, self._latents(key)
        text_kind = "refiner_encode" if key.kind == "refiner_step" else "encode"
        hidden, pooled, lengths = self._encoded(
            self.cfg if key.kind == "refiner_step" else key.cfg, key.windows, text_kind
        )
        if self.cross_attention_cache and key.kind in BASE_STEPS:
            weights = {**weights, CROSS_KV: self._split(self._cross_kv(key.cfg, key.windows))}
        if key.image_tokens:
            weights = {**weights, IMAGE_PROMPT: self._image_prompt()}
        step_args = (
            weights,
            latents,
            self._history(latents),  # [B, 4, 4, h, w]
            spec(hidden.shape, hidden.dtype),  # [cB, K*77, D]
            spec(pooled.shape, pooled.dtype),  # [cB, P]
            spec(lengths.shape, lengths.dtype),  # [cB]
            spec((n,), np.float32),  # guidance [B]
            spec((n,), np.uint32),  # seeds [B]
            spec((n, rows, len(COEFFICIENTS)), np.float32),  # each image's plan rows [B, R, 13]
            spec((), np.int32, whole=True),  # the first row's index
            image_inputs(latents, spec((n, 1, *latents.shape[2:]), np.float32)),  # the picture (denoise.unet_step)
            spec((n, rows), np.float32),  # each image's blend sigma per row [B, R]
        )
        count = spec((), np.int32, whole=True)  # the rows this call runs, 1 to R
        if key.kind == "step_shallow":
            return (*step_args, self._split(self._feature(key.height, key.width, key.cfg)), count)  # [cB, h, w, C]
        if key.kind == "step_control":
            maps = tuple(spec((n, 3, key.height, key.width), np.float32) for _ in key.nets)  # [B, 3, H, W] each
            types = (spec((len(key.nets),), np.int32, whole=True),) if self._union(key) else ()  # a union's [n]
            scales = spec((rows, len(key.nets)), np.float32, whole=True)  # [R, n]
            return (*step_args, maps, scales, *types, count)
        if key.kind == "refiner_step":
            return (*step_args, spec((2,), np.float32, whole=True), count)  # aesthetic scores: negative, positive
        if key.extras:  # FreeU's factors, the row's PAG scale [B, R, 5]
            return (*step_args, spec((n, rows, len(EXTRAS)), np.float32), count)
        if key.parts is not None:  # the blend weights: [P, cells] per attention grid (host/planning/region_plan.py)
            grids = attention_grids(*latents.shape[2:], len(self.modules.unet.config.block_out_channels))
            return (*step_args, tuple(spec((key.parts, h * w), np.float32, whole=True) for h, w in grids), count)
        return (*step_args, count)

    def _encoded(self, cfg: bool, windows: int | None, kind: str = "encode"):
        """Shapes of what encode[cfg, K] (or refiner_encode) returns: hidden [cB, K*77, D], pooled [cB, P],
        key_lengths [cB]."""
        if (kind, cfg, windows) not in self._text_shapes:  # kept: every step program's arguments ask for it
            key = ProgramKey(kind, cfg=cfg, windows=windows)
            self._text_shapes[kind, cfg, windows] = jax.eval_shape(self.jitted(key), *self.abstract_args(key))
        return self._text_shapes[kind, cfg, windows]

    def _cross_kv(self, cfg: bool, windows: int | None) -> dict:
        """Shapes of the table cross_kv[cfg, K] returns: {layer path: (keys, values) [cB, K*77, C]}."""
        if (cfg, windows) not in self._table_shapes:
            key = ProgramKey("cross_kv", cfg=cfg, windows=windows)
            self._table_shapes[cfg, windows] = jax.eval_shape(self.jitted(key), *self.abstract_args(key))
        return self._table_shapes[cfg, windows]

    @property
    def image_tokens(self) -> int | None:
        """T, the image tokens of a request's image prompts: S slots x the most tokens an adapter gives (None: no
        image prompt is served)."""
        if not self.ip_slots:
            return None
        return self.ip_slots * max(projection.config.tokens for projection in self.modules.image_projections)

    def _image_prompt(self) -> dict:
        """A step's image prompt (replicated): the table `image_prompt` makes, and per slot its scale, window and
        adapter (one-hot [A, S]), per token whether it is real [T] (device/image_prompt.step_weights)."""
        if "image_prompt" not in self._table_shapes:
            key = ProgramKey("image_prompt")
            self._table_shapes["image_prompt"] = jax.eval_shape(self.jitted(key), *self.abstract_args(key))
        spec, slots = functools.partial(self._spec, whole=True), self.ip_slots
        whole = jax.tree_util.tree_map(lambda x: spec(x.shape, x.dtype), self._table_shapes["image_prompt"])
        return {
            **whole,
            "scale": spec((slots,), np.float32),
            "first": spec((slots,), np.int32),
            "stop": spec((slots,), np.int32),
            "slots": spec((len(self.modules.image_projections), slots), np.float32),
            "tokens": spec((self.image_tokens,), np.float32),
        }

    def _union(self, key: ProgramKey) -> bool:
        """A step_control program with a union ControlNet among its units (it reads their types too)."""
        return any(is_union(self.modules.controlnets[i]) for i in key.nets or ())

    def _feature(self, height: int, width: int, cfg: bool):
        """Shape of DeepCache's feature a whole-UNet step keeps: [cB, h, w, C]. Kept: finding it traces the whole
        step (seconds), and every shallow step's and halve_feature's arguments ask for it."""
        if (height, width, cfg) not in self._features:
            key = ProgramKey("step_full", height, width, cfg)
            self._features[height, width, cfg] = jax.eval_shape(self.jitted(key), *self.abstract_args(key))[2]
        return self._features[height, width, cfg]

    def _split(self, shapes):
        """Abstract batch-split arguments of these shapes."""
        return jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sharded(self.mesh)), shapes
        )

    def lower(self, key: ProgramKey):
        return self.jitted(key).trace(*self.abstract_args(key)).lower()

    def compile(self, key: ProgramKey) -> jax.stages.Compiled:
        """`key`'s compiled program, built on first use (from JAX's persistent cache when it has it)."""
        if key not in self._compiled:
            self._compiled[key] = self.compile_lowered(self.lower(key))
        return self._compiled[key]

    def compile_lowered(self, lowered) -> jax.stages.Compiled:
        """XLA's compile of a lowered program of these, with the servers' `--xla-option`s."""
        return lowered.compile(compiler_options(self.xla_options) or None)

    def install(self, key: ProgramKey, compiled: jax.stages.Compiled) -> None:
        """Use an executable built elsewhere (a precompiled start-up) for `key`."""
        self._compiled[key] = compiled

    def is_compiled(self, key: ProgramKey) -> bool:
        return key in self._compiled


def _abstract_controlnet(module, mesh):
    """A ControlNet architecture's weights as replicated shapes in its computation dtype."""
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, module.dtype, sharding=replicated(mesh)), shape_params(module)
    )


def image_inputs(latents, repaint) -> dict:
    """A step's `image` argument (device/denoise.unet_step): x0, its noise, the mask, the masked picture."""
    return {"latents": latents, "noise": latents, "repaint": repaint, "masked": latents}


def _latest_to_rgb(history):
    """The preview of a step's history: its first array, the step's D [b, 4, h, w] -> uint8 [b, h, w, 3]."""
    return latents_to_rgb(history[:, 0])


def _named(fn, name: str):
    """`fn` under `name`, the name JAX gives the program in its logs (JAX_LOG_COMPILES, cache hits)."""

    def program(*args, **kwargs):
        return fn(*args, **kwargs)

    program.__name__ = program.__qualname__ = name
    return program


def _without_weights(fn):
    """`fn` with an ignored first argument (the empty weights dict), so every program takes weights first."""

    @functools.wraps(fn)
    def wrapper(_weights, *args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper
