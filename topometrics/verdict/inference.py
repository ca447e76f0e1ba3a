"""The verdict's test: does a family of inputs improve a cross-validated prediction beyond a base model?

For one comparison (base inputs, added inputs, target, run layout):

1. :func:`nested_cross_validate`: leave-one-group-out. Inside each training fold, a standardised ridge on
   the base (penalty chosen by leave-one-*group*-out over the training groups, never leave-one-run-out,
   so runs that share a group cannot vouch for each other's penalty); the added columns are
   orthogonalised on the base by least squares on the training rows (Frisch-Waugh-Lovell: an input that
   co-varies with the base keeps its full coefficient instead of being shrunk), and a second ridge of
   those orthogonal parts is fitted to the base's training residuals.
2. :func:`clark_west`: the one-sided Clark-West statistic, the mean over runs of
   ``2 e_without (pred_with - pred_without)`` (nats^2; > 0: the family's out-of-fold contribution points
   at the base's out-of-fold error). For nested models it is the MSE difference corrected for the noise
   the larger model adds under the null.
3. :func:`family_test`: its p-value from refits with the family's rung x recipe *cells* permuted as
   blocks within their rung (each run keeps its seed, :func:`cell_permutation`): exact, up to Monte
   Carlo error, under the null that the family may mark a cell but does not predict its loss.
4. :func:`cell_bounds`: one-sided 95 % bounds on the change in MAE with the cells as the
   units (runs of one cell share a residual and are not independent).

Pure numpy; shapes are (n_runs,) and (n_runs, n_columns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

BASE_ALPHAS = np.logspace(-3, 3, 13)  # penalties of the base ridge (standardised inputs)
FAMILY_ALPHAS = np.logspace(-3, 6, 19)  # penalties of the added family's ridge: up to "no contribution"
REFIT_STACK = 32  # permutation refits fitted together (an early stop wastes at most this many less one)
TIE = 1e-7  # a refit's statistic within TIE x the base's mean squared error of the observed one ties with it


def _standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both standardised by ``train``'s column means and SDs over its rows (axis -2: (n, k) or (P, n, k))."""
    mean, sd = train.mean(axis=-2, keepdims=True), train.std(axis=-2, keepdims=True)
    sd = np.where(sd > 1e-12 * np.maximum(np.abs(mean), 1.0), sd, np.inf)  # a constant column contributes 0
    return (train - mean) / sd, (test - mean) / sd


