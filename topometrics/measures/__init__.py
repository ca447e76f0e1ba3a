"""Measures: pure functions of weight matrices and point clouds (no files, no processes).

Entry points: ``neural_persistence.neural_persistence`` (Rieck et al. 2019) over
``spanning_tree``; ``persistence.vietoris_rips_diagrams`` / ``diagram_summary`` /
``wasserstein_distance``; ``representation.representation_topology``; ``scale_free.scale_free_features``;
``spectral`` and ``heavy_tail`` baselines; ``layer_features.layer_features`` / ``aggregate_layers``
(every per-layer weight feature of one layer, and the ``layer='all'`` aggregation the vocabulary declares);
``row_blocks`` (the float64 row blocks several measures share).
"""
