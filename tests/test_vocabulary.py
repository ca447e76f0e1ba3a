"""The feature vocabulary: the names the features code writes are exactly the declared ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.repo_params import features_params
from topometrics.dynamics.trajectory import trajectory_values
from topometrics.features.checkpoint import (
    checkpoint_features,
    forward_features,
    representation_features,
    weight_features,
)
from topometrics.features.distances import distance_features
from topometrics.features.forward import NoForwardPass, validation_batch
from topometrics.measures.layer_features import aggregate_layers
from topometrics.models.model import GPT, GPTConfig, linear_layer_names, linear_weights
from topometrics.vocabulary import (
    ALL,
    DISTANCE,
    FAMILIES,
    FORWARD,
    GRADIENT,
    GRADIENT_TOPOLOGY,
    HEAVY_TAIL,
    NP,
    REPRESENTATION,
    SCALE_FREE,
    SPECTRAL,
    STATES,
    VR,
    WEIGHTS,
    computed_from,
    kind,
    lookup,
    model_level,
    names,
    per_layer,
)

REPO = Path(__file__).resolve().parents[1]
CONFIG = GPTConfig(context=16, hidden=8, layers=2, heads=2)
PARAMS = features_params(rep_points=60, rep_batch=4, betti_scales=3, workers=1)


@pytest.fixture(scope="module")
def two_checkpoints():
    batch = validation_batch(np.random.default_rng(0).integers(0, 128, 200).astype(np.uint8), 16, PARAMS.rep_batch)
    out = []
    for seed in (0, 1):
        model = GPT(CONFIG)
        model.init_weights(torch.Generator().manual_seed(seed))
        out.append(checkpoint_features(model.state_dict(), CONFIG, batch, PARAMS))
    return out


def test_every_layer_gets_exactly_the_declared_per_layer_features_in_order(two_checkpoints):
    prev, cur = two_checkpoints
    rows = cur.rows + distance_features(prev, cur, linear_layer_names(CONFIG.layers)).rows
    for layer in linear_layer_names(CONFIG.layers):
        written = [name for row_layer, name, _, _ in rows if row_layer == layer]
        order = (NP, VR, SPECTRAL, SCALE_FREE, HEAVY_TAIL, GRADIENT, GRADIENT_TOPOLOGY, DISTANCE)
        assert written == [n for family in order for n in per_layer(family)]


def test_layer_all_gets_exactly_the_declared_model_level_features(two_checkpoints):
    prev, cur = two_checkpoints
    rows = cur.rows + distance_features(prev, cur, linear_layer_names(CONFIG.layers)).rows
    rows += [
        (layer, n, v, why) for layer, values, why in trajectory_values("a", "b", 0, PARAMS) for n, v in values.items()
    ]
    written = sorted(name for layer, name, _, _ in rows if layer == ALL)
    declared = sorted(n for family in FAMILIES for n in model_level(family, PARAMS.betti_scales))
    assert written == declared
    assert all(lookup(n) is not None for n in written)


def test_the_rows_of_each_input_are_the_rows_null_when_it_is_unusable(two_checkpoints):
    _, cur = two_checkpoints
    layers = linear_layer_names(CONFIG.layers)
    model = GPT(CONFIG)
    model.init_weights(torch.Generator().manual_seed(1))

    def rows(*inputs):
        declared = computed_from(*inputs, scales=PARAMS.betti_scales)
        return {(layer, n) for layer in layers for n in declared.per_layer} | {(ALL, n) for n in declared.model_level}

    weights = {r[:2] for r in weight_features(linear_weights(model.state_dict(), CONFIG.layers), PARAMS).rows}
    forward = {r[:2] for r in cur.rows} - weights  # a checkpoint's rows are its weight rows and its forward rows

    def failed():
        raise NoForwardPass("no forward pass")

    assert weights == rows(WEIGHTS) and forward == rows(FORWARD, STATES)
    assert {r[:2] for r in forward_features(failed, layers, PARAMS).rows} == forward
    states = representation_features(np.full((4, 8), np.nan), PARAMS).rows
    assert {r[:2] for r in states} == rows(STATES) and all(r[3] == "non-finite hidden states" for r in states)


def test_aggregation_follows_the_declaration():
    values = {"a": {"np_norm": 1.0, "vr_tp0": 2.0, "w_fro": 3.0, "w_spec": 1.0}}
    values["b"] = {"np_norm": 3.0, "vr_tp0": 5.0, "w_fro": 4.0, "w_spec": 7.0}
    assert aggregate_layers(values) == {"np_norm": 2.0, "np_norm_std": 1.0, "vr_tp0": 7.0, "w_fro": 5.0, "w_spec": 7.0}
    with pytest.raises(ValueError, match="frobenius is not a declared per-layer feature"):
        aggregate_layers({"a": {"frobenius": 1.0}})
    with pytest.raises(ValueError, match="batch_loss is not a declared per-layer feature"):
        aggregate_layers({"a": {"batch_loss": 1.0}})


def test_kinds_come_from_the_declaration():
    assert [kind(n) for n in ("np_norm_std", "vr_w1_prev", "rep_betti1_07", "rep_tp0")] == ["topological"] * 4
    assert [kind(n) for n in ("w_fro", "w_spec", "rep_rankme", "rep_pr")] == ["spectral"] * 4
    assert [kind(n) for n in ("grad_norm", "batch_loss", "frobenius", "w_spec_std")] == ["other"] * 4


def test_names_rejects_undeclared_names():
    assert names("vr_tp0", "np_sum") == ("vr_tp0", "np_sum")
    with pytest.raises(ValueError, match=r"undeclared feature names \['np_norm_mean'\]"):
        names("vr_tp0", "np_norm_mean")


def test_every_declared_feature_is_documented():
    docs = (REPO / "docs" / "features.md").read_text()
    for family in FAMILIES:
        for feature in family.features:
            assert f"`{feature.name}" in docs, feature.name
    assert model_level(REPRESENTATION, 2)[-4:] == ("rep_betti1_00", "rep_betti1_01", "rep_rankme", "rep_pr")


def test_the_families_params_accept_are_the_declared_ones():
    from topometrics.params import FEATURE_FAMILIES

    assert tuple(family.name for family in FAMILIES) == FEATURE_FAMILIES
    assert kind("hess_eig1") == "geometric" and kind("ls_hess_saddles") == "topological"


def test_the_shipped_params_compute_every_declared_family():
    # params.yaml lists features.families: a family declared here but not listed there is computed, then NULL
    # ("family switched off") in every row of the shipped pipeline; docs/params.md names the same families.
    import yaml

    declared = [family.name for family in FAMILIES]
    shipped = yaml.safe_load((REPO / "params.yaml").read_text())["features"]["families"]
    assert sorted(shipped) == sorted(declared), f"params.yaml features.families lacks {set(declared) - set(shipped)}"
    rows = (REPO / "docs" / "params.md").read_text().splitlines()
    row = next(line for line in rows if line.startswith("| `features.families`"))
    assert [name for name in declared if f"`{name}`" not in row] == [], "docs/params.md's features.families row"
