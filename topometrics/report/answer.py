"""The report's opening: the between-run verdict in a few sentences a researcher can quote, or why there is none.

From the ``topology_verdict`` view and the params snapshot the warehouse keeps in ``meta``: what was
tested, against which baseline, on how many runs, and the verdict of every topological family together
at each fraction of training (:data:`topometrics.verdict.verdict.HEADLINE_FAMILY`, in the scheme of
:func:`topometrics.verdict.verdict.headline_scheme`). When nothing could be compared, one paragraph
gives the reasons grouped by cause and the ``dvc exp run`` that makes the verdict computable, derived
from the params (:func:`topometrics.verdict.remedy.remedy`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace

import pandas as pd

from topometrics.report.frames import Missing
from topometrics.report.verdict import CV_WORDS, FAMILY_WORDS, sentence
from topometrics.verdict import remedy as analysis_remedy
from topometrics.verdict import verdict as analysis_verdict
from topometrics.vocabulary import verdict_families

QUESTION = (
    "Tested: whether adding the topology of a run's weights and representations ({families}) to {baseline} "
    "predicts the run's final validation loss better, between runs"
)
NORM_BASELINE_WORDS = "its loss curve and weight norm"
BASELINE_WORDS = {"norm": NORM_BASELINE_WORDS, "recipe": "its loss curve, weight norm and recipe"}
SCHEME_GROUPS = {"seed": "seeds", "variant": "recipe variants", "rung": "rungs"}
# Defined once, under the sentences that use them first (a newcomer met "cells" and "recipes" undefined).
TERMS = (
    "Terms: a recipe is one set of training settings (learning rate and its schedule, weight decay, warm-up, batch, "
    "steps): the base or a variant; a cell is one rung trained with one recipe, its runs differing only in seed; "
    "MAE is the mean absolute error of the predicted final validation loss over held-out runs; "
    "leave-one-X-out holds out every run of one X in turn."
)


@dataclass(frozen=True)
class Answer:
    """The sentences that open the report, and the command that makes the verdict computable (or able to show
    an effect) with why, when there is one."""

    sentences: tuple[str, ...]
    command: str | None = None
    command_why: str | None = None
    computed: bool = False
    terms: str | None = TERMS  # the words the sentences use, defined (None when there are no sentences of results)
    for_answer: bool = False  # the command trains the layout an answer needs (its last sentence says what it is)


def answer(verdict, meta, runs=None) -> Answer:
    """The opening from the ``topology_verdict`` frame (or :class:`Missing`), the ``meta`` frame and the ``runs``
    frame (their measured throughput projects the training an answer needs), ending, when the declared runs are
    fewer than an answer needs, with what it needs and the one command that trains it."""
    params = _params(meta)
    if isinstance(verdict, Missing):
        why = "runs the analysis and the warehouse"
        return Answer((f"No verdict yet: {verdict.reason}.",), "dvc repro", why, terms=None)
    opening = _opening(verdict, params)
    layout = analysis_remedy.answer_layout(params) if params is not None else None
    if layout is None:
        return opening
    needs = _needs(params, layout, _throughput(runs))
    command = analysis_remedy.layout_command(params, layout)
    return replace(opening, sentences=(*opening.sentences, needs), command=command, command_why=None, for_answer=True)


def _needs(params: dict, layout: analysis_remedy.Layout, tokens_per_s: dict[str, float]) -> str:
    """What an answer needs (runs, cells, seeds), against what params declares, and its projected training time."""
    have = analysis_remedy.declared_layout(params)
    said = (
        f"An answer needs {layout.runs} runs: {layout.cells} cells ({layout.recipes} recipes x {len(layout.rungs)} "
        f"rungs), {layout.seeds} seeds each, the layout whose power was measured at "
        f"{100 * analysis_remedy.ANSWER_POWER:.0f} % (docs/results.md); "
        f"this project declares {have.runs} runs in {have.cells} cells."
    )
    workers = int(params["train"].get("workers") or 0) or len(os.sched_getaffinity(0))
    minutes = analysis_remedy.training_minutes(params, layout, tokens_per_s, workers)
    if minutes is None:
        sweep = f"{','.join(layout.rungs)}:{layout.recipes - 1}:{layout.seeds}:{params['train']['steps']}"
        return said + f" `python -m bench train --sweep {sweep}` projects their training time on this machine."
    return said + (
        f" Training them takes about {_duration(minutes)} here ({workers} processes at each rung's measured "
        "throughput); the command below trains them and keeps the runs already trained."
    )


def _duration(minutes: float) -> str:
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"


def _throughput(runs) -> dict[str, float]:
    """Each rung's median training throughput (tokens per second) over its runs that recorded one."""
    if not isinstance(runs, pd.DataFrame) or "tokens_per_s" not in runs:
        return {}
    rates = runs.loc[runs["kind"] == "ladder"].dropna(subset=["tokens_per_s"])
    return {rung: float(r) for rung, r in rates.groupby("rung")["tokens_per_s"].median().items()}


