"""An ESRGAN upscaler run on fixed-size tiles, blended where they overlap: any picture, one compiled program.

An RRDBNet at 2048² output holds ~2048² × 64 features per activation (1 GiB in float32, dozens of them alive), and
a program per picture size would compile per request. So the picture is cut into TILE × TILE input tiles (A1111's
ESRGAN defaults: 192 px, overlap 8) whose starts are spread evenly so neighbours overlap by at least OVERLAP, and
the tiles run TILE_BATCH at a time through ONE program per (architecture, tile size), the weights its argument. Each
tile's output is weighted by a feather over the OVERLAP × scale output pixels next to an edge it shares with a
neighbour (0 in the outer quarter, rising linearly to 1 across the middle half: `feather`), and the weighted sum is
divided by the weights' sum: the tiles' edge effects (the model sees zero padding there) are left out and the
neighbours cross-fade, so no seam shows. A picture smaller
than a tile is mirrored out to one tile and the output cropped back.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: A1111's ESRGAN tile and overlap (its `ESRGAN_tile`, `ESRGAN_tile_overlap` defaults), in input pixels.
TILE = 192
OVERLAP = 8
#: Tiles per program call (the last call padded with blank tiles).
TILE_BATCH = 4


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Where the tiles along one side of `length` start: [0] when one tile covers it, else the fewest tiles whose
    neighbours overlap by at least `overlap`, spread evenly from 0 to length - tile."""
    if length <= tile:
        return [0]
    count = math.ceil((length - overlap) / (tile - overlap))
    return [round(i * (length - tile) / (count - 1)) for i in range(count)]


def feather(size: int, overlap: int, before: bool, after: bool) -> np.ndarray:
    """float32 [size]: 1, except towards an edge shared with a neighbour (`before`/`after`): 0 over the overlap's
    outer quarter, rising linearly to 1 over its middle half. The blend is thus as smooth as a linear cross-fade but
    takes nothing from the pixels next to a tile's edge, where the zero padding beyond it shows most."""
    distance = np.arange(size, dtype=np.float32) + 0.5  # from the leading edge
    margin = overlap / 4

    def ramp(d):
        return np.clip((d - margin) / max(overlap - 2 * margin, 1.0), 1e-6, 1.0)

    weight = np.ones(size, np.float32)
    if before:
        weight = np.minimum(weight, ramp(distance))
    if after:
        weight = np.minimum(weight, ramp(distance[::-1]))
    return weight


class TiledUpscaler:
    """One upscaler model on one device: `upscale(uint8 [h, w, 3]) -> uint8 [h·s, w·s, 3]`.

    `compile()` builds its one program (start-up); after that no picture size compiles anything.
    """

    def __init__(
        self,
        module: Any,
        params: dict,
        *,
        tile: int = TILE,
        overlap: int = OVERLAP,
        batch: int = TILE_BATCH,
        device: jax.Device | None = None,
    ) -> None:
        if tile % module.unshuffle or not 0 <= overlap < tile // 2:
            raise ValueError(f"tile {tile} and overlap {overlap} do not suit this model")
        self.module, self.tile, self.overlap, self.batch = module, tile, overlap, batch
        self.scale = int(module.scale)
        self.device = device or jax.devices()[0]
        self.params = jax.device_put(params, self.device)
        self._compiled = None

    def _run(self, params, tiles):
        """float32 [N, T, T, 3] in [0, 1] -> [N, T·s, T·s, 3], clipped to [0, 1] as A1111 clips."""
        return jnp.clip(self.module.apply({"params": params}, tiles), 0.0, 1.0)

    def compile(self):
        """The program for this model and tile size, compiled once."""
        if self._compiled is None:
            here = jax.sharding.SingleDeviceSharding(self.device)
            tiles = jax.ShapeDtypeStruct((self.batch, self.tile, self.tile, 3), jnp.float32, sharding=here)
            params = jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=here), self.params
            )
            self._compiled = jax.jit(self._run).trace(params, tiles).lower().compile()
        return self._compiled

    def upscale(self, image: np.ndarray) -> np.ndarray:
        """uint8 [h, w, 3] -> uint8 [h·scale, w·scale, 3]."""
        return np.clip(np.rint(self.upscale_float(image.astype(np.float32) / 255.0) * 255.0), 0, 255).astype(np.uint8)

    def upscale_float(self, image: np.ndarray) -> np.ndarray:
        """float32 [h, w, 3] in [0, 1] -> float32 [h·scale, w·scale, 3], tile by tile, feathered."""
        height, width = image.shape[:2]
        tile, s = self.tile, self.scale
        padded = np.pad(image, ((0, max(0, tile - height)), (0, max(0, tile - width)), (0, 0)), mode="symmetric")
        rows, columns = (
            tile_starts(padded.shape[0], tile, self.overlap),
            tile_starts(padded.shape[1], tile, self.overlap),
        )
        places = [(y, x) for y in rows for x in columns]
        total = np.zeros((padded.shape[0] * s, padded.shape[1] * s, 3), np.float32)
        weights = np.zeros(total.shape[:2] + (1,), np.float32)
        program = self.compile()
        for first in range(0, len(places), self.batch):
            chunk = places[first : first + self.batch]
            tiles = np.zeros((self.batch, tile, tile, 3), np.float32)
            for i, (y, x) in enumerate(chunk):
                tiles[i] = padded[y : y + tile, x : x + tile]
            out = np.asarray(program(self.params, jax.device_put(tiles, self.device)))
            for i, (y, x) in enumerate(chunk):
                weight = np.outer(
                    feather(tile * s, self.overlap * s, y > 0, y < rows[-1]),
                    feather(tile * s, self.overlap * s, x > 0, x < columns[-1]),
                )[..., None]
                total[y * s : (y + tile) * s, x * s : (x + tile) * s] += out[i] * weight
                weights[y * s : (y + tile) * s, x * s : (x + tile) * s] += weight
        return (total / weights)[: height * s, : width * s]
