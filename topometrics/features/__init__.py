"""Features: one checkpoint to feature rows, one run to shards, and the same features live while training.

Entry points: ``checkpoint.checkpoint_features`` (linear weights + an optional forward pass -> rows;
the one per-checkpoint path of our runs and external series); ``forward.model_on_batch`` (that forward pass:
states, gradient norms, loss, the loss surface's and the gradient clouds' batches); ``distances.distance_features``
(each diagram's distance to the previous checkpoint's); ``gradient_cloud.gradient_rows`` (the per-example
gradient clouds' rows, from the forward pass); ``sweep.sweep_shards`` (every checkpoint of
every run -> shards in one batch, what the features stage runs; ``sweep.run_shards`` for one run) and
``run_shards.read_tables`` (the shards read back);
``monitor.TopologyMonitor`` / ``monitor.TopologyCallback`` (weight features every N steps of a training
loop or a Hugging Face Trainer, written to a monitor log; with ``monitor_surface.SurfaceSource`` also the
loss surface, by ``monitor_surface.surface_rows`` in the monitor's worker).
"""
