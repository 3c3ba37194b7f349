"""LoRA on the devices: fixed slots, one compiled merge, the unmerged weights kept to restore from.

Merging a LoRA set into the weights when it changes costs one pass over the touched kernels and nothing per step
(side branches cost every step: ../shared/design.md's "Merge vs side branch" estimates ≈ 11 ms per change
against +6–22 ms per step for SDXL at 1024² on v5e). So that switching sets never compiles,
everything the merge program sees has shapes fixed at start-up by `MergeLayout`:

- the touched kernels: the union of the kernels any accepted LoRA file changes (the rest are never passed);
- S = 4 slots, each holding one LoRA's factors at rank R = the largest rank of any accepted layer (a smaller rank
  is padded with zeros, which adds nothing), per kernel `down` [K, R] and `up` [R, out] with the layer's
  alpha / rank folded into `up` on the host (`pack`); an unused slot holds zeros (`empty_slot`);
- the weights: [S, 3] float32, one multiplier per slot and component (UNet, TE1, TE2), so A1111's
  `<lora:name:te:unet>` is two numbers, never a new program.

`merge_leaves` computes, per kernel, in float32: original + Σ_s w[s, c] · down_s @ up_s (one [K, S·R] @ [S·R, out]
product), cast to the kernel's dtype. Where every slot's weight for the kernel's component is 0 it returns the
original exactly (a select, not an addition of zero), so a request without LoRA after LoRA requests gets the
weights, and the pixels, it got before any LoRA. `MergeProgram` jits it once with the previous merged kernels
donated (unused, kept with `keep_unused=True` so XLA can write the new kernels into their buffers: no third copy).
Device memory: the served params hold the merged kernels, the unmerged originals of the touched kernels are kept
beside them, plus the packed slots that are placed.

Measured 2026-11-24 (tiny checkpoint + fixture LoRAs: 281 kernels, 3.2 M weights, R = 8,
4 slots; a busy 2-core CPU, 1 device): first call (compile) 2.4 s; per change 6 ms with the factors placed once,
~45 ms with them sent from the host each time (the same for bfloat16 weights).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

#: LoRAs applied at once.
SLOTS = 4
#: The components a LoRA may change; column c of the weights [S, 3] is component c's multiplier.
COMPONENTS = ("unet", "text_encoder", "text_encoder_2")
#: A kernel of the checkpoint: (component, *path in its Flax parameter tree).
LeafPath = tuple[str, ...]


@dataclass(frozen=True)
class MergeLayout:
    """The merge program's static shapes, fixed at start-up from every accepted LoRA file."""

    leaves: tuple[LeafPath, ...]  # every kernel some accepted LoRA changes, sorted (component first)
    shapes: tuple[tuple[int, ...], ...]  # each kernel's Flax shape: [in, out] or [kh, kw, in, out]
    rank: int  # R: every slot's factors have rank R (smaller ranks are zero-padded)
    slots: int = SLOTS  # S: LoRAs applied at once
    # The packed factors' dtype: the weights' (bfloat16 halves what each placed slot holds on the devices; the
    # merge still multiplies and adds in float32).
    factor_dtype: str = "float32"

    @classmethod
    def from_loras(
        cls,
        loras: Sequence,
        shapes: Mapping[LeafPath, tuple[int, ...]],
        slots: int = SLOTS,
        factor_dtype: str = "float32",
    ) -> MergeLayout:
        """The layout for `loras` (objects with `.layers: {leaf: layer with .rank}`, e.g. checkpoint/lora.py's
        LoraFile); `shapes` maps each kernel to its Flax shape (checkpoint/lora.py's LoraTargets.shapes)."""
        leaves = sorted({leaf for lora in loras for leaf in lora.layers}, key=_leaf_order)
        rank = max((layer.rank for lora in loras for layer in lora.layers.values()), default=1)
        return cls(
            leaves=tuple(leaves),
            shapes=tuple(tuple(shapes[leaf]) for leaf in leaves),
            rank=rank,
            slots=slots,
            factor_dtype=factor_dtype,
        )

    @property
    def dtype(self) -> np.dtype:
        """`factor_dtype` as a NumPy dtype (bfloat16 through ml_dtypes, which JAX imports)."""
        return np.dtype(jnp.dtype(self.factor_dtype))

    @property
    def components(self) -> tuple[int, ...]:
        """Each kernel's column in the weights [S, 3] (its component's index in COMPONENTS)."""
        return tuple(COMPONENTS.index(leaf[0]) for leaf in self.leaves)

    @property
    def factor_shapes(self) -> tuple[tuple[tuple[int, int], tuple[int, int]], ...]:
        """Per kernel: (down [K, R], up [R, out]) with K the kernel's input size (kh·kw·in for a conv)."""
        return tuple(((int(np.prod(shape[:-1])), self.rank), (self.rank, shape[-1])) for shape in self.shapes)

    def slot_bytes(self) -> int:
        """Bytes one packed slot takes (all kernels' down and up, in `factor_dtype`)."""
        return sum((k * r + r * o) * self.dtype.itemsize for (k, r), (_, o) in self.factor_shapes)


