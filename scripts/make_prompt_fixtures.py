"""Regenerate the weighted-prompt and textual-inversion references (tests/fixtures/prompts-expected.*), the
embedding files (tests/fixtures/embeddings/) and the clip-skip references (tests/fixtures/clip-skip-expected.*).

Needs torch, so it runs only in a separate environment, never in CI or at run time:

    /work/torchenv/bin/python scripts/make_prompt_fixtures.py             # all of them
    /work/torchenv/bin/python scripts/make_prompt_fixtures.py clip-skip   # the clip-skip references only

What it writes, all from diffusers' and transformers' PYTORCH classes on tests/fixtures/tiny-pt (float32, 64x64,
Euler, leading spacing, fixed initial latents):
- Weighted prompts: A1111's "Original" emphasis computed here from the PyTorch text encoders (each segment
  tokenized on its own; per encoder and 77-token window, hidden states × weights, then rescaled to the unweighted
  mean; the pooled embedding unweighted) and handed to `StableDiffusionXLPipeline` as `prompt_embeds`,
  `pooled_prompt_embeds` and their negatives. The segments and weights are written out by hand (A1111's parse of
  each prompt), so the reference does not reuse the engine's parser.
- An SDXL embedding file (`clip_l` [2, D1], `clip_g` [2, D2]) and the pipeline's image with it loaded by
  diffusers' `load_textual_inversion` into both encoders (text_encoder + tokenizer with clip_l, text_encoder_2 +
  tokenizer_2 with clip_g); plus an SD 1.5-style file and a broken one, which a server refuses at start-up.
- Clip skip: the pipeline's own `clip_skip=1` (hidden_states[-3] of both encoders for the prompt; diffusers reads
  the negative prompt's at [-2] whatever clip_skip is, so this case has no negative prompt: zeros, SDXL's
  `force_zeros_for_empty_prompt`), and a case with a negative prompt read at the same layer as the prompt, as A1111
  and ComfyUI read both texts: each text through `encode_prompt(clip_skip=1)` and handed over as `prompt_embeds`
  / `negative_prompt_embeds`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
CHECKPOINT = FIXTURES / "tiny-pt"
EMBEDDINGS = FIXTURES / "embeddings"
SIZE, STEPS, GUIDANCE, LATENT_SEED = 64, 3, 6.5, 4321
BREAK = None  # a segment that closes the 77-token window
#: The SDXL embedding's name (its file's stem) and vector count.
EMBEDDING, VECTORS = "zqxtoken", 2

#: (name, prompt, its segments, negative prompt, its segments): A1111's parse of each, written out.
EMPHASIS_CASES = [
    (
        "weighted",
        "a (red:1.3) car, [blurry], ((masterpiece))",
        [("a ", 1.0), ("red", 1.3), (" car, ", 1.0), ("blurry", 1 / 1.1), (", ", 1.0), ("masterpiece", 1.21)],
        "(low quality:1.4), text",
        [("low quality", 1.4), (", text", 1.0)],
    ),
    (
        "weighted_break",
        "a (cozy:1.5) cabin BREAK snowy [[forest]]",
        [("a ", 1.0), ("cozy", 1.5), (" cabin", 1.0), BREAK, ("snowy ", 1.0), ("forest", 1 / 1.21)],
        "blurry BREAK (text:0.5)",
        [("blurry", 1.0), BREAK, ("text", 0.5)],
    ),
]
PLAIN_NEGATIVE = "blurry"
#: (name, prompt, negative prompt or None, clip_skip): the clip-skip references (`write_clip_skip`).
CLIP_SKIP_CASES = [
    ("clip_skip_1", "a lighthouse on a cliff at dusk", None, 1),
    ("clip_skip_1_negative", "a lighthouse on a cliff at dusk", "blurry, low quality", 1),
]
EMBEDDING_PROMPT = f"a photo of {EMBEDDING} by the sea"


def windows(tokenizer, segments) -> tuple[list[list[int]], list[list[float]]]:
    """Token rows [K][77] and weights [K][77]: segments tokenized one by one, 75 tokens per window, BREAK closing
    one; begin/end tokens, padding with the tokenizer's pad token (as diffusers' `padding="max_length"`)."""
    chunks: list[list[tuple[int, float]]] = [[]]
    for segment in segments:
        if segment is BREAK:
            chunks.append([])
            continue
        text, weight = segment
        for token in tokenizer(text, add_special_tokens=False).input_ids:
            if len(chunks[-1]) == 75:
                chunks.append([])
            chunks[-1].append((token, weight))
    rows, weights = [], []
    for chunk in chunks:
        pad = 75 - len(chunk)
        rows.append(
            [tokenizer.bos_token_id] + [t for t, _ in chunk] + [tokenizer.eos_token_id] + [tokenizer.pad_token_id] * pad
        )
        weights.append([1.0] + [w for _, w in chunk] + [1.0] + [1.0] * pad)
    return rows, weights


@torch.no_grad()
def emphasized_embeds(pipe, segments) -> tuple[torch.Tensor, torch.Tensor]:
    """A1111's "Original" emphasis: prompt_embeds [1, K*77, D1+D2] and the first window's pooled [1, P]."""
    per_encoder, pooled = [], None
    for tokenizer, encoder in ((pipe.tokenizer, pipe.text_encoder), (pipe.tokenizer_2, pipe.text_encoder_2)):
        rows, weights = windows(tokenizer, segments)
        parts = []
        for row, weight in zip(rows, weights, strict=True):
            out = encoder(torch.tensor([row]), output_hidden_states=True)
            z = out.hidden_states[-2]  # [1, 77, D]
            multipliers = torch.tensor([weight], dtype=z.dtype)[..., None]  # [1, 77, 1]
            weighted = z * multipliers
            parts.append(weighted * (z.mean() / weighted.mean()))
            if encoder is pipe.text_encoder_2 and pooled is None:
                pooled = out[0]  # [1, P]: text_embeds, unweighted
        per_encoder.append(torch.cat(parts, dim=1))  # [1, K*77, D]
    return torch.cat(per_encoder, dim=-1), pooled


def render(pipe, latents: np.ndarray, **texts) -> np.ndarray:
    with torch.no_grad():
        image = pipe(
            num_inference_steps=STEPS,
            guidance_scale=GUIDANCE,
            height=SIZE,
            width=SIZE,
            latents=torch.from_numpy(latents),
            output_type="np",
            **texts,
        ).images  # float32 [1, 64, 64, 3] in [0, 1]
    return np.asarray(image, np.float32)


def render_weighted(pipe, latents, prompt_segments, negative_segments) -> np.ndarray:
    embeds, pooled = emphasized_embeds(pipe, prompt_segments)
    negative_embeds, negative_pooled = emphasized_embeds(pipe, negative_segments)
    return render(
        pipe,
        latents,
        prompt_embeds=embeds,
        pooled_prompt_embeds=pooled,
        negative_prompt_embeds=negative_embeds,
        negative_pooled_prompt_embeds=negative_pooled,
    )


def unweighted(segments):
    return [s if s is BREAK else (s[0], 1.0) for s in segments]


def write_embeddings(pipe) -> dict[str, torch.Tensor]:
    """The SDXL embedding (2 vectors per encoder, at the scale of the vocabulary's), an SD 1.5-style one, a broken
    one."""
    from safetensors.torch import save_file

    EMBEDDINGS.mkdir(exist_ok=True)
    generator = torch.Generator().manual_seed(7)
    tensors = {}
    for key, encoder in (("clip_l", pipe.text_encoder), ("clip_g", pipe.text_encoder_2)):
        table = encoder.get_input_embeddings().weight
        tensors[key] = torch.randn((VECTORS, table.shape[1]), generator=generator) * table.std() * 3
    save_file(tensors, EMBEDDINGS / f"{EMBEDDING}.safetensors")
    save_file({"emb_params": torch.randn((2, 768), generator=generator)}, EMBEDDINGS / "sd15emb.safetensors")
    (EMBEDDINGS / "broken.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    return tensors


@torch.no_grad()
def both_at(pipe, prompt: str, negative: str, clip_skip: int) -> dict[str, torch.Tensor]:
    """The prompt's and the negative prompt's embeddings, each read at `clip_skip` by diffusers' `encode_prompt`."""
    embeds, _, pooled, _ = pipe.encode_prompt(prompt, do_classifier_free_guidance=False, clip_skip=clip_skip)
    negative_embeds, _, negative_pooled, _ = pipe.encode_prompt(
        negative, do_classifier_free_guidance=False, clip_skip=clip_skip
    )
    return {
        "prompt_embeds": embeds,
        "pooled_prompt_embeds": pooled,
        "negative_prompt_embeds": negative_embeds,
        "negative_pooled_prompt_embeds": negative_pooled,
    }


def write_clip_skip(pipe, latents: np.ndarray, versions: dict) -> None:
    """tests/fixtures/clip-skip-expected.*: each case of CLIP_SKIP_CASES, and how far it is from clip_skip None."""
    arrays, cases = {"latents": latents}, []
    for name, prompt, negative, clip_skip in CLIP_SKIP_CASES:
        if negative is None:
            arrays[name] = render(pipe, latents, prompt=prompt, clip_skip=clip_skip)
            plain = render(pipe, latents, prompt=prompt)
        else:
            arrays[name] = render(pipe, latents, **both_at(pipe, prompt, negative, clip_skip))
            plain = render(pipe, latents, prompt=prompt, negative_prompt=negative)
        levels = np.abs(np.round(arrays[name] * 255) - np.round(plain * 255))
        print(f"{name}: differs from SDXL's own layer by up to {levels.max():.0f} levels, {levels.mean():.1f} mean")
        assert levels.mean() > 2, f"{name}'s layer barely changes the image"
        cases.append({"name": name, "prompt": prompt, "negative_prompt": negative, "clip_skip": clip_skip})
    manifest = {
        "what": "diffusers' PyTorch StableDiffusionXLPipeline on tests/fixtures/tiny-pt (float32): clip_skip=1; with a "
        "negative prompt, both texts read at that layer by encode_prompt(clip_skip=1) (A1111's and ComfyUI's reading)",
        "height": SIZE,
        "width": SIZE,
        "steps": STEPS,
        "guidance_scale": GUIDANCE,
        "sampler": "euler",
        "latents": "npz key 'latents', float32 [1, 4, 8, 8] (before scaling by init_noise_sigma)",
        "images": "npz key = case name, float32 [1, 64, 64, 3] in [0, 1]",
        "cases": cases,
        "versions": versions,
    }
    np.savez_compressed(FIXTURES / "clip-skip-expected.npz", **arrays)
    (FIXTURES / "clip-skip-expected.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {FIXTURES / 'clip-skip-expected.npz'}")


def main() -> None:
    import diffusers
    import transformers
    from diffusers import StableDiffusionXLPipeline

    sys.path.insert(0, str(REPO))
    pipe = StableDiffusionXLPipeline.from_pretrained(str(CHECKPOINT), torch_dtype=torch.float32)
    latents = np.random.default_rng(LATENT_SEED).standard_normal((1, 4, SIZE // 8, SIZE // 8)).astype(np.float32)
    versions = {
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
    }
    write_clip_skip(pipe, latents, versions)
    if sys.argv[1:] == ["clip-skip"]:
        return
    arrays = {"latents": latents}
    cases = []
    for name, prompt, segments, negative, negative_segments in EMPHASIS_CASES:
        arrays[name] = render_weighted(pipe, latents, segments, negative_segments)
        plain = render_weighted(pipe, latents, unweighted(segments), unweighted(negative_segments))
        levels = np.abs(np.round(arrays[name] * 255) - np.round(plain * 255))
        print(f"{name}: differs from its weights at 1 by up to {levels.max():.0f} levels, {levels.mean():.1f} mean")
        assert levels.mean() > 2, f"{name}'s weights barely change the image"
        cases.append(
            {
                "name": name,
                "prompt": prompt,
                "negative_prompt": negative,
                "segments": segments,
                "negative_segments": negative_segments,
            }
        )
    tensors = write_embeddings(pipe)
    arrays["no_embedding"] = render(pipe, latents, prompt=EMBEDDING_PROMPT, negative_prompt=PLAIN_NEGATIVE)
    pipe.load_textual_inversion(
        tensors["clip_l"], token=EMBEDDING, text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer
    )
    pipe.load_textual_inversion(
        tensors["clip_g"], token=EMBEDDING, text_encoder=pipe.text_encoder_2, tokenizer=pipe.tokenizer_2
    )
    arrays["embedding"] = render(pipe, latents, prompt=EMBEDDING_PROMPT, negative_prompt=PLAIN_NEGATIVE)
    levels = np.abs(np.round(arrays["embedding"] * 255) - np.round(arrays["no_embedding"] * 255))
    print(f"embedding: differs from the name read as words by up to {levels.max():.0f} levels, {levels.mean():.1f}")
    assert levels.mean() > 2, "the embedding barely changes the image"
    manifest = {
        "what": "diffusers' PyTorch StableDiffusionXLPipeline on tests/fixtures/tiny-pt (float32): A1111's Original "
        "emphasis from the PyTorch text encoders as prompt_embeds; an SDXL embedding by load_textual_inversion",
        "height": SIZE,
        "width": SIZE,
        "steps": STEPS,
        "guidance_scale": GUIDANCE,
        "sampler": "euler",
        "latents": "npz key 'latents', float32 [1, 4, 8, 8] (before scaling by init_noise_sigma)",
        "images": "npz key = case name, float32 [1, 64, 64, 3] in [0, 1]",
        "cases": cases,
        "embedding": {
            "name": EMBEDDING,
            "vectors": VECTORS,
            "prompt": EMBEDDING_PROMPT,
            "negative_prompt": PLAIN_NEGATIVE,
            "refused": ["sd15emb", "broken"],
        },
        "versions": {
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "transformers": transformers.__version__,
        },
    }
    np.savez_compressed(FIXTURES / "prompts-expected.npz", **arrays)
    (FIXTURES / "prompts-expected.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {FIXTURES / 'prompts-expected.npz'} and {EMBEDDINGS}")


if __name__ == "__main__":
    main()
