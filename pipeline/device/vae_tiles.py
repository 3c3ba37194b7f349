"""The VAE in tiles, for images too big to decode or encode whole within a chip's HBM (2048² and up).

Why: SDXL's VAE has one self-attention over every latent of the image (its middle block), so a whole decode at 2048²
(256² latents) holds a 65536 × 65536 attention matrix, and its 128-channel 2048² activations besides (bench/HISTORY.md,
"Hires 2048² and the refiner on v5e", gives the compiler's figures for v5e). In tiles, memory is one tile's, whatever
the image size.

How: the latents (decode) or pixels (encode) are cut into fixed tiles that overlap by `overlap` latents; the tiles
are run one after another in a `lax.fori_loop`, so the compiled program holds one tile's VAE (one body per tile
shape, whatever the image size) and an accumulator of the output. Each tile's output is weighted by a feathered
mask, a linear ramp over `overlap` from each tile edge (never 0, so a pixel only one tile covers keeps its value),
and the sum is divided by the summed weights: across an overlap the output fades linearly from one tile to the next,
so no seam shows (tests/engine/test_vae_tiles.py checks the seams against the whole decode and encode).

What differs from the whole VAE, as in A1111's and ComfyUI's tiled VAE, which accept it: each tile's GroupNorm
statistics and middle-block attention are over the tile, not the whole image, and a tile's convolutions see zero
padding at its edges (the overlap and the feathering hide those edges). The tiny model's figures, tiled against
whole, are in the test's docstring.

Tile placement is static (from the image size, tile and overlap): the first tile at 0, the last ending at the edge,
the rest evenly between, so every overlap is at least `overlap` latents.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .modules import Modules
from .vae import decode, encode_local, to_uint8

#: The latent tile's side (64 latents = 512 px: SDXL's VAE at 512² needs ~0.5 GiB of temporaries on v5e, and its
#: middle-block attention sees a 4096-latent context, what SD 1.5's VAE was trained at) and the overlap between tiles
#: (16 latents = 128 px: wider than a 3x3 convolution stack's edge effects reach in practice, and a 512 px tile at
#: stride 48 latents covers 2048² in 5 × 5 tiles).
TILE = 64
OVERLAP = 16


def tile_starts(length: int, tile: int, overlap: int) -> tuple[int, ...]:
    """Where the tiles along a side of `length` latents start: the first at 0, the last at length - tile, evenly
    between, with at least `overlap` latents shared by neighbours. One tile (at 0) when the side fits in one."""
    if length <= tile:
        return (0,)
    count = math.ceil((length - overlap) / (tile - overlap))
    return tuple(round(i * (length - tile) / (count - 1)) for i in range(count))


def feather(tile: int, overlap: int) -> np.ndarray:
    """A tile's weight along one side [tile]: a linear ramp up over `overlap` from each edge, 1 in the middle; the
    edge sample weighs 0.5 / overlap, not 0 (a pixel that one tile covers keeps its value after normalizing)."""
    position = np.arange(tile, dtype=np.float32) + 0.5
    return np.minimum(1.0, np.minimum(position, tile - position) / max(overlap, 1)).astype(np.float32)


def _tiles(height: int, width: int, tile: tuple[int, int], overlap: int) -> np.ndarray:
    """Every tile's (top, left) in latents [n, 2], rows first, for latents of height × width."""
    tops, lefts = tile_starts(height, tile[0], overlap), tile_starts(width, tile[1], overlap)
    return np.array([(top, left) for top in tops for left in lefts], dtype=np.int32)