def _opening(verdict: pd.DataFrame, params: dict | None) -> Answer:
    """The verdict's sentences, or why it cannot be computed, with the command that lets it."""
    verdict = verdict[verdict["role"] != "outlier"] if "role" in verdict else verdict  # the report's table has them
    if "level" in verdict:  # the opening answers the between-cell question (and states a within-cell endpoint)
        verdict = verdict[(verdict["level"].fillna("between") == "between") | (verdict["role"] == "primary")]
    scheme = analysis_verdict.headline_scheme(verdict)
    if scheme is None:
        return _not_computable(verdict, params)
    in_scheme = verdict[(verdict["cv"] == scheme) & ~verdict["verdict"].astype(str).str.startswith("skipped")]
    tested = in_scheme[in_scheme["family"] == analysis_verdict.HEADLINE_FAMILY]
    if tested.empty:  # every family together could not be compared: the families that could, at the last fraction
        tested = in_scheme[in_scheme["fraction"] == in_scheme["fraction"].max()]
    tested = tested.sort_values(["fraction", "family"])
    n, groups = int(in_scheme["n"].max()), int(in_scheme["n_groups"].max())  # the runs any row of the scheme used
    head = f"{_question(verdict)}: {n} runs, {CV_WORDS[scheme]} ({groups} {SCHEME_GROUPS[scheme]})."
    primary = verdict[verdict["role"] == "primary"] if "role" in verdict else verdict.iloc[:0]
    unit = (params or {}).get("analysis", {}).get("loss_unit", "nats")
    lead = [f"Pre-registered endpoint: {sentence(r, unit)}" for _, r in primary.iterrows()]
    lead += [_power(params, int(primary["n"].fillna(0).max()))] if len(primary) and params is not None else []
    lead = lead or ["No pre-registered endpoint (analysis.primary): every row below is exploratory."]
    label = "Exploratory (topology rows Holm-corrected per scheme; the rest uncorrected context): "
    rows = [sentence(r, unit) for _, r in tested.iterrows()]
    rows = [(label if i == 0 and len(primary) else "") + row for i, row in enumerate(rows)]
    sentences = [head, *lead, *rows, _families(verdict, scheme)]
    command, why = None, None
    if tested["verdict"].astype(str).str.startswith("not enough runs").all() and params is not None:
        rungs = len(params["ladder"])
        need = analysis_remedy.recipes_needed(rungs, float(tested["alpha"].iloc[-1]), _permutations(params))
        sentences.append(
            f"With {n} runs the cell permutations cannot reach the level; it needs {need} recipes per rung."
            if need
            else "analysis.permutations is too small for the level: raise it."
        )
    surface = analysis_remedy.surface_remedy(params) if params is not None else []
    if surface and command is None:  # the other families ran; these two could not have
        command, why = _command(surface)
        sentences.append(f"The loss-surface families could not be compared: they need {why}.")
    return Answer(tuple(sentences), command, why, computed=True)


def _permutations(params: dict) -> int:
    return int(params["analysis"].get("permutations", 99))


def _power(params: dict, n: int) -> str:
    """The sweep's power as recorded with its endpoint (``analysis.primary.power``), else where it comes from:
    the bench's simulation fitted to this sweep's own variance components (:func:`calibrate_command`). A power
    below 80 % says the sweep is too small, with the runs the bench says it would need (``needed_runs``) or the
    command that finds the cells; fewer runs in the verdict (``n``) than the layout declares says the recorded
    power overstates it."""
    layout = (len(params["ladder"]), 1 + len(params.get("variants") or {}), len(params["train"]["seeds"]))
    declared = math.prod(layout)
    primary = params["analysis"].get("primary") or {}
    power, needed, command = primary.get("power"), primary.get("needed_runs"), calibrate_command(primary)
    if power is None:
        return (
            "Power: the share of simulated sweeps like this one in which a family explaining >= 30 % of the "
            f"residual variance is called 'adds' is measured by `{command}` (the simulation fitted to this "
            "sweep's own variance components; docs/results.md)."
        )
    said = (
        f"Power: this sweep detects a family explaining >= 30 % of the residual variance with {100 * power:.0f} % "
        f"power (recorded with the endpoint; `{command}` measures it on this sweep)."
    )
    if power < 0.8:
        need = f"the bench says it would need {needed} runs" if needed else f"`{command}` finds the cells it would need"
        said += f" This sweep is too small for the 80 % target: {need}."
    if n < declared:
        said += f" Only {n} of the {declared} declared runs reached the verdict, so the power is lower than stated."
    return said


