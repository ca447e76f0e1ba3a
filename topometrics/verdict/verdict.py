"""Between-run incremental validity: does topology predict a run's final loss beyond its loss curve and weight norm?

Within one run everything that grows with training correlates with the loss, so the question is asked
*between* runs: do runs whose topology looks different end differently than what is known already says?

Every comparison predicts each run's final validation loss (as the drop from the last observed one)
with a base model and with the base plus a family of inputs (each feature's level and rate),
leave-one-group-out (groups: seed, recipe variant, rung); the test, its p-value and its bounds are
:mod:`topometrics.verdict.inference` (family orthogonalised on the base inside each training fold,
one-sided Clark-West statistic, p from refits with the family's rung x recipe cells permuted within
their rung, one-sided 95 % bounds with the cells as units). The comparisons (:func:`comparisons`):

- ``primary`` (role ``primary``): the pre-registered endpoint ``analysis.primary`` (its family or
  feature, fraction, scheme, level and baseline), judged alone at ``analysis.alpha``;
- each verdict family of kind topological against the baselines of :mod:`topometrics.verdict.baselines`:
  ``recipe`` (loss curve + weight norm + recipe) and ``recipe+<geometric family>`` (role ``topology``,
  exploratory: Holm-corrected together per scheme and level, and only they);
- context rows, uncorrected: the weight norm over the loss curve, the recipe over the norm, each other
  family over ``recipe``, the topological families over the older ``norm`` baselines, all of them together.
Each runs between cells and, leave-one-seed-out, within cells (``level``, :mod:`topometrics.verdict.levels`).

The verdict word (:func:`word`): ``adds`` needs the test (p below the level) *and* a minimum effect (a gain of
at least ``analysis.min_effect`` of the baseline MAE); ``hurts`` when the 95 % bound shows worse predictions
and the reverse one-sided test passes; ``ruled out (> X %)`` (for a linear use) when the upper bound on the
gain is within ``analysis.equivalence_margin`` of the baseline MAE; ``not enough runs`` when the smallest p
the permutations can give cannot pass the level; otherwise ``no evidence``. Each row also gives the seed-to-
seed SD of the final loss (the noise ceiling) and the share of run pairs each model orders correctly by final
loss, beside ranking by the current loss.

Anything that cannot be compared is a row with ``status = 'skipped'`` and its reason. Pure functions
over DataFrames.

Why over 400 lines: the comparisons and the words they earn are one definition (tests: ``inference``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from topometrics.params import AnalysisParams, ParamsError
from topometrics.verdict import baselines as declared
from topometrics.verdict import inference, levels
from topometrics.vocabulary import kind, lookup, run_level, verdict_families

# The baselines' columns, declared in topometrics.verdict.baselines (one table; these are its names here).
LOSS_INPUTS, NORM_INPUTS, GRAD_INPUTS = declared.LOSS, declared.NORM, declared.GRAD
RECIPE_INPUTS = declared.RECIPE_COLUMNS
BASE_CANDIDATES = declared.CURVE_CANDIDATES
SCHEMES = ("seed", "variant", "rung")  # leave-one-<scheme>-out; 'variant' only where runs have one
LEVELS, WITHIN_SCHEME = levels.LEVELS, levels.WITHIN_SCHEME
MIN_CHECKPOINTS = 4  # observed checkpoints a run needs at a fraction
MIN_GROUPS = 3  # groups a leave-one-group-out scheme needs
MIN_COVERAGE = 0.75  # share of runs in which an input column must be finite to be used
RUN_KEYS = ("rung", "seed", "variant")
NORM_BASELINE = "norm"  # the baseline "loss curve + weight norm" (context rows, and the outlier rows)
DEFAULT_BASELINE = declared.DEFAULT  # "loss curve + weight norm + recipe": every topology row's smaller model

VERDICT_COLUMNS = [
    "cv", "level", "fraction", "family", "comparison", "role", "baseline", "n", "n_cells", "n_groups", "mae_without",
    "mae_with", "delta_mae", "ci_low", "ci_high", "gain_share", "bound_share", "seed_sd", "decision_without",
    "decision_with", "decision_current", "n_outliers", "auroc_without", "auroc_with", "auroc_low", "auroc_high",
    "statistic", "p_value", "p_adjusted", "p_reverse", "min_p", "verdict", "status", "reason", "inputs",
]  # fmt: skip
ERROR_COLUMNS = [
    "cv", "level", "fraction", "family", "comparison", "rung", "seed", "variant", "actual", "predicted_without",
    "predicted_with", "error_without", "error_with",
]  # fmt: skip


def family_columns(families: dict[str, tuple[str, ...]] | None = None) -> dict[str, tuple[str, ...]]:
    """Input columns of every family: ``<feature>_level`` and ``<feature>_rate`` (see ``predict.window_summary``), or
    the feature itself for a summary of the run up to the cutoff (:func:`topometrics.vocabulary.run_level`)."""
    families = verdict_families() if families is None else families
    columns = lambda f: (f,) if run_level(f) else (f"{f}_level", f"{f}_rate")  # noqa: E731
    return {name: tuple(c for f in feats for c in columns(f)) for name, feats in families.items()}


def family_kind(features: tuple[str, ...]) -> str:
    """The kind shared by a family's features (:func:`topometrics.vocabulary.kind`), 'mixed' when they differ."""
    kinds = {kind(f) for f in features}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def baselines(families: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Baseline name -> its inputs (:mod:`topometrics.verdict.baselines`): ``recipe`` (loss curve + weight norm +
    recipe, the default) and ``norm`` (loss curve + weight norm), each alone and + each geometric verdict family."""
    cols = family_columns(families)
    geometric = [name for name, feats in families.items() if family_kind(feats) == "geometric"]
    out = {}
    for name in (DEFAULT_BASELINE, NORM_BASELINE):
        out |= {name: declared.columns(name)} | {f"{name}+{g}": declared.columns(name) + cols[g] for g in geometric}
    return out


def comparisons(families: dict[str, tuple[str, ...]] | None = None) -> list[dict]:
    """Every exploratory and context comparison: {family, comparison, role, baseline, base, extra}.

    Topology rows (exploratory, Holm) test each topological family over the default baseline and over it +
    each geometric family; the same families over the older ``norm`` baselines, the recipe over the norm, the
    weight norm over the loss curve, the other families and all topological families together are context."""
    families = verdict_families() if families is None else families
    cols, bases = family_columns(families), baselines(families)
    row = lambda fam, comp, role, base, extra: {  # noqa: E731
        "family": fam, "comparison": comp, "role": role, "baseline": base,
        "base": bases.get(base) or declared.columns(base), "extra": extra,
    }  # fmt: skip
    out = [row("weight_norm", "(2) vs (1)", "context", "loss", NORM_INPUTS)]
    out.append(row("recipe", f"recipe vs {NORM_BASELINE}", "context", NORM_BASELINE, RECIPE_INPUTS))
    topological = [name for name, feats in families.items() if family_kind(feats) == "topological"]
    out += [row(n, f"(3) vs {DEFAULT_BASELINE}", "context", DEFAULT_BASELINE, cols[n]) for n in families
            if n not in topological]  # fmt: skip
    current = [b for b in bases if b.partition("+")[0] == DEFAULT_BASELINE]
    out += [row(n, f"(3) vs {b}", "topology", b, cols[n]) for b in current for n in topological]
    out += [row(n, f"(3) vs {b}", "context", b, cols[n]) for b in bases if b not in current for n in topological]
    everything = tuple(c for n in topological for c in cols[n])
    return out + [row("everything", f"(4) vs {DEFAULT_BASELINE}", "context", DEFAULT_BASELINE, everything)]


def check_primary(
    params: AnalysisParams, families: dict[str, tuple[str, ...]] | None = None, computed: tuple[str, ...] | None = None
) -> None:
    """``analysis.primary``'s names against the vocabulary: a verdict family, whose features (<= 3 of them, or
    the whole family when it has <= 3) it names, and a declared baseline; else one :class:`ParamsError` line.
    With ``computed`` (``features.families``), also that the features stage computes what the endpoint and its
    baseline read: a family switched off has no values, and the sweep could not answer its own question."""
    p = params.primary
    if p is None:
        return
    families = verdict_families() if families is None else families
    read = [*(p.features or families.get(p.family, ())), *families.get(p.baseline.partition("+")[2], ())]
    off = sorted({lookup(f).family.name for f in read if lookup(f) and not run_level(f)} - set(computed or ()))
    problems = [
        (p.family not in families, f"family {p.family!r} is not a verdict family ({', '.join(families)})"),
        (not set(p.features) <= set(families.get(p.family, ())), f"features {list(p.features)} not all in {p.family}"),
        (len(p.features or families.get(p.family, ())) > 3, f"{p.family} has > 3 features: declare <= 3 in features"),
        (p.baseline not in baselines(families), f"baseline {p.baseline!r} is not one of {list(baselines(families))}"),
        (computed is not None and bool(off), f"it reads the families {off}, which features.families leaves out"),
    ]  # fmt: skip
    for bad, why in problems:
        if bad:
            raise ParamsError(f"analysis.primary: {why}; fix it in params.yaml before the sweep")


def primary_comparison(params: AnalysisParams, families: dict[str, tuple[str, ...]] | None = None) -> dict | None:
    """The pre-registered comparison of ``analysis.primary`` (None when none is declared)."""
    primary = params.primary
    if primary is None:
        return None
    families = verdict_families() if families is None else families
    features = primary.features or families.get(primary.family, ())
    extra = family_columns({primary.family: tuple(features)})[primary.family]
    base = baselines(families).get(primary.baseline, declared.columns(DEFAULT_BASELINE))
    spec = {"family": primary.family, "comparison": "primary", "role": "primary", "baseline": primary.baseline}
    return spec | {"base": base, "extra": extra}


def incremental_validity(
    inputs: pd.DataFrame,
    params: AnalysisParams,
    families: dict[str, tuple[str, ...]] | None = None,
    map_jobs: Callable[[Callable, list], list] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every comparison at every fraction and cross-validation scheme, with its verdict.

    Parameters
    ----------
    inputs : DataFrame
        One row per run and fraction: ``rung``, ``seed`` (and ``variant`` when runs have recipe
        variants), ``fraction``, ``n_seen`` (checkpoints observed), ``actual`` (final val loss),
        ``anchor`` (last observed val loss) and the input columns (:data:`LOSS_INPUTS`,
        :data:`NORM_INPUTS`, :func:`family_columns`); a missing column counts as all-NaN.
    params : the analysis params (``permutations``, ``seed``, ``alpha``, ``min_effect``,
        ``equivalence_margin``, ``primary``): params.yaml's ``analysis``
    families : family name -> layer-'all' feature names (default the vocabulary's, ``verdict_families()``)
    map_jobs : ``map_jobs(fn, jobs) -> [fn(job) for job in jobs]``: where the comparisons run (default here; the
        stage passes the execution seam's pool). A comparison depends only on its job: the same tables anywhere.

    Returns
    -------
    verdict : DataFrame with :data:`VERDICT_COLUMNS`, one row per scheme x fraction x comparison
    errors : DataFrame with :data:`ERROR_COLUMNS`, the paired per-run predictions behind each ok row
    """
    check_primary(params, families)
    rows, jobs = [], []
    plan, primary = comparisons(families), primary_comparison(params, families)
    for scheme in SCHEMES:
        for fraction, g in inputs.groupby("fraction", sort=True):
            for level in LEVELS if scheme == WITHIN_SCHEME else LEVELS[:1]:
                why = scheme_problem(g, scheme, fraction) if level == "between" else levels.within_problem(g, fraction)
                here = plan
                if primary and _is_primary(params.primary, scheme, level, fraction):
                    here = [primary, *plan]
                for spec in (s | {"permutations": _permutations(s, plan, inputs, params)} for s in here):
                    row = {"cv": scheme, "level": level, "fraction": float(fraction)}
                    rows.append(row | {k: spec[k] for k in VERDICT_COLUMNS if k in spec})
                    if why is not None:
                        rows[-1] |= {"n": 0, "status": "skipped", "reason": why}
                        continue
                    jobs.append((len(rows) - 1, (g, scheme, spec, params, level)))
    todo = [job for _, job in jobs]
    results = map_jobs(compare, todo) if map_jobs else [compare(job) for job in todo]
    errors = []
    for (i, _), (result, errs) in zip(jobs, results, strict=True):
        rows[i] |= result
        keys = {k: rows[i][k] for k in ("cv", "level", "fraction", "family", "comparison")}
        errors += [e | keys for e in errs]
    verdict = pd.DataFrame(rows, columns=VERDICT_COLUMNS)
    return judge(verdict, params), pd.DataFrame(errors, columns=ERROR_COLUMNS)


