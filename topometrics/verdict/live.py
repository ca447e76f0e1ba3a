"""A predictor a user can carry to a new run: the final loss from the current loss at a fraction, with intervals.

:func:`fit_forecaster` fits, per fraction of training, final loss = a + b x (last observed loss) by least
squares over the sweep's runs, and the half-widths of its 80 % and 95 % prediction intervals for a *new* run
by the jackknife+ rule in its split-conformal form (Barber et al. 2021): the ceil(level (n + 1))-th smallest
absolute leave-one-run-out residual (r_i / (1 - h_ii), the hat matrix's closed form). It records the
tokenizer and the loss unit the runs were measured in: a run of another tokenizer or unit is refused
(:func:`topometrics.analysis.forecast.forecast_line` reads the file). The current loss is the one input a
live run has without the analysis stack; the verdict's ranking baseline ("current loss") is the same input.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

FORMAT = "topometrics.live_forecast.v1"  # the file's "format"; analysis/forecast.py refuses any other
LEVELS = (0.8, 0.95)


def forecaster_file(inputs: pd.DataFrame, corpus_source: dict, loss_unit: str) -> dict:
    """:func:`fit_forecaster` with the tokenizer of the corpus record (``data/corpus/source.json``): its
    ``tokenizer`` entry's kind and vocabulary size, or the character tokenizer where it has none."""
    tok = corpus_source.get("tokenizer")
    tokenizer = {"kind": "bpe", "vocab_size": int(tok["vocab_size"])} if tok else {"kind": "char"}
    return fit_forecaster(inputs, tokenizer, loss_unit)


def fit_forecaster(inputs: pd.DataFrame, tokenizer: dict, loss_unit: str, min_runs: int = 4) -> dict:
    """The forecaster as a JSON-ready dict: ``format``, ``tokenizer``, ``loss_unit``, ``fractions``: {fraction:
    {a, b, n, half_width: {level: nats}}} for every fraction of ``inputs`` (``fraction``, ``anchor``,
    ``actual``) with at least ``min_runs`` runs; an infinite half-width (too few runs) is written as null."""
    out = {"format": FORMAT, "tokenizer": tokenizer, "loss_unit": loss_unit, "fractions": {}}
    for fraction, g in inputs.groupby("fraction", sort=True):
        x, y = g["anchor"].to_numpy(float), g["actual"].to_numpy(float)
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.sum() < min_runs or np.ptp(x[ok]) == 0:
            continue
        design = np.column_stack([np.ones(ok.sum()), x[ok]])
        coef, *_ = np.linalg.lstsq(design, y[ok], rcond=None)
        hat = np.einsum("ij,jk,ik->i", design, np.linalg.pinv(design.T @ design), design)
        loo = np.sort(np.abs((y[ok] - design @ coef) / (1 - hat)))
        widths = {}
        for level in LEVELS:
            rank = math.ceil(level * (len(loo) + 1))
            widths[f"{level:g}"] = float(loo[rank - 1]) if rank <= len(loo) else None
        out["fractions"][f"{fraction:g}"] = {"a": float(coef[0]), "b": float(coef[1]), "n": int(ok.sum())}
        out["fractions"][f"{fraction:g}"]["half_width"] = widths
    return out
