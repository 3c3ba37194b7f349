"""Tiny IP-Adapter files and reference outputs from diffusers' PyTorch SDXL pipeline (needs torch; never run by CI).

    /work/torchenv/bin/python scripts/make_ip_adapter_fixtures.py [ENGINE_SITE_PACKAGES]

(ENGINE_SITE_PACKAGES: where JAX is, for the engine's noise; default the project's .venv.)

Writes, for tests/fixtures/tiny-pt's UNet (cross_attention_dim 96):
- tests/fixtures/ip-adapter/image_encoder/: a tiny random `CLIPVisionModelWithProjection` (float32, image_size 32,
  patch 8, hidden 64, 3 layers, 4 heads, projection 48), as `save_pretrained` writes it;
- tests/fixtures/ip-adapter/ip-adapter_tiny.safetensors (and the same state as ip-adapter_tiny.bin): a plain
  IP-Adapter (`ImageProjModel`, 4 tokens) in h94/IP-Adapter's published layout (`image_proj.*`,
  `ip_adapter.{k}.to_k_ip.weight` / `to_v_ip.weight`, k = 1, 3, 5, ... over the UNet's cross-attentions in
  `unet.attn_processors` order), float16 as h94's files are;
- tests/fixtures/ip-adapter/ip-adapter-plus_tiny.safetensors: an IP-Adapter Plus (h94's `Resampler`: 16 queries,
  dim 64, 2 heads of 64, depth 4, ff_mult 4, on the encoder's penultimate hidden states), same layout, float16;
- tests/fixtures/ip-adapter-image-a.png (48x40), ip-adapter-image-b.png (40x56): the image prompts;
- tests/fixtures/ip-adapter-expected.npz and .json: diffusers' preprocessing, encoder outputs and projections of
  image a, and images (float32 [1, 64, 64, 3] in [0, 1]) of `StableDiffusionXLPipeline` on tests/fixtures/tiny-pt
  (float32, 64x64, Euler, leading, 4 steps, guidance 5, negative "blurry", seed 7, `latents=` the engine's noise,
  `device/denoise.initial_latents`) after `load_ip_adapter` + `set_ip_adapter_scale`: no image prompt, the plain
  adapter at 0, 0.6, 1, two images at once, a step window (the scale switched per step by `callback_on_step_end`),
  guidance 1 (against its own no-image case), and the Plus adapter at 0.6. The .json says each case's settings, the
  preprocessing, the uncond rule, the attention layers' numbering and the versions.
Every random tensor comes from fixed seeds and the runs use one thread, so a rerun writes the same bytes.
"""

from __future__ import annotations

import io
import json
import math
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FIXTURES = REPO / "tests" / "fixtures"
CHECKPOINT = FIXTURES / "tiny-pt"
IP_DIR = FIXTURES / "ip-adapter"
ENGINE_SITE_PACKAGES = REPO / ".venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
SIZE = 64
PROMPT = "a lighthouse on a cliff at dusk"
NEGATIVE = "blurry"
STEPS = 4
SEED = 7
ENCODER_CONFIG = {
    "image_size": 32,
    "patch_size": 8,
    "num_channels": 3,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "projection_dim": 48,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-5,
}
PLAIN_TOKENS = 4
#: h94's Resampler arguments for the Plus adapter (embedding_dim = the encoder's hidden_size). diffusers 0.39 builds
#: `IPAdapterPlusImageProjection` with its default depth 4 and dim_head 64 (heads = to_q rows // 64), so depth must
#: be 4; dim 64 with 2 heads of 64 keeps the file small and makes the attention's width (128) differ from dim.
RESAMPLER = {
    "dim": 64,
    "depth": 4,
    "dim_head": 64,
    "heads": 2,
    "num_queries": 16,
    "embedding_dim": 64,
    "output_dim": 96,
    "ff_mult": 4,
}
PLAIN_FILE = "ip-adapter_tiny.safetensors"
PLAIN_BIN = "ip-adapter_tiny.bin"
PLUS_FILE = "ip-adapter-plus_tiny.safetensors"
IP_STD = 0.3  # to_k_ip / to_v_ip: large enough that the adapter visibly changes the tiny UNet's image
WINDOW = (0.25, 0.75)  # step i has the image prompt when start <= i / steps < end
#: (name, adapter, images, scale, guidance, window)
CASES = [
    ("none", None, (), 0.0, 5.0, None),
    ("plain_0", "plain", ("a",), 0.0, 5.0, None),
    ("plain_0.6", "plain", ("a",), 0.6, 5.0, None),
    ("plain_1", "plain", ("a",), 1.0, 5.0, None),
    ("plain_two_0.6", "plain", ("a", "b"), 0.6, 5.0, None),
    ("plain_window", "plain", ("a",), 1.0, 5.0, WINDOW),
    ("guidance_1_none", None, (), 0.0, 1.0, None),
    ("guidance_1_plain", "plain", ("a",), 0.6, 1.0, None),
    ("plus_0.6", "plus", ("a",), 0.6, 5.0, None),
]


