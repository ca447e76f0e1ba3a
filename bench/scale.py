"""``python -m bench scale``: per-checkpoint work on 1 and 2 workers of a Dask LocalCluster.

Writes ``--checkpoints`` synthetic Pythia-70m-shaped checkpoints (every tensor of GPT-NeoX 70M:
hidden 512, 6 blocks, MLP 2048, vocabulary 50304, float16 as published, N(0, 0.02) with a seed
per step) into a temporary folder, then computes their weight-feature shards (the streamed,
one-layer-at-a-time path of external series, written as Parquet shards) on a LocalCluster of 1
and then 2 single-threaded workers, each a fresh cluster and a fresh shard folder. Also times the
same work on the default ``local`` execution (the process pool of ``topometrics.execution.compute``) and on a
LocalCluster, each including its start: which of the two ``compute.cluster: local`` should be.

Per worker count: seconds per checkpoint (wall / checkpoints), bytes read per second (the workers'
``read_chars``: both streaming passes, from the page cache since the files were just written),
and peak memory per job. Each job measures its own peak RSS over the RSS it started with (Linux:
the kernel's high-water mark, reset at the job's start through ``/proc/self/clear_refs``). The
*fixed overhead* is that peak for a small checkpoint of the same architecture (hidden 64) on a warm
worker: every worker first computes the small checkpoint (finishing the imports), then one real
checkpoint (not timed: it pays the one-time costs of large layers, such as BLAS's packing buffers
and the library code their paths run, which stay with the process; its peak over the fixed overhead
is reported as the first checkpoint's), then the small one again. The Pythia-70m jobs' peak over
it must stay within 2x the largest linear layer as float32 (the layer read, and at most as much
again while its features are computed: streaming holds one layer at a time). Scaling efficiency =
2-worker speed / (2 x 1-worker speed). The load average is printed with the numbers: the machine
may be shared. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

PYTHIA_70M = {"hidden": 512, "layers": 6, "intermediate": 2048, "vocab": 50304}
SMALL = {"hidden": 64, "layers": 6, "intermediate": 256, "vocab": 1000}  # the fixed-overhead probe
WORKER_COUNTS = (1, 2)
JOB_PEAKS: list[int] = []  # this process's jobs: peak RSS over the RSS at the job's start (bytes)


def pythia_70m_shapes(size: dict = PYTHIA_70M) -> dict[str, tuple[int, ...]]:
    """Every tensor of a GPT-NeoX state dict of ``size`` (default 70M), in its safetensors order."""
    d, f, v = size["hidden"], size["intermediate"], size["vocab"]
    shapes: dict[str, tuple[int, ...]] = {"gpt_neox.embed_in.weight": (v, d)}
    block = {
        "input_layernorm.weight": (d,), "input_layernorm.bias": (d,),
        "post_attention_layernorm.weight": (d,), "post_attention_layernorm.bias": (d,),
        "attention.query_key_value.weight": (3 * d, d), "attention.query_key_value.bias": (3 * d,),
        "attention.dense.weight": (d, d), "attention.dense.bias": (d,),
        "mlp.dense_h_to_4h.weight": (f, d), "mlp.dense_h_to_4h.bias": (f,),
        "mlp.dense_4h_to_h.weight": (d, f), "mlp.dense_4h_to_h.bias": (d,),
    }  # fmt: skip
    for i in range(size["layers"]):
        shapes |= {f"gpt_neox.layers.{i}.{name}": shape for name, shape in block.items()}
    return shapes | {"gpt_neox.final_layer_norm.weight": (d,), "gpt_neox.final_layer_norm.bias": (d,),
                     "embed_out.weight": (v, d)}  # fmt: skip


def largest_linear_bytes() -> int:
    d, f = PYTHIA_70M["hidden"], PYTHIA_70M["intermediate"]
    return f * d * 4  # mlp.dense_h_to_4h (and 4h_to_h) as float32, the dtype a layer is read into


def weight_shard(path: str) -> dict:
    """The weight-feature tables of one checkpoint file, streamed (the job each worker runs)."""
    from bench import PARAMS_YAML
    from topometrics.features.checkpoint import diagrams_frame, features_frame, linear_and_forward_features
    from topometrics.params import load_params
    from topometrics.series.checkpoint import open_weights, streamed_linear_weights

    start = reset_peak_rss()
    loaders, global_max = streamed_linear_weights(*open_weights((Path(path),)))
    result = linear_and_forward_features(loaders, global_max, None, load_params(PARAMS_YAML).features)
    step = int(Path(path).stem.removeprefix("step"))
    tables = {
        "features": features_frame(result, "pythia-70m", 0, step),
        "diagrams": diagrams_frame(result, "pythia-70m", 0, step),
    }
    JOB_PEAKS.append(peak_rss() - start)
    return tables


def reset_peak_rss() -> int:
    """Reset this process's peak RSS to its RSS now (Linux ``clear_refs``); returns the RSS (bytes).
    Where it cannot be reset the peak stays the process's lifetime peak (an upper bound)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status_kb("VmRSS") * 1024