def _is_primary(primary, scheme: str, level: str, fraction: float) -> bool:
    """Whether this scheme, level and fraction are the pre-registered endpoint's (its within-cell test runs
    under :data:`WITHIN_SCHEME` whatever its ``cv``)."""
    at = WITHIN_SCHEME if primary.level == "within" else primary.cv
    return scheme == at and level == primary.level and math.isclose(fraction, primary.fraction)


def _permutations(spec: dict, plan: list[dict], inputs: pd.DataFrame, params: AnalysisParams) -> int:
    """Refits for a row: ``analysis.permutations``, raised for topology rows until Holm's first level
    alpha / m (m = topology rows of a scheme) is reachable: 2 m / alpha - 1."""
    if spec["role"] != "topology":
        return params.permutations
    m = sum(c["role"] == "topology" for c in plan) * inputs["fraction"].nunique()
    return max(params.permutations, math.ceil(2 * m / params.alpha) - 1)


def judge(verdict: pd.DataFrame, params: AnalysisParams) -> pd.DataFrame:
    """``p_adjusted`` (Holm over the ok ``topology`` rows of each scheme; the others as they are) and ``verdict``."""
    out = verdict.copy()
    out["p_adjusted"] = out["p_value"].astype(float)
    level = pd.Series(params.alpha, index=out.index)
    tested = out[(out["role"] == "topology") & (out["status"] == "ok")]
    level_of = out["level"].fillna("between") if "level" in out else pd.Series("between", index=out.index)
    for _, idx in tested.groupby(["cv", level_of]).groups.items():
        out.loc[idx, "p_adjusted"] = inference.holm(out.loc[idx, "p_value"].to_numpy(float))
        level[idx] = params.alpha / len(idx)  # Holm's first step: the level the smallest p must pass
    out["verdict"] = [
        word(r, r["p_adjusted"], params.alpha, params.equivalence_margin, params.min_effect, level[i])
        if r["status"] == "ok"
        else f"skipped: {r['reason'] or 'no reason recorded'}"
        for i, r in out.iterrows()
    ]
    return out


