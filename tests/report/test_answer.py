"""topometrics.report.answer: the report opens with the verdict in sentences, or why not and the command for one.

The verdict views are computed by the real analysis (topometrics.verdict.verdict) from the synthetic runs of
tests/verdict/test_verdict.py, so the reasons grouped here are the ones the analysis writes.
"""

import json

import duckdb
import pandas as pd
import pytest

from tests.repo_params import analysis_params, raw_params
from tests.verdict.helpers import SWEEP_LAYOUT, synthetic_runs, warehouse_with
from topometrics.params import AnalysisParams, ParamsError, PrimaryParams, parse_params
from topometrics.report import contents, frames, html
from topometrics.report.answer import _families, answer, calibrate_command
from topometrics.verdict import remedy, verdict

FAMILIES = {"weights_vr": ("vr_tp0", "vr_tp1"), "scale_free": ("vr_unit_tp0",), "heavy_tail": ("w_alpha", "rep_alpha")}
FAST = analysis_params(permutations=49)  # smallest p 0.02: passes Holm's 0.025 over 2 topology rows


def view(runs: pd.DataFrame, params: AnalysisParams = FAST) -> pd.DataFrame:
    runs = runs.query("fraction != 0.3")
    table, errors = verdict.incremental_validity(runs, params, FAMILIES)
    return warehouse_with(table, errors).execute("SELECT * FROM topology_verdict ORDER BY ALL").df()


def meta(**params) -> pd.DataFrame:
    """The warehouse's meta frame with a params snapshot: tiny-project defaults, overridden by ``params``."""
    snapshot = {"train": {"steps": 40, "ckpt_every": 10, "seeds": [42]}, "analysis": {"fractions": [0.2, 0.3, 0.5]}}
    snapshot |= {"ladder": {"a": {}, "b": {}}, "variants": {}} | params
    return pd.DataFrame({"key": ["params", "code_version"], "value": [json.dumps(snapshot), "test"]})


def test_a_short_single_seed_run_says_why_in_one_paragraph_and_gives_the_command():
    skipped = view(synthetic_runs("topology").query("fraction == 0.1"))  # 3 checkpoints: every comparison skipped
    got = answer(skipped, meta())
    assert not got.computed and len(got.sentences) == 3
    assert got.sentences[0].startswith("Tested: whether adding the topology of a run's weights and representations")
    between = int((skipped.level == "between").sum())  # the opening answers the between-cell question
    assert got.sentences[1] == (
        f"The verdict cannot be computed yet: none of its {between} comparisons could run: by 10% of training "
        f"the runs have at most 3 checkpoints; a comparison needs 4 ({between} comparisons)."
    )
    # 2 rungs: 24 recipes make the 48 cells of the measured layout, 2 seeds each; 40 steps, a checkpoint every 10:
    # every 2 steps gives 4 checkpoints by 20%. One command: the 23 recipes drawn, the second seed, the spacing.
    assert got.sentences[2].startswith(
        "An answer needs 96 runs: 48 cells (24 recipes x 2 rungs), 2 seeds each, the layout whose power was "
        "measured at 85 % (docs/results.md); this project declares 2 runs in 2 cells."
    )
    assert got.command == (
        "dvc exp run $(python tools/sample_recipes.py --n 23 --seed 2026 --steps 40) -S 'train.seeds=[42,43]' "
        "-S train.ckpt_every=2"
    )
    assert got.for_answer and got.command_why is None


def test_too_few_groups_in_every_scheme_are_grouped_by_reason():
    runs = synthetic_runs("topology").query("rung != 'c' and seed <= 2 and variant == 'x' and fraction > 0.1")
    got = answer(view(runs.drop(columns="variant")), meta(train={"steps": 5000, "ckpt_every": 100, "seeds": [1, 2]}))
    assert got.sentences[1] == (
        # 1 fraction x 8 comparisons per scheme: 6 between cells (loss, norm, recipe context rows, 2 families,
        # every family) and 2 within
        "The verdict cannot be computed yet: none of its 24 comparisons could run: "
        "leave-one-rung-out needs at least 3 rungs, got 2 (8 comparisons); leave-one-seed-out needs at least 3 "
        "seeds, got 2 (8 comparisons); runs have no variant column (a single recipe) (8 comparisons)."
    )
    assert got.command == "dvc exp run $(python tools/sample_recipes.py --n 23 --seed 2026 --steps 5000)"