def peak_rss() -> int:
    """This process's peak RSS since the last reset (bytes)."""
    try:
        return _status_kb("VmHWM") * 1024
    except (OSError, KeyError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields[key].split()[0])


def job_peaks() -> list[int]:
    """This worker's per-job peaks so far, then forgotten."""
    peaks = list(JOB_PEAKS)
    JOB_PEAKS.clear()
    return peaks


def worker_baseline() -> dict:
    """Import what the job needs, then report this process's RSS and bytes read so far."""
    import psutil

    import topometrics.series.checkpoint  # noqa: F401

    proc = psutil.Process()
    return {"rss": proc.memory_info().rss, "read": proc.io_counters().read_chars}


def worker_after() -> dict:
    import psutil

    return {"read": psutil.Process().io_counters().read_chars}


def run_on_cluster(files: list[Path], small: Path, warm: Path, workers: int, shard_root: Path) -> dict:
    """Shards of ``files`` on a fresh LocalCluster of ``workers`` workers; times exclude its start.

    Every worker first computes (not timed) the ``small`` checkpoint (imports), the ``warm`` one (a
    real checkpoint: one-time workspaces; its peak is reported as the first job's) and ``small``
    again: the fixed overhead."""
    from distributed import Client

    from topometrics.execution.cluster import local_cluster, map_on_cluster
    from topometrics.execution.shards import Fingerprint, ShardKey, Task, compute_shards

    tasks = [
        Task(ShardKey("pythia-70m", "base", 0, i), Fingerprint(f.name, "bench", "bench"), str(f))
        for i, f in enumerate(files)
    ]
    with local_cluster(workers, memory_limit=None) as cluster, Client(cluster) as client:
        baseline = max(b["rss"] for b in client.run(worker_baseline).values()) / 2**20
        on_every_worker(client, weight_shard, str(small))  # finishes the imports
        client.run(job_peaks)
        on_every_worker(client, weight_shard, str(warm))  # the first real checkpoint on a worker
        first = max(p for peaks in client.run(job_peaks).values() for p in peaks) / 2**20
        on_every_worker(client, weight_shard, str(small))
        fixed = max(p for peaks in client.run(job_peaks).values() for p in peaks) / 2**20
        before = client.run(worker_after)
        start = time.perf_counter()
        run = compute_shards(
            shard_root, tasks, weight_shard, lambda fn, jobs: map_on_cluster(client, fn, jobs), ("features", "diagrams")
        )
        seconds = time.perf_counter() - start
        after = client.run(worker_after)
        peak = max(p for peaks in client.run(job_peaks).values() for p in peaks) / 2**20
    assert len(run.computed) == len(files) and not run.failed, run.failed
    read = sum(after[w]["read"] - before[w]["read"] for w in before)
    return {"workers": workers, "seconds": seconds, "s_per_checkpoint": seconds / len(files),
            "read_mb_s": read / seconds / 2**20, "read_bytes": read, "baseline_rss_mb": baseline,
            "fixed_overhead_mb": fixed, "peak_over_fixed_mb": peak - fixed,
            "first_over_fixed_mb": first - fixed}  # fmt: skip


def on_every_worker(client, fn, job) -> None:
    """``fn(job)`` once on every worker as a task: in the worker's task thread, where the timed jobs
    run (``client.run`` uses another thread, and a thread's first BLAS call and allocations have
    one-time costs of their own: 5 MB on the first task, measured)."""
    for address in client.scheduler_info()["workers"]:
        client.submit(fn, job, workers=[address], allow_other_workers=False, pure=False).result()