def _ridge_paths(x: np.ndarray, y: np.ndarray, x_new: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """Predictions at ``x_new`` of centred ridges fitted on (x, y), one row per penalty: (n_alphas, n_new)."""
    xm, ym = x.mean(axis=0), y.mean()
    u, s, vt = np.linalg.svd(x - xm, full_matrices=False)
    shrink = s / (s**2 + alphas[:, None])  # (n_alphas, rank)
    proj = (x_new - xm) @ vt.T  # (n_new, rank)
    return ym + (proj * shrink[:, None, :]) @ (u.T @ (y - ym))


def ridge_predict(x: np.ndarray, y: np.ndarray, x_new: np.ndarray, alphas: np.ndarray, groups) -> np.ndarray:
    """A standardised ridge fitted on (x, y) predicting ``x_new``, its penalty chosen by leave-one-group-out
    squared error over ``groups`` (the training rows' groups; leave-one-row-out when fewer than 3 groups).

    ``x`` (n, k) and ``x_new`` (n_new, k) give (n_new,) by :func:`_ridge_paths`; a stack ``x`` (P, n, k) and
    ``x_new`` (P, n_new, k) with the one ``y`` (n,) give (P, n_new) by :func:`_ridge_paths_stack`, each design
    with its own penalty (the permutation refits of one fold)."""
    paths = _ridge_paths_stack if x.ndim == 3 else _ridge_paths
    xs, xs_new = _standardise(x, x_new)
    groups = np.asarray(groups)
    labels = np.unique(groups)
    if len(labels) < 3:
        labels, groups = np.arange(len(y)), np.arange(len(y))
    sse = np.zeros((*x.shape[:-2], len(alphas)))
    for held in labels:
        test = groups == held
        if (~test).sum() < 2:
            continue
        sse += ((paths(xs[..., ~test, :], y[~test], xs[..., test, :], alphas) - y[test]) ** 2).sum(axis=-1)
    best = alphas[np.argmin(sse, axis=-1)][..., None]  # (1,) or (P, 1)
    return paths(xs, y, xs_new, best)[..., 0, :]


def _ridge_paths_stack(x: np.ndarray, y: np.ndarray, x_new: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """:func:`_ridge_paths` of P designs at once (:func:`ridge_predict` of a stack): ``x`` (P, n, k),
    ``x_new`` (P, n_new, k), one ``y`` (n,); ``alphas`` (n_alphas,) shared, or (P, 1) one per design. Returns
    (P, n_alphas, n_new) (n_alphas 1 for the latter).

    From the eigenpairs (λ, v) of each centred design's k x k Gram matrix instead of its SVD: the ridge's
    fit ``x_new v diag(1 / (λ + α)) vᵀ xᵀ y`` is the SVD's ``diag(s / (s² + α)) uᵀ y`` with s² = λ, and a k x k
    eigenproblem costs a fraction of an n x k SVD (which was nine tenths of a permutation refit). Squaring the
    design squares its condition number: on standardised columns (λ ≤ n) with α ≥ 1e-3 the predictions agree
    with :func:`_ridge_paths` to about 1e-10 relative (tested); a direction with λ ≈ 0 has vᵀxᵀy ≈ 0 and adds
    nothing, as the SVD's zero singular values do."""
    xm, ym = x.mean(axis=1, keepdims=True), y.mean()
    centred = x - xm
    lam, v = np.linalg.eigh(centred.transpose(0, 2, 1) @ centred)  # (P, k), (P, k, k)
    alphas = alphas[None, :, None] if alphas.ndim == 1 else alphas[:, :, None]
    weight = 1.0 / (np.maximum(lam, 0.0)[:, None, :] + alphas)  # (P, n_alphas, k)
    fitted = np.einsum("pkr,pk->pr", v, np.einsum("pnk,n->pk", centred, y - ym))  # vᵀ xᵀ (y - ym): (P, k)
    coef = (weight * fitted[:, None, :]) @ v.transpose(0, 2, 1)  # (P, n_alphas, k): each penalty's coefficients
    return ym + coef @ (x_new - xm).transpose(0, 2, 1)


def orthogonalise(extra: np.ndarray, design: np.ndarray, train: np.ndarray) -> np.ndarray:
    """``extra`` (n, k) less its least-squares fit on ``design`` (n, 1 + base columns: [1, base]) over the
    ``train`` rows (a boolean (n,) mask), applied to every row."""
    coef, *_ = np.linalg.lstsq(design[train], extra[train], rcond=None)
    return extra - design @ coef


@dataclass(frozen=True)
class Folds:
    """The base model's out-of-fold predictions and, per fold, what the family's refits reuse."""

    without: np.ndarray  # (n,) out-of-fold predictions of the base model (NaN where a fold could not fit)
    folds: tuple  # (test mask, train mask, in-sample base residual on train, design [1, base]) per fold


def base_folds(base: np.ndarray, y: np.ndarray, groups, candidates=None) -> Folds:
    """Leave-one-group-out fits of the base ridge (a group whose complement has < 3 runs stays NaN).

    ``candidates``: column-index lists of ``base``, the alternative base models; inside each training fold
    the one with the smallest leave-one-group-out error over the training groups is fitted (default: one
    candidate, every column). A candidate with no columns predicts the training mean.
    """
    groups = np.asarray(groups)
    candidates = [list(range(base.shape[1]))] if candidates is None else [list(c) for c in candidates]
    without = np.full(len(y), np.nan)
    folds = []
    for held in np.unique(groups):
        test, train = groups == held, groups != held
        if train.sum() < 3:
            continue
        cols = min(candidates, key=lambda c: _inner_error(base[train][:, c], y[train], groups[train]))
        fitted = _fit_base(base[train][:, cols], y[train], base[:, cols], groups[train])
        without[test] = fitted[test]
        folds.append((test, train, y[train] - fitted[train], np.column_stack([np.ones(len(y)), base[:, cols]])))
    return Folds(without, tuple(folds))


_RECENT_FOLDS: dict[tuple, Folds] = {}  # shared_base_folds' last few fits, oldest first
RECENT_FOLDS = 16


def shared_base_folds(base: np.ndarray, y: np.ndarray, groups, candidates=None) -> Folds:
    """:func:`base_folds`, fitted once for the same base, target, groups and candidates (compared by value)
    among the last :data:`RECENT_FOLDS` asked for: every family of a scheme, fraction and level is tested
    against the same base on the same runs, and its choice among the candidates, leave-one-group-out inside
    each fold, was four tenths of a verdict's time. The Folds returned are shared: read, never written."""
    key = (base.shape, base.tobytes(), y.tobytes(), tuple(np.asarray(groups).tolist()), repr(candidates))
    if key not in _RECENT_FOLDS:
        if len(_RECENT_FOLDS) >= RECENT_FOLDS:
            _RECENT_FOLDS.pop(next(iter(_RECENT_FOLDS)))
        _RECENT_FOLDS[key] = base_folds(base, y, groups, candidates)
    return _RECENT_FOLDS[key]


def _fit_base(x: np.ndarray, y: np.ndarray, x_new: np.ndarray, groups) -> np.ndarray:
    if x.shape[1] == 0:
        return np.full(len(x_new), y.mean())
    return ridge_predict(x, y, x_new, BASE_ALPHAS, groups)


def _inner_error(x: np.ndarray, y: np.ndarray, groups) -> float:
    """Leave-one-group-out squared error of the base ridge on ``x`` (the candidate's score; inf when the
    training rows span fewer than 3 groups: 0, so the first candidate wins)."""
    labels = np.unique(groups)
    if len(labels) < 3 or len(y) < 4:
        return 0.0
    return float(sum(np.sum((_fit_base(x[groups != g], y[groups != g], x[groups == g], groups[groups != g])
                             - y[groups == g]) ** 2) for g in labels))  # fmt: skip


def with_family(folds: Folds, extra: np.ndarray, groups) -> np.ndarray:
    """Out-of-fold predictions of the base plus the family (orthogonalised on the base inside each fold).

    ``extra`` (n, k) gives (n,); a stack (P, n, k) (the permutation refits: one family's rows in P orders)
    gives (P, n). The base's folds are shared; each fold orthogonalises every family on its design in one
    least-squares solve (the design's factorisation shared by every right-hand side) and fits the ridges of a
    stack by stacked k x k eigenproblems (:func:`ridge_predict`), so a refit costs array work instead of a
    Python loop of small LAPACK calls: equal to P calls on one family to about 1e-10 relative."""
    groups = np.asarray(groups)
    extras = extra if extra.ndim == 3 else extra[None]
    n_stack, n, k = extras.shape
    out = np.full((n_stack, n), np.nan)
    columns = extras.transpose(1, 0, 2).reshape(n, n_stack * k)  # (n, P k): every family's columns side by side
    for test, train, residual, design in folds.folds:
        ortho = orthogonalise(columns, design, train).reshape(n, n_stack, k).transpose(1, 0, 2)
        ortho = ortho if extra.ndim == 3 else ortho[0]
        added = ridge_predict(ortho[..., train, :], residual, ortho[..., test, :], FAMILY_ALPHAS, groups[train])
        out[:, test] = folds.without[test] + added
    return out if extra.ndim == 3 else out[0]


def nested_cross_validate(base: np.ndarray, extra: np.ndarray, y: np.ndarray, groups) -> dict[str, np.ndarray]:
    """Leave-one-group-out predictions ``without`` (base ridge) and ``with`` (+ the orthogonalised family)."""
    folds = base_folds(np.asarray(base, float), np.asarray(y, float), groups)
    return {"without": folds.without, "with": with_family(folds, np.asarray(extra, float), groups)}


def clark_west(y: np.ndarray, without: np.ndarray, with_: np.ndarray) -> float:
    """Mean of ``2 (y - without)(with - without)`` over the finite runs (> 0: the family helps)."""
    term = 2 * (y - without) * (with_ - without)
    term = term[np.isfinite(term)]
    return float(term.mean()) if len(term) else np.nan


def cell_permutation(rungs, cells, seeds, rng: np.random.Generator) -> np.ndarray:
    """Row indices that give every run the family of the same-seed run of another cell of its rung.

    Cells are permuted as blocks within each rung. A run whose seed the source cell lacks takes that cell's
    run of the same rank (runs sorted by seed). A rung with a single cell keeps its rows.
    """
    rungs, cells, seeds = np.asarray(rungs), np.asarray(cells), np.asarray(seeds)
    index = np.arange(len(rungs))
    for rung in np.unique(rungs):
        names = np.unique(cells[rungs == rung])
        if len(names) < 2:
            continue
        members = {c: index[(rungs == rung) & (cells == c)] for c in names}
        members = {c: m[np.argsort(seeds[m], kind="stable")] for c, m in members.items()}
        for target, source in zip(names, rng.permutation(names), strict=True):
            dest, src = members[target], members[source]
            index[dest] = src[np.arange(len(dest)) % len(src)]
    return index


def within_cell_permutation(cells, rng: np.random.Generator) -> np.ndarray:
    """Row indices that shuffle the runs of each cell among themselves (a cell of one run keeps its row): the
    within-cell test's null, that a family does not tell which seed of a recipe ends better."""
    cells = np.asarray(cells)
    index = np.arange(len(cells))
    for label in np.unique(cells):
        members = index[cells == label]
        index[members] = rng.permutation(members)
    return index


def distinct_within(cells) -> int:
    """How many distinct within-cell shuffles exist: the product over cells of (runs in the cell)!."""
    _, counts = np.unique(np.asarray(cells), return_counts=True)
    return int(np.prod([math.factorial(int(c)) for c in counts], dtype=object))


def distinct_permutations(rungs, cells) -> int:
    """How many distinct cell-block permutations exist: the product over rungs of (cells in the rung)!."""
    rungs, cells = np.asarray(rungs), np.asarray(cells)
    count = 1
    for rung in np.unique(rungs):
        count *= int(np.prod(np.arange(1, len(np.unique(cells[rungs == rung])) + 1)))
    return count


@dataclass(frozen=True)
class FamilyTest:
    """One comparison: out-of-fold predictions, the Clark-West statistic and its cell-permutation p."""

    without: np.ndarray
    with_: np.ndarray
    statistic: float  # Clark-West mean, nats^2
    p_value: float  # one-sided, (1 + #{permuted >= observed}) / (1 + permutations done)
    n_perm: int  # permutations done
    min_p: float  # the smallest p this design can give: max(1 / (1 + n_perm), 1 / distinct permutations)
    p_reverse: float = np.nan  # the reverse one-sided p, (1 + #{permuted <= observed}) / (1 + done): a family
    # whose contribution points *away* from the base's error more than a permuted one's does


@dataclass(frozen=True)
class RunLabels:
    """The per-run labels of a sweep, each an array of shape (n_runs,): who may vouch for whom in a fold, and
    what a permutation refit may move where."""

    groups: np.ndarray  # cross-validation groups: a fold leaves one out (seed, recipe or rung)
    rungs: np.ndarray  # size rung: cell blocks are permuted within it
    cells: np.ndarray  # rung x recipe label: the runs that differ only by seed
    seeds: np.ndarray  # seed: pairs a run with its same-seed run of another cell


@dataclass(frozen=True)
class Refits:
    """The permutation refits behind a p-value: at most ``n_perm`` of them, drawn from ``seed``; ``stop`` > 0
    ends them early (Besag & Clifford 1991) once ``stop`` reach the observed statistic (and, in a two-tailed
    count, ``stop`` fall at or below it); 0 runs them all."""

    n_perm: int = 99
    seed: int = 0
    stop: int = 0


def family_test(
    base, extra, y, labels: RunLabels, refits: Refits = Refits(), candidates=None, within: bool = False
) -> FamilyTest:
    """The Clark-West statistic of ``extra`` over ``base`` and its p from up to ``refits.n_perm`` cell-block
    refits. ``base`` (n_runs, n_base), ``extra`` (n_runs, n_extra), ``y`` (n_runs,) in nats; ``labels``: the
    runs' cross-validation groups, rungs, cells and seeds.

    ``within``: the refits shuffle the family among the runs of each cell (:func:`within_cell_permutation`,
    the within-cell question) instead of permuting cells as blocks within their rung (the between-cell one).

    ``refits.stop`` > 0: sequential (Besag & Clifford 1991): the refits end once ``stop`` of them reach the
    observed statistic *and* ``stop`` fall at or below it, with p = hits / refits done, so a family far from
    significance in both directions costs few refits while one near either tail gets all ``n_perm`` (the
    smallest p stays 1 / (1 + n_perm)). The reverse p (``p_reverse``) is the lower tail of the same refits.

    The base fits (the candidate chosen per fold, see :func:`base_folds`) are shared by every refit (only
    the family moves). Rows must be complete (no NaN).
    """
    groups, rungs, cells, seeds = labels.groups, labels.rungs, labels.cells, labels.seeds
    n_perm, stop = refits.n_perm, refits.stop
    base, extra, y = (np.asarray(a, float) for a in (base, extra, y))
    folds = shared_base_folds(base, y, groups, candidates)
    with_ = with_family(folds, extra, groups)
    observed = clark_west(y, folds.without, with_)
    rng = np.random.default_rng(refits.seed)
    distinct = distinct_within(cells) if within else distinct_permutations(rungs, cells)
    min_p = max(1 / (1 + max(n_perm, 0)), 1 / distinct)
    if n_perm < 1 or not np.isfinite(observed) or min_p >= 1.0:  # nothing to permute: no p
        return FamilyTest(folds.without.copy(), with_, observed, np.nan, 0, min_p)
    # a refit within TIE of the base's MSE of the observed statistic ties with it: the refits' fits take another
    # route than the observed one's (equal to ~1e-10), and an identity permutation must still reach it
    tie = TIE * float(np.nanmean((y - folds.without) ** 2))
    hits = low = done = 0

    def draw():
        return within_cell_permutation(cells, rng) if within else cell_permutation(rungs, cells, seeds, rng)

    for refit in stacked_refits(folds, extra, groups, draw, n_perm):
        moved = clark_west(y, folds.without, refit)
        hits += moved >= observed - tie
        low += moved <= observed + tie
        done += 1
        if stop and hits >= stop and low >= stop:
            return FamilyTest(folds.without.copy(), with_, observed, hits / done, done, min_p, low / done)
    return FamilyTest(folds.without.copy(), with_, observed, (1 + hits) / (1 + done), done, min_p,
                      (1 + low) / (1 + done))  # fmt: skip


def stacked_refits(folds: Folds, extra: np.ndarray, groups, draw, n_perm: int):
    """The ``n_perm`` refits of :func:`with_family` with ``extra``'s rows in the orders ``draw()`` gives, one
    (n,) prediction at a time, fitted :data:`REFIT_STACK` at a time: the same draws in the same order as one
    refit at a time (a stack's draws past a caller's early stop are never used), the Python work per stack."""
    done = 0
    while done < n_perm:
        size = min(REFIT_STACK, n_perm - done)
        yield from with_family(folds, extra[np.array([draw() for _ in range(size)])], groups)
        done += size


def cell_bounds(difference, cells, level: float = 0.95) -> tuple[float, float, float, int]:
    """Mean over runs of the per-run ``difference`` and its one-sided ``level`` lower and upper bounds, with the
    cells as the units: (mean, lower, upper, cells). The bounds are a Student t interval over the cell means
    (each cell's runs averaged first) centred on the run mean; NaN bounds with fewer than 2 cells."""
    difference, cells = np.asarray(difference, float), np.asarray(cells)
    keep = np.isfinite(difference)
    if not keep.any():
        return np.nan, np.nan, np.nan, 0
    means = np.array([difference[keep & (cells == c)].mean() for c in np.unique(cells[keep])])
    mean = float(difference[keep].mean())
    if len(means) < 2:
        return mean, np.nan, np.nan, len(means)
    half = float(stats.t.ppf(level, len(means) - 1) * means.std(ddof=1) / np.sqrt(len(means)))
    return mean, mean - half, mean + half, len(means)


def pair_agreement(predicted: np.ndarray, actual: np.ndarray, cells=None, within: bool = False) -> float:
    """Share of run pairs (with different final losses) that ``predicted`` orders as ``actual`` does; with
    ``cells``, only the pairs of different cells (``within`` False: which recipe/size ends better) or of the
    same cell (``within`` True: which seed of a recipe ends better)."""
    i, j = np.triu_indices(len(actual), k=1)
    differ = actual[i] != actual[j]
    if cells is not None:
        cells = np.asarray(cells)
        differ &= (cells[i] == cells[j]) if within else (cells[i] != cells[j])
    if not differ.any():
        return np.nan
    return float(np.mean(np.sign(predicted[i] - predicted[j])[differ] == np.sign(actual[i] - actual[j])[differ]))


def holm(p_values) -> np.ndarray:
    """Holm step-down adjusted p-values over the finite ones: max over j <= rank of (m - j + 1) p_(j), capped at 1."""
    p = np.asarray(p_values, float)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    m = len(order)
    adjusted = np.full(len(p), np.nan)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return adjusted
