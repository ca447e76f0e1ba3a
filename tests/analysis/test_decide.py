"""topometrics.analysis.decide: the stopping and interval tables the analysis stage writes into the warehouse."""


def test_stopping_decisions_and_interval_coverage_on_the_pipeline_warehouse(con):
    # five rungs of one seed: the sweep can stop a share of its 5 runs, no rung can stop one of its 1
    stop = con.execute("SELECT * FROM stopping_decisions").df()
    sweep = stop[(stop["scope"] == "sweep") & (stop["predictor"] == "current loss") & (stop["status"] == "ok")]
    assert sorted(sweep["fraction"].unique()) == [0.2, 0.3, 0.5]
    assert sorted(sweep["killed"].unique()) == [1, 2, 3]  # floor(0.25, 0.5, 0.75 x 5)
    rung = stop[stop["scope"] == "rung"]
    assert (rung["reason"].str.startswith("no rung has 4 runs (the most: 1)")).all()
    # leave-one-rung-out predictions carry intervals, and the view counts only the finite ones
    coverage = con.execute("SELECT * FROM interval_coverage").df()
    intervals = con.execute("SELECT * FROM prediction_intervals WHERE isfinite(half_width)").df()
    assert len(intervals) == coverage["n"].sum()
    assert set(coverage["nominal"]) <= {0.8, 0.95}
