"""``python -m bench series``: streamed neural persistence at Pythia-1B scale, and series speed.

1. Writes a safetensors file with Pythia-1B's linear layers (hidden 2048, 16 blocks, MLP 8192:
   qkv 6144x2048, dense 2048x2048, h_to_4h 8192x2048, 4h_to_h 2048x8192; Gaussian weights, float32
   by default, ``--dtype float16`` for the published precision), then measures NP of every linear
   layer streamed layer by layer (pass 1 global max, pass 2 NP), in a fresh subprocess so that the
   writer's memory does not count: wall time, peak RSS and the RSS after imports (the baseline).
2. Checkpoints per minute for a series of pythia-14m-shaped checkpoints (hidden 128, 6 blocks,
   MLP 512, vocab 50304) with a tokenizer trained here: all features, and weight features alone.

Temporary files are deleted at the end. The last line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

PYTHIA_1B = {"hidden": 2048, "layers": 16, "intermediate": 8192}
PYTHIA_14M = {"hidden": 128, "layers": 6, "heads": 4, "intermediate": 512, "vocab": 50304}


def pythia_1b_shapes() -> dict[str, tuple[int, int]]:
    d, f = PYTHIA_1B["hidden"], PYTHIA_1B["intermediate"]
    shapes = {"attention.query_key_value": (3 * d, d), "attention.dense": (d, d)}
    shapes |= {"mlp.dense_h_to_4h": (f, d), "mlp.dense_4h_to_h": (d, f)}
    return {f"gpt_neox.layers.{i}.{m}.weight": s for i in range(PYTHIA_1B["layers"]) for m, s in shapes.items()}


def write_random_safetensors(path: Path, shapes: dict[str, tuple[int, int]], dtype: str, seed: int = 0) -> None:
    """Write N(0, 0.02) tensors one at a time (the file format: 8-byte header size, JSON header, data)."""
    tag, itemsize = {"float32": ("F32", 4), "float16": ("F16", 2)}[dtype]
    header, offset = {}, 0
    for name, shape in shapes.items():
        nbytes = int(np.prod(shape)) * itemsize
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)  # data aligned to 8 bytes, as safetensors writes it
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        for shape in shapes.values():
            f.write((rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dtype).tobytes())


def measure_streamed_np(path: Path) -> dict:
    """NP of every NeoX linear layer of ``path``, streamed; run in a fresh process (``--measure``)."""
    import psutil

    from topometrics.measures.neural_persistence import neural_persistence
    from topometrics.series.checkpoint import open_weights, streamed_linear_weights

    baseline = psutil.Process().memory_info().rss
    start = time.perf_counter()
    loaders, global_max = streamed_linear_weights(*open_weights((path,)))  # pass 1
    pass1 = time.perf_counter() - start
    values = [neural_persistence(load(), global_max).np_norm for load in loaders.values()]  # pass 2
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"seconds": seconds, "pass1_s": pass1, "layers": len(values), "np_norm_mean": float(np.mean(values)),
            "baseline_rss_mb": baseline / 2**20, "peak_rss_mb": peak / 2**20}  # fmt: skip


def series_speed(folder: Path, checkpoints: int) -> dict:
    """Seconds per pythia-14m-shaped checkpoint: all features, and the weight features alone."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from bench import PARAMS_YAML
    from topometrics.features.checkpoint import linear_and_forward_features
    from topometrics.params import load_params
    from topometrics.params_sources import SeriesSource
    from topometrics.series.checkpoint import open_weights, streamed_linear_weights
    from topometrics.series.source_shards import series_shards
    from topometrics.training.corpus import offline_text

    text = offline_text()
    _save_tokenizer(folder, text[:100_000])
    p = PYTHIA_14M
    cfg = GPTNeoXConfig(hidden_size=p["hidden"], num_hidden_layers=p["layers"], num_attention_heads=p["heads"],
                        intermediate_size=p["intermediate"], vocab_size=p["vocab"])  # fmt: skip
    for step in range(checkpoints):
        model, gen = GPTNeoXForCausalLM(cfg), torch.Generator().manual_seed(step)
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
        model.save_pretrained(folder / f"step{1000 * step}", safe_serialization=True)
    repo = load_params(PARAMS_YAML)
    params = dataclasses.replace(repo.features, workers=1)  # one checkpoint at a time, in this process
    series = dataclasses.replace(repo.series, sources={"bench": SeriesSource(path=str(folder))})
    series_shards(series, params, text, folder.parent / "warm-up")  # imports, first calls
    start = time.perf_counter()
    result = series_shards(series, params, text, folder.parent / "shards")  # as the stage: shards written
    full = (time.perf_counter() - start) / checkpoints
    (status,) = result.status["series"]
    assert all(s["status"] == "computed" for s in status["checkpoints"]), status
    start = time.perf_counter()
    for step in range(checkpoints):
        loaders, global_max = streamed_linear_weights(
            *open_weights((folder / f"step{1000 * step}" / "model.safetensors",))
        )
        linear_and_forward_features(loaders, global_max, None, params)
    weights = (time.perf_counter() - start) / checkpoints
    return {"full_s": full, "weights_s": weights}