def _blend(run_tile, source, out_shape, scale: int, tile: tuple[int, int], overlap: int, source_scale: int):
    """Run `run_tile` on each tile of `source` (NHWC, `source_scale` samples per latent) and blend the outputs
    (NHWC, `scale` samples per latent) with the feathered weights into float32 `out_shape`."""
    tile_h, tile_w = tile
    starts = jnp.asarray(_tiles(out_shape[1] // scale, out_shape[2] // scale, tile, overlap))
    weight = np.outer(feather(tile_h * scale, overlap * scale), feather(tile_w * scale, overlap * scale))
    weight = jnp.asarray(weight)[None, :, :, None]  # [1, th, tw, 1]
    batch, channels = source.shape[0], source.shape[-1]
    window = (batch, tile_h * source_scale, tile_w * source_scale, channels)

    def body(i, carry):
        total, weights = carry
        top, left = starts[i, 0], starts[i, 1]
        piece = jax.lax.dynamic_slice(source, (0, top * source_scale, left * source_scale, 0), window)
        out = run_tile(piece).astype(jnp.float32) * weight
        at = (0, top * scale, left * scale, 0)
        total = jax.lax.dynamic_update_slice(total, jax.lax.dynamic_slice(total, at, out.shape) + out, at)
        summed = jax.lax.dynamic_slice(weights, at, weight.shape) + weight
        return total, jax.lax.dynamic_update_slice(weights, summed, at)

    zeros = (jnp.zeros(out_shape, jnp.float32), jnp.zeros((1, *out_shape[1:3], 1), jnp.float32))
    total, weights = jax.lax.fori_loop(0, starts.shape[0], body, zeros)
    return total / weights


def tile_shape(height: int, width: int, tile: int) -> tuple[int, int]:
    """The tile in latents for latents of height × width: `tile` per side, or the side when it is shorter."""
    return min(tile, height), min(tile, width)


def decode_tiled(modules: Modules, params, latents, tile: int | None = None, overlap: int | None = None):
    """VAE decode in feathered tiles: float32 [b, 4, h, w] -> float32 [b, 8h, 8w, 3] in [0, 1] (as vae.decode)."""
    tile, overlap = tile or TILE, OVERLAP if overlap is None else overlap
    batch, _, height, width = latents.shape
    scale = modules.vae_scale_factor
    shape = tile_shape(height, width, tile)
    nhwc = latents.transpose(0, 2, 3, 1)

    def run_tile(piece):  # [b, th, tw, 4] -> [b, 8th, 8tw, 3]
        return decode(modules, params, piece.transpose(0, 3, 1, 2))

    return _blend(run_tile, nhwc, (batch, height * scale, width * scale, 3), scale, shape, overlap, 1)


def decode_tiled_local(modules: Modules, params, latents, tile: int | None = None, overlap: int | None = None):
    """vae.decode_local in tiles: float32 [b, 4, h, w] -> uint8 [b, H, W, 3]. Tile and overlap in latents, TILE
    and OVERLAP unless given (read when traced)."""
    return to_uint8(decode_tiled(modules, params, latents, tile, overlap))


def encode_tiled_local(modules: Modules, params, pixels, keep, tile: int | None = None, overlap: int | None = None):
    """vae.encode_local in feathered tiles of `tile` latents (8 × tile pixels): uint8 [b, H, W, 3], keep bool
    [b, H, W] -> float32 [b, 4, H/8, W/8]. Each tile greys its masked-out pixels, as the whole encode does."""
    tile, overlap = tile or TILE, OVERLAP if overlap is None else overlap
    batch, height, width, _ = pixels.shape
    scale = modules.vae_scale_factor
    latent_h, latent_w = height // scale, width // scale
    shape = tile_shape(latent_h, latent_w, tile)

    def run_tile(piece):  # uint8 [b, 8th, 8tw, 4] (3 levels + keep) -> latents NHWC [b, th, tw, 4]
        levels, kept = piece[..., :3], piece[..., 3] > 0
        return encode_local(modules, params, levels, kept).transpose(0, 2, 3, 1)

    packed = jnp.concatenate([pixels, keep[..., None].astype(jnp.uint8)], axis=-1)  # one array to slice per tile
    latents = _blend(run_tile, packed, (batch, latent_h, latent_w, 4), 1, shape, overlap, scale)
    return latents.transpose(0, 3, 1, 2)
