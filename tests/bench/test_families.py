"""Each family's cost in its own process, beside the cost model's estimate (bench.families)."""

import json

import pytest

from bench import features as bench_features
from bench.families import with_estimates
from topometrics.execution.cost import BYTES_PER_PARAMETER, FIXED_BYTES, SECONDS_PER_MILLION


def test_each_family_runs_alone_in_its_own_process_and_stands_beside_its_estimate(capsys):
    assert bench_features.main(["--models", "xl", "--families", "np,gradient_topology"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[2] for line in out[:2]] == ["np", "gradient_topology"]
    assert "ETA" in out[0] and out[-2].startswith("families: 2 processes in")
    assert json.loads(out[0][out[0].index("{") :])["family"] == "np"  # each finished row, as it finishes
    table = json.loads(out[-1])["xl"]
    np_row, gt = table["np"], table["gradient_topology"]
    # each process measured its own family only: the other family's values are NaN there
    assert np_row["values"] > 0 and gt["values"] > 0 and np_row["values"] != gt["values"]
    for row in (np_row, gt):
        assert row["cpu_s"] > 0 and row["peak_mb"] >= row["ready_mb"] > 0 and row["n_params"] == 97_200
    assert gt["estimate_s"] == round(SECONDS_PER_MILLION["gradient_topology"] * 97_200 / 1e6, 1)
    assert table["weights"]["members"] == ["np"] and table["weights"]["cpu_s"] == np_row["cpu_s"]


def test_the_weight_families_are_summed_against_their_one_estimate():
    rows = {f: {"cpu_s": s, "peak_mb": m} for f, s, m in [("np", 1.5, 900), ("vr", 2.25, 1200), ("gradient", 4.0, 800)]}
    out = with_estimates(rows, 2_000_000)
    assert out["weights"]["cpu_s"] == 3.75 and out["weights"]["peak_mb"] == 1200
    assert out["weights"]["members"] == ["np", "vr"]
    assert out["weights"]["estimate_s"] == round(SECONDS_PER_MILLION["weights"] * 2, 1)
    assert out["weights"]["s_per_million"] == 1.875 and out["gradient"]["s_per_million"] == 2.0
    peak = FIXED_BYTES + BYTES_PER_PARAMETER["gradient"] * 2_000_000
    assert out["gradient"]["estimate_peak_mb"] == round(peak / (1 << 20))
    assert "estimate_s" not in out["np"]  # a member is compared through its group


def test_an_unknown_family_is_one_line_naming_the_choices():
    with pytest.raises(SystemExit, match=r"--families: unknown \['nope'\]; choose from np,vr"):
        bench_features.main(["--models", "xl", "--families", "np,nope"])