def engine_noise(seed: int) -> np.ndarray:
    """The engine's standard-normal initial noise for `seed`: float32 [1, 4, 8, 8]."""
    from pipeline.device.denoise import initial_latents

    return np.array(initial_latents(np.asarray([seed], np.uint32), SIZE, SIZE, 8), np.float32)


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez_compressed with a fixed timestamp on every member, so that a rerun writes the same bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, buffer.getvalue())


def make_images() -> dict:
    """Two small non-square RGB images (smooth gradients, a few shapes), so resize + centre crop are exercised."""
    from PIL import Image, ImageDraw

    def gradient(width: int, height: int, phase: float) -> Image.Image:
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        r = 127.5 + 127.5 * np.sin(x / width * 3.0 + phase)
        g = 255.0 * y / (height - 1)
        b = 127.5 + 127.5 * np.cos((x + y) / (width + height) * 5.0 - phase)
        return Image.fromarray(np.round(np.stack([r, g, b], -1)).clip(0, 255).astype(np.uint8), "RGB")

    a = gradient(48, 40, 0.0)
    draw = ImageDraw.Draw(a)
    draw.ellipse((6, 8, 26, 30), fill=(250, 240, 40))
    draw.rectangle((30, 4, 44, 18), fill=(20, 30, 200))
    draw.line((0, 39, 47, 22), fill=(255, 255, 255), width=3)
    b = gradient(40, 56, 1.7)
    draw = ImageDraw.Draw(b)
    draw.polygon([(20, 4), (36, 30), (4, 30)], fill=(200, 20, 40))
    draw.ellipse((10, 34, 34, 52), fill=(30, 200, 90))
    draw.rectangle((2, 2, 9, 50), fill=(10, 10, 10))
    return {"a": a, "b": b}


def make_encoder():
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(0)
    encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(**ENCODER_CONFIG)).float().eval()
    encoder.save_pretrained(str(IP_DIR / "image_encoder"), safe_serialization=True)
    return encoder


def cross_attentions(unet) -> list[dict]:
    """The UNet's cross-attentions with their h94 number k, as diffusers' `_convert_ip_adapter_attn_to_diffusers`
    numbers them (k = 1, then + 2 for each cross-attention, walking `unet.attn_processors`), and the width of each."""
    layers, k = [], 1
    for index, name in enumerate(unet.attn_processors.keys()):
        if name.endswith("attn1.processor"):
            continue
        if name.startswith("mid_block"):
            hidden = unet.config.block_out_channels[-1]
        elif name.startswith("up_blocks"):
            hidden = list(reversed(unet.config.block_out_channels))[int(name[len("up_blocks.")])]
        else:
            hidden = unet.config.block_out_channels[int(name[len("down_blocks.")])]
        # h94's own numbering is the index in `unet.attn_processors` (attn1 even, attn2 odd): the same here
        assert index == k, (index, k, name)
        layers.append({"k": k, "module": name.removesuffix(".processor"), "inner_dim": hidden})
        k += 2
    return layers


