"""The torch-free conversion's renaming rules (pipeline/checkpoint/pt_names.py): every tensor of the PyTorch fixture
(tests/fixtures/tiny-pt, all four networks) gets the key and the value diffusers' and transformers' own per-tensor
helpers gave it (tests/fixtures/pt-names-expected.json: scripts/make_pt_names_fixtures.py, run in the reference venv,
since transformers 5 and diffusers 0.40 removed those helpers); the rules on their own cases; and a name that fits
nowhere keeps its name, for the loader to refuse in one line."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from conftest import FIXTURES, TINY_PT

from pipeline.checkpoint.convert import SafetensorsReader, _rename_diffusers, _Shape, target_shapes
from pipeline.checkpoint.pt_names import diffusers_key, rename_diffusers, rename_transformers

COMPONENTS = ("unet", "vae", "text_encoder", "text_encoder_2")


@pytest.fixture(scope="module")
def networks():
    from pipeline.checkpoint.networks import build_networks

    return build_networks(TINY_PT, "float32")


def tensors(component: str):
    """(file name, PyTorch name, NumPy array) of each tensor in the fixture's safetensors files for `component`."""
    for file in sorted((TINY_PT / component).glob("*.safetensors")):
        with SafetensorsReader(file) as reader:
            names = reader.keys()
            for name in names:
                if not name.endswith("position_ids"):
                    yield file.name, name, reader.get_tensor(name)


#: The libraries' key and value hash for each fixture tensor, by component and PyTorch name.
LIBRARIES = json.loads((FIXTURES / "pt-names-expected.json").read_text(encoding="utf-8"))["tensors"]


def value_hash(value) -> str:
    """As the fixture script hashes a value: its float32 bytes in the layout given."""
    return hashlib.sha256(np.ascontiguousarray(np.asarray(value, np.float32)).tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_fixture_tensor_is_renamed_as_the_libraries_do(networks, component):
    targets = target_shapes(getattr(networks, component).init_weights)
    lookup = {key: _Shape(shape) for key, shape in targets.items()}
    text = component.startswith("text_encoder")
    seen, remaining = set(), dict(LIBRARIES[component])
    for file, name, tensor in tensors(component):
        if text:
            mine = rename_transformers(tuple(name.split(".")), tensor, lookup, "")
        else:
            mine = _rename_diffusers(name, tensor, lookup)
        theirs_key, theirs_value = remaining.pop(f"{file}:{name}")
        assert mine[0] == tuple(theirs_key) and mine[0] in targets, (name, mine[0], theirs_key)
        assert mine[1].shape == targets[mine[0]] and value_hash(mine[1]) == theirs_value, name
        seen.add(mine[0])
    assert seen == set(targets)  # every parameter of the network comes from one tensor
    assert not remaining  # and every tensor the libraries renamed was read


def test_the_rules_on_their_own():
    lookup = {
        key: _Shape(shape)
        for key, shape in {
            ("down_blocks_0", "attentions_0", "transformer_blocks_0", "attn1", "query", "kernel"): (8, 4),
            ("down_blocks_0", "resnets_0", "norm1", "scale"): (4,),
            ("down_blocks_0", "resnets_0", "norm1", "bias"): (4,),
            ("conv_in", "kernel"): (3, 3, 4, 8),
            ("time_embedding", "linear_1", "kernel"): (8, 16),
            ("text_model", "embeddings", "token_embedding", "embedding"): (10, 8),
        }.items()
    }
    rng = np.random.default_rng(0)
    assert diffusers_key("down_blocks.0.attentions.1.proj_in.weight") == (
        "down_blocks_0",
        "attentions_1",
        "proj_in",
        "weight",
    )
    q = rng.standard_normal((4, 8))  # PyTorch Linear: [out, in]
    key, value = rename_diffusers(
        diffusers_key("down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight"), q, lookup
    )
    assert key[-2:] == ("query", "kernel") and np.array_equal(value, q.T)
    key, _ = rename_diffusers(diffusers_key("down_blocks.0.resnets.0.norm1.weight"), np.ones(4), lookup)
    assert key[-1] == "scale"
    conv = rng.standard_normal((8, 4, 3, 3))  # [O, I, kh, kw]
    key, value = rename_diffusers(("conv_in", "weight"), conv, lookup)
    assert key == ("conv_in", "kernel") and value.shape == (3, 3, 4, 8)
    key, value = rename_diffusers(("time_embedding", "linear_1", "weight"), rng.standard_normal((16, 8)), lookup)
    assert key == ("time_embedding", "linear_1", "kernel") and value.shape == (8, 16)
    key, _ = rename_transformers(("embeddings", "token_embedding", "weight"), np.ones((10, 8)), lookup, "text_model")
    assert key == ("embeddings", "token_embedding", "embedding")  # present under the base model's prefix
    assert rename_diffusers(("mystery", "thing"), np.ones(2), lookup)[0] == ("mystery", "thing")  # refused upstream
