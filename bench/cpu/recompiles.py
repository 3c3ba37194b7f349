"""Part 4: random requests (prompts of every length, negative prompts, styles, guidance, seeds) add no compilations.

Every input that varies between requests is a traced argument of the one compiled program; this part proves it
by counting XLA compilations (`generator.compile_count`) around many random requests through the engine.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from ..common import Progress, Stats, progress, random_request


@dataclass(frozen=True)
class RecompileResult:
    """Compilations around a run of random requests."""

    requests: int  # random requests sent through Generator.generate (styles applied as the app applies them)
    compiles_before: int  # generator.compile_count before the first request
    compiles_after: int  # ... and after the last
    compiles_added: int  # after - before (must be 0)
    truncated_prompts: int  # requests whose prompt overflowed CLIP's 77 tokens (a different token count)
    per_call: Stats  # seconds per generate call
    wall_s: float  # the whole run


def recompiles(generator, requests: int, seed: int = 0, say: Progress = progress) -> RecompileResult:
    """Send `requests` random requests to the engine and count the compilations they trigger."""
    from ..engine import load_styles

    styles = load_styles()
    rng = random.Random(seed)
    before = generator.compile_count
    times, truncated = [], 0
    started = time.perf_counter()
    for index in range(requests):
        fields = random_request(rng, list(styles))
        request = generator.request(
            fields["prompt"],
            negative_prompt=fields["negative_prompt"],
            style=fields["style"],
            guidance_scale=fields["guidance_scale"],
            seed=fields["seed"],
        )  # the style applied as the app applies it
        result = generator.generate(request)
        times.append(result.timings["total_s"])
        truncated += bool(result.truncated)
        if (index + 1) % 25 == 0 or index + 1 == requests:
            say(f"recompiles: {index + 1}/{requests} requests, {generator.compile_count - before} compilations")
    after = generator.compile_count
    return RecompileResult(
        requests=requests,
        compiles_before=before,
        compiles_after=after,
        compiles_added=after - before,
        truncated_prompts=truncated,
        per_call=Stats.of(times),
        wall_s=time.perf_counter() - started,
    )
