"""Distances of a checkpoint's persistence diagrams to the previous checkpoint's (the ``distance`` family).

Entry point: :func:`distance_features` (a checkpoint's rows from its own and its predecessor's diagrams).
"""

from __future__ import annotations

import numpy as np

from topometrics.features.checkpoint import CheckpointFeatures
from topometrics.measures.persistence import bottleneck_distance, wasserstein_distance
from topometrics.vocabulary import ALL, DISTANCE, model_only, per_layer


def distance_features(
    prev: CheckpointFeatures | None, cur: CheckpointFeatures, layers: list[str]
) -> CheckpointFeatures:
    """Wasserstein-1 and bottleneck distances of each diagram to the previous checkpoint's.

    Per layer, the distance between the graded diagrams ``[H0, H1]`` with matchings inside a
    dimension: W1 is the sum of the per-dimension W1, bottleneck the per-dimension maximum.
    ``layer='all'`` sums both over layers. Finite bars only. NULL with a reason for the first
    checkpoint or when either diagram is missing (diverged checkpoint).
    """
    out = CheckpointFeatures()
    layer_names, model_names = per_layer(DISTANCE), model_only(DISTANCE)
    totals = {name: 0.0 for name in layer_names}
    total_reason = None
    for layer in layers:
        values, reason = _graded_distances(prev, cur, ("weights", layer), layer_names)
        out.add(layer, values, reason)
        total_reason = total_reason or reason
        totals = {k: totals[k] + values[k] for k in totals}
    out.add(ALL, totals, total_reason)
    values, reason = _graded_distances(prev, cur, ("representation", ALL), model_names)
    out.add(ALL, values, reason)
    return out


def _graded_distances(prev, cur, key, names) -> tuple[dict[str, float], str | None]:
    if prev is None:
        return dict.fromkeys(names, np.nan), "first checkpoint: no previous diagram"
    if key not in prev.diagrams or key not in cur.diagrams:
        return dict.fromkeys(names, np.nan), "diagram missing at this or the previous checkpoint"
    pairs = list(zip(prev.diagrams[key], cur.diagrams[key], strict=True))
    w1 = sum(wasserstein_distance(a, b) for a, b in pairs)
    bneck = max(bottleneck_distance(a, b) for a, b in pairs)
    return dict(zip(names, (w1, bneck), strict=True)), None
