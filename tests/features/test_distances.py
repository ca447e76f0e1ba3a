"""topometrics.features.distances: each diagram's distances to the previous checkpoint's, per layer and summed."""

import numpy as np
import pytest

from topometrics.features.checkpoint import CheckpointFeatures
from topometrics.features.distances import distance_features
from topometrics.measures.persistence import bottleneck_distance, wasserstein_distance

LAYERS = ["block0.attn.qkv", "block0.mlp.in"]


def checkpoint(shift: float) -> CheckpointFeatures:
    """H0 and H1 diagrams of every layer and of the representation, their deaths moved by ``shift``."""
    out = CheckpointFeatures()
    for i, key in enumerate([("weights", LAYERS[0]), ("weights", LAYERS[1]), ("representation", "all")]):
        h0 = np.array([[0.0, 1.0 + i], [0.0, 0.5]]) + [0.0, shift * (i + 1)]
        h1 = np.array([[0.2, 0.6 + shift]])
        out.diagrams[key] = [h0, h1]
    return out


def values(features: CheckpointFeatures) -> dict[tuple[str, str], tuple[float, str | None]]:
    return {(layer, name): (value, reason) for layer, name, value, reason in features.rows}


def test_a_layers_distances_are_summed_over_dimensions_and_layer_all_sums_the_layers():
    prev, cur = checkpoint(0.0), checkpoint(0.25)
    got = values(distance_features(prev, cur, LAYERS))
    for layer in LAYERS:
        pairs = list(zip(prev.diagrams[("weights", layer)], cur.diagrams[("weights", layer)], strict=True))
        assert got[(layer, "vr_w1_prev")] == (pytest.approx(sum(wasserstein_distance(a, b) for a, b in pairs)), None)
        assert got[(layer, "vr_bneck_prev")] == (pytest.approx(max(bottleneck_distance(a, b) for a, b in pairs)), None)
    assert got[("all", "vr_w1_prev")][0] == pytest.approx(sum(got[(la, "vr_w1_prev")][0] for la in LAYERS))
    assert got[("all", "vr_bneck_prev")][0] == pytest.approx(sum(got[(la, "vr_bneck_prev")][0] for la in LAYERS))
    # the representation: one H0 death moved by 0.75 (its other bar by 0.75 too) and the H1 death by 0.25
    assert got[("all", "rep_w1_prev")][0] > 0 and got[("all", "rep_w1_prev")][1] is None
    assert values(distance_features(cur, cur, LAYERS))[("all", "rep_w1_prev")] == (0.0, None)  # no change: 0


def test_a_single_bar_moved_by_one_is_at_distance_one_in_both_metrics():
    prev, cur = CheckpointFeatures(), CheckpointFeatures()
    empty = np.zeros((0, 2))
    prev.diagrams[("weights", "w")] = [np.array([[0.0, 4.0]]), empty]
    cur.diagrams[("weights", "w")] = [np.array([[0.0, 5.0]]), empty]  # diagonal: 2 + 2.5 away; each other: 1
    got = values(distance_features(prev, cur, ["w"]))
    assert got[("w", "vr_w1_prev")] == (pytest.approx(1.0), None)
    assert got[("w", "vr_bneck_prev")] == (pytest.approx(1.0), None)


def test_the_first_checkpoint_and_a_missing_diagram_are_null_with_the_reason():
    first = values(distance_features(None, checkpoint(0.0), LAYERS))
    assert all(np.isnan(v) and r == "first checkpoint: no previous diagram" for v, r in first.values())
    assert {name for _, name in first} == {"vr_w1_prev", "vr_bneck_prev", "rep_w1_prev", "rep_bneck_prev"}
    diverged = checkpoint(0.1)
    del diverged.diagrams[("weights", LAYERS[1])]
    got = values(distance_features(checkpoint(0.0), diverged, LAYERS))
    assert got[(LAYERS[0], "vr_w1_prev")][1] is None
    assert got[(LAYERS[1], "vr_w1_prev")][1] == "diagram missing at this or the previous checkpoint"
    assert (
        np.isnan(got[("all", "vr_w1_prev")][0]) and got[("all", "vr_w1_prev")][1] == got[(LAYERS[1], "vr_w1_prev")][1]
    )
