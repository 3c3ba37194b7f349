"""A run plan's host rows onto the devices: what `host/loop.py` reads, placed over the 1-D `data` mesh.

Per-image arrays are split over the batch, small settings replicated (`device/sharding.py`), on one process or several
(each fills its own devices' shards). The stand-ins a text-to-image step reads for "no picture" and the empty
embedding tables are placed once per size and kept. Everything here runs with the device lock held or at warm-up.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from PIL import Image

from ..contract.hires import LATENT_UPSCALERS, PIXEL_UPSCALERS
from ..device.denoise import LATENT_CHANNELS
from ..device.sharding import batch_sharded, global_batch, replicated, to_host
from .compiling.programs import ProgramKey, ServedPrograms
from .loop import Blank, HiresInputs, PictureInputs, RefinerInputs, RegionInputs, RequestInputs
from .planning.hires_plan import hires_seeds
from .planning.region_plan import RegionPlan
from .planning.run_plan import Conditioning, PictureRows, SecondPass
from .planning.sampler_plan import HISTORY
from .planning.tokens import ExtraRows, extra_capacity
from .upscale_tiles import TiledUpscaler


class Placement:
    """Host arrays -> device arrays on `mesh`, with the stand-ins kept per size and call size."""

    def __init__(self, mesh, text_widths: tuple[int, int]):
        self.batch_sharding = batch_sharded(mesh)
        self.replicated = replicated(mesh)
        self._text_widths = text_widths  # (D1, D2): the text encoders' input widths (embedding tables)
        self._blanks: dict[tuple[int, int, int], Blank] = {}  # per call batch and size: the stand-ins for "no picture"
        self._no_embeddings: dict[int, tuple] = {}  # per K windows: the empty embedding tables, on the devices

    def put(self, array: np.ndarray) -> jax.Array:
        """A small host array on every device (replicated)."""
        return global_batch((np.asarray(array),), self.replicated)[0]

    def split(self, array: np.ndarray) -> jax.Array:
        """A per-image host array [B, ...] on the devices, split over the batch."""
        return global_batch((np.asarray(array),), self.batch_sharding)[0]

    def put_all(self, arrays) -> tuple:
        """Host arrays on every device (replicated)."""
        return global_batch(tuple(np.asarray(a) for a in arrays), self.replicated)

    def request_inputs(self, rows: tuple, conditioning: Conditioning) -> RequestInputs:
        """A call's text rows (`Conditioning.rows`, or several requests' concatenated) on the devices."""
        return RequestInputs(
            *global_batch(rows, self.batch_sharding),
            embedding_tables=self.embedding_tables(conditioning.embeddings, conditioning.windows),
            clip_skip=self.put_all((np.int32(conditioning.clip_skip),))[0],
        )

    def embedding_tables(self, extra: ExtraRows, k: int) -> tuple:
        """The embedding tables [E, D1], [E, D2] on every device: the vectors the texts use, or (none used) the zero
        tables placed once per K."""
        if not extra.size and k in self._no_embeddings:
            return self._no_embeddings[k]
        tables = self.put_all(extra.tables(extra_capacity(k), self._text_widths))
        if not extra.size:
            self._no_embeddings[k] = tables
        return tables

    def pictures(self, pictures: list[PictureRows], block: int) -> PictureInputs:
        """Pictures on the devices, split over the batch: each one's rows repeated for the `block` images of its
        request ([len(pictures) · block, ...] each), the start weights per image."""

        def repeated(parts) -> np.ndarray:  # each picture's row for its block's images; one picture: a view
            blocks = [np.broadcast_to(rows, (block, *rows.shape[1:])) for rows in parts]
            return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)

        arrays = tuple(map(repeated, zip(*(picture.arrays for picture in pictures), strict=True)))
        weights = np.repeat(np.asarray([picture.weight for picture in pictures], np.float32), block)  # [B]
        return PictureInputs(*global_batch(arrays, self.batch_sharding), weight=weights)

    def blank(self, programs: ServedPrograms, height: int, width: int, params) -> Blank:
        """What a step of `programs` reads without a picture, made once per size and call size."""
        if (programs.batch, height, width) not in self._blanks:
            n, scale = programs.batch, programs.modules.vae_scale_factor
            latents = np.zeros((n, LATENT_CHANNELS, height // scale, width // scale), np.float32)
            history = np.zeros((n, HISTORY, *latents.shape[1:]), np.float32)  # [B, 4, 4, h, w]
            zeros, ones, history = global_batch((latents, np.ones_like(latents[:, :1]), history), self.batch_sharding)
            masked = zeros
            if programs.inpainting_unet:  # diffusers' inpainting pipeline with an all-white mask: a grey picture
                pixels, keep = np.zeros((n, height, width, 3), np.uint8), np.zeros((n, height, width), bool)
                grey, keep = global_batch((pixels, keep), self.batch_sharding)
                encode = programs.compile(ProgramKey("encode_image", height, width))
                masked = encode(programs.weights(ProgramKey("encode_image"), params), grey, keep)
            self._blanks[(programs.batch, height, width)] = Blank(
                latents=zeros, repaint=ones, masked=masked, history=history
            )
        return self._blanks[(programs.batch, height, width)]

    def refiner(self, switch_row: int, rows: int, aesthetic: tuple[float, float]) -> RefinerInputs | None:
        """The refiner stage's inputs, when rows from `switch_row` on are the refiner's (None: none are)."""
        if switch_row >= rows:
            return None
        return RefinerInputs(switch_row=switch_row, aesthetic=self.put(np.asarray(aesthetic, np.float32)))

    def regions(self, planned: RegionPlan | None) -> RegionInputs | None:
        """A regional prompt's blend weights on every device (None: no regions)."""
        if planned is None:
            return None
        return RegionInputs(planned.parts, self.put_all(planned.weights))

    def hires(
        self,
        second: SecondPass | None,
        seeds: tuple[int, ...],
        programs: ServedPrograms,
        params,
        aesthetic: tuple[float, float],
        upscalers: dict[str, TiledUpscaler],
    ) -> HiresInputs | None:
        """The second pass's inputs on the devices: its seeds, its size's stand-ins, a pixel upscaler's resize (None
        without a second pass)."""
        if second is None:
            return None
        hires = second.hires
        height, width = hires.size
        keep, seed_array = global_batch(
            (np.ones((len(seeds), height, width), bool), hires_seeds(list(seeds))), self.batch_sharding
        )
        latent = hires.upscaler in LATENT_UPSCALERS
        method, model = PIXEL_UPSCALERS.get(hires.upscaler, "LANCZOS"), upscalers.get(hires.upscaler)
        resize = None if latent else functools.partial(self.resize, size=hires.size, method=method, model=model)
        refiner = None if hires.refiner_row is None else self.refiner(hires.refiner_row, hires.plan.rows, aesthetic)
        return HiresInputs(
            size=hires.size,
            upscaler=hires.upscaler,
            latent=latent,
            plan=hires.plan,
            speed=second.speed,
            seeds=seed_array,
            blank=self.blank(programs, height, width, params),
            keep=keep,
            resize=resize,
            refiner=refiner,
            extras=second.extras,
        )

    def resize(
        self, pixels: jax.Array, *, size: tuple[int, int], method: str, model: TiledUpscaler | None = None
    ) -> jax.Array:
        """A pixel upscaler: the first pass's uint8 [B, h, w, 3] gathered, each image resized with PIL's `method`
        (A1111's Lanczos and Nearest are PIL's), placed back split over the batch: uint8 [B, H, W, 3]. With an
        ESRGAN `model`, each image is the model's (tiled) first, then resized to the hires size unless already
        there (A1111's `upscale` then LANCZOS when the model's scale is not the one asked for)."""
        height, width = size
        resample = getattr(Image.Resampling, method)
        images = [model.upscale(image) for image in to_host(pixels)] if model is not None else list(to_host(pixels))
        resized = np.stack(
            [
                image
                if image.shape[:2] == (height, width)
                else np.asarray(Image.fromarray(image).resize((width, height), resample=resample))
                for image in images
            ]
        )
        return global_batch((resized,), self.batch_sharding)[0]