def calibrate_command(primary: dict) -> str:
    """``python -m bench power --calibrate`` on this project's warehouse for the primary endpoint's fraction,
    scheme and base (the loss curve + norm where its baseline starts with ``norm``)."""
    command = "python -m bench power --calibrate data/warehouse.duckdb"
    if primary.get("fraction"):
        command += f" --fraction {primary['fraction']:g}"
    if primary.get("cv") in ("variant", "seed", "rung"):
        command += f" --cv {primary['cv']}"
    if str(primary.get("baseline", "recipe")).split("+")[0] == "norm":
        command += " --baseline norm"
    return command


def _not_computable(verdict: pd.DataFrame, params: dict | None) -> Answer:
    """Why no comparison ran, grouped by cause, and the command that lets them run."""
    causes = "; ".join(f"{reason} ({n} comparisons)" for reason, n in analysis_remedy.skip_groups(verdict))
    why = f"The verdict cannot be computed yet: none of its {len(verdict)} comparisons could run: {causes}."
    command, because = _command(analysis_remedy.remedy(params)) if params is not None else (None, None)
    return Answer((f"{_question(verdict)}.", why), command, because)


def _command(settings: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    if not settings:
        return None, None
    return "dvc exp run " + " ".join(f"-S {s}" for s, _ in settings), "; ".join(why for _, why in settings)


def _question(verdict: pd.DataFrame) -> str:
    families = [f for f in verdict_families() if f in set(verdict["family"])]  # in the vocabulary's order
    words = [FAMILY_WORDS.get(f, f.replace("_", "-")) for f in families]
    named = ", ".join(words) + (" families" if words else "no families")
    return QUESTION.format(families=named, baseline=_baselines(verdict))


def _baselines(verdict: pd.DataFrame) -> str:
    """The baselines the topology rows were compared with, the strongest named as such: the loss curve and
    weight norm, and that plus each geometric family (``norm+curvature``) where such a row was computed."""
    if "baseline" not in verdict or "role" not in verdict:
        return NORM_BASELINE_WORDS
    ran = verdict[(verdict["role"] != "context") & ~verdict["verdict"].astype(str).str.startswith("skipped")]
    bases = {str(b).partition("+")[0] for b in ran["baseline"].dropna()}
    base = "recipe" if "recipe" in bases else "norm"
    extra = sorted({str(b).split("+", 1)[1] for b in ran["baseline"] if str(b).startswith(f"{base}+")})
    if not extra:
        return BASELINE_WORDS[base]
    words = " and ".join(FAMILY_WORDS.get(e, e.replace("_", "-")) for e in extra)
    strongest = BASELINE_WORDS[base].removeprefix("its ").replace(" and ", ", ")
    return f"{BASELINE_WORDS[base]} and, the strongest baseline, to its {strongest} and {words}"


def _families(verdict: pd.DataFrame, scheme: str) -> str:
    """Which single families add or hurt in the headline scheme, at which fractions, and against which
    baseline when the verdict has more than one (each fraction named once)."""
    single = verdict[(verdict["cv"] == scheme) & ~verdict["family"].isin(["weight_norm", "everything"])]
    if "role" in single:  # the tested rows; a context row's recipe-blind baseline leaves the recipe to be found
        single = single[single["role"].isin(["topology", "primary"])]
    baselines = sorted(single["baseline"].dropna().unique()) if "baseline" in single else []
    found = []
    for word in ("adds", "hurts"):
        hits = single[single["verdict"] == word]
        for family, g in hits.groupby("family", sort=False):
            at = ", ".join(_at(f, h, baselines) for f, h in g.groupby("fraction"))
            found.append(f"{FAMILY_WORDS.get(family, family.replace('_', '-'))} {word} at {at}")
    if not found:
        return f"No single family adds or hurts at any fraction ({CV_WORDS[scheme]})."
    return f"Single families ({CV_WORDS[scheme]}): {'; '.join(found)}."


def _at(fraction: float, rows: pd.DataFrame, baselines: list[str]) -> str:
    """'20%', '20% (every baseline)' or '20% (over norm+curvature)': the baselines only when there are several."""
    if len(baselines) < 2 or "baseline" not in rows:
        return f"{100 * fraction:g}%"
    over = sorted(rows["baseline"].dropna().unique())
    return f"{100 * fraction:g}% ({'every baseline' if over == baselines else 'over ' + ', '.join(over)})"


def _params(meta) -> dict | None:
    """The params snapshot of ``meta`` (None for a warehouse without one)."""
    if not isinstance(meta, pd.DataFrame):
        return None
    values = dict(zip(meta["key"], meta["value"], strict=True))
    params = json.loads(values["params"]) if values.get("params") else {}
    return params if {"train", "ladder", "analysis"} <= set(params) else None