def _save_tokenizer(folder: Path, text: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(
        [text], trainers.BpeTrainer(vocab_size=2000, initial_alphabet=alphabet, show_progress=False)
    )
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench series", description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["float32", "float16"], default="float32", help="Pythia-1B file precision")
    ap.add_argument("--checkpoints", type=int, default=3, help="pythia-14m-shaped checkpoints to time")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # child mode: one file, JSON out
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure_streamed_np(args.measure)))
        return 0
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tmp = Path(tempfile.mkdtemp(prefix="topometrics-bench-series-"))
    try:
        shapes = pythia_1b_shapes()
        path = tmp / "pythia-1b-linear.safetensors"
        start = time.perf_counter()
        write_random_safetensors(path, shapes, args.dtype)
        print(f"wrote {path.stat().st_size / 2**30:.2f} GiB ({len(shapes)} layers, {args.dtype}) "
              f"in {time.perf_counter() - start:.1f} s")  # fmt: skip
        child = subprocess.run([sys.executable, "-m", "bench", "series", "--measure", str(path)],
                               capture_output=True, text=True, check=True)  # fmt: skip
        np_run = json.loads(child.stdout.strip().splitlines()[-1])
        path.unlink()
        with threadpool_limits(limits=1, user_api="blas"):  # as the stage does
            speed = series_speed(tmp / "pythia-14m", args.checkpoints)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    largest_mb = max(a * b for a, b in shapes.values()) * 4 / 2**20  # as float32 in memory
    over_baseline = np_run["peak_rss_mb"] - np_run["baseline_rss_mb"]
    rows = [
        ("Pythia-1B NP, all 64 layers streamed (s)", f"{np_run['seconds']:.2f}", "<= 10"),
        ("  of which pass 1, global max|w| (s)", f"{np_run['pass1_s']:.2f}", ""),
        ("peak RSS (MB)", f"{np_run['peak_rss_mb']:.0f}", ""),
        ("  baseline RSS after imports (MB)", f"{np_run['baseline_rss_mb']:.0f}", ""),
        ("  peak above baseline (MB)", f"{over_baseline:.0f}", f"< {2 * largest_mb:.0f} (2x largest layer)"),
        ("largest layer, float32 (MB)", f"{largest_mb:.0f}", ""),
        ("pythia-14m all features (s/checkpoint)", f"{speed['full_s']:.2f}", ""),
        ("pythia-14m all features (checkpoints/min)", f"{60 / speed['full_s']:.1f}", ""),
        ("pythia-14m weight features only (s/checkpoint)", f"{speed['weights_s']:.2f}", ""),
    ]
    for name, value, target in rows:
        print(f"{name:<48} {value:>10}  {target}")
    print(json.dumps({
        "pythia1b_np_s": round(np_run["seconds"], 3), "pythia1b_pass1_s": round(np_run["pass1_s"], 3),
        "peak_rss_mb": round(np_run["peak_rss_mb"], 1), "baseline_rss_mb": round(np_run["baseline_rss_mb"], 1),
        "largest_layer_mb": round(largest_mb, 1), "dtype": args.dtype,
        "pythia14m_ckpt_per_min": round(60 / speed["full_s"], 2),
        "pythia14m_weights_s": round(speed["weights_s"], 3),
    }))  # fmt: skip
    return 0