def word(row, p: float, alpha: float, margin: float, min_effect: float, level: float | None = None) -> str:
    """The verdict of one tested comparison (``row``: :func:`summarise`'s keys; ``p``: its p-value, adjusted
    where it is exploratory; ``level``: the smallest level a p must pass, default ``alpha``).

    ``hurts`` needs the 95 % bound to show worse predictions *and* the reverse one-sided test (``p_reverse``:
    the family's contribution points away from the base's error more than a permuted family's) to pass
    ``level``; a family that only adds noise makes the larger model worse by construction, which is
    ``no evidence``, not harm."""
    level = alpha if level is None else level
    if not row["min_p"] < level:
        return f"not enough runs (n={int(row['n'])}, {int(row['n_cells'])} cells)"
    if p < alpha and row["gain_share"] >= min_effect:
        return "adds"
    if row["ci_low"] > 0:
        reverse = row.get("p_reverse", np.nan)
        return "hurts" if reverse is not None and reverse < level else "no evidence"
    if row["bound_share"] <= margin:
        return f"ruled out (> {100 * max(row['bound_share'], 0.0):.1f} %)"
    return "no evidence"


def summarise(y: np.ndarray, test: inference.FamilyTest, cells, actual=None, current=None, within=False) -> dict:
    """MAEs, delta MAE (with - without, nats) and its one-sided 95 % bounds over cells, the gain and its upper
    bound as shares of the baseline MAE, the smallest p the permutations can give, and (given the final
    losses ``actual`` and the current losses ``current``) the share of run pairs each model orders right:
    pairs of different cells, or with ``within`` pairs of the same cell."""
    e_wo, e_w = np.abs(y - test.without), np.abs(y - test.with_)
    paired = np.isfinite(e_wo) & np.isfinite(e_w)
    cells = np.asarray(cells)[paired]
    delta, low, high, n_cells = inference.cell_bounds(e_w[paired] - e_wo[paired], cells)
    mae = float(e_wo[paired].mean()) if paired.any() else np.nan
    out = {"n": int(paired.sum()), "n_cells": n_cells, "mae_without": mae, "mae_with": float(np.mean(e_w[paired]))}
    out |= {"delta_mae": delta, "ci_low": low, "ci_high": high, "gain_share": -delta / mae, "bound_share": -low / mae}
    out |= {"statistic": test.statistic, "p_value": test.p_value, "p_reverse": test.p_reverse}
    out["min_p"] = test.min_p
    if actual is not None:
        final = np.asarray(actual, float)[paired]
        start = final - y[paired]  # the anchor (between), the anchor + the cell's mean drop (within)
        order = lambda predicted: inference.pair_agreement(predicted, final, cells, within)  # noqa: E731
        out |= {"decision_without": order(start + test.without[paired])}
        out |= {"decision_with": order(start + test.with_[paired])}
        out |= {"decision_current": order(np.asarray(current, float)[paired])}
    return out


