"""What A1111's emphasis and textual-inversion embeddings cost a request on the host, and that they compile nothing.

    python -m bench.features.prompts             # tiny-pt with the embedding fixtures, 64x64, 2 steps (minutes)
    python -m bench.features.prompts --repeats 200

Host: the prompt and negative prompt read into token ids and weights (`host/planning/tokens.PromptReader`), the
request's embedding tables built, against today's plain `tokenize` of the same texts; and the embedding tables placed on
the devices. Engine: requests mixing plain, weighted, BREAK and embedding prompts through the served programs, with the
programs XLA built during them counted (the goal: 0). The tokenizers are the checkpoint's (tiny-pt's CLIP BPE; the
SDXL ones are larger vocabularies with the same algorithm).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from .millis import Millis

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
TEXTS = {
    "plain": ("a cozy cabin in a snowy forest, warm light, detailed", "blurry, low quality"),
    "weighted": ("a (cozy:1.3) cabin in a [snowy] forest, ((warm light)), detailed", "(blurry:1.2), [low quality]"),
    "break": ("a (cozy:1.3) cabin BREAK a [snowy] forest, ((warm light))", "blurry BREAK (low quality:1.2)"),
    "embedding": ("a photo of zqxtoken, (warm light:1.2)", "(zqxtoken:0.8), blurry"),
}


def timed(function, repeats: int) -> Millis:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return Millis.of_seconds(times)


def host_costs(generator, repeats: int) -> None:
    from ..engine import ExtraRows, extra_capacity, tokenize

    reader, windows = generator.prompts, generator.config.prompt_windows
    widths = generator.programs.text_widths
    print(f"host, per request (prompt + negative prompt), {repeats} repeats, ms median (p90; min–max):")
    for name, (prompt, negative) in TEXTS.items():

        def read(prompt=prompt, negative=negative):
            extra = ExtraRows()
            reader.read(prompt, windows, extra)
            reader.read(negative, windows, extra)
            return extra.tables(extra_capacity(windows), widths) if extra.size else None  # as the engine does

        def plain(prompt=prompt, negative=negative):
            tokenize(reader.tokenizers, prompt, windows)
            tokenize(reader.tokenizers, negative, windows)

        print(f"  {name:10s} read {timed(read, repeats).text(3)}   plain tokenize {timed(plain, repeats).text(3)}")
    extra = ExtraRows()
    reader.read(TEXTS["embedding"][0], windows, extra)
    tables = extra.tables(extra_capacity(windows), widths)
    put = timed(lambda: [t.block_until_ready() for t in generator._put_all(tables)], repeats)
    sizes = " + ".join(f"{t.shape[0]}×{t.shape[1]}" for t in tables)
    print(f"  embedding tables on the devices ({sizes} float32, replicated): {put.text(3)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(FIXTURES / "tiny-pt"))
    parser.add_argument("--embeddings-dir", default=str(FIXTURES / "embeddings"))
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from ..engine import Generator

    generator = Generator.from_pretrained(
        args.model, height=64, width=64, steps=2, dtype="float32", embeddings_dir=args.embeddings_dir
    )
    generator.warmup()
    print(f"{generator.device_summary}; embeddings offered: {', '.join(generator.rules.embeddings) or 'none'}")
    host_costs(generator, args.repeats)
    before = generator.compile_count
    runs = 0
    for emphasis_round in range(2):
        for prompt, negative in TEXTS.values():
            generator.generate(generator.request(prompt, negative_prompt=negative, seed=emphasis_round))
            runs += 1
    print(
        f"engine: {runs} requests (plain, weighted, BREAK, embedding, twice): "
        f"{generator.compile_count - before} programs compiled"
    )


if __name__ == "__main__":
    main()
