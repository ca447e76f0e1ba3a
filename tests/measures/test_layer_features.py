"""Tests of topometrics.measures.layer_features: one layer's weight features, with or without its buffer."""

from __future__ import annotations

import numpy as np

from tests.measures.helpers import trained_like  # the scale-free tests' trained-looking layers
from tests.repo_params import features_params
from topometrics.measures.layer_features import layer_features
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
