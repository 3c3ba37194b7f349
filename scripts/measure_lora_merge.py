"""Measure the LoRA merge per change on the tiny checkpoint with the fixture LoRAs (tests/fixtures/lora/).

    JAX_PLATFORMS=cpu python scripts/measure_lora_merge.py [float32|bfloat16]
    JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8 python scripts/measure_lora_merge.py

Prints the start-up costs (kernel table, reading the directory, packing) and the merge program's first call
(compile) and per-change time: 30 changes cycling through 1 to 4 slots with varying weights, with the factors
passed from the host and with the factors placed once on the devices, weights replicated over every device.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.loading import load_model  # noqa: E402
from pipeline.lora_files import COMPONENTS, load_lora_dir, lora_targets  # noqa: E402
from pipeline.lora_merge import MergeLayout, MergeProgram, get_leaves, pack, slot_weights  # noqa: E402
from pipeline.sharding import data_mesh, replicated  # noqa: E402

CHANGES = 30


def main() -> None:
    dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
    checkpoint = REPO / "tests" / "fixtures" / "tiny-pt"
    model = load_model(str(checkpoint), dtype=dtype, conversion_cache=False)
    config = json.loads((checkpoint / "unet" / "config.json").read_text())
    started = time.perf_counter()
    targets = lora_targets(config, {c: model.params[c] for c in COMPONENTS})
    tabled = time.perf_counter()
    directory = load_lora_dir(REPO / "tests" / "fixtures" / "lora", targets)
    read = time.perf_counter()
    layout = MergeLayout.from_loras(directory.loras, targets.shapes)
    packed = [pack(layout, lora) for lora in directory.loras]
    packed_at = time.perf_counter()
    weights_count = sum(int(np.prod(shape)) for shape in layout.shapes)
    print(
        f"kernel table {1e3 * (tabled - started):.0f} ms, read {len(directory.loras)} LoRAs + "
        f"{len(directory.refused)} refused {1e3 * (read - tabled):.0f} ms, pack {1e3 * (packed_at - read):.0f} ms; "
        f"layout: {len(layout.leaves)} kernels, {weights_count / 1e6:.2f} M weights, R = {layout.rank}, "
        f"{layout.slot_bytes() / 1e6:.2f} MB per slot"
    )
    sharding = replicated(data_mesh())
    program = MergeProgram(layout, sharding=sharding)
    originals = tuple(jax.device_put(x, sharding) for x in get_leaves(model.params, layout.leaves))
    previous = MergeProgram.copies(originals)
    started = time.perf_counter()
    previous = jax.block_until_ready(program(previous, originals, packed, slot_weights(layout, [(1, 1)] * 4)))
    print(
        f"{len(jax.devices())} × {jax.devices()[0].platform}, {dtype}: first call {time.perf_counter() - started:.2f} s"
    )
    placed = [slot.placed(sharding) for slot in packed]
    for label, slots in (("factors from the host", packed), ("factors placed once", placed)):
        times = []
        for i in range(CHANGES + 1):
            count = 1 + i % 4
            chosen = (slots[i % 4 :] + slots[: i % 4])[:count]
            weights = slot_weights(layout, [(0.5 + 0.1 * j, -0.3 + 0.2 * j) for j in range(count)])
            started = time.perf_counter()
            previous = jax.block_until_ready(program(previous, originals, chosen, weights))
            if i:  # the first call with placed factors places the empty slot once
                times.append(time.perf_counter() - started)
        print(f"  per change, {label}: median {1e3 * statistics.median(times):.1f} ms "
              f"(min {1e3 * min(times):.1f}, max {1e3 * max(times):.1f}); compiled programs: "
              f"{program.jitted._cache_size()}")  # fmt: skip


if __name__ == "__main__":
    main()