def seed_sd(g: pd.DataFrame) -> float:
    """Pooled within-cell (rung x recipe) SD of the final loss: how far seeds alone move it (nats)."""
    cells = _cells(g)
    dev = g["actual"].to_numpy(float) - g.groupby(cells)["actual"].transform("mean").to_numpy(float)
    dof = len(g) - cells.nunique()
    return float(np.sqrt(np.nansum(dev**2) / dof)) if dof > 0 else np.nan


_cells = levels.cells  # a run's rung x recipe cell label


def scheme_problem(g: pd.DataFrame, scheme: str, fraction: float) -> str | None:
    """Why no comparison can run for this scheme and fraction (None when they can)."""
    seen = g["n_seen"].to_numpy(float) if "n_seen" in g else np.zeros(len(g))
    if len(g) == 0 or np.nanmax(seen, initial=0) < MIN_CHECKPOINTS:
        most = int(np.nanmax(seen, initial=0))
        return f"fraction {fraction:g} observes at most {most} checkpoints per run; need {MIN_CHECKPOINTS}"
    if scheme not in g or g[scheme].isna().all():
        return f"runs have no {scheme} column" + (" (a single recipe)" if scheme == "variant" else "")
    groups = g.loc[seen >= MIN_CHECKPOINTS, scheme].nunique()
    if groups < MIN_GROUPS:
        return f"leave-one-{scheme}-out needs at least {MIN_GROUPS} {scheme}s, got {groups}"
    return None


