"""`python -m bench.cpu.convert`: time and peak memory of converting PyTorch safetensors, and of the conversion cache.

    python -m bench.cpu.convert                      # the tiny PyTorch fixture: first vs second start (cache)
    python -m bench.cpu.convert --full-size          # also a full-size random SDXL UNet file (2.57 B params, fp16,
                                                 # 4.8 GiB; needs ~10 GiB free disk and ~6 GiB memory, bfloat16)

Every figure is measured in a fresh subprocess (peak RSS = its ru_maxrss). The full-size file is written without
torch from assets/sdxl_unet_pt_shapes.json (SDXL UNet's PyTorch names and shapes), tensor by tensor, and deleted
afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "tiny-pt"

_CHILD = r"""
import json, os, resource, sys, time
os.environ.setdefault("JAX_PLATFORMS", "cpu")
mode, source, dtype, cache = sys.argv[1:5]
started = time.perf_counter()
if mode == "model":
    from bench.engine import load_model
    loaded = load_model(source, dtype=dtype, conversion_cache=cache == "1")
    result = {"load_s": loaded.load_s, "origins": loaded.origins}
else:
    from bench.engine import load_converted, network
    config = json.load(open(sys.argv[5]))
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    unet = network("unet", config, dtype)
    converted = load_converted([__import__("pathlib").Path(source)], unet.init_weights, component="unet",
                               dtype=dtype, config=config, use_cache=cache == "1")
    result = {"load_s": converted.seconds, "origins": {"unet": "conversion cache" if converted.cached else "converted"}}
result["process_s"] = time.perf_counter() - started
result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print("RESULT " + json.dumps(result))
"""


def measure(mode: str, source: str, dtype: str, cache_root: Path | None, *extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SDXL_JAX_CACHE": str(cache_root or "/nonexistent")}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, source, dtype, "1" if cache_root else "0", *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"measurement failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def write_random_unet(path: Path, shapes: dict[str, list[int]], seed: int = 0) -> int:
    """A safetensors file of random float16 tensors, written one tensor at a time (no full copy in memory)."""
    import numpy as np

    header, offset = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    rng = np.random.default_rng(seed)
    with path.open("wb") as out:
        out.write(len(blob).to_bytes(8, "little") + blob)
        for shape in shapes.values():
            out.write((rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16).tobytes())
    return offset


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu.convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full-size", action="store_true", help="also convert a full-size random SDXL UNet file")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="target dtype")
    parser.add_argument("--workdir", default=None, help="where the 4.8 GiB file and cache go (default: a temp dir)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    results: dict = {"dtype": args.dtype}
    with tempfile.TemporaryDirectory(prefix="bench-convert-", dir=args.workdir) as tmp:
        work = Path(tmp)
        results["fixture_no_cache"] = measure("model", str(FIXTURE), args.dtype, None)
        results["fixture_first_start"] = measure("model", str(FIXTURE), args.dtype, work / "cache")
        results["fixture_second_start"] = measure("model", str(FIXTURE), args.dtype, work / "cache")
        for key in ("fixture_no_cache", "fixture_first_start", "fixture_second_start"):
            print(f"{key:28s} {json.dumps(results[key])}", flush=True)
        if args.full_size:
            shapes = json.loads((REPO / "assets" / "sdxl_unet_pt_shapes.json").read_text())["shapes"]
            unet_file = work / "sdxl_unet_random.fp16.safetensors"
            size = write_random_unet(unet_file, shapes)
            results["full_size_file"] = {"tensors": len(shapes), "bytes": size, "gib": size / 2**30}
            print(f"{'full_size_file':28s} {json.dumps(results['full_size_file'])}", flush=True)
            config = str(REPO / "assets" / "sdxl_unet_config.json")
            for key, cache in (
                ("full_no_cache", None),
                ("full_first_start", work / "fc"),
                ("full_second_start", work / "fc"),
            ):
                results[key] = measure("unet", str(unet_file), args.dtype, cache, config)
                print(f"{key:28s} {json.dumps(results[key])}", flush=True)
            unet_file.unlink()
            shutil.rmtree(work / "fc", ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
