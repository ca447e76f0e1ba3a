"""The loss landscape around the weights: the topology of a loss slice and the curvature of the loss.

Entry points: ``sublevel.sublevel_diagram`` (0-dimensional sublevel-set persistence of a grid of losses,
axis-aligned neighbours) and ``sublevel.slice_summary`` (minima, saddles, persistence, the centre's basin,
the loss range); ``curvature.top_eigenpairs`` (Lanczos on Hessian-vector products) and
``curvature.hutchinson_trace``. Pure functions of arrays and of a Hessian-vector-product operator.
"""
