"""The served ControlNets and one request's ControlNet inputs for the host loop.

`ServedControlNets` holds the ControlNets a server loaded (`--controlnet`) that fit its UNet, grouped by architecture:
the step program is compiled per combination of architectures (`sets`: one unit, two units), and each unit's weights
are an argument, so ControlNets of one architecture (canny, depth, ... of the same size) share programs. A union
ControlNet (ProMax) is an architecture of its own, per model: the units naming it are one forward with as many
conditions (the combination's count of it), their types traced. A request's units become `loop.ControlInputs`: maps
on the devices, weights, the per-step scales (weight x window) and the union units' types.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

import numpy as np

from ...contract.controlnet_units import CONTROL_TYPES, MAX_CONTROLNETS, ControlUnit, step_scales
from ...device.nets.controlnet_union import SDXLControlNetUnion
from ...device.sharding import global_batch, replicate_tree
from ..loop import ControlInputs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedControlNets:
    """What a server offers: names, architectures, each one's placed weights, the compiled combinations."""

    names: tuple[str, ...] = ()
    archs: tuple = ()  # distinct SDXLControlNet modules
    arch_of: dict = field(default_factory=dict)  # name -> index into archs
    trees: dict = field(default_factory=dict)  # name -> weights, replicated on the mesh
    sets: tuple[tuple[int, ...], ...] = ()  # static: the architecture combinations with a step program
    unions: tuple[str, ...] = ()  # the names of the union ControlNets (a control_type per unit)

    @classmethod
    def of(cls, nets: list, loaded, mesh=None, units: int = MAX_CONTROLNETS) -> ServedControlNets:
        """Place each loaded ControlNet that fits the UNet on `mesh` (None: place nothing, a TPU topology's
        precompile reads shapes only); one that does not fit is named in one line and left out. `units`: the most
        ControlNets a request uses at once (--controlnet-units): a step program per combination up to it."""
        unet = loaded.networks.unet_config
        archs, keys, arch_of, trees = [], [], {}, {}
        for net in nets:
            why = mismatch(net.module, unet)
            if why:
                logger.error("ControlNet %r does not fit this model (%s); the server starts without it.", net.name, why)
                continue
            union = isinstance(net.module, SDXLControlNetUnion)
            key = repr(net.module) + (f" {net.name}" if union else "")  # a union's units share one model's forward
            if key not in keys:
                keys.append(key)
                archs.append(net.module)
            arch_of[net.name] = keys.index(key)
            trees[net.name] = replicate_tree(net.params, mesh) if mesh is not None else None
        indices = range(len(archs))
        sets = tuple(
            combo for size in range(1, units + 1) for combo in itertools.combinations_with_replacement(indices, size)
        )
        unions = tuple(name for name in arch_of if isinstance(archs[arch_of[name]], SDXLControlNetUnion))
        return cls(tuple(arch_of), tuple(archs), arch_of, trees, sets, unions)


def mismatch(module, unet: dict) -> str:
    """Why a ControlNet cannot feed this UNet's residuals ("" when it can)."""
    wanted = {
        "cross_attention_dim": unet.get("cross_attention_dim"),
        "block_out_channels": tuple(unet.get("block_out_channels", ())),
        "layers_per_block": unet.get("layers_per_block"),
        "projection_class_embeddings_input_dim": unet.get("projection_class_embeddings_input_dim"),
        "addition_time_embed_dim": unet.get("addition_time_embed_dim"),
    }
    for name, value in wanted.items():
        have = getattr(module, name)
        if (tuple(have) if isinstance(have, (list, tuple)) else have) != value:
            return f"its {name} is {have}, the UNet's {value}"
    return ""


def control_inputs(
    served: ServedControlNets, units: tuple[ControlUnit, ...], steps: int, n: int, sharding
) -> ControlInputs | None:
    """A request's units on the devices for a batch of `n` images over `steps` plan rows (None without any units),
    sorted by architecture: the program's order (addition of two residuals is the same in either order)."""
    if not units:
        return None
    units = tuple(sorted(units, key=lambda unit: served.arch_of[unit.name]))
    maps = []
    for unit in units:
        pixels = np.transpose(unit.pixels(), (2, 0, 1)).astype(np.float32) / 255.0  # [3, H, W] in [0, 1]
        maps.append(np.broadcast_to(pixels, (n, *pixels.shape)))  # [B, 3, H, W]
    placed = global_batch(tuple(maps), sharding)
    return ControlInputs(
        maps=tuple(placed),
        trees=tuple(served.trees[unit.name] for unit in units),
        nets=tuple(served.arch_of[unit.name] for unit in units),
        scales=step_scales(units, steps),
        types=np.asarray([CONTROL_TYPES.get(unit.control_type, -1) for unit in units], np.int32)
        if any(unit.control_type for unit in units)
        else None,
    )