def curve_extras(g: pd.DataFrame, base_cols: list[str]) -> list[str]:
    """The loss-curve base's further candidates (the rank of the current loss, the gradient-norm statistics)
    usable in ``g`` and not already among ``base_cols``."""
    return usable_columns(g, tuple(c for c in ("loss_rank", *GRAD_INPUTS) if c in g and c not in base_cols))[0]


def usable_columns(g: pd.DataFrame, columns: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The columns finite in at least :data:`MIN_COVERAGE` of the rows of ``g``, and the others."""
    keep, dropped = [], []
    for c in columns:
        share = np.isfinite(g[c].to_numpy(float)).mean() if c in g and len(g) else 0.0
        (keep if share >= MIN_COVERAGE and share > 0 else dropped).append(c)
    return keep, dropped


def compare(job: tuple) -> tuple[dict, list[dict]]:
    """One comparison's numbers and per-run predictions; ``job``: (inputs at one fraction, scheme, spec, params,
    level), a pool's job. ``level`` 'within': cell means removed, one-seed cells left out, seeds shuffled."""
    g, scheme, spec, params, level = job
    g = g[g["n_seen"] >= MIN_CHECKPOINTS].reset_index(drop=True)
    base_cols, base_dropped = usable_columns(g, spec["base"])
    extra_cols, extra_dropped = usable_columns(g, spec["extra"])
    note = _dropped_note(base_dropped + extra_dropped)
    if not base_cols:
        return {"n": 0, "status": "skipped", "reason": "no usable inputs of the smaller model" + note}, []
    if not extra_cols:
        return {"n": 0, "status": "skipped", "reason": f"family {spec['family']} has no usable values" + note}, []
    known = {c for part in declared.PARTS for c in part.columns}
    geometric = [c for c in spec["base"] if c not in known]  # a <baseline>+<family> baseline's own columns
    if geometric and not set(geometric) & set(base_cols):  # else it would silently be the plain baseline
        return {"n": 0, "status": "skipped", "reason": f"baseline {spec['baseline']} has no usable values" + note}, []
    if set(LOSS_INPUTS) <= set(spec["base"]):  # the loss-curve part is chosen among BASE_CANDIDATES
        base_cols += curve_extras(g, base_cols)
    g, base_cols = declared.flexible_basis(g, base_cols)
    both = base_cols + extra_cols
    target = (g["actual"] - g["anchor"]).to_numpy(float)
    usable = np.isfinite(g[both].to_numpy(float)).all(axis=1) & np.isfinite(target)
    sub = g[usable].reset_index(drop=True)
    y, base_x, extra_x = target[usable], sub[base_cols].to_numpy(float), sub[extra_cols].to_numpy(float)
    groups, within = sub[scheme].to_numpy(), level == "within"
    if within:  # which seed of a cell ends better: only the deviations from the cell's means
        sub, (y, base_x, extra_x), groups = levels.within_cells(sub, y, base_x, extra_x)
    n_groups = len(np.unique(groups))
    if n_groups < (2 if within else MIN_GROUPS):
        why = f"{len(sub)} runs with every input span {n_groups} {scheme}s; need {2 if within else MIN_GROUPS}"
        return {"n": len(sub), "n_groups": n_groups, "status": "skipped", "reason": why + note}, []
    cells = _cells(sub).to_numpy()
    labels = inference.RunLabels(groups, sub["rung"].astype(str).to_numpy(), cells, sub["seed"].to_numpy())
    refits = inference.Refits(spec["permutations"], params.seed, stop=10)
    test = inference.family_test(base_x, extra_x, y, labels, refits, base_candidates(base_cols), within=within)
    actual = sub["actual"].to_numpy(float)
    result = summarise(y, test, cells, actual, sub["anchor"].to_numpy(float), within)
    result |= {"n_groups": n_groups, "seed_sd": seed_sd(sub), "inputs": ",".join(both)}
    if result["n"] < 2 or result["n_cells"] < 2:
        why = f"{result['n']} runs in {result['n_cells']} cells predicted by both models; need 2 cells"
        return result | {"status": "skipped", "reason": why + note}, []
    result |= {"status": "ok", "reason": note.removeprefix("; ") or None}
    keys = [k for k in RUN_KEYS if k in sub]
    start = actual - y  # the anchor (between), the anchor + the cell's mean drop (within)
    errs = [
        {k: sub.at[i, k] for k in keys}
        | {"actual": actual[i], "predicted_without": start[i] + test.without[i]}
        | {"predicted_with": start[i] + test.with_[i]}
        | {"error_without": abs(test.without[i] - y[i]), "error_with": abs(test.with_[i] - y[i])}
        for i in np.flatnonzero(np.isfinite(test.without) & np.isfinite(test.with_))
    ]
    return result, errs


