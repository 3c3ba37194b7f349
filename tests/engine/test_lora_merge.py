"""The compiled LoRA merge (pipeline/device/lora.py) on made-up kernels: equal to a NumPy reference for 0, 1 and 4
slots, restoring bit for bit, one compile for every set, slots and layout checked. The merge inside the engine, against
PyTorch, is tests/engine/test_lora.py."""

from __future__ import annotations

from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest

from pipeline.checkpoint.lora import LoraFile, LoraLayer
from pipeline.device.lora import MergeLayout, MergeProgram, empty_slot, pack, slot_weights
from pipeline.host.compiling.compile_cache import CompileCounter

# ---- the merge alone, on made-up kernels --------------------------------------------------------------------------

SHAPES = {
    ("unet", "linear", "kernel"): (6, 5),
    ("unet", "conv", "kernel"): (3, 3, 4, 5),
    ("unet", "pointwise", "kernel"): (1, 1, 4, 3),
    ("text_encoder", "q_proj", "kernel"): (5, 5),
    ("text_encoder_2", "fc1", "kernel"): (5, 7),
}


def made_up_lora(name: str, rank: int, seed: int, leaves=None) -> LoraFile:
    """A LoraFile with random factors of `rank` for `leaves` (default: all of SHAPES), scale 0.5 + seed / 10."""
    rng = np.random.default_rng(seed)
    layers = {}
    for leaf in leaves or SHAPES:
        shape = SHAPES[leaf]
        down = rng.standard_normal((int(np.prod(shape[:-1])), rank)).astype(np.float32)
        up = rng.standard_normal((rank, shape[-1])).astype(np.float32)
        layers[leaf] = LoraLayer(down=down, up=up, scale=0.5 + seed / 10, module=f"{name}:{'/'.join(leaf)}")
    return LoraFile(
        name=name, path=Path(f"{name}.safetensors"), format="made up", layers=layers, size_bytes=0, addnet_hash="0" * 64
    )


def originals_of(layout: MergeLayout, dtype) -> tuple:
    rng = np.random.default_rng(99)
    values = [rng.standard_normal(shape).astype(dtype) for shape in layout.shapes]
    values[0].reshape(-1)[0] = -0.0  # a negative zero must come back as itself, not as +0.0
    return tuple(jax.device_put(v) for v in values)


def reference(layout, originals, loras, weights) -> list[np.ndarray]:
    """float64 NumPy: original + Σ_slots w[component] · scale · down @ up, per kernel (before the cast)."""
    out = []
    for leaf, shape, original in zip(layout.leaves, layout.shapes, originals, strict=True):
        total = np.asarray(original).astype(np.float64)
        for lora, (te, unet) in zip(loras, weights, strict=True):
            layer = lora.layers.get(leaf)
            if layer is not None:
                w = unet if leaf[0] == "unet" else te
                total = total + w * layer.scale * (layer.down.astype(np.float64) @ layer.up).reshape(shape)
        out.append(total)
    return out


@pytest.fixture(scope="module")
def made_up():
    loras = [
        made_up_lora("a", 4, 1),
        made_up_lora("b", 2, 2),
        made_up_lora("c", 3, 3, list(SHAPES)[:2]),
        made_up_lora("d", 1, 4, list(SHAPES)[3:]),
    ]
    layout = MergeLayout.from_loras(loras, SHAPES)
    return layout, loras, {lora.name: pack(layout, lora) for lora in loras}


def bits(array) -> np.ndarray:
    array = np.asarray(array)
    return array.view(np.uint16 if array.dtype.itemsize == 2 else np.uint32)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_merge_equals_numpy_for_0_1_and_4_slots_and_restores_bit_for_bit(made_up, dtype):
    layout, loras, packed = made_up
    assert layout.rank == 4 and layout.slots == 4 and len(layout.leaves) == len(SHAPES)
    assert [leaf[0] for leaf in layout.leaves] == ["unet"] * 3 + ["text_encoder", "text_encoder_2"]
    program = MergeProgram(layout)
    originals = originals_of(layout, dtype)
    previous = MergeProgram.copies(originals)
    sets = [
        [],  # no LoRA
        [("a", (0.7, 0.7))],
        [("a", (1.0, 1.0)), ("b", (-0.8, -0.8)), ("c", (0.5, 0.5)), ("d", (1.5, 1.5))],  # 4 slots, one negative
        [("b", (0.0, 1.2))],  # text-encoder weight 0: the text encoders stay exactly as they were
        [],  # back to no LoRA after LoRAs
    ]
    for chosen in sets:
        weights = [w for _, w in chosen]
        merged = program(previous, originals, [packed[n] for n, _ in chosen], slot_weights(layout, weights))
        assert all(p.is_deleted() for p in previous)  # donated: their buffers hold `merged` now
        expected = reference(layout, originals, [next(x for x in loras if x.name == n) for n, _ in chosen], weights)
        for leaf, got, want, original in zip(layout.leaves, merged, expected, originals, strict=True):
            assert got.dtype == dtype and got.shape == original.shape
            untouched = all((w[0] if leaf[0] != "unet" else w[1]) == 0 for w in weights)
            if untouched:
                np.testing.assert_array_equal(bits(got), bits(original), err_msg=f"{chosen} {leaf}")
            elif dtype == np.float32:
                np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6, atol=2e-6, err_msg=f"{chosen} {leaf}")
            else:  # bfloat16: the float32 sum rounded once
                np.testing.assert_allclose(
                    np.asarray(got, np.float32),
                    want.astype(dtype).astype(np.float32),
                    rtol=2**-7,
                    atol=1e-6,
                    err_msg=f"{chosen} {leaf}",
                )
        previous = merged
    for got, original in zip(previous, originals, strict=True):  # the last set was "no LoRA"
        np.testing.assert_array_equal(bits(got), bits(original))
    assert all(not o.is_deleted() for o in originals)


