"""Execution: where per-checkpoint work runs, and the shards it leaves.

Entry points: ``compute.map_jobs`` / ``each_result`` (the one way work runs in parallel: a local
process pool or a Dask cluster, ``cluster``); ``compute.whole_job_executor`` (where whole jobs, the
training runs, go: a spawn pool here or the same cluster); ``compute.background_pool`` (the single-worker pool of a
live monitor); ``lifeline.die_with`` (workers die with their parent); ``shards.compute_shards`` /
``write_shard`` / ``is_current`` (per-checkpoint Parquet shards with the fingerprint of their inputs);
``cost.checkpoint_costs`` / ``unaffordable`` (what a checkpoint's jobs cost in time and memory, told before they
run, so a job that cannot fit is skipped with the GB it needs rather than killed).
"""