def test_a_computed_verdict_reads_as_quotable_sentences():
    got = answer(view(synthetic_runs("topology")), meta())
    assert got.computed and got.for_answer  # 2 rungs x 1 recipe x 1 seed declared: the answer's layout is the command
    assert got.sentences[0].endswith(": 36 runs, leave-one-seed-out (4 seeds).")
    assert "weights-VR, scale-free, heavy-tail families" in got.sentences[0]
    at_50 = next(s for s in got.sentences if s.startswith("At 50% of training"))
    assert "adding every family to the loss curve + weight norm + recipe changes MAE by" in at_50
    assert "(n=36 runs" in at_50
    assert not any(s.startswith("At 10%") for s in got.sentences)  # skipped there: the table says why
    families = got.sentences[-2]  # the last says what an answer needs
    assert families.startswith("Single families (leave-one-seed-out): ") and "scale-free adds at" in families
    assert "a cell is one rung trained with one recipe" in got.terms and "a recipe is" in got.terms  # words used


def test_the_lead_sentence_names_the_strongest_baseline_the_topology_rows_were_tested_against():
    frame = view(synthetic_runs("topology"))
    assert "to its loss curve, weight norm and recipe predicts" in answer(frame, meta()).sentences[0]
    topology = frame[frame["role"] == "topology"]
    stronger = pd.concat([frame, topology.assign(baseline="recipe+curvature")], ignore_index=True)
    assert (
        "to its loss curve, weight norm and recipe and, the strongest baseline, to its loss curve, weight norm, "
        "recipe and curvature predicts" in answer(stronger, meta()).sentences[0]
    )
    skipped = topology.assign(baseline="recipe+curvature", verdict="skipped: family curvature has no usable values")
    assert "the strongest baseline" not in answer(pd.concat([frame, skipped]), meta()).sentences[0]


def test_without_the_all_families_row_the_families_that_ran_lead():
    frame = view(synthetic_runs("topology"))
    frame = frame[frame["family"] != verdict.HEADLINE_FAMILY]
    got = answer(frame, meta())
    assert got.computed and got.sentences[0].endswith(": 36 runs, leave-one-seed-out (4 seeds).")
    # the weight norm's context row; each family over the loss curve + weight norm (context) and + recipe
    assert sum(s.startswith("At 50% of training, adding") for s in got.sentences) == 5


def test_not_enough_runs_says_how_many_recipes_per_rung_would_do():
    runs = synthetic_runs("topology").query("variant == 'x' and seed <= 3 and rung != 'c'")  # 6 runs, 2 cells
    frame = view(runs)
    need = remedy.recipes_needed(2, 0.05, 49)
    got = answer(frame, meta(train={"steps": 40, "ckpt_every": 2, "seeds": [1, 2, 3]}))
    assert need == 3  # (3!)^2 = 36 cell-block permutations: smallest p 1/36 < 0.05; (2!)^2 = 4 cannot
    assert (
        f"With 6 runs the cell permutations cannot reach the level; it needs {need} recipes per rung." in got.sentences
    )


def test_the_pre_registered_endpoint_leads_and_every_other_row_is_labelled_exploratory():
    primary = PrimaryParams(family="scale_free", fraction=0.5, cv="seed")
    got = answer(view(synthetic_runs("topology"), analysis_params(permutations=49, primary=primary)), meta())
    assert got.sentences[1].startswith("Pre-registered endpoint: At 50% of training, adding the scale-free family")
    assert got.sentences[1].endswith(": adds.") and "one-sided p=0.02" in got.sentences[1]
    assert got.sentences[2].startswith("Power: ")
    assert "`python -m bench power --calibrate data/warehouse.duckdb`" in got.sentences[2]
    assert got.sentences[3].startswith("Exploratory (topology rows Holm-corrected per scheme")