@dataclass(frozen=True)
class SlotFactors:
    """One LoRA packed for a slot: every kernel of the layout, rank R, alpha/rank folded into `up`."""

    downs: tuple  # per kernel of the layout: [K, R] (zeros where the LoRA does not change the kernel)
    ups: tuple  # per kernel of the layout: [R, out], already × the layer's scale

    def placed(self, sharding: jax.sharding.Sharding) -> SlotFactors:
        """The same factors on the devices (e.g. once at start-up, so a change transfers nothing)."""
        return SlotFactors(
            downs=tuple(jax.device_put(self.downs, sharding)), ups=tuple(jax.device_put(self.ups, sharding))
        )


def _leaf_order(leaf: LeafPath) -> tuple:
    return (COMPONENTS.index(leaf[0]) if leaf[0] in COMPONENTS else len(COMPONENTS), leaf)


def pack(layout: MergeLayout, lora) -> SlotFactors:
    """`lora`'s factors in the layout (host arrays of the layout's dtype): zero-padded to rank R, scale folded into
    `up` (in float32, then cast).

    A kernel the layout has and the LoRA does not change gets zeros; a kernel the LoRA changes that the layout
    lacks is a caller's error (the layout is built from every accepted file).
    """
    extra = set(lora.layers) - set(layout.leaves)
    if extra:
        raise ValueError(f"{getattr(lora, 'name', 'LoRA')} changes {len(extra)} kernels outside the merge layout")
    downs, ups, dtype = [], [], layout.dtype
    for leaf, ((k, rank), (_, out)) in zip(layout.leaves, layout.factor_shapes, strict=True):
        down, up = np.zeros((k, rank), dtype), np.zeros((rank, out), dtype)
        layer = lora.layers.get(leaf)
        if layer is not None:
            r = layer.rank
            down[:, :r] = layer.down
            up[:r, :] = np.asarray(layer.up, np.float32) * np.float32(layer.scale)
        downs.append(down)
        ups.append(up)
    return SlotFactors(downs=tuple(downs), ups=tuple(ups))


def empty_slot(layout: MergeLayout) -> SlotFactors:
    """An unused slot: zeros (with weight 0 it adds nothing; with any weight, still nothing)."""
    downs = tuple(np.zeros(d, layout.dtype) for d, _ in layout.factor_shapes)
    ups = tuple(np.zeros(u, layout.dtype) for _, u in layout.factor_shapes)
    return SlotFactors(downs=downs, ups=ups)


def slot_weights(layout: MergeLayout, weights: Sequence[tuple[float, float]]) -> np.ndarray:
    """float32 [S, 3]: per slot (text-encoder weight, UNet weight) -> its multiplier per component; unused slots 0."""
    if len(weights) > layout.slots:
        raise ValueError(f"at most {layout.slots} LoRAs at once; got {len(weights)}")
    table = np.zeros((layout.slots, len(COMPONENTS)), np.float32)
    for slot, (te, unet) in enumerate(weights):
        table[slot] = (unet, te, te)
    return table


def merge_leaves(originals, downs, ups, weights, *, components: tuple[int, ...]):
    """The merged kernels: per kernel l, original + Σ_s weights[s, c_l] · downs[s][l] @ ups[s][l] (float32).

    originals: tuple over kernels of [shape] (the weight dtype); downs / ups: tuple over slots of tuple over kernels
    of [K, R] / [R, out]; weights: float32 [S, 3]; components: static, each kernel's column of `weights`.
    Returns a tuple over kernels in the originals' dtypes; a kernel whose component has every weight 0 is returned
    as the original, bit for bit.
    """
    merged = []
    for index, (original, column) in enumerate(zip(originals, components, strict=True)):
        w = weights[:, column]  # [S]
        a = jnp.concatenate([downs[s][index].astype(jnp.float32) * w[s] for s in range(len(downs))], axis=1)  # [K, S·R]
        b = jnp.concatenate([ups[s][index].astype(jnp.float32) for s in range(len(ups))], axis=0)  # [S·R, out]
        delta = jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)  # [K, out]
        updated = (original.astype(jnp.float32) + delta.reshape(original.shape)).astype(original.dtype)
        merged.append(jnp.where(jnp.any(w != 0), updated, original))
    return tuple(merged)


