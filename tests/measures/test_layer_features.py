"""Tests of topometrics.measures.layer_features: one layer's weight features, with or without its buffer."""

from __future__ import annotations

import numpy as np
import pytest

from tests.measures.helpers import trained_like  # the scale-free tests' trained-looking layers
from tests.repo_params import features_params
from topometrics.measures import layer_features as layer_features_module
from topometrics.measures.layer_features import OFF, layer_features
from topometrics.vocabulary import HEAVY_TAIL, NP, SCALE_FREE, SPECTRAL, VR, per_layer


def test_layer_features_give_the_same_values_whether_or_not_they_may_overwrite_the_layer():
    w = trained_like((70, 30), 7).astype(np.float32)
    kept = w.copy()
    values, dgms, alpha = layer_features(w, 3.0, features_params(), 2)
    assert np.array_equal(w, kept)  # not overwritten by default
    again, dgms_again, alpha_again = layer_features(w, 3.0, features_params(), 2, overwrite=True)
    assert again == values and alpha_again == alpha
    assert all(np.array_equal(a, b) for a, b in zip(dgms, dgms_again, strict=True))
    assert not np.array_equal(w, kept)  # the buffer held the nulls


def test_layer_features_are_the_declared_per_layer_weight_features():
    values, dgms, alpha = layer_features(trained_like((40, 24), 8), 5.0, features_params(), 0)
    declared = [n for f in (NP, VR, SPECTRAL, SCALE_FREE) for n in per_layer(f)]
    assert sorted(values) == sorted(declared)
    assert [n for n in per_layer(HEAVY_TAIL)] == ["w_alpha"] and np.isfinite(alpha.alpha)
    assert len(dgms) == 2 and all(d.shape[1] == 2 for d in dgms)


@pytest.mark.parametrize("on", [("np",), ("vr", "heavy_tail"), ("spectral", "scale_free"), ("scale_free",)])
def test_a_family_that_is_off_is_not_computed_and_the_others_keep_their_values(on, monkeypatch):
    w = trained_like((70, 30), 7).astype(np.float32)
    every, every_dgms, every_alpha = layer_features(w, 3.0, features_params(), 2)
    if "vr" not in on:  # vr off: its Rips diagrams are never computed
        monkeypatch.setattr(layer_features_module, "rips_diagrams", _never)
    if not {"spectral", "heavy_tail"} & set(on):  # no family reads the singular values
        monkeypatch.setattr(layer_features_module, "singular_values", _never)
    if not {"np", "scale_free"} & set(on):
        monkeypatch.setattr(layer_features_module, "bipartite_max_spanning_tree", _never)
    values, dgms, alpha = layer_features(w, 3.0, features_params(families=on), 2)
    assert list(values) == list(every)  # the same keys, in the same order
    for family in (NP, VR, SPECTRAL, SCALE_FREE):
        for name in per_layer(family):
            same = values[name] == every[name] or (np.isnan(values[name]) and np.isnan(every[name]))
            assert same if family.name in on else np.isnan(values[name]), name
    assert (alpha == every_alpha) if "heavy_tail" in on else (np.isnan(alpha.alpha) and alpha.reason == OFF)
    if "vr" in on:
        assert all(np.array_equal(a, b) for a, b in zip(dgms, every_dgms, strict=True))
    else:
        assert [d.shape for d in dgms] == [(0, 2), (0, 2)]


def _never(*args, **kwargs):
    raise AssertionError("computed for a family that is off")