def test_the_page_opens_with_the_answer_and_folds_the_verdict_table_away():
    loaded = frames.load(duckdb.connect())  # an empty warehouse: every other piece is Missing
    loaded |= {"verdict": view(synthetic_runs("topology").query("fraction == 0.1")), "meta": meta()}
    doc = contents.build(loaded)
    page = html.render_html(doc, "/* no bundle */")
    answer_at = page.index('<section id="answer"')
    assert answer_at < page.index('<table class="banner') < page.index("<h2>Figures</h2>")
    command = (  # HTML-escaped quotes
        "dvc exp run $(python tools/sample_recipes.py --n 23 --seed 2026 --steps 40) -S &#x27;train.seeds=[42,43]"
        "&#x27; -S train.ckpt_every=2"
    )
    assert f"For an answer: <code>{command}</code>" in page
    assert page.count("An answer needs 96 runs") == 1  # stated once, on the first screen
    table = page.index('<details id="verdict-table"><summary>Verdict per scheme, fraction and family (32 comparisons')
    assert page.index("<h2>Figures</h2>") < table
    assert page.count("The verdict cannot be computed yet") == 1
    terms = page.index('<p class="terms">Terms: a recipe is one set of training settings')
    assert answer_at < terms < page.index("</section>", answer_at)  # defined once, inside the answer


@pytest.mark.parametrize("frame", [frames.Missing("the warehouse cannot answer `verdict`"), None])
def test_no_verdict_view_says_so_and_points_at_dvc_repro(frame):
    got = answer(frame if frame is not None else frames.need(pd.DataFrame(), "verdict"), None)
    assert got.sentences[0].startswith("No verdict yet: ") and got.command == "dvc repro"


@pytest.mark.parametrize(
    ("power", "needed", "said"),
    [
        (0.84, None, "with 84 % power (recorded with the endpoint; `python -m bench power --calibrate "
         "data/warehouse.duckdb --fraction 0.5 --cv seed` measures it on this sweep)."),
        (0.62, 144, "with 62 % power (recorded with the endpoint; `python -m bench power --calibrate "
         "data/warehouse.duckdb --fraction 0.5 --cv seed` measures it on this sweep). This "
         "sweep is too small for the 80 % target: the bench says it would need 144 runs."),
        (0.62, None, "This sweep is too small for the 80 % target: `python -m bench power --calibrate "
         "data/warehouse.duckdb --fraction 0.5 --cv seed` finds the cells it would need."),
    ],
)  # fmt: skip
def test_the_power_recorded_with_the_endpoint_sits_beside_its_verdict(power, needed, said):
    primary = PrimaryParams(family="scale_free", fraction=0.5, cv="seed", power=power)
    frame = view(synthetic_runs("topology"), analysis_params(permutations=49, primary=primary))
    recorded = {"family": "scale_free", "fraction": 0.5, "cv": "seed", "power": power, "needed_runs": needed}
    got = answer(frame, meta(analysis={"fractions": [0.2, 0.3, 0.5], "primary": recorded}))
    assert got.sentences[2].startswith("Power: this sweep detects a family explaining >= 30 % of the residual")
    assert said in got.sentences[2] and "declared runs" not in got.sentences[2]
    seeds = {"steps": 40, "ckpt_every": 10, "seeds": list(range(100))}  # more runs declared than reached it
    short = answer(frame, meta(analysis={"fractions": [0.2, 0.3, 0.5], "primary": recorded}, train=seeds))
    n = int(frame.query("role == 'primary'")["n"].iloc[0])
    assert short.sentences[2].endswith(
        f" Only {n} of the 200 declared runs reached the verdict, so the power is lower than stated."
    )


def with_primary(primary: dict) -> dict:
    """params.yaml with three seeds of one rung, no variants and ``primary`` declared."""
    raw = raw_params()
    raw["train"]["seeds"], raw["ladder"], raw["variants"] = [1, 2, 3], {"tiny": {"hidden": 8}}, {}
    raw["analysis"]["primary"] = primary
    return raw


