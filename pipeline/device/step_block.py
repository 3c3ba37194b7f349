"""Several plan rows of one step kind in one program call: the step's body in a loop on the devices.

Why: calling a step program costs more than its kernels. Each call hands the UNet's ~650 weight arrays to every
device: on 8 CPU devices at 128², 4 steps cost 371 CPU ms as four calls and 349 as one call looping over them, the
same pixels (bench/HISTORY.md). diffusers' pipeline, one program for its whole loop, pays that once per image.
So a step program takes up to `rows` consecutive rows (`EngineConfig.steps_per_call`): their per-row arguments
stacked, the first row's index and `count`, how many to run (traced: one program runs any count from 1 to `rows`,
so no request compiles). The host (`host/loop.py`) reports progress and checks Stop between calls, so a request
somebody follows step by step runs one row per call; one nobody watches, as many as fit.

    block = over_rows(step_local_with_settings, rows=4, per_row={8: 1, 11: 1})
    latents, history = block(weights, latents, history, ..., rows_coefficients, first_index, image, blend, count)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: Where a step's arguments sit (`programs.STEP_SPECS`): the latents and the history it carries from row to row,
#: and the row's index (each row adds its place in the block to the first row's).
LATENTS, HISTORY, INDEX = 1, 2, 9
#: The per-row arguments every step kind has, and the axis their rows are stacked on: the plan rows [b, R, 13] and
#: the blend sigmas [b, R].
ROW_ARGUMENTS = {8: 1, 11: 1}


def over_rows(step, rows: int, per_row: dict[int, int]):
    """`step` (one row: (weights, latents, history, ...) -> (latents', history', *kept)) over `count` consecutive
    rows, its last argument (int32 [], 1 to `rows`): each row reads its slice of the `per_row` arguments (position ->
    the axis of length `rows` they are stacked on) and the latents and history the row before made. Returns the
    last row's results (what it keeps, e.g. DeepCache's feature, too)."""

    def row_arguments(args, i):
        picked = [
            jax.lax.dynamic_index_in_dim(arg, i, axis=per_row[at], keepdims=False) if at in per_row else arg
            for at, arg in enumerate(args)
        ]
        picked[INDEX] = args[INDEX] + i
        return picked

    def block(*args):
        *args, count = args
        if rows == 1:  # no loop: the program is the step's own
            return step(*row_arguments(args, 0))
        one = jax.jit(step)  # traced once: the shapes below and the loop's body share its trace
        first = row_arguments(args, 0)
        kept = [jnp.zeros(shape.shape, shape.dtype) for shape in jax.eval_shape(one, *first)[2:]]

        def body(i, carry):
            arguments = row_arguments(args, i)
            arguments[LATENTS], arguments[HISTORY] = carry[0], carry[1]
            return tuple(one(*arguments))

        return jax.lax.fori_loop(0, count, body, (args[LATENTS], args[HISTORY], *kept))

    return block