class MergeProgram:
    """`merge_leaves` jitted for one layout; the previous merged kernels are donated (their buffers reused).

        program = MergeProgram(layout)
        merged = program(previous, originals, [pack(...), ...], slot_weights(layout, [(te, unet), ...]))

    `previous`: the kernels the served params hold now (deleted by the call: donated; at start-up a copy of the
    originals, `copies`); `originals`: the unmerged kernels (kept, never donated); slots: up to S SlotFactors
    (padded with `empty_slot`s). Every call has the same shapes, so the program is compiled once (jax.jit's cache;
    `compile` builds it ahead of time). `sharding` (the engine's replicated sharding) fixes the arguments' and the
    results': pass it, so that host and placed factors (`SlotFactors.placed`) share the one program; without it,
    pass only host factors (results then follow the originals' placement).
    """

    def __init__(self, layout: MergeLayout, sharding: jax.sharding.Sharding | None = None):
        self.layout = layout
        self.sharding = sharding
        self._empty: SlotFactors | None = None
        body = functools.partial(merge_donating, components=layout.components)
        shardings = {} if sharding is None else {"in_shardings": sharding, "out_shardings": sharding}
        self.jitted = jax.jit(body, donate_argnums=(0,), keep_unused=True, **shardings)

    @staticmethod
    def copies(originals: tuple) -> tuple:
        """Fresh buffers with the originals' values and shardings: the first `previous` (never donate originals)."""
        return tuple(jax.device_put(x, x.sharding, may_alias=False) for x in originals)

    def empty(self) -> SlotFactors:
        """A zero slot, made once (and placed once, with a sharding)."""
        if self._empty is None:
            empty = empty_slot(self.layout)
            self._empty = empty if self.sharding is None else empty.placed(self.sharding)
        return self._empty

    def arguments(self, slots: Sequence[SlotFactors], weights) -> tuple:
        """(downs, ups, weights) for the jitted program: `slots` padded to S with zero slots."""
        if len(slots) > self.layout.slots:
            raise ValueError(f"at most {self.layout.slots} LoRAs at once; got {len(slots)}")
        full = list(slots) + [self.empty()] * (self.layout.slots - len(slots))
        if self.sharding is not None:
            # Every argument committed to the one sharding: jit keys its cache on the arguments' placement, so
            # host and placed factors mixed would each compile anew. Placed slots are passed as they are.
            full = [slot if isinstance(slot.downs[0], jax.Array) else slot.placed(self.sharding) for slot in full]
            weights = jax.device_put(np.asarray(weights, np.float32), self.sharding)
        elif not isinstance(weights, jax.Array):
            weights = np.asarray(weights, np.float32)
        return tuple(slot.downs for slot in full), tuple(slot.ups for slot in full), weights

    def __call__(self, previous: tuple, originals: tuple, slots: Sequence[SlotFactors], weights) -> tuple:
        downs, ups, weights = self.arguments(slots, weights)
        return self.jitted(tuple(previous), tuple(originals), downs, ups, weights)

    def compile(self, previous: tuple, originals: tuple):
        """Compile ahead of time for these kernels (arrays or ShapeDtypeStructs with their shardings)."""
        downs, ups, weights = self.arguments([], np.zeros((self.layout.slots, len(COMPONENTS)), np.float32))
        return self.jitted.lower(tuple(previous), tuple(originals), downs, ups, weights).compile()


def merge_donating(previous, originals, downs, ups, weights, *, components):
    """`merge_leaves` taking the previous merged kernels first, to donate their buffers to the result."""
    del previous  # donated: its buffers become the outputs' (same shapes and dtypes)
    return merge_leaves(originals, downs, ups, weights, components=components)


# ---- pytree helpers: the kernels of a params tree, and back ------------------------------------------------------


def get_leaves(params: Mapping, leaves: Sequence[LeafPath]) -> tuple:
    """The kernels at `leaves` of {component: nested dict} params, in order."""
    out = []
    for leaf in leaves:
        node = params
        for key in leaf:
            node = node[key]
        out.append(node)
    return tuple(out)


def with_leaves(params: Mapping, leaves: Sequence[LeafPath], values: Sequence) -> dict:
    """A copy of the nested-dict `params` with the kernels at `leaves` replaced (other leaves shared, not copied)."""

    def copy(node):
        return {k: copy(v) for k, v in node.items()} if isinstance(node, Mapping) else node

    out = {component: copy(tree) for component, tree in params.items()}
    for leaf, value in zip(leaves, values, strict=True):
        node = out
        for key in leaf[:-1]:
            node = node[key]
        node[leaf[-1]] = value
    return out


__all__ = [
    "COMPONENTS",
    "SLOTS",
    "MergeLayout",
    "MergeProgram",
    "SlotFactors",
    "empty_slot",
    "get_leaves",
    "merge_leaves",
    "pack",
    "slot_weights",
    "with_leaves",
]
