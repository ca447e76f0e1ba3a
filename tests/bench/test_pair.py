"""bench pair: one checkpoint's features under another revision and this checkout, in fresh processes."""

import json
import math

import pytest

from bench.pair import largest_differences, main


def test_the_largest_difference_per_feature_counts_one_sided_nans_and_ignores_equal_ones():
    a = {"l0|f": 1.0, "l1|f": 2.0, "l0|g": math.nan, "l0|h": math.nan, "l0|k": 5.0}
    b = {"l0|f": 1.0, "l1|f": 2.5, "l0|g": math.nan, "l0|h": 1.0, "other|only": 3.0}
    assert largest_differences(a, b) == {"h": math.inf, "f": 0.2, "g": 0.0}


def test_a_pair_against_head_runs_both_in_their_own_processes_with_equal_values(capsys):
    families = "np,vr,spectral,trajectory"
    assert main(["--against", "HEAD", "--model", "xl", "--families", families, "--repeats", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert [line.split()[1] for line in out[:2]] == ["against", "this"]
    assert len(result["cpu_s"]["against"]) == len(result["cpu_s"]["this"]) == 1 and result["speedup"] > 0
    assert "np_norm" in result["largest_difference"] and "vr_tp0" in result["largest_difference"]
    assert set(result["largest_difference"].values()) == {0.0}  # one code, seeded draws: the same values


def test_a_revision_that_does_not_exist_is_one_line(capsys):
    with pytest.raises(SystemExit, match="--against no-such-revision"):
        main(["--against", "no-such-revision", "--model", "xl", "--repeats", "1"])
