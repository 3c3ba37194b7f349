"""The X/Y/Z plot (pipeline/contract/xyz_plot.py, xyz_run.py, xyz_grid.py): A1111's axes, ranges and script_args read
without JAX; then on `batched_engine` (2 devices × 2 images) each cell equals the single request with its values, bit
for bit, nothing compiles, and Stop keeps the cells that finished."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import generate

from pipeline.contract.errors import InvalidInput
from pipeline.contract.image_files import PARAMETERS_KEY
from pipeline.contract.parameters import parse_infotext
from pipeline.contract.request import RequestRules, parse_request
from pipeline.contract.xyz_plot import A1111_AXES, OWN_AXES, Plot, axis_named
from pipeline.contract.xyz_run import run_plot

RULES = RequestRules(sizes=((64, 64),), loras=("style",))


def _parse(given):
    return parse_request(**given, rules=RULES)


# ---- reading a plot, no JAX ------------------------------------------------------------------------------------------


def test_a1111_ranges_and_value_lists():
    plot = Plot.of("Steps: 1-5 (+2)", "CFG Scale: 1-3 [3], 7.5", 'Prompt S/R: "cat, tabby", dog')
    assert plot.x.values == (1, 3, 5) and plot.y.values == (1.0, 2.0, 3.0, 7.5)
    assert plot.z.values == ("cat, tabby", "dog") and plot.size == 24
    assert Plot.of("Seed: 10-12").x.values == (10, 11, 12)
    assert Plot.of("CFG Scale: 0.5-1.5 (+0.5)").x.values == (0.5, 1.0, 1.5)
    assert Plot.of("Steps: 2-8 [4]").x.values == (2, 4, 6, 8)
    assert plot.x.labels == ("Steps: 1", "Steps: 3", "Steps: 5") and plot.z.labels == ("cat, tabby", "dog")


def test_axes_by_a1111_label_and_by_index_in_its_list():
    assert len(A1111_AXES) == 43 and A1111_AXES[7] == "Prompt S/R" and A1111_AXES[39] == "Refiner switch at"
    for index, label in [(1, "Seed"), (4, "Steps"), (6, "CFG Scale"), (9, "Sampler"), (11, "Checkpoint name")]:
        assert axis_named(index).label == label == axis_named(label.lower()).label
    assert [axis_named(len(A1111_AXES) + i).label for i in range(3)] == list(OWN_AXES)
    assert axis_named("Schedule type").label == A1111_AXES[17] and axis_named(26).label == "Denoising"
    # A1111 1.10's script_args: types by index or label, a choice axis's values from its dropdown
    plot = Plot.of_script_args([4, "2,3", [], "CFG Scale", "3, 5", [], 9, "", ["Euler", "Euler a"], True, False])
    assert (plot.x.values, plot.y.values, plot.z.values) == ((2, 3), (3.0, 5.0), ("Euler", "Euler a"))
    assert plot.settings() == {
        "Script": "X/Y/Z plot",
        **{"X Type": "Steps", "X Values": "2,3", "Y Type": "CFG Scale", "Y Values": "3, 5"},
        **{"Z Type": "Sampler", "Z Values": "Euler,Euler a"},
    }


@pytest.mark.parametrize(
    ("axes", "sentence"),
    [
        (("Steps: 1-300",), "would have at least 300 cells; this server makes at most 64 (--xyz-max-cells)."),
        (
            ("Steps: 1-20", "Seed: 1-15"),
            "The X/Y/Z plot has 300 cells; this server makes at most 64 (--xyz-max-cells).",
        ),
        (("Eta: 0, 1",), "The X/Y/Z plot axis 'Eta' is not offered here; the axes: Seed, Steps"),
        (("Colour: red",), "Unknown X/Y/Z plot axis 'Colour'"),
        (("Steps 4,6",), "The plot's X axis is 'LABEL: values' (as 'Steps: 4,6'); got 'Steps 4,6'."),
        (("Steps: four",), "Steps takes numbers; got 'four'."),
        (("Steps: 5-1 (+1)",), "The range '5-1 (+1)' of Steps gives no values."),
        ((None, None, None), "The X/Y/Z plot needs at least one axis"),
    ],
)
def test_a_bad_plot_is_one_sentence_before_anything_runs(axes, sentence):
    with pytest.raises(InvalidInput, match=None) as refused:
        Plot.of(*axes)
    assert sentence in str(refused.value) and str(refused.value).count(". ") == 0


def test_each_cell_is_the_request_with_its_values_and_a_refused_cell_names_itself():
    given = {"prompt": "a dog <lora:style:0.8>", "negative_prompt": "dog hair", "seed": 5}
    cells = Plot.of("Prompt S/R: dog, cat", "LoRA weight: 0.5, 1").cells(given, _parse, model="tiny")
    assert [(cell.position, cell.where) for cell in cells] == [
        ((0, 0, 0), "dog, LoRA weight: 0.5"),
        ((1, 0, 0), "cat, LoRA weight: 0.5"),
        ((0, 1, 0), "dog, LoRA weight: 1"),
        ((1, 1, 0), "cat, LoRA weight: 1"),
    ]
    assert cells[1].request.prompt == "a cat <lora:style:0.5>" and cells[1].request.negative_prompt == "cat hair"
    assert cells[3].request.loras == (("style", 1.0, 1.0),) and {cell.request.seed for cell in cells} == {5}
    drawn = Plot.of("Steps: 2,3").cells({"prompt": "x", "randomize_seed": True}, _parse)
    assert drawn[0].request.seed == drawn[1].request.seed  # one random seed for the whole plot, as A1111 fixes it
    for axis, sentence in [
        ("Steps: 2, 200", "The plot's cell Steps: 200 is refused: Steps must be a whole number from 1 to 100"),
        ("Checkpoint name: tiny, sdxl", "The plot's cell sdxl is refused: Checkpoint 'sdxl' is not loaded"),
        ("Hires upscale: 2", "This server has no hires fix (start it with --hires-scales)"),
    ]:
        with pytest.raises(InvalidInput, match=None) as refused:
            Plot.of(axis).cells({"prompt": "x"}, _parse, model="tiny")
        assert sentence in str(refused.value)


# ---- on the engine ---------------------------------------------------------------------------------------------------


def _pixels(result) -> np.ndarray:
    return np.stack([np.asarray(image) for image in result.images])


def test_every_cell_equals_its_single_request_bit_for_bit_and_nothing_compiles(batched_engine):
    engine = batched_engine
    plot = Plot.of("Steps: 2,3", "CFG Scale: 1, 6")
    cells = plot.cells({"prompt": "a lighthouse at dusk", "seed": 11}, lambda given: engine.request(**given))
    compiles, reports = engine.compile_count, []
    outcome = run_plot(engine, plot, cells, on_progress=lambda *report: reports.append(report))
    assert engine.compile_count == compiles and outcome.stopped is None and outcome.finished == 4
    assert reports[-1] == (2 * (2 + 3), 2 * (2 + 3), 4, 4)  # every step of every cell
    for cell, result in zip(cells, outcome.results, strict=True):
        steps, guidance = (2, 3)[cell.position[0]], (1.0, 6.0)[cell.position[1]]
        alone = generate(engine, "a lighthouse at dusk", seed=11, steps=steps, guidance_scale=guidance)
        np.testing.assert_array_equal(_pixels(result), _pixels(alone))
    (grid,) = outcome.grids
    assert grid.width > 2 * 64 and grid.height > 2 * 64  # the cells and their labels' margins
    np.testing.assert_array_equal(np.asarray(grid)[-64:, -64:], np.asarray(outcome.results[3].images[0]))
    settings = parse_infotext(grid.info[PARAMETERS_KEY]).settings
    assert settings["Steps"] == "2" and settings["Script"] == "X/Y/Z plot" and settings["Y Values"] == "1, 6"


def test_stop_ends_the_plot_and_the_cells_that_finished_stay(batched_engine):
    engine = batched_engine
    plot = Plot.of("Seed: 1-4")
    cells = plot.cells({"prompt": "a bowl of lemons"}, lambda given: engine.request(**given))
    stop = threading.Event()

    def on_progress(done, total, finished, count):
        if finished == 1:
            stop.set()  # once the first cell is in: the running one stops at its next step, no other starts

    outcome = run_plot(engine, plot, cells, on_progress=on_progress, should_stop=stop.is_set, at_once=1)
    assert outcome.stopped is not None and outcome.finished == 1 and outcome.results[1:] == (None, None, None)
    np.testing.assert_array_equal(
        _pixels(outcome.results[0]), _pixels(generate(engine, "a bowl of lemons", seed=1, steps=2))
    )
    (grid,) = outcome.grids
    assert (np.asarray(grid)[-64:, -64:] == 255).all()  # the last cell left white


def test_the_cli_refuses_a_plot_past_its_cells_before_loading_and_names_its_grids(capsys, tmp_path):
    from pipeline.__main__ import _grid_name, main

    argv = ["generate", "--model", "tiny", "--prompt", "a cat", "--out", str(tmp_path / "out")]
    assert main([*argv, "--xyz-x", "Steps: 1-10", "--xyz-y", "Seed: 1-10", "--xyz-max-cells", "99"]) == 2
    assert capsys.readouterr().err == (
        "error: The X/Y/Z plot has 100 cells; this server makes at most 99 (--xyz-max-cells).\n"
    )
    assert main([*argv, "--xyz-x", "Steps: 2, 200"]) == 2
    assert "The plot's cell Steps: 200 is refused" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert [_grid_name(title) for title in ("", "Steps: 4", "DPM++ 2M", "a cat/dog")] == [
        "grid.png",
        "grid-4.png",
        "grid-DPM++_2M.png",
        "grid-a_cat_dog.png",
    ]