def local_choices(files: list[Path], workers: int = 2) -> dict:
    """Wall seconds for the same jobs on the process pool and on a LocalCluster, each including its start.

    The files are repeated up to ``MIN_JOBS_PER_WORKER`` jobs per worker: with fewer, ``local``
    runs everything in the calling process (a pool would not pay), which is not the comparison.
    """
    from distributed import Client

    from topometrics.execution.cluster import local_cluster, map_on_cluster
    from topometrics.execution.compute import MIN_JOBS_PER_WORKER, each_result

    paths = [str(f) for f in files]
    jobs = (paths * MIN_JOBS_PER_WORKER * workers)[: max(len(paths), MIN_JOBS_PER_WORKER * workers)]
    start = time.perf_counter()
    pool = dict(each_result(weight_shard, jobs, workers=workers, label="pool"))
    pool_s = time.perf_counter() - start
    start = time.perf_counter()
    with local_cluster(workers, memory_limit=None) as cluster, Client(cluster) as client:
        dask = dict(map_on_cluster(client, weight_shard, jobs))
    cluster_s = time.perf_counter() - start
    assert len(pool) == len(dask) == len(jobs)
    return {"jobs": len(jobs), "pool_s": pool_s, "local_cluster_s": cluster_s}


def main(argv: list[str]) -> int:
    from bench.series import write_random_safetensors

    ap = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoints", type=int, default=8, help="synthetic Pythia-70m-shaped checkpoints")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="topometrics-bench-scale-"))
    try:
        shapes = pythia_70m_shapes()
        files = [tmp / "weights" / f"step{1000 * i}.safetensors" for i in range(args.checkpoints)]
        files[0].parent.mkdir()
        for i, path in enumerate(files):
            write_random_safetensors(path, shapes, "float16", seed=i)
        size = files[0].stat().st_size
        small = tmp / "small" / "step0.safetensors"  # the weight_shard job reads the step from the name
        small.parent.mkdir()
        write_random_safetensors(small, pythia_70m_shapes(SMALL), "float16", seed=0)
        warm = tmp / "warm" / "step0.safetensors"
        warm.parent.mkdir()
        write_random_safetensors(warm, shapes, "float16", seed=args.checkpoints)
        runs = {n: run_on_cluster(files, small, warm, n, tmp / f"shards-{n}") for n in WORKER_COUNTS}
        local = local_choices(files)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    one, two = runs[1], runs[2]
    efficiency = (one["seconds"] / two["seconds"]) / 2
    limit_mb = 2 * largest_linear_bytes() / 2**20
    within = all(r["peak_over_fixed_mb"] <= limit_mb for r in runs.values())
    load = os.getloadavg()
    for n, r in runs.items():
        print(f"{n} worker(s): {r['s_per_checkpoint']:.2f} s/checkpoint, {r['read_mb_s']:.0f} MB/s read, peak "
              f"{r['peak_over_fixed_mb']:.1f} MB per job over a fixed overhead of {r['fixed_overhead_mb']:.1f} MB "
              f"(a worker's first checkpoint: {r['first_over_fixed_mb']:.1f} MB; "
              f"after {r['baseline_rss_mb']:.0f} MB of imports per worker)")  # fmt: skip
    print(f"scaling efficiency {efficiency:.2f}; 2 x largest layer {limit_mb:.0f} MB: peak "
          f"{'within' if within else 'ABOVE'} the bound; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")  # fmt: skip
    print(f"compute.cluster local, {local['jobs']} jobs on 2 workers incl. start: "
          f"process pool {local['pool_s']:.1f} s, LocalCluster {local['local_cluster_s']:.1f} s")  # fmt: skip
    print(json.dumps({
        "checkpoints": args.checkpoints, "checkpoint_bytes": size, "largest_layer_bytes": largest_linear_bytes(),
        "s_per_checkpoint": {n: round(r["s_per_checkpoint"], 3) for n, r in runs.items()},
        "read_mb_per_s": {n: round(r["read_mb_s"], 1) for n, r in runs.items()},
        "read_bytes_per_checkpoint": round(one["read_bytes"] / args.checkpoints),
        "scaling_efficiency": round(efficiency, 3),
        "peak_over_fixed_mb": {n: round(r["peak_over_fixed_mb"], 1) for n, r in runs.items()},
        "fixed_overhead_mb": {n: round(r["fixed_overhead_mb"], 1) for n, r in runs.items()},
        "first_checkpoint_over_fixed_mb": {n: round(r["first_over_fixed_mb"], 1) for n, r in runs.items()},
        "baseline_rss_mb": round(one["baseline_rss_mb"], 1),
        "two_largest_layers_mb": round(limit_mb, 1), "within_bound": within,
        "local_jobs": local["jobs"], "local_pool_s": round(local["pool_s"], 2),
        "local_cluster_s": round(local["local_cluster_s"], 2),
        "loadavg": [round(x, 2) for x in load], "cores": os.cpu_count(),
    }))  # fmt: skip
    return 0