def test_one_compile_serves_every_set(made_up):
    layout, _, packed = made_up
    CompileCounter.install()
    program = MergeProgram(layout)
    originals = originals_of(layout, np.float32)
    previous = program(MergeProgram.copies(originals), originals, [], slot_weights(layout, []))
    before = CompileCounter.compiles()
    for chosen in (["a"], ["b", "c"], ["d", "c", "b", "a"], [], ["a", "a"]):
        weights = slot_weights(layout, [(0.3 * (i + 1), -0.2 * i) for i in range(len(chosen))])
        previous = program(previous, originals, [packed[name] for name in chosen], weights)
    jax.block_until_ready(previous)
    assert CompileCounter.compiles() == before
    assert program.jitted._cache_size() == 1
    # With the engine's sharding (2 devices, replicated), host factors and factors placed once share the program.
    from pipeline.device.sharding import data_mesh, replicated

    sharding = replicated(data_mesh(jax.devices()[:2]))
    program = MergeProgram(layout, sharding=sharding)
    originals = tuple(jax.device_put(x, sharding) for x in originals)
    previous = MergeProgram.copies(originals)
    placed = {name: slot.placed(sharding) for name, slot in packed.items()}
    for chosen in ([packed["a"]], [placed["a"], packed["b"]], [placed["c"]], [], [placed["d"], placed["b"]]):
        previous = program(previous, originals, chosen, slot_weights(layout, [(1.0, 1.0)] * len(chosen)))
    assert program.jitted._cache_size() == 1
    assert all(x.sharding.is_fully_replicated and len(x.sharding.device_set) == 2 for x in previous)


def test_slots_and_layout_are_checked(made_up):
    layout, loras, packed = made_up
    with pytest.raises(ValueError, match="at most 4 LoRAs"):
        slot_weights(layout, [(1.0, 1.0)] * 5)
    with pytest.raises(ValueError, match="at most 4 LoRAs"):
        MergeProgram(layout).arguments([packed["a"]] * 5, np.zeros((4, 3), np.float32))
    outside = made_up_lora("e", 2, 5)
    outside.layers[("unet", "elsewhere", "kernel")] = outside.layers[("unet", "linear", "kernel")]
    with pytest.raises(ValueError, match="outside the merge layout"):
        pack(layout, outside)
    # Rank padding adds nothing: b (rank 2) packed at R = 4 has zero columns/rows past its rank, scale in `up`.
    leaf = ("unet", "linear", "kernel")
    index = layout.leaves.index(leaf)
    b = next(x for x in loras if x.name == "b").layers[leaf]
    np.testing.assert_array_equal(packed["b"].downs[index][:, 2:], 0)
    np.testing.assert_array_equal(packed["b"].ups[index][2:], 0)
    np.testing.assert_allclose(packed["b"].ups[index][:2], b.up * b.scale)
    # A LoRA that does not change a kernel of the layout packs zeros there, like an empty slot.
    d_index = layout.leaves.index(("unet", "conv", "kernel"))
    np.testing.assert_array_equal(packed["d"].downs[d_index], empty_slot(layout).downs[d_index])
    assert layout.slot_bytes() == 4 * sum(k * 4 + 4 * o for (k, _), (_, o) in layout.factor_shapes)


def test_bfloat16_factors_take_half_the_memory_and_merge_as_float32_factors_do(made_up):
    """A bfloat16 server packs its factors in bfloat16 (what each placed slot holds on the devices, halved); the
    merge still computes in float32, so the kernels differ from float32 factors' by the factors' rounding only."""
    import dataclasses

    layout, loras, packed = made_up
    half = dataclasses.replace(layout, factor_dtype="bfloat16")
    assert half.slot_bytes() * 2 == layout.slot_bytes()
    packed_half = {lora.name: pack(half, lora) for lora in loras}
    assert all(x.dtype == ml_dtypes.bfloat16 for slot in packed_half.values() for x in slot.downs + slot.ups)
    assert empty_slot(half).ups[0].dtype == ml_dtypes.bfloat16
    originals = originals_of(layout, ml_dtypes.bfloat16)
    chosen = [("a", (1.0, 1.0)), ("b", (-0.8, -0.8))]
    weights = slot_weights(layout, [w for _, w in chosen])
    full = MergeProgram(layout)(MergeProgram.copies(originals), originals, [packed[n] for n, _ in chosen], weights)
    halved = MergeProgram(half)(MergeProgram.copies(originals), originals, [packed_half[n] for n, _ in chosen], weights)
    for got, want, original in zip(halved, full, originals, strict=True):
        assert got.dtype == want.dtype == ml_dtypes.bfloat16
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        delta = np.abs(want - np.asarray(original, np.float32)).max()
        assert np.abs(got - want).max() <= 0.03 * delta + 2**-7 * np.abs(want).max()
