"""`python -m bench.accelerator.device_site`: the packages `python -m bench gpu` needs on a lent GPU machine, as one
tarball.

    python -m bench.accelerator.device_site                       # .device/site.tar.xz (7.6 MB), from the package index
    python -m bench.accelerator.device_site --wheels DIR          # from wheels already in DIR (no index)

The device machine (bench/HISTORY.md, "Its first run on an H200") has no network, its own python 3.12 with jax,
torch, huggingface_hub 1.x, transformers 5 and tokenizers 0.23.2, and takes at most 64 MiB of working tree per call.
The PyTorch peer's worker needs diffusers 0.39.0 and transformers 4.57.6, which at import refuses huggingface_hub
1.x and tokenizers above 0.23.0, and diffusers imports `importlib_metadata`; the engine was measured with flax
0.12.12. As wheels these are 22 MB, and with this repository's tracked files that is over the limit, so they go
unpacked into one folder (`pip install --target`, no dependencies: the machine has the rest) and packed with xz.
On the machine, before the bench:

    python3 -c "import tarfile; tarfile.open('.device/site.tar.xz').extractall('/tmp/site', filter='fully_trusted')"
    PYTHONPATH=/tmp/site:. JAX_PLATFORMS=cuda python3 -m bench gpu --out $OUT

Each device call names `.device/site.tar.xz` in its `carry`; `.device/` must be ignored (`.git/info/exclude`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: What travels, pinned: the versions the 2026-11-28 run used (bench/results/gpu/).
PACKAGES = (
    "flax==0.12.12",
    "diffusers==0.39.0",
    "transformers==4.57.6",
    "huggingface_hub==0.36.2",
    "tokenizers==0.22.2",
    "importlib_metadata==10.2.0",
)
#: The device machine's python and platform, for the wheels pip picks.
TARGET = (
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
)
DEFAULT_OUT = REPO / ".device" / "site.tar.xz"


def download(folder: Path) -> list[Path]:
    """PACKAGES' wheels for the device machine's python, without their dependencies, into `folder`."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        *TARGET,
        "--dest",
        str(folder),
        *PACKAGES,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()
        raise SystemExit(f"device_site: pip could not download the wheels: {lines[-1] if lines else 'no output'}")
    return sorted(folder.glob("*.whl"))


def unpack(wheels: list[Path], site: Path) -> None:
    """The wheels installed into `site` as `pip install --target` lays them out (no dependencies, no bytecode), for
    the device machine's python whatever this one is (flax 0.12.12 asks for 3.12)."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--only-binary=:all:",
        *TARGET,
        "--target",
        str(site),
        *map(str, wheels),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"device_site: pip could not unpack the wheels: {done.stderr.strip().splitlines()[-1]}")


def pack(site: Path, out: Path) -> int:
    """`site`'s contents (without `bin/` and bytecode caches) as an xz tarball at `out`, replaced whole; its bytes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        return None if "__pycache__" in parts or parts[0] == "bin" else info

    with tarfile.open(partial, "w:xz", preset=9) as archive:
        for entry in sorted(site.iterdir()):
            archive.add(entry, arcname=entry.name, filter=keep)
    partial.replace(out)
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.accelerator.device_site",
        description=" ".join(__doc__.split("\n\n")[0].split()),
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--wheels", type=Path, help="take the wheels from this folder instead of the index")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the tarball (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        wheels = sorted(args.wheels.glob("*.whl")) if args.wheels else download(Path(scratch) / "wheels")
        if not wheels:
            raise SystemExit(f"device_site: no wheels in {args.wheels}")
        site = Path(scratch) / "site"
        unpack(wheels, site)
        size = pack(site, args.out)
    print(
        f"device_site: {len(wheels)} packages in {args.out} ({size / 1e6:.1f} MB): "
        + ", ".join(wheel.name.split("-")[0] + " " + wheel.name.split("-")[1] for wheel in wheels)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
