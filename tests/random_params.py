"""Seeded random parameters for any network's tree, the same bytes wherever they are made.

`scripts/make_network_fixtures.py` runs diffusers' and transformers' Flax classes on them and
tests/engine/test_networks.py runs the project's own networks on them (tests/fixtures/networks-expected.npz), so
neither the fixture nor the test stores weights. Every leaf is random (biases and norm scales too, unlike the tiny
checkpoint's zeros and ones), so a bias or scale read from the wrong place shows.
"""

from __future__ import annotations

import math
import zlib

import jax
import numpy as np


def leaf_name(path) -> str:
    """A tree path as "down_blocks_1/attentions_0/proj_in/kernel"."""
    return "/".join(str(getattr(entry, "key", entry)) for entry in path)


def random_params(shapes, seed: int):
    """float32 NumPy values for the tree of `jax.ShapeDtypeStruct`s `shapes` (e.g. `jax.eval_shape(init, key)`):
    kernels normal / sqrt(fan in), embeddings normal x 0.02, norm scales 1 + normal x 0.1, the rest normal x 0.1;
    each leaf from its own generator seeded by (seed, its path)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    values = []
    for path, spec in leaves:
        name = leaf_name(path)
        normal = np.random.default_rng([seed, zlib.crc32(name.encode())]).standard_normal(spec.shape)
        kind = name.rsplit("/", 1)[-1]
        if kind == "kernel":
            value = normal / math.sqrt(math.prod(spec.shape[:-1]))
        elif kind == "embedding":
            value = normal * 0.02
        elif kind == "scale":
            value = 1 + normal * 0.1
        else:
            value = normal * 0.1
        values.append(np.asarray(value, np.float32))
    return jax.tree_util.tree_unflatten(treedef, values)


def tree_shapes(tree) -> dict[str, list[int]]:
    """{leaf name: shape} of a parameter tree (arrays or shape structs), sorted by name."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return dict(sorted((leaf_name(path), list(leaf.shape)) for path, leaf in leaves))
