"""Chart functions: each spec's encodings (fields, types, rung colours) and its inlined data."""

import pandas as pd
import pytest

from topometrics.report import charts

RUNGS = ["xl", "tiny", "small"]


def _runs(**columns) -> pd.DataFrame:
    """Two checkpoints per rung of RUNGS, seed 42, plus the given columns."""
    frame = pd.DataFrame({"rung": [r for r in RUNGS for _ in (0, 1)], "seed": 42, "step": [0, 100] * len(RUNGS)})
    return frame.assign(**columns)


def _encoding(spec: dict) -> dict:
    """The encoding of a plain, faceted (spec.encoding) or layered chart (its first layer)."""
    inner = spec.get("spec", spec)
    return inner["layer"][0]["encoding"] if "layer" in inner else inner["encoding"]


def _fields(spec: dict) -> dict[str, tuple[str, str]]:
    return {ch: (e.get("field"), e.get("type")) for ch, e in _encoding(spec).items() if isinstance(e, dict)}


def _assert_rung_colour(spec: dict) -> None:
    color = _encoding(spec)["color"]
    assert (color["field"], color["type"]) == ("rung", "nominal")
    domain = color["scale"]["domain"]
    assert domain == [r for r in charts.RUNG_ORDER if r in domain] + sorted(set(domain) - set(charts.RUNG_ORDER))
    assert color["scale"]["range"] == [charts.rung_hue(r) for r in domain]


# --- rung colours ----------------------------------------------------------------------------------


def test_rung_domain_is_the_ladder_rungs_present_then_other_rungs_sorted():
    rungs = ["zeta/series", "small", "EleutherAI/pythia-14m", "tiny", "small"]
    assert charts.rung_domain(rungs) == ["tiny", "small", "EleutherAI/pythia-14m", "zeta/series"]


def test_a_rung_keeps_its_colour_whichever_rungs_a_chart_has():
    one = charts.rung_color(["xl"]).to_dict()["scale"]
    three = charts.rung_color(["tiny", "xl", "EleutherAI/pythia-14m"]).to_dict()["scale"]
    assert one["range"][one["domain"].index("xl")] == three["range"][three["domain"].index("xl")]
    assert len(three["range"]) == len(three["domain"]) == 3  # the legend lists the rungs present, no more
    again = charts.rung_color(["EleutherAI/pythia-14m", "zeta/series"]).to_dict()["scale"]
    assert again["range"][0] == three["range"][2]  # an external series keeps its hue too


# --- one test per chart ----------------------------------------------------------------------------


def test_loss_curves():
    frame = _runs(val_loss=[4.8, 2.5, 4.8, 1.4, 4.8, 2.1])
    spec = charts.loss_curves(frame).to_dict()
    assert spec["mark"]["type"] == "line"
    assert _fields(spec)["x"] == ("step", "quantitative") and _fields(spec)["y"] == ("val_loss", "quantitative")
    assert _fields(spec)["detail"] == ("seed", "nominal")
    _assert_rung_colour(spec)
    assert spec["data"]["values"][2] == {"rung": "tiny", "seed": 42, "step": 0, "val_loss": 4.8}


def test_np_evolution():
    spec = charts.np_evolution(_runs(np=[0.3, 0.4] * 3)).to_dict()
    assert _fields(spec)["y"] == ("np", "quantitative")
    _assert_rung_colour(spec)
    assert [row["np"] for row in spec["data"]["values"]] == [0.3, 0.4] * 3


def test_vr_evolution_has_one_panel_per_homology_dimension():
    frame = pd.concat([_runs(feature=f, value=[1.0, 2.0] * 3) for f in ("vr_tp0", "vr_tp1")])
    spec = charts.vr_evolution(frame).to_dict()
    assert spec["facet"]["column"]["field"] == "feature"
    assert spec["resolve"]["scale"]["y"] == "independent"
    assert _fields(spec)["y"] == ("value", "quantitative")
    _assert_rung_colour(spec)
    assert {row["feature"] for row in spec["data"]["values"]} == {"vr_tp0", "vr_tp1"}


def test_tp0_vs_loss_is_a_scatter_coloured_by_rung():
    spec = charts.tp0_vs_loss(_runs(vr_tp0=[1.0, 5.0] * 3, val_loss=[4.0, 2.0] * 3)).to_dict()
    assert spec["mark"]["type"] == "circle"
    assert _fields(spec)["x"] == ("vr_tp0", "quantitative") and _fields(spec)["y"] == ("val_loss", "quantitative")
    _assert_rung_colour(spec)
    assert len(spec["data"]["values"]) == 6


