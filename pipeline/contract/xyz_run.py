"""An X/Y/Z plot run on an engine: its cells as the ordinary requests they are, then its grids.

    outcome = run_plot(engine, plot, cells, on_progress=..., should_stop=...)
    outcome.grids        # one labelled grid per Z value, its `parameters` the first cell's plus the plot's axes
    outcome.results      # each cell's EngineResult (None: a cell a Stop left undone)

The cells go to `engine.generate` a few at a time (the engine's `concurrency`, the requests its page runs at once), so
an engine that merges requests (`--merge-requests`, host/merging.py) runs the cells whose programs agree (size, UNet
calls, text windows, LoRAs, ...) in one call, as it does any requests that wait together, and an engine alone runs
them one after another; either way nothing is compiled for a plot, and a cell's pixels are those of the request it
is (with merging, those of a request in a call of that size: host/merging.py). Stop ends the running cells at their
next step and starts no other; the cells that finished stay, and the grids show them with the rest left white.
Any engine of the `Engine` protocol runs a plot (this process's, a cluster's leader, engine services).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from PIL import Image

from .engine import REQUESTS_AT_ONCE, Engine, EngineResult
from .image_files import PARAMETERS_KEY
from .parameters import _setting
from .stopping import Stopped
from .xyz_grid import draw_grid
from .xyz_plot import Cell, Plot

#: `on_progress(steps done, steps in all, cells finished, cells)`: the plot's progress, as its cells' steps finish.
PlotProgress = Callable[[int, int, int, int], None]


@dataclass(frozen=True)
class PlotOutcome:
    """What a plot made: each cell's result (None where a Stop left it undone), how it stopped, its grids."""

    plot: Plot
    cells: tuple[Cell, ...]
    results: tuple[EngineResult | None, ...]
    stopped: Stopped | None  # the first cell that stopped (None: every cell finished)

    @property
    def finished(self) -> int:
        return sum(result is not None for result in self.results)

    @property
    def cell_images(self) -> list[Image.Image]:
        """Each finished cell's first image (the one its grid shows), with its own `parameters`, in cell order."""
        return [result.images[0] for result in self.results if result is not None and result.images]

    @property
    def grids(self) -> list[Image.Image]:
        """One grid per Z value (`xyz_grid.draw_grid`), titled with it when there is a Z axis; its `parameters` are
        its first finished cell's with the plot's axes added, as A1111 writes a grid's."""
        plot, cells = self.plot, self.cells
        columns, rows = len(plot.x.values), len(plot.y.values)
        per_grid = columns * rows
        x_labels = [cell.labels[0] for cell in cells[:columns]]  # the cells' own: a Seed of -1 drawn
        y_labels = [cells[row * columns].labels[1] for row in range(rows)]
        grids = []
        for iz in range(len(plot.z.values)):
            results = self.results[iz * per_grid : (iz + 1) * per_grid]
            firsts = [result.images[0] if result is not None and result.images else None for result in results]
            grid = draw_grid(firsts, columns, rows, x_labels, y_labels, title=cells[iz * per_grid].labels[2])
            texts = [result.parameters[0] for result in results if result is not None and result.parameters]
            if texts:
                grid.info[PARAMETERS_KEY] = grid_parameters(texts[0], plot)
            grids.append(grid)
        return grids


def grid_parameters(first: str, plot: Plot) -> str:
    """A grid's `parameters`: its first cell's, with "Script: X/Y/Z plot, X Type: ..., X Values: ..." added to the
    settings line (A1111's extra_generation_params), so PNG Info reads the first cell's settings from it."""
    added = ", ".join(f"{key}: {_setting(value)}" for key, value in plot.settings().items())
    return f"{first}, {added}"


def run_plot(
    engine: Engine,
    plot: Plot,
    cells: Sequence[Cell],
    *,
    on_progress: PlotProgress | None = None,
    should_stop: Callable[[], bool] | None = None,
    at_once: int | None = None,
) -> PlotOutcome:
    """Run every cell of `plot` on `engine` (`at_once` at a time: by default the engine's `concurrency`), reporting
    the steps of all its cells, asking `should_stop` before each step of each and before starting each. A cell that
    fails ends the plot with its error once the running cells have stopped."""
    progress = _Progress(cells, on_progress)
    halted = threading.Event()
    stopped: list[Stopped] = []
    failed: list[BaseException] = []

    def stop_now() -> bool:
        return halted.is_set() or (should_stop is not None and bool(should_stop()))

    def run(index: int) -> EngineResult | None:
        if stop_now():
            halted.set()
            return None
        try:
            result = engine.generate(cells[index].request, progress.listener(index), should_stop=stop_now)
        except Stopped as exc:
            stopped.append(exc)
            halted.set()
            return None
        except BaseException as exc:  # the plot's error, once the others have stopped
            failed.append(exc)
            halted.set()
            return None
        progress.finish(index)
        return result

    workers = max(1, at_once or int(getattr(engine, "concurrency", REQUESTS_AT_ONCE)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="xyz-cell") as pool:
        results = tuple(pool.map(run, range(len(cells))))
    if failed:
        raise failed[0]
    first_stop = stopped[0] if stopped else (Stopped(0, 0) if halted.is_set() else None)
    return PlotOutcome(plot, tuple(cells), results, first_stop)


class _Progress:
    """The plot's steps: each cell's total (its request's steps until its run says), summed, and those done."""

    def __init__(self, cells: Sequence[Cell], listener: PlotProgress | None):
        self._listener = listener
        self._totals = [cell.request.steps + cell.request.hires_steps_run() for cell in cells]
        self._done = [0] * len(cells)
        self._finished = 0
        self._lock = threading.Lock()

    def listener(self, index: int) -> Callable[[int, int], None] | None:
        if self._listener is None:
            return None

        def on_step(done: int, total: int) -> None:
            with self._lock:
                self._done[index], self._totals[index] = done, total
                self._report()

        return on_step

    def finish(self, index: int) -> None:
        with self._lock:
            self._done[index] = self._totals[index]
            self._finished += 1
            self._report()

    def _report(self) -> None:
        if self._listener is not None:
            self._listener(sum(self._done), sum(self._totals), self._finished, len(self._totals))
