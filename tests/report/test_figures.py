"""topometrics.report.figures: the long frames of the DVC plots, and a figure without data is Missing with why."""

import pandas as pd

from topometrics.report.figures import dvc_plots, figures
from topometrics.report.frames import Missing


def test_dvc_plots_are_the_ladders_mean_over_seeds_per_step_and_rung_in_rung_order():
    checkpoints = pd.DataFrame(
        {"step": [0, 0, 10, 0, 10, 0], "rung": ["small", "small", "small", "tiny", "tiny", "pythia"],
         "seed": [1, 2, 1, 1, 1, 0], "val_loss": [4.0, 5.0, 3.0, 6.0, 5.5, 9.0],
         "kind": ["ladder"] * 5 + ["series"]}
    )  # fmt: skip
    plots = dvc_plots(checkpoints, Missing("no np view"))
    assert plots["loss"].to_dict("records") == [
        {"step": 0, "rung": "tiny", "val_loss": 6.0},
        {"step": 10, "rung": "tiny", "val_loss": 5.5},
        {"step": 0, "rung": "small", "val_loss": 4.5},  # the mean of the two seeds
        {"step": 10, "rung": "small", "val_loss": 3.0},
    ]  # the series' row is not a ladder run
    assert plots["np"].empty and list(plots["np"].columns) == ["step", "rung", "np"]
    assert list(dvc_plots(checkpoints.iloc[:0], None)["loss"].columns) == ["step", "rung", "val_loss"]


def test_a_figure_without_data_is_missing_saying_what_it_lacks_and_a_missing_frame_keeps_its_reason():
    loaded = {
        "checkpoints": pd.DataFrame(columns=["rung", "seed", "step", "val_loss", "kind"]),
        "np": Missing("`np_series` is empty"),
        "features": Missing("the features stage has not run"),
        "rho": Missing("the analysis stage has not run"),
        "mae": Missing("the analysis stage has not run"),
        "scaling": Missing("no scaling view"),
        "scaling_fits": Missing("no scaling view"),
    }
    out = figures(loaded)
    assert set(out) == {
        "loss_curves", "np_evolution", "vr_evolution", "tp0_vs_loss", "correlation_heatmap",
        "prediction_comparison", "scaling", "betti_curves", "wasserstein_to_previous", "validation_series",
    }  # fmt: skip
    assert all(isinstance(figure, Missing) for figure in out.values())
    assert out["loss_curves"].reason == "no checkpoints"  # an empty frame: the figure says what it lacks
    assert out["np_evolution"].reason == "`np_series` is empty"  # a Missing frame: its own reason
    assert out["betti_curves"].reason == "the features stage has not run"
    assert out["correlation_heatmap"].reason == out["prediction_comparison"].reason == "the analysis stage has not run"