def test_correlation_heatmap_orders_rungs_fixes_the_colour_domain_and_labels_each_family_panel():
    rho = pd.DataFrame(
        {"rung": ["xl", "tiny", "xl", "tiny", "xl"], "feature": ["np_norm", "np_norm", "vr_tp0", "vr_tp0", "zz"],
         "rho": [-1, 0.5, 0.2, 1, 0.0]}
    )  # fmt: skip
    spec = charts.correlation_heatmap(rho).to_dict()
    panels = {panel["title"]: panel for panel in spec["vconcat"]}
    assert list(panels) == ["np", "other", "vr"]  # one panel per family, 'other' for an undeclared name
    for panel in panels.values():
        assert panel["mark"]["type"] == "rect" and panel["encoding"]["x"]["sort"] == ["tiny", "xl"]
        assert panel["encoding"]["x"]["axis"]["orient"] == "top"  # each panel's rung labels at its top
        assert panel["encoding"]["color"]["field"] == "rho"
        assert panel["encoding"]["color"]["scale"]["domain"] == [-1, 1] and panel["width"] == 80
    rows = {p: [r["feature"] for r in panels[p]["data"]["values"]] for p in panels}
    assert rows == {"np": ["np_norm", "np_norm"], "other": ["zz"], "vr": ["vr_tp0", "vr_tp0"]}
    assert panels["np"]["height"] == 12


def test_prediction_comparison_groups_methods_within_fraction():
    mae = pd.DataFrame({"method": ["loss_power_law", "loss_topology"] * 2, "fraction": [0.3, 0.3, 0.5, 0.5]})
    spec = charts.prediction_comparison(mae.assign(mae=[0.1, 0.09, 0.08, 0.06])).to_dict()
    assert spec["mark"]["type"] == "bar"
    assert _fields(spec)["x"] == ("fraction", "ordinal")
    assert _fields(spec)["xOffset"] == ("method", "nominal") and _fields(spec)["color"] == ("method", "nominal")
    assert _fields(spec)["y"] == ("mae", "quantitative")


def test_scaling_uses_log_log_axes_and_draws_the_fit():
    points = pd.DataFrame({"rung": ["tiny", "xl"], "n_params": [2936, 97200], "feature": "vr_tp0", "value": [5, 9]})
    fit = pd.DataFrame({"feature": "vr_tp0", "n_params": [2936, 97200], "value": [5.1, 8.9]})
    spec = charts.scaling(points, fit).to_dict()
    layers = spec["spec"]["layer"]
    assert [layer["mark"]["type"] for layer in layers] == ["line", "circle"]
    for layer in layers:
        assert layer["encoding"]["x"]["scale"]["type"] == "log" and layer["encoding"]["y"]["scale"]["type"] == "log"
    assert layers[1]["encoding"]["color"]["field"] == "rung"
    assert spec["facet"]["field"] == "feature" and spec["columns"] == 3
    assert sorted(row["layer"] for row in spec["data"]["values"]) == ["fit", "fit", "points", "points"]


def test_scaling_without_a_fit_has_points_only():
    points = pd.DataFrame({"rung": ["tiny"], "n_params": [2936], "feature": "val_loss", "value": [2.4]})
    spec = charts.scaling(points).to_dict()
    assert [layer["mark"]["type"] for layer in spec["spec"]["layer"]] == ["circle"]


def test_betti_curves_dash_the_first_checkpoint_and_facet_by_dimension():
    curves = pd.DataFrame(
        {"rung": "small", "checkpoint": ["first", "final"] * 2, "dim": ["H0", "H0", "H1", "H1"], "scale": [0, 0, 0, 0]}
    )
    spec = charts.betti_curves(curves.assign(betti=[5, 3, 1, 0])).to_dict()
    assert spec["facet"]["column"]["field"] == "dim"
    assert _fields(spec)["strokeDash"] == ("checkpoint", "nominal")
    assert _fields(spec)["y"] == ("betti", "quantitative")
    _assert_rung_colour(spec)


def test_wasserstein_to_previous():
    spec = charts.wasserstein_to_previous(_runs(value=[None, 0.5] * 3)).to_dict()
    assert _fields(spec)["y"] == ("value", "quantitative")
    _assert_rung_colour(spec)
    assert spec["data"]["values"][0]["value"] is None  # NaN travels as JSON null, never as NaN


def test_validation_series_puts_ours_beside_the_paper():
    series = pd.DataFrame(
        {"step": [0, 1000, 0, 1000], "quantity": "NP mean", "value": [0.3, 0.4, 0.338, 0.377]}
        | {"source": ["ours", "ours", "paper", "paper"]}
    )
    spec = charts.validation_series(series).to_dict()
    assert spec["facet"]["column"]["field"] == "quantity"
    assert _encoding(spec)["color"]["field"] == "source"
    assert [r["source"] for r in spec["data"]["values"]] == ["ours", "ours", "paper", "paper"]


# --- inputs ----------------------------------------------------------------------------------------


def test_a_missing_column_names_the_chart_and_the_column():
    with pytest.raises(ValueError, match=r"loss_curves needs columns .* lacks \['val_loss'\]"):
        charts.loss_curves(pd.DataFrame({"rung": ["tiny"], "seed": [1], "step": [0]}))


def test_an_empty_frame_is_refused():
    with pytest.raises(ValueError, match="np_evolution got an empty frame"):
        charts.np_evolution(pd.DataFrame(columns=["rung", "seed", "step", "np"]))