def make_ip_weights(layers: list[dict], cross_dim: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    state = {}
    for layer in layers:
        for which in ("to_k_ip", "to_v_ip"):
            shape = (layer["inner_dim"], cross_dim)
            state[f"ip_adapter.{layer['k']}.{which}.weight"] = torch.randn(shape, generator=generator) * IP_STD
    return state


def linear(shape, generator, bias: bool = False) -> torch.Tensor:
    """A weight [out, in] of std 1/sqrt(in), or a bias of std 0.1."""
    if bias:
        return torch.randn(shape, generator=generator) * 0.1
    return torch.randn(shape, generator=generator) / math.sqrt(shape[1])


def layer_norm(prefix: str, dim: int, generator) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}.weight": 1.0 + 0.1 * torch.randn(dim, generator=generator),
        f"{prefix}.bias": 0.1 * torch.randn(dim, generator=generator),
    }


def make_plain(layers, cross_dim: int, embed_dim: int) -> dict[str, torch.Tensor]:
    """h94's `ImageProjModel` (proj: Linear(embed_dim, 4 * cross_dim), norm: LayerNorm(cross_dim)) + ip weights."""
    g = torch.Generator().manual_seed(1)
    state = {
        "image_proj.proj.weight": linear((PLAIN_TOKENS * cross_dim, embed_dim), g),
        "image_proj.proj.bias": linear((PLAIN_TOKENS * cross_dim,), g, bias=True),
        **layer_norm("image_proj.norm", cross_dim, g),
    }
    state.update(make_ip_weights(layers, cross_dim, g))
    return {k: v.to(torch.float16) for k, v in state.items()}


def make_plus(layers, cross_dim: int) -> dict[str, torch.Tensor]:
    """h94's `Resampler` (ip_adapter/resampler.py) with RESAMPLER's arguments + ip weights."""
    r = RESAMPLER
    dim, inner = r["dim"], r["dim_head"] * r["heads"]
    g = torch.Generator().manual_seed(2)
    state = {
        "image_proj.latents": torch.randn((1, r["num_queries"], dim), generator=g) / math.sqrt(dim),
        "image_proj.proj_in.weight": linear((dim, r["embedding_dim"]), g),
        "image_proj.proj_in.bias": linear((dim,), g, bias=True),
        "image_proj.proj_out.weight": linear((r["output_dim"], dim), g),
        "image_proj.proj_out.bias": linear((r["output_dim"],), g, bias=True),
        **layer_norm("image_proj.norm_out", r["output_dim"], g),
    }
    for i in range(r["depth"]):
        attn, ff = f"image_proj.layers.{i}.0", f"image_proj.layers.{i}.1"
        state.update(layer_norm(f"{attn}.norm1", dim, g))
        state.update(layer_norm(f"{attn}.norm2", dim, g))
        state[f"{attn}.to_q.weight"] = linear((inner, dim), g)
        state[f"{attn}.to_kv.weight"] = linear((2 * inner, dim), g)
        state[f"{attn}.to_out.weight"] = linear((dim, inner), g)
        state.update(layer_norm(f"{ff}.0", dim, g))
        state[f"{ff}.1.weight"] = linear((dim * r["ff_mult"], dim), g)
        state[f"{ff}.3.weight"] = linear((dim, dim * r["ff_mult"]), g)
    state.update(make_ip_weights(layers, cross_dim, g))
    return {k: v.to(torch.float16) for k, v in state.items()}


def h94_plain(state: dict[str, torch.Tensor], embeds: torch.Tensor) -> torch.Tensor:
    """h94's ImageProjModel.forward, written out, to check diffusers' conversion of the file."""
    s = {k.removeprefix("image_proj."): v.float() for k, v in state.items() if k.startswith("image_proj.")}
    tokens = torch.nn.functional.linear(embeds, s["proj.weight"], s["proj.bias"]).reshape(
        embeds.shape[0], PLAIN_TOKENS, -1
    )
    return torch.nn.functional.layer_norm(tokens, tokens.shape[-1:], s["norm.weight"], s["norm.bias"])


