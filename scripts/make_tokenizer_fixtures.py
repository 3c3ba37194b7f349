"""Regenerate tests/fixtures/clip-tokens-expected.json: token ids from transformers 4.57's slow `CLIPTokenizer`, the
tokenizer every reference of this project ran (diffusers' PyTorch and Flax pipelines), for the project's own
`pipeline/checkpoint/clip_tokenizer.py` to match.

Runs in the reference venv (transformers 4.57.6, no ftfy, as diffusers' pipelines ran it here), never in CI:

    .venv-reference/bin/python scripts/make_tokenizer_fixtures.py

For both tokenizers of tests/fixtures/tiny-pt (CLIP-L's pads with its end token, CLIP-G's with "!", an added token
of its own): hand-picked prompts (case, accents, CJK, control and zero-width characters, special tokens written out,
"!" runs, numbers, contractions, emoji, long text) and 300 random strings drawn with a fixed seed from a pool of such
characters; for each, the ids without special tokens, as `host/planning/tokens.py` asks for them.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECKPOINT = REPO / "tests" / "fixtures" / "tiny-pt"
OUT = REPO / "tests" / "fixtures" / "clip-tokens-expected.json"

PROMPTS = [
    "a photo of an astronaut riding a horse on the moon, highly detailed",
    "",
    " ",
    "a",
    "A",
    "Hello WORLD!! It's 4pm, isn't it? We'll see; they'd've",
    "café crème brûlée, naïve résumé, ÅNGSTRÖM, Straße, ǅ",
    "cafe\u0301 (combining accent, NFC makes é)",
    "東京タワー 夜景 風景画, 한국어 프롬프트, русский текст",
    "tabs\tand\nnewlines\r\nand  double  spaces",
    "zero\u200bwidth\u200d joiner, soft\u00adhyphen, nbsp\u00a0here, bom\ufeff, ctrl\x07bell\x00nul\ufffd",
    "<|endoftext|> test <|startoftext|>x<|endoftext|>",
    "<|ENDOFTEXT|> and <|Startoftext|> upper",
    "!",
    "!!!",
    "wow!nice! !yes",
    "a (red:1.3) car, [blurry], ((masterpiece)), BREAK, embedding:zqxtoken",
    "1234567890 3.14 1,000,000 ½ ² Ⅻ ٣",
    "emoji 🚀🔥👩‍🚀 and symbols ©®™ §¶ → ← ≠ ∞",
    "a" * 300,
    " ".join(["masterpiece best quality"] * 40),
    "___---***///\\\\|||",
    "'s 't 're 've 'm 'll 'd 'S 'T",
    "ﬁne ﬂower (ligatures)",
    "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ",
    "\u0000\u0001\u001f\u007f\u0085\u2028\u2029",
]
POOL = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789     ,.;:!?'\"()[]{}<>|_-+*/\\@#$%^&~`"
    "éèêëàâäôöûüçñÉÅßøæœ東京大阪猫犬日本語한국어русский🚀🔥\u200b\u00a0\t\n\u0301\u00ad½²Ⅻ٣ﬁＦ!!!"
)


def random_prompts(count: int, seed: int = 20261127) -> list[str]:
    rng = random.Random(seed)
    special = ["<|endoftext|>", "<|startoftext|>", "!"]
    texts = []
    for _ in range(count):
        parts = [rng.choice(special) if rng.random() < 0.05 else rng.choice(POOL) for _ in range(rng.randint(0, 60))]
        texts.append("".join(parts))
    return texts


def main() -> int:
    import transformers
    from transformers import CLIPTokenizer

    prompts = PROMPTS + random_prompts(300)
    cases = {}
    for name in ("tokenizer", "tokenizer_2"):
        tokenizer = CLIPTokenizer.from_pretrained(CHECKPOINT / name)
        if tokenizer.fix_text is not None:
            sys.exit("ftfy is installed: the reference pipelines ran without it; use a venv without ftfy")
        cases[name] = {
            "bos": tokenizer.bos_token_id,
            "eos": tokenizer.eos_token_id,
            "pad": tokenizer.pad_token_id,
            "pad_token": tokenizer.pad_token,
            "length": len(tokenizer),
            "model_max_length": tokenizer.model_max_length,
            "ids": [tokenizer(p, add_special_tokens=False, truncation=False, verbose=False).input_ids for p in prompts],
        }
    OUT.write_text(
        json.dumps(
            {
                "transformers": transformers.__version__,
                "checkpoint": "tests/fixtures/tiny-pt",
                "prompts": prompts,
                "tokenizers": cases,
            },
            ensure_ascii=False,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {OUT.relative_to(REPO)}: {len(prompts)} prompts x 2 tokenizers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
