"""Between-run incremental validity: does topology predict a run's final loss beyond its loss curve and weight norm?

Within one run every quantity that grows with training correlates with the loss, so the question can
only be asked *between* runs: at a fraction of training, do runs whose topology looks different end
at a different final loss than their loss curve so far and their weight norm already say?

At every fraction, nested ridge models predict each run's final validation loss (as the drop from
the last observed one), fitted across runs with leave-one-group-out cross-validation
(:func:`nested_cross_validate`; groups: seed, recipe variant, rung):

1. ``loss``: the loss curve only: the extrapolations of the per-run laws fitted to the observed
   curve (power law in steps, multi-power law and LR-annealing law, both reading the LR schedule);
2. ``norm``: (1) + the weight norm (level and rate of the network's Frobenius norm);
3. ``<family>``: (2) + one family of topological features (level and rate of each; the families
   are declared in :mod:`topometrics.vocabulary`, :func:`~topometrics.vocabulary.verdict_families`);
4. ``everything``: (2) + every family.

Per run, the absolute errors of two nested models are paired: (3) vs (2) for each family, (4) vs (2),
and (2) vs (1) (family ``weight_norm``). :func:`topometrics.analysis.stats.paired_difference` gives the mean
difference (delta MAE, negative = the added inputs help), its paired-bootstrap CI and the Wilcoxon
signed-rank p. The SQL view ``topology_verdict`` adds the Bonferroni correction and the verdict word.

Both models of a comparison are fitted on the same runs: those with every input of the larger
model. An input column enters only when it is finite in at least :data:`MIN_COVERAGE` of the runs
(so a feature NULL on the smallest rungs, e.g. a heavy-tail alpha, drops those runs for its family
rather than the whole family); dropped columns are named in ``reason``. Anything that cannot be
compared is a row with ``status = 'skipped'`` and its reason, never a NaN without one.
Pure functions over DataFrames.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from sklearn.linear_model import RidgeCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from topometrics.analysis import predict, stats
from topometrics.vocabulary import verdict_families

LOSS_INPUTS = ("loss_drop", "mpl_drop", "tissue_drop")  # the per-run laws' predicted drop from the anchor
NORM_INPUTS = ("weight_norm_level", "weight_norm_rate")
SCHEMES = ("seed", "variant", "rung")  # leave-one-<scheme>-out; 'variant' only where runs have one
MIN_CHECKPOINTS = 4  # observed checkpoints a run needs at a fraction
MIN_GROUPS = 3  # groups a leave-one-group-out scheme needs
MIN_COVERAGE = 0.75  # share of runs in which an input column must be finite to be used
RUN_KEYS = ("rung", "seed", "variant")
RESIDUAL_ALPHAS = np.logspace(-3, 6, 19)  # penalties of the added family's ridge (see nested_cross_validate)

VERDICT_COLUMNS = [
    "cv", "fraction", "family", "comparison", "n", "n_groups", "mae_without", "mae_with", "delta_mae",
    "ci_low", "ci_high", "statistic", "p_value", "status", "reason", "inputs",
]  # fmt: skip
ERROR_COLUMNS = [
    "cv", "fraction", "family", "rung", "seed", "variant", "actual", "predicted_without", "predicted_with",
    "error_without", "error_with",
]  # fmt: skip


def family_columns(families: dict[str, tuple[str, ...]] | None = None) -> dict[str, tuple[str, ...]]:
    """Input columns of every family: ``<feature>_level`` and ``<feature>_rate`` (see ``predict.window_summary``)."""
    families = verdict_families() if families is None else families
    return {name: tuple(f"{f}_{k}" for f in feats for k in ("level", "rate")) for name, feats in families.items()}


def comparisons(families: dict[str, tuple[str, ...]] | None = None) -> list[tuple[str, str, tuple, tuple]]:
    """(family, comparison, inputs of the smaller model, inputs added by the larger) in report order."""
    cols = family_columns(families)
    base = LOSS_INPUTS + NORM_INPUTS
    out = [("weight_norm", "(2) vs (1)", LOSS_INPUTS, NORM_INPUTS)]
    out += [(name, "(3) vs (2)", base, extra) for name, extra in cols.items()]
    everything = tuple(c for extra in cols.values() for c in extra)
    return out + [("everything", "(4) vs (2)", base, everything)]


def incremental_validity(
    inputs: pd.DataFrame,
    families: dict[str, tuple[str, ...]] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every nested comparison at every fraction and cross-validation scheme.

    Parameters
    ----------
    inputs : DataFrame
        One row per run and fraction: ``rung``, ``seed`` (and ``variant`` when runs have recipe
        variants), ``fraction``, ``n_seen`` (checkpoints observed), ``actual`` (final val loss),
        ``anchor`` (last observed val loss) and the input columns (:data:`LOSS_INPUTS`,
        :data:`NORM_INPUTS`, :func:`family_columns`); a missing column counts as all-NaN.
    families : family name -> layer-'all' feature names (default the vocabulary's, ``verdict_families()``)
    n_boot, seed : paired-bootstrap resamples and seed

    Returns
    -------
    verdict : DataFrame with :data:`VERDICT_COLUMNS`, one row per scheme x fraction x comparison
    errors : DataFrame with :data:`ERROR_COLUMNS`, the paired per-run predictions behind each ok row
    """
    rows, errors = [], []
    plan = comparisons(families)
    for scheme in SCHEMES:
        for fraction, g in inputs.groupby("fraction", sort=True):
            why = _scheme_problem(g, scheme, fraction)
            for family, comparison, base, extra in plan:
                row = {"cv": scheme, "fraction": float(fraction), "family": family, "comparison": comparison}
                if why is not None:
                    rows.append(row | {"n": 0, "status": "skipped", "reason": why})
                    continue
                result, errs = _compare(g, scheme, base, extra, family, n_boot, seed)
                rows.append(row | result)
                errors += [e | {"cv": scheme, "fraction": float(fraction), "family": family} for e in errs]
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS), pd.DataFrame(errors, columns=ERROR_COLUMNS)