def h94_resampler(state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """h94's Resampler.forward (PerceiverAttention + FeedForward), written out, to check diffusers' conversion."""
    s = {k.removeprefix("image_proj."): v.float() for k, v in state.items() if k.startswith("image_proj.")}
    f = torch.nn.functional
    r = RESAMPLER

    def ln(t, prefix):
        return f.layer_norm(t, (t.shape[-1],), s[f"{prefix}.weight"], s[f"{prefix}.bias"])

    def heads(t):
        return t.view(t.shape[0], t.shape[1], r["heads"], -1).transpose(1, 2)

    latents = s["latents"].repeat(x.shape[0], 1, 1)
    x = f.linear(x, s["proj_in.weight"], s["proj_in.bias"])
    for i in range(r["depth"]):
        a = f"layers.{i}.0"
        xn, ln_latents = ln(x, f"{a}.norm1"), ln(latents, f"{a}.norm2")
        q = f.linear(ln_latents, s[f"{a}.to_q.weight"])
        k, v = f.linear(torch.cat([xn, ln_latents], dim=-2), s[f"{a}.to_kv.weight"]).chunk(2, dim=-1)
        scale = 1 / math.sqrt(math.sqrt(r["dim_head"]))
        weight = torch.softmax((heads(q) * scale) @ (heads(k) * scale).transpose(-2, -1), dim=-1)
        out = (weight @ heads(v)).permute(0, 2, 1, 3).reshape(latents.shape[0], latents.shape[1], -1)
        latents = f.linear(out, s[f"{a}.to_out.weight"]) + latents
        h = f"layers.{i}.1"
        hidden = f.gelu(f.linear(ln(latents, f"{h}.0"), s[f"{h}.1.weight"]))
        latents = f.linear(hidden, s[f"{h}.3.weight"]) + latents
    return ln(f.linear(latents, s["proj_out.weight"], s["proj_out.bias"]), "norm_out")


def ip_state(unet) -> dict[str, torch.Tensor]:
    """What `load_ip_adapter` put into the UNet: the image projection and every to_k_ip / to_v_ip."""
    return {k: v.clone() for k, v in unet.state_dict().items() if "encoder_hid_proj" in k or "_ip." in k}


def main() -> None:
    if len(sys.argv) > 1:
        sys.path.append(sys.argv[1])
    else:
        sys.path.append(str(ENGINE_SITE_PACKAGES))
    torch.set_num_threads(1)
    import diffusers
    import PIL
    import safetensors
    import transformers
    from diffusers import StableDiffusionXLPipeline
    from safetensors.torch import save_file
    from transformers import CLIPImageProcessor

    IP_DIR.mkdir(exist_ok=True)
    pipe = StableDiffusionXLPipeline.from_pretrained(str(CHECKPOINT), torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    unet = pipe.unet
    cross_dim = unet.config.cross_attention_dim
    layers = cross_attentions(unet)

    images = make_images()
    for key, image in images.items():
        image.save(FIXTURES / f"ip-adapter-image-{key}.png")
    encoder = make_encoder()
    plain, plus = make_plain(layers, cross_dim, ENCODER_CONFIG["projection_dim"]), make_plus(layers, cross_dim)
    save_file(plain, str(IP_DIR / PLAIN_FILE))
    save_file(plus, str(IP_DIR / PLUS_FILE))
    nested = {
        part: {k.removeprefix(f"{part}."): v for k, v in plain.items() if k.startswith(f"{part}.")}
        for part in ("image_proj", "ip_adapter")
    }
    torch.save(nested, IP_DIR / PLAIN_BIN)

    noise = engine_noise(SEED)
    arrays: dict[str, np.ndarray] = {"noise": noise}
    processor = CLIPImageProcessor(size=ENCODER_CONFIG["image_size"], crop_size=ENCODER_CONFIG["image_size"])
    with torch.no_grad():
        pixels = {key: processor(image, return_tensors="pt").pixel_values for key, image in images.items()}
        out_a = encoder(pixels["a"], output_hidden_states=True)
        out_b = encoder(pixels["b"], output_hidden_states=True)
        zero = encoder(torch.zeros_like(pixels["a"]), output_hidden_states=True)
    arrays.update(
        preprocess_a=pixels["a"].numpy(),
        preprocess_b=pixels["b"].numpy(),
        encoder_embeds_a=out_a.image_embeds.numpy(),
        encoder_embeds_b=out_b.image_embeds.numpy(),
        encoder_penultimate_a=out_a.hidden_states[-2].numpy(),
        encoder_penultimate_zero=zero.hidden_states[-2].numpy(),
    )
    for name in ("encoder_embeds_a", "encoder_penultimate_a"):
        std = float(arrays[name].std())
        assert std > 1e-2, (name, std)

    def run(case, ip_images) -> np.ndarray:
        name, adapter, keys, scale, guidance, window = case
        kwargs = dict(
            prompt=PROMPT,
            negative_prompt=NEGATIVE if guidance > 1 else None,
            num_inference_steps=STEPS,
            guidance_scale=guidance,
            height=SIZE,
            width=SIZE,
            latents=torch.from_numpy(noise),
            output_type="np",
        )
        if adapter is not None:
            # one adapter: a list with one entry, that entry the list of its images (their tokens concatenated)
            kwargs["ip_adapter_image"] = [[ip_images[k] for k in keys]]
            scales = [scale if window is None or window[0] <= i / STEPS < window[1] else 0.0 for i in range(STEPS)]
            pipe.set_ip_adapter_scale(scales[0])
            if window is not None:

                def next_scale(pipeline, i, t, callback_kwargs):
                    if i + 1 < STEPS:
                        pipeline.set_ip_adapter_scale(scales[i + 1])
                    return callback_kwargs

                kwargs["callback_on_step_end"] = next_scale
        with torch.no_grad():
            return np.asarray(pipe(**kwargs).images, np.float32)  # [1, 64, 64, 3]

    results, loaded = {}, {}
    for adapter, weight_name in (("bin", PLAIN_BIN), ("plain", PLAIN_FILE), ("plus", PLUS_FILE)):
        # the first case of each: no image prompt, before any adapter is loaded
        for case in CASES:
            if case[1] is None and case[0] not in results:
                print(case[0])
                results[case[0]] = run(case, images)
        pipe.load_ip_adapter(str(IP_DIR), subfolder="", weight_name=weight_name, image_encoder_folder="image_encoder")
        loaded[adapter] = ip_state(pipe.unet)
        assert isinstance(pipe.feature_extractor, CLIPImageProcessor)
        assert pipe.feature_extractor.to_dict() == processor.to_dict()
        projection = pipe.unet.encoder_hid_proj.image_projection_layers[0]
        with torch.no_grad():
            if adapter == "plain":
                proj = projection(out_a.image_embeds)
                reference = h94_plain(plain, out_a.image_embeds)
                arrays["proj_plain_a"] = proj.numpy()
                arrays["proj_plain_uncond"] = projection(torch.zeros_like(out_a.image_embeds)).numpy()
            elif adapter == "plus":
                proj = projection(out_a.hidden_states[-2])
                reference = h94_resampler(plus, out_a.hidden_states[-2])
                arrays["proj_plus_a"] = proj.numpy()
                arrays["proj_plus_uncond"] = projection(zero.hidden_states[-2]).numpy()
            if adapter != "bin":
                error = float((proj - reference).abs().max())
                assert error < 1e-4, (adapter, error)
                print(f"{adapter}: diffusers' projection vs h94's forward, max |diff| {error:.2e}")
        if adapter != "bin":
            for case in CASES:
                if case[1] == adapter:
                    print(case[0])
                    results[case[0]] = run(case, images)
        pipe.unload_ip_adapter()
    # the .bin and the .safetensors load into the same weights
    assert loaded["bin"].keys() == loaded["plain"].keys()
    assert all(torch.equal(loaded["bin"][k], loaded["plain"][k]) for k in loaded["plain"])
    # unloading gives the plain pipeline back
    again = run(CASES[0], images)
    assert np.array_equal(again, results["none"])

    def baseline(name: str) -> np.ndarray:
        return results["guidance_1_none" if name.startswith("guidance_1") else "none"]

    levels = {
        name: int(np.abs(np.round(results[name] * 255) - np.round(baseline(name) * 255)).max()) for name in results
    }
    max_diff = {name: float(np.abs(results[name] - baseline(name)).max() * 255) for name in results}
    print("max |case - its no-image case| in 8-bit levels:", {k: round(v, 2) for k, v in max_diff.items()})
    for name in ("plain_0.6", "plain_1", "plus_0.6", "plain_two_0.6", "plain_window", "guidance_1_plain"):
        assert max_diff[name] > 8, (name, max_diff[name])
    arrays.update(results)

    cases = []
    for name, adapter, keys, scale, guidance, window in CASES:
        entry = {
            "name": name,
            "adapter": {None: None, "plain": PLAIN_FILE, "plus": PLUS_FILE}[adapter],
            "images": [f"ip-adapter-image-{k}.png" for k in keys],
            "scale": scale,
            "guidance_scale": guidance,
            "negative_prompt": NEGATIVE if guidance > 1 else None,
            "prompt": PROMPT,
            "steps": STEPS,
            "seed": SEED,
        }
        if adapter is not None:
            entry["ip_adapter_image"] = f"[[{', '.join(keys)}]]: one adapter, its images' tokens concatenated"
        if window is not None:
            entry["window"] = {
                "start": window[0],
                "end": window[1],
                "rule": "step i active when start <= i/steps < end",
            }
            entry["scale_per_step"] = [scale if window[0] <= i / STEPS < window[1] else 0.0 for i in range(STEPS)]
            entry["how"] = (
                "set_ip_adapter_scale(scale_per_step[0]) before the call; callback_on_step_end after step i sets "
                "scale_per_step[i + 1]; a scale of 0 skips the image attention in IPAdapterAttnProcessor2_0"
            )
        cases.append(entry)
    pp = processor.to_dict()
    manifest = {
        "what": "diffusers' PyTorch StableDiffusionXLPipeline on tests/fixtures/tiny-pt (float32, 64x64) after "
        "load_ip_adapter(tests/fixtures/ip-adapter, weight_name=...) + set_ip_adapter_scale",
        "images": "npz key = case name, float32 [1, 64, 64, 3] in [0, 1]; 'noise': the engine's noise for the seed, "
        "passed as latents=",
        "arrays": {
            "preprocess_a, preprocess_b": "pipe.feature_extractor(image).pixel_values, float32 [1, 3, 32, 32]",
            "encoder_embeds_a, encoder_embeds_b": "image_encoder(preprocess).image_embeds [1, 48]",
            "encoder_penultimate_a": "image_encoder(preprocess_a, output_hidden_states=True).hidden_states[-2] "
            "[1, 17, 64] (16 patches + the class token)",
            "encoder_penultimate_zero": "the same for torch.zeros_like(preprocess_a) (the Plus uncond input)",
            "proj_plain_a": "unet.encoder_hid_proj.image_projection_layers[0](encoder_embeds_a) [1, 4, 96] (plain)",
            "proj_plain_uncond": "the plain projection of zeros [1, 4, 96] (the plain adapter's negative tokens)",
            "proj_plus_a": "the Plus resampler of encoder_penultimate_a [1, 16, 96]",
            "proj_plus_uncond": "the Plus resampler of encoder_penultimate_zero [1, 16, 96]",
        },
        "preprocess": {
            "built_by": "load_ip_adapter: CLIPImageProcessor(size=image_encoder.config.image_size, "
            "crop_size=image_encoder.config.image_size) (the slow, PIL processor)",
            "do_convert_rgb": pp["do_convert_rgb"],
            "do_resize": pp["do_resize"],
            "size": pp["size"],
            "resample": f"{pp['resample']} (PIL bicubic): shortest edge to 32, aspect kept",
            "do_center_crop": pp["do_center_crop"],
            "crop_size": pp["crop_size"],
            "do_rescale": pp["do_rescale"],
            "rescale_factor": pp["rescale_factor"],
            "do_normalize": pp["do_normalize"],
            "image_mean": pp["image_mean"],
            "image_std": pp["image_std"],
        },
        "image_encoder": {
            "class": "CLIPVisionModelWithProjection",
            "folder": "ip-adapter/image_encoder",
            "dtype": "float32",
            "config": ENCODER_CONFIG,
            "init": "transformers' default init after torch.manual_seed(0)",
        },
        "adapters": {
            PLAIN_FILE: {
                "kind": "plain (h94 ImageProjModel)",
                "dtype": "float16, as h94's files are",
                "tokens": PLAIN_TOKENS,
                "keys": {k: list(v.shape) for k, v in plain.items()},
            },
            PLAIN_BIN: "the same state as torch.save({'image_proj': {...}, 'ip_adapter': {...}}), prefixes stripped",
            PLUS_FILE: {
                "kind": "Plus (h94 Resampler, ip_adapter/resampler.py)",
                "dtype": "float16, as h94's files are",
                "resampler": RESAMPLER,
                "keys": {k: list(v.shape) for k, v in plus.items()},
            },
            "init": f"torch.randn from fixed generators: linear weights std 1/sqrt(fan_in), biases 0.1, LayerNorm "
            f"weight 1 + 0.1 N, bias 0.1 N, latents N / sqrt(dim), to_k_ip / to_v_ip std {IP_STD}",
        },
        "ip_adapter_numbering": {
            "rule": "diffusers' _convert_ip_adapter_attn_to_diffusers: walk unet.attn_processors, k = 1 for the first "
            "cross-attention (attn2) and + 2 for each next one; attn1 layers get no weights. k equals the index in "
            "unet.attn_processors (attn1 even, attn2 odd), h94's own numbering",
            "layers": layers,
        },
        "uncond": {
            "plain": "encode_image(output_hidden_states=False): negative image embeds = "
            "torch.zeros_like(image_embeds), then the projection of those zeros (proj_plain_uncond)",
            "plus": "encode_image(output_hidden_states=True): negative = image_encoder(torch.zeros_like(pixel_values))."
            "hidden_states[-2] (encoder_penultimate_zero; zeros after normalisation, not a black image), then the "
            "resampler of it (proj_plus_uncond)",
            "cfg": "prepare_ip_adapter_image_embeds concatenates [negative, positive] on the batch, as the text; "
            "at guidance 1 only the positive",
            "several_images": "ip_adapter_image=[[a, b]]: embeds [1, 2, 48], each projected, their tokens "
            "concatenated (8 tokens) in the attention; negatives the same per image",
        },
        "scale": "IPAdapterAttnProcessor2_0: attn2 output = attention(text) + scale * attention(q, to_k_ip(tokens), "
        "to_v_ip(tokens)), same heads as the attn2; scale 0 skips the image attention",
        "max_levels_vs_none": {
            "what": "max |case - none| * 255 on the float images (guidance_1_*: against guidance_1_none)",
            **{k: round(v, 4) for k, v in max_diff.items()},
        },
        "max_levels_vs_none_8bit": {"what": "the same on the images rounded to 8 bits", **levels},
        "scheduler": dict(pipe.scheduler.config),
        "cases": cases,
        "versions": {
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "transformers": transformers.__version__,
            "safetensors": safetensors.__version__,
            "PIL": PIL.__version__,
            "numpy": np.__version__,
        },
    }
    save_npz(FIXTURES / "ip-adapter-expected.npz", arrays)
    (FIXTURES / "ip-adapter-expected.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    print(f"wrote {FIXTURES / 'ip-adapter-expected.npz'} and .json")


if __name__ == "__main__":
    main()