def base_candidates(base_cols: list[str]) -> list[list[int]] | None:
    """Column indices of each usable :data:`BASE_CANDIDATES` entry plus every non-loss base column (norm,
    geometric family); None (one model of every column) when the base has no loss-curve part."""
    curve = set(declared.CURVE)
    always = [i for i, c in enumerate(base_cols) if c not in curve]
    if len(always) == len(base_cols):
        return None
    found = []
    for candidate in BASE_CANDIDATES:
        cols = [base_cols.index(c) for c in candidate if c in base_cols]
        if len(cols) == len(candidate) and sorted(cols + always) not in found:
            found.append(sorted(cols + always))
    return found


def _dropped_note(dropped: list[str]) -> str:
    if not dropped:
        return ""
    return f"; not used (finite in < {MIN_COVERAGE:.0%} of runs): {', '.join(dropped)}"


HEADLINE_FAMILY = "everything"  # without a primary endpoint: every topological family together


def headline_scheme(view: pd.DataFrame) -> str | None:
    """The scheme the answer leads with: the primary endpoint's when it has a row, else the first of
    :data:`SCHEMES` (seeds, recipe variants, rungs: the nearest runs first) with a comparison that was not
    skipped; None when all were."""
    tested = view[~view["verdict"].astype(str).str.startswith("skipped")]
    primary = view[view["role"] == "primary"] if "role" in view else view.iloc[:0]
    if len(primary):
        return str(primary["cv"].iloc[0])
    return next((s for s in SCHEMES if (tested["cv"] == s).any()), None)


