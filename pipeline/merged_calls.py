"""A merged call's parts made of planned requests (`--merge-requests`): each request's ticket for the merger
(`host/merging.py`: the queue and its one worker), and the one run a call's tickets make together.

    ticket = ticket_of(run, on_step, should_stop, on_preview)      # Generator.generate: a mergeable request
    merged, rows = merged_run([ticket.extra for ticket in padded], block)   # Generator.run_group: one call

The requests of a call agree on their `RunPlan.merge_key` (size, UNet calls, speed plan, text windows, clip skip,
embeddings, LoRAs, picture or not), so the first one's plan runs for all of them, each block of images on its own
sampler's rows and with its own host rows. Host data only: nothing here runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .host.merging import Ticket
from .host.planning.run_plan import RunPlan
from .host.planning.sampler_plan import stacked


def ticket_of(run: RunPlan, on_step=None, should_stop=None, on_preview=None) -> Ticket:
    """A mergeable request's ticket for the merger: its rows (one per device: seeds seed, seed + 1, ...), key and
    listeners, and its plan (what `merged_run` reads of it)."""
    return Ticket(
        run.merge_key,
        run.conditioning.rows,
        len(run.first.speed.schedule),
        run.request,
        on_step,
        should_stop,
        on_preview,
        extra=run,
    )


def merged_run(runs: list[RunPlan], block: int) -> tuple[RunPlan, tuple[np.ndarray, ...]]:
    """The run of one merged call of `runs` (one per block of `block` images, in the call's order): the first's,
    with each block's own sampler rows (`stacked`), and the call's host rows, each block's own, [B, ...] each."""
    first = runs[0]  # what the key makes the same for every ticket: size, speed, K, embeddings, clip skip
    rows = tuple(np.concatenate(parts) for parts in zip(*(run.conditioning.rows for run in runs), strict=True))
    plan = stacked([run.first.plan for run in runs], block)  # each block its own sampler's rows
    return dataclasses.replace(first, first=dataclasses.replace(first.first, plan=plan)), rows