def _scheme_problem(g: pd.DataFrame, scheme: str, fraction: float) -> str | None:
    """Why no comparison can run for this scheme and fraction (None when they can)."""
    seen = g["n_seen"].to_numpy(float) if "n_seen" in g else np.zeros(len(g))
    if len(g) == 0 or np.nanmax(seen, initial=0) < MIN_CHECKPOINTS:
        most = int(np.nanmax(seen, initial=0))
        return f"fraction {fraction:g} observes at most {most} checkpoints per run; need {MIN_CHECKPOINTS}"
    if scheme not in g or g[scheme].isna().all():
        return f"runs have no {scheme} column (a single recipe)"
    groups = g.loc[seen >= MIN_CHECKPOINTS, scheme].nunique()
    if groups < MIN_GROUPS:
        return f"leave-one-{scheme}-out needs at least {MIN_GROUPS} {scheme}s, got {groups}"
    return None


def usable_columns(g: pd.DataFrame, columns: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The columns finite in at least :data:`MIN_COVERAGE` of the rows of ``g``, and the others."""
    keep, dropped = [], []
    for c in columns:
        share = np.isfinite(g[c].to_numpy(float)).mean() if c in g and len(g) else 0.0
        (keep if share >= MIN_COVERAGE and share > 0 else dropped).append(c)
    return keep, dropped


def _compare(g, scheme, base, extra, family, n_boot, seed) -> tuple[dict, list[dict]]:
    g = g[g["n_seen"] >= MIN_CHECKPOINTS].reset_index(drop=True)
    base_cols, base_dropped = usable_columns(g, base)
    extra_cols, extra_dropped = usable_columns(g, extra)
    note = _dropped_note(base_dropped + extra_dropped)
    if not base_cols:
        return {"n": 0, "status": "skipped", "reason": "no usable inputs of the smaller model" + note}, []
    if not extra_cols:
        return {"n": 0, "status": "skipped", "reason": f"family {family} has no usable values" + note}, []
    both = base_cols + extra_cols
    target = (g["actual"] - g["anchor"]).to_numpy(float)
    usable = np.isfinite(g[both].to_numpy(float)).all(axis=1) & np.isfinite(target)
    sub = g[usable].reset_index(drop=True)
    groups = sub[scheme].nunique()
    if groups < MIN_GROUPS:
        why = f"{int(usable.sum())} runs with every input span {groups} {scheme}s; need {MIN_GROUPS}"
        return {"n": int(usable.sum()), "n_groups": groups, "status": "skipped", "reason": why + note}, []
    drops = nested_cross_validate(
        sub[base_cols].to_numpy(float), sub[extra_cols].to_numpy(float), target[usable], sub[scheme].to_numpy()
    )
    pred = {k: sub["anchor"].to_numpy(float) + v for k, v in drops.items()}
    err = {k: np.abs(v - sub["actual"].to_numpy(float)) for k, v in pred.items()}
    paired = np.isfinite(err["with"]) & np.isfinite(err["without"])
    r = stats.paired_difference(err["with"][paired], err["without"][paired], n_boot, seed)
    result = {"n": r.n, "n_groups": int(sub.loc[paired, scheme].nunique()), "delta_mae": r.delta}
    result |= {"mae_with": float(np.mean(err["with"][paired])) if r.n else None}
    result |= {"mae_without": float(np.mean(err["without"][paired])) if r.n else None}
    result |= {"ci_low": r.ci_low, "ci_high": r.ci_high, "statistic": r.statistic, "p_value": r.p_value}
    result |= {"inputs": ",".join(both)}
    if r.n < 2:
        result |= {"status": "skipped", "reason": f"{r.n} runs predicted by both models; need 2" + note}
        return result, []
    result |= {"status": "ok", "reason": ((r.reason or "") + note).removeprefix("; ") or None}
    keys = [k for k in RUN_KEYS if k in sub]
    errs = [
        {k: sub.at[i, k] for k in keys}
        | {"actual": sub.at[i, "actual"], "predicted_without": pred["without"][i], "predicted_with": pred["with"][i]}
        | {"error_without": err["without"][i], "error_with": err["with"][i]}
        for i in np.flatnonzero(paired)
    ]
    return result, errs


def nested_cross_validate(base: np.ndarray, extra: np.ndarray, y: np.ndarray, groups) -> dict[str, np.ndarray]:
    """Leave-one-group-out predictions of a model and of the same model plus ``extra`` inputs.

    ``without``: standardised ridge on ``base`` (penalty chosen by efficient leave-one-out inside the
    training runs, :data:`topometrics.analysis.predict.RIDGE_ALPHAS`). ``with``: that prediction plus a second
    standardised ridge of ``extra`` fitted to the first model's training residuals, with penalties up
    to :data:`RESIDUAL_ALPHAS`' 1e6, so inputs that explain nothing beyond the base shrink to no
    contribution instead of diluting the base's coefficients (one shared penalty over both sets
    would). Rows are complete (no NaN); a group whose complement has fewer than 3 runs is NaN.
    """
    groups = np.asarray(groups)
    out = {"without": np.full(len(y), np.nan), "with": np.full(len(y), np.nan)}
    for held in np.unique(groups):
        test, train = groups == held, groups != held
        if train.sum() < 3:
            continue
        first = make_pipeline(StandardScaler(), RidgeCV(alphas=predict.RIDGE_ALPHAS)).fit(base[train], y[train])
        residual = y[train] - first.predict(base[train])
        second = make_pipeline(StandardScaler(), RidgeCV(alphas=RESIDUAL_ALPHAS)).fit(extra[train], residual)
        out["without"][test] = first.predict(base[test])
        out["with"][test] = out["without"][test] + second.predict(extra[test])
    return out


def _dropped_note(dropped: list[str]) -> str:
    if not dropped:
        return ""
    return f"; not used (finite in < {MIN_COVERAGE:.0%} of runs): {', '.join(dropped)}"


HEADLINE_FAMILY = "everything"  # the answer's row: every family added to the loss curve and weight norm


def headline_scheme(view: pd.DataFrame) -> str | None:
    """The cross-validation scheme the answer leads with: the first of :data:`SCHEMES` (seeds, then recipe
    variants, then rungs: the nearest runs first) with a comparison that was not skipped; None when all were."""
    tested = view[~view["verdict"].astype(str).str.startswith("skipped")]
    return next((s for s in SCHEMES if (tested["cv"] == s).any()), None)


def verdict_metrics(view: pd.DataFrame) -> dict:
    """The headline rows of the ``topology_verdict`` view as the ``verdict`` entry of ``reports/metrics.json``:
    ``{cv, f<percent>: {verdict, delta_mae, n}}``, the :data:`HEADLINE_FAMILY` row of each fraction of the
    :func:`headline_scheme` (``cv`` 'none' and each verdict 'skipped' when nothing could be compared). A few
    columns whatever the number of runs; every row is in the warehouse."""
    if view.empty:
        return {"cv": "none"}
    scheme = headline_scheme(view)
    rows = view[(view["cv"] == (scheme or view["cv"].iloc[0])) & (view["family"] == HEADLINE_FAMILY)]
    out: dict = {"cv": scheme or "none"}
    for r in rows.sort_values("fraction").itertuples(index=False):
        word = str(r.verdict).split(":")[0]  # 'skipped: <reason>' -> 'skipped' (the report says why)
        entry = {"verdict": word}
        if scheme is not None and pd.notna(r.delta_mae):
            entry |= {"delta_mae": float(f"{float(r.delta_mae):.6g}"), "n": int(r.n)}
        out[f"f{round(100 * r.fraction):02d}"] = entry
    return out


# The reasons _scheme_problem gives (the report groups skipped rows by them).
TOO_FEW_CHECKPOINTS = re.compile(r"^fraction (\S+) observes at most (\d+) checkpoints per run; need (\d+)$")
TOO_FEW_GROUPS = re.compile(r"^leave-one-(\w+)-out needs at least (\d+) \w+, got (\d+)$")


def skip_groups(view: pd.DataFrame) -> list[tuple[str, int]]:
    """The reasons of the view's skipped rows, one entry per cause with the number of comparisons it skipped,
    most first: the per-fraction shortage of checkpoints is one cause (naming each fraction), a column note
    (``; not used ...``) is dropped, every other reason is its own cause."""
    skipped = view.loc[view["verdict"].astype(str).str.startswith("skipped"), "verdict"].astype(str)
    reasons = skipped.str.removeprefix("skipped: ").str.split("; not used").str[0]
    short = reasons.str.extract(TOO_FEW_CHECKPOINTS)
    found = short[0].notna()
    groups = [(reason, int(n)) for reason, n in reasons[~found].value_counts().items()]
    if found.any():
        seen = short[found].drop_duplicates().astype(float).sort_values(0)
        fractions = ", ".join(f"{100 * f:g}%" for f in seen[0])
        most = ", ".join(f"{int(m)}" for m in seen[1])
        groups.append((f"by {fractions} of training the runs have at most {most} checkpoints; a comparison needs "
                       f"{int(seen[2].max())}", int(found.sum())))  # fmt: skip
    return sorted(groups, key=lambda g: -g[1])


def remedy(params: dict, need_runs: int = 0) -> list[tuple[str, str]]:
    """The ``dvc exp run -S`` settings that make the verdict computable for the declared runs, each with why
    (``params``: the params snapshot the warehouse keeps in ``meta``); empty when the design allows it.

    - a checkpoint every ``train.ckpt_every`` steps must give :data:`MIN_CHECKPOINTS` by the first fraction
      (step 0 counts): the largest divisor of ``train.steps`` that does;
    - some scheme needs :data:`MIN_GROUPS` groups: seeds are added after the largest until there are as many;
    - ``need_runs``: the runs a comparison needs to pass the corrected level (verdict ``not enough runs``):
      seeds are added until the declared runs reach it.
    """
    train, fractions = params["train"], params["analysis"]["fractions"]
    steps, every, seeds = int(train["steps"]), int(train["ckpt_every"]), list(train["seeds"])
    settings = []
    cutoff = min(fractions) * steps
    if cutoff // every + 1 < MIN_CHECKPOINTS:
        fits = [d for d in range(1, steps + 1) if steps % d == 0 and cutoff // d + 1 >= MIN_CHECKPOINTS]
        when = f"by {100 * min(fractions):g}% of training"
        if fits:
            settings.append((f"train.ckpt_every={max(fits)}", f"{MIN_CHECKPOINTS} checkpoints {when}"))
        else:
            settings.append((f"train.steps={steps * MIN_CHECKPOINTS}", f"enough steps for a checkpoint {when}"))
    groups = {"seed": len(seeds), "variant": 1 + len(params.get("variants") or {}), "rung": len(params["ladder"])}
    per_seed = groups["variant"] * groups["rung"]
    wanted = max(MIN_GROUPS if max(groups.values()) < MIN_GROUPS else 0, -(-need_runs // per_seed))
    if wanted > len(seeds):
        more = seeds + [max(seeds) + i for i in range(1, wanted - len(seeds) + 1)]
        why = f"{wanted} seeds, {wanted * per_seed} runs: leave-one-seed-out"
        settings.append((f"'train.seeds=[{','.join(map(str, more))}]'", why))
    return settings


def runs_needed(n_tests: int, alpha: float) -> int:
    """The fewest paired runs whose smallest two-sided Wilcoxon p, 2^(1-n), can pass alpha / n_tests (the
    ``not enough runs`` rule of the ``topology_verdict`` view)."""
    n = 2
    while 2.0 ** (1 - n) >= alpha / max(n_tests, 1):
        n += 1
    return n
