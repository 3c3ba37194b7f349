"""Regenerate tests/fixtures/pt-names-expected.json: the key and value diffusers' and transformers' own per-tensor
PyTorch -> Flax helpers give every tensor of tests/fixtures/tiny-pt (all four networks), for the project's torch-free
renaming rules (pipeline/checkpoint/pt_names.py) to match (tests/engine/test_pt_names.py).

transformers 5 removed its Flax module and diffusers 0.40 its Flax models, so this runs in the reference venv
(requirements-reference.txt), never in CI or at run time:

    .venv/bin/python -m bench.reference_venv     # makes .venv-reference once
    .venv-reference/bin/python scripts/make_pt_names_fixtures.py

Each tensor's entry (by file and name: the fp16 variant holds the same names): the Flax key the helpers give it and
the sha256 of the value's float32 bytes in that layout (a transposed kernel hashes differently from the PyTorch
tensor). The lookup the helpers consult is the project's
own networks' parameter tree (`convert.target_shapes`), as convert.py hands it to them.
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CHECKPOINT = REPO / "tests" / "fixtures" / "tiny-pt"
OUT = REPO / "tests" / "fixtures" / "pt-names-expected.json"
COMPONENTS = ("unet", "vae", "text_encoder", "text_encoder_2")


def value_hash(value) -> str:
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(np.asarray(value, np.float32)).tobytes()).hexdigest()[:16]


def library_rename(name: str, tensor, lookup: dict, text: bool):
    """What convert.py did with the libraries' helpers (diffusers' embedding-name slip corrected, as it did)."""
    if text:
        from transformers import modeling_flax_pytorch_utils as library

        return library.rename_key_and_reshape_tensor(tuple(name.split(".")), tensor, lookup, "")
    from diffusers.models import modeling_flax_pytorch_utils as library

    key = tuple(library.rename_key(name).split("."))
    renamed, value = library.rename_key_and_reshape_tensor(key, tensor, lookup)
    if renamed not in lookup and key[-1] == "weight" and key[:-1] + ("embedding",) in lookup:
        renamed = key[:-1] + ("embedding",)
    return renamed, value


def main() -> int:
    from pipeline.checkpoint.convert import SafetensorsReader, _Shape, target_shapes
    from pipeline.checkpoint.networks import build_networks

    networks = build_networks(CHECKPOINT, "float32")
    expected = {}
    for component in COMPONENTS:
        targets = target_shapes(getattr(networks, component).init_weights)
        lookup = {key: _Shape(shape) for key, shape in targets.items()}
        entries = {}
        for file in sorted((CHECKPOINT / component).glob("*.safetensors")):  # the fp16 variant beside the shards
            with SafetensorsReader(file) as reader:
                for name in reader.keys():  # noqa: SIM118 (the reader is no dict)
                    if name.endswith("position_ids"):
                        continue
                    key, value = library_rename(name, reader.get_tensor(name), lookup, component.startswith("text"))
                    entries[f"{file.name}:{name}"] = [list(key), value_hash(value)]
        expected[component] = entries
    versions = {name: metadata.version(name) for name in ("diffusers", "transformers", "numpy")}
    OUT.write_text(
        json.dumps(
            {"versions": versions, "checkpoint": "tests/fixtures/tiny-pt", "tensors": expected},
            separators=(",", ":"),
            sort_keys=True,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {OUT.relative_to(REPO)}: {sum(map(len, expected.values()))} tensors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
