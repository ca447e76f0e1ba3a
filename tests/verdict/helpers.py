"""Helpers shared by the verdict and report tests: synthetic runs with a known signal and a warehouse holding them."""

import dataclasses

import duckdb
import numpy as np
import pandas as pd

from tests.repo_params import analysis_params
from topometrics.analysis import warehouse
from topometrics.params import FEATURE_FAMILIES
from topometrics.verdict import verdict
from topometrics.verdict.intervals import CURRENT

FRACTIONS = (0.1, 0.3, 0.5)


def synthetic_runs(signal: str, seed: int = 0) -> pd.DataFrame:
    """36 runs (3 rungs x 4 seeds x 3 variants) x 3 fractions of model inputs with a known final loss.

    signal 'topology': the final loss depends on a scale-free feature independent of the norm;
    'norm': on the weight norm only (every topological input is a monotone function of the norm or noise).
    Fraction 0.1 observes only 3 checkpoints.
    """
    rng = np.random.default_rng(seed)
    rows = []
    runs = [(r, s, v) for r in ("a", "b", "c") for s in (1, 2, 3, 4) for v in ("x", "y", "z")]
    norm = rng.normal(0, 1, len(runs))
    topo = rng.normal(0, 1, len(runs))
    law = rng.normal(-0.3, 0.05, len(runs))
    for fraction in FRACTIONS:
        for i, (rung, s, variant) in enumerate(runs):
            anchor = 2.0 + 0.1 * rng.normal()
            hidden = {"topology": 0.3 * topo[i], "norm": 0.2 * norm[i]}[signal]
            actual = anchor + law[i] + hidden + rng.normal(0, 0.005)
            row = {"rung": rung, "seed": s, "variant": variant, "fraction": fraction, "actual": actual}
            row |= {"anchor": anchor, "n_seen": 3 if fraction == 0.1 else 12}
            row |= {"loss_drop": law[i] + rng.normal(0, 0.005), "mpl_drop": law[i] + rng.normal(0, 0.01)}
            row |= {"tissue_drop": np.nan if i % 3 == 0 else law[i]}  # fails in 1/3 of runs: not used
            row |= {"weight_norm_level": norm[i], "weight_norm_rate": rng.normal()}
            for columns in verdict.family_columns().values():
                for j, col in enumerate(columns):
                    row[col] = rng.normal() if j else np.exp(norm[i])  # a monotone function of the norm, or noise
            row["vr_unit_tp0_level"] = topo[i] if signal == "topology" else rng.normal()
            row["w_alpha_level"] = row["w_alpha_rate"] = row["rep_alpha_level"] = row["rep_alpha_rate"] = np.nan
            rows.append(row)
    return pd.DataFrame(rows)


def warehouse_with(table: pd.DataFrame, errors: pd.DataFrame, alpha: float = 0.05) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    schema, *views = warehouse.sql_files()
    con.execute(schema.read_text())
    settings = dataclasses.replace(analysis_params().settings(), alpha=alpha)
    values = list(settings.__dict__.values())
    con.execute(f"INSERT INTO settings VALUES ({', '.join('?' * len(values))})", values)
    for name, frame in (("incremental_validity", table), ("incremental_errors", errors)):
        con.register("frame", frame)
        con.execute(f"INSERT INTO {name} SELECT * FROM frame")
        con.unregister("frame")
    for view in views:
        con.execute(view.read_text())
    return con


def _sweep(seed: int, n_cells: int = 12, seeds: int = 4) -> pd.DataFrame:
    """A sweep whose final loss a family's predictor knows (+ tiny noise) and the baseline barely does."""
    rng = np.random.default_rng(seed)
    n = n_cells * seeds
    actual = rng.normal(3.0, 0.3, n)
    cells = np.repeat([f"r{i % 3}|v{i}" for i in range(n_cells)], seeds)
    return pd.DataFrame({
        "rung": [c.split("|")[0] for c in cells], "cell": cells, "actual": actual, "steps": 1000.0,
        CURRENT: actual + rng.normal(0, 1.0, n), "norm+oracle": actual + rng.normal(0, 0.01, n),
        "norm+noise": rng.normal(3.0, 0.3, n),
    })  # fmt: skip


KINDS = {CURRENT: "baseline", "norm+oracle": "family", "norm+noise": "family"}


CHAR = {"kind": "char"}


def _runs(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    anchor = rng.uniform(2.0, 3.0, n)
    return pd.DataFrame({"fraction": 0.2, "anchor": anchor, "actual": 0.5 + 0.9 * anchor + rng.normal(0, 0.01, n)})


SWEEP_LAYOUT = {  # the measured sweep's params: 3 rungs, the base and 15 drawn recipes, 2 seeds
    "train": {"steps": 1000, "ckpt_every": 50, "seeds": [3, 13], "batch_size": 32, "workers": 0},
    "ladder": dict.fromkeys(["tiny", "small", "medium"], {}),
    "variants": {f"r{i:02d}": {} for i in range(1, 16)},
    "analysis": {"fractions": [0.2, 0.3, 0.5], "alpha": 0.05, "permutations": 99},
    "data": {"seq_len": 128},
    "features": {"families": list(FEATURE_FAMILIES), "landscape_every": 5},  # the repository's, as it was swept
}
