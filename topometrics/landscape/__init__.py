"""The loss landscape around the weights: the topology of a loss slice and the curvature of the loss.

Entry points: ``sublevel.sublevel_diagram`` (0-dimensional sublevel-set persistence of a grid of losses,
axis-aligned neighbours) and ``sublevel.slice_summary`` (minima, saddles, persistence, the centre's basin,
the loss range); ``curvature.top_eigenpairs`` (Lanczos on Hessian-vector products) and
``curvature.hutchinson_trace``; ``trace.hessian_trace`` (exact up to a parameter count, else deflated
Hutchinson to a target standard error); ``slice.random_direction`` / ``filter_normalised`` (Li et al. 2018),
``slice.loss_grid`` (a model's loss on a 2-D grid around its weights, batched with ``torch.func``) and
``slice.flat_hvp`` (the exact Hessian-vector-product operator of any model's loss), ``slice.difference_hvp``
(the same by differences of float64 gradients, one-sided for the curvature) and ``slice.exact_hvp`` (exact, in
float32, a window at a time: a large model's); ``vectors`` (float32 parameter-sized vectors and rows kept in a
file, for a large model's Lanczos); ``gradients.gradient_topology``
(per-example gradients on a fixed batch: ``nn.Linear`` layers from one batched pass,
``gradients.linear_example_gradients``, the others layer by layer with ``torch.func``: Vietoris-Rips summaries of each
linear layer's cloud and of the whole network's Johnson-Lindenstrauss projection, raw and unit-normalised,
beside the gradient-noise scale and the mean pairwise cosine; ``clouds.cloud_geometry``, a cloud's Gram matrix
and distances in one pass over its column chunks); ``surface.surface_values``
(one checkpoint's slice summaries and curvature, each NULL value with its reason). Pure functions of arrays,
of parameter dicts and of a loss of parameters; nothing here reads or writes a file but a large model's curvature
vectors, in unnamed temporary files ``surface`` closes before it returns (nothing to leave behind if killed).
"""