def test_a_power_outside_zero_one_is_one_params_error():
    primary = {"family": "weights_vr", "fraction": 0.3, "cv": "seed", "level": "within", "power": 84}
    with pytest.raises(ParamsError, match=r"analysis.primary: power 84.0 is not a share in \(0, 1\]"):
        parse_params(with_primary(primary))


def test_needed_runs_without_a_short_power_or_within_the_declared_runs_is_one_params_error():
    primary = {"family": "weights_vr", "fraction": 0.3, "cv": "seed", "level": "within"}
    for recorded in ({"power": 0.9, "needed_runs": 144}, {"power": 0.5, "needed_runs": 3}, {"needed_runs": 144}):
        with pytest.raises(ParamsError, match=r"needed_runs \d+ goes with a power below 0.8 and more than the 3 runs"):
            parse_params(with_primary(primary | recorded))
    assert parse_params(with_primary(primary | {"power": 0.5, "needed_runs": 4}))


def test_a_family_that_adds_over_both_baselines_names_the_fraction_once():
    rows = [("landscape", 0.2, "norm"), ("landscape", 0.2, "norm+curvature"), ("scale_free", 0.2, "norm+curvature")]
    rows += [("landscape", 0.5, "norm+curvature"), ("weights_vr", 0.3, "norm")]
    verdict = pd.DataFrame(rows, columns=["family", "fraction", "baseline"]).assign(cv="seed", verdict="adds")
    verdict.loc[3, "verdict"] = "hurts"
    assert _families(verdict, "seed") == (
        "Single families (leave-one-seed-out): landscape adds at 20% (every baseline); scale-free adds at 20% "
        "(over norm+curvature); weights-VR adds at 30% (over norm); landscape hurts at 50% (over norm+curvature)."
    )


def test_the_opening_counts_every_run_the_scheme_used_not_only_those_every_family_covers():
    frame = view(synthetic_runs("topology"))
    frame.loc[frame["family"] == "everything", "n"] = 30  # a family missing in some runs: fewer runs together
    got = answer(frame, meta())
    assert got.sentences[0].endswith(": 36 runs, leave-one-seed-out (4 seeds).")


def test_the_answer_projects_the_training_from_the_runs_measured_throughput_or_names_the_bench():
    params = SWEEP_LAYOUT | {"variants": {}, "train": SWEEP_LAYOUT["train"] | {"seeds": [42], "workers": 2}}
    frame = view(synthetic_runs("topology"))
    snapshot = pd.DataFrame({"key": ["params"], "value": [json.dumps(params)]})
    # 1000 steps x 32 x 128 = 4,096,000 tokens a run: 4,096 s at 1,000 tokens/s (tiny, small), 8,192 s at 500
    runs = pd.DataFrame({"rung": ["tiny", "tiny", "small", "medium"], "kind": "ladder",
                         "tokens_per_s": [900.0, 1100.0, 1000.0, 500.0]})  # fmt: skip
    needs = answer(frame, snapshot, runs).sentences[-1]
    # 32 medium runs of 8,192 s on 2 processes: 36.4 h; then 64 runs of 4,096 s: another 36.4 h -> 72.8 h
    assert needs.endswith(
        "Training them takes about 72.8 h here (2 processes at each rung's measured throughput); the command below "
        "trains them and keeps the runs already trained."
    )
    without = answer(frame, snapshot, runs.query("rung != 'medium'")).sentences[-1]
    assert without.endswith(
        "`python -m bench train --sweep tiny,small,medium:15:2:1000` projects their training time on this machine."
    )


def test_the_calibrate_command_names_the_endpoints_fraction_scheme_and_base():
    norm = {"fraction": 0.2, "cv": "seed", "baseline": "norm+curvature"}
    assert calibrate_command(norm) == (
        "python -m bench power --calibrate data/warehouse.duckdb --fraction 0.2 --cv seed --baseline norm"
    )
    recipe = {"fraction": 0.3, "cv": "variant", "baseline": "recipe+curvature"}
    assert calibrate_command(recipe).endswith("--fraction 0.3 --cv variant")
    assert calibrate_command({}) == "python -m bench power --calibrate data/warehouse.duckdb"