def verdict_metrics(view: pd.DataFrame) -> dict:
    """The headline of the ``topology_verdict`` view as the ``verdict`` entry of ``reports/metrics.json``:
    ``primary: {family, fraction, verdict, delta_mae, gain_share, bound_share, p_value, n}`` when an endpoint
    was declared, then ``{cv, f<percent>: {verdict, delta_mae, n}}`` (exploratory), the
    :data:`HEADLINE_FAMILY` row of each fraction of the :func:`headline_scheme`."""
    if view.empty:
        return {"cv": "none"}
    out: dict = {}
    primary = view[view["role"] == "primary"] if "role" in view else view.iloc[:0]
    for r in primary.itertuples(index=False):
        entry = {"family": r.family, "fraction": float(r.fraction), "cv": r.cv, "verdict": str(r.verdict)}
        entry["level"] = str(getattr(r, "level", None) or "between")
        for key in ("delta_mae", "gain_share", "bound_share", "p_value"):
            value = getattr(r, key)
            entry[key] = float(f"{float(value):.6g}") if pd.notna(value) else None
        out["primary"] = entry | {"n": int(r.n)}
    scheme = headline_scheme(view)
    between = view["level"].fillna("between") == "between" if "level" in view else True
    rows = view[(view["cv"] == (scheme or view["cv"].iloc[0])) & (view["family"] == HEADLINE_FAMILY) & between]
    out["cv"] = scheme or "none"
    for r in rows.sort_values("fraction").itertuples(index=False):
        word = str(r.verdict).split(":")[0]  # 'skipped: <reason>' -> 'skipped' (the report says why)
        entry = {"verdict": word}
        if scheme is not None and pd.notna(r.delta_mae):
            entry |= {"delta_mae": float(f"{float(r.delta_mae):.6g}"), "n": int(r.n)}
        out[f"f{round(100 * r.fraction):02d}"] = entry
    return out
