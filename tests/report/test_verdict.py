"""The report's lead section: the verdict in sentences, the forest plot's encoding, the partial-rho heatmap, Missing."""

import duckdb
import pandas as pd

from topometrics.report import contents, frames, html, verdict

COMMON = dict(n_cells=8, mae_without=0.05, gain_share=0.08, baseline="norm", role="topology")
ROWS = pd.DataFrame(
    [
        COMMON | dict(cv="seed", fraction=0.3, family="weights_vr", n=32, delta_mae=-0.004, ci_low=-0.010,
                      ci_high=0.001, p_adjusted=0.41, verdict="no evidence"),
        COMMON | dict(cv="seed", fraction=0.3, family="weight_norm", n=32, delta_mae=-0.052, ci_low=-0.081,
                      ci_high=-0.027, p_adjusted=0.01, verdict="adds", baseline="loss", role="context"),
        COMMON | dict(cv="rung", fraction=0.5, family="heavy_tail", n=0, delta_mae=None, ci_low=None, ci_high=None,
                      p_adjusted=None, verdict="skipped: fewer than 3 groups", role="context"),
        COMMON | dict(cv="rung", fraction=0.5, family="everything", n=3, delta_mae=0.02, ci_low=0.01, ci_high=0.03,
                      p_adjusted=1.0, verdict="not enough runs (n=3, 3 cells)", n_cells=3, role="context"),
        COMMON | dict(cv="seed", fraction=0.5, family="scale_free", n=32, delta_mae=-0.004, ci_low=-0.010,
                      ci_high=0.001, p_adjusted=0.03, verdict="adds", role="primary"),
    ]
)  # fmt: skip


def test_each_row_reads_as_a_sentence_with_its_numbers():
    table = verdict.verdict_table(ROWS)
    reads = dict(zip(table["family"], table["reads as"], strict=True))
    assert reads["weights_vr"] == (
        "At 30% of training, adding the weights-VR family to the loss curve + weight norm changes MAE by "
        "−0.004 nats [95% bounds −0.01, 0.001; cells as units], 8% of the baseline MAE 0.05 "
        "(n=32 runs in 8 cells, leave-one-seed-out, exploratory, Holm-corrected, one-sided Holm p=0.41): no evidence."
    )
    assert (
        "adding the weight norm to the loss curve changes MAE by −0.052 nats [95% bounds −0.081, −0.027"
        in reads["weight_norm"]
    )
    assert reads["weight_norm"].endswith("(n=32 runs in 8 cells, leave-one-seed-out, context, one-sided p=0.01): adds.")
    assert reads["heavy_tail"].endswith("was not tested (leave-one-rung-out, context): skipped: fewer than 3 groups.")
    assert reads["everything"].endswith("one-sided p=1): not enough runs (n=3, 3 cells).")
    assert "pre-registered, one-sided p=0.03): adds." in reads["scale_free"]
    assert table["family"].iloc[0] == "scale_free"  # the pre-registered endpoint first
    assert list(table.columns[:5]) == ["role", "cv", "fraction", "family", "baseline"]


def test_a_change_below_numerical_precision_reads_identical_not_as_a_number():
    noise = ROWS.iloc[[0]].assign(delta_mae=-2.78e-17, ci_low=-1e-16, ci_high=1e-16, verdict="no evidence")
    read = verdict.verdict_table(noise)["reads as"].iloc[0]
    assert "identical to the baseline's to numerical precision" in read and "e-17" not in read
    assert read.endswith("leave-one-seed-out, exploratory, Holm-corrected): no evidence.")
    worse = ROWS.iloc[[0]].assign(delta_mae=0.0258, gain_share=-1.066)  # a share past 100 %: no exponent
    assert "−107% of the baseline MAE" in verdict.verdict_table(worse)["reads as"].iloc[0]
    small = ROWS.iloc[[0]].assign(delta_mae=-1e-6)  # a millionth of a nat on a baseline of 0.05 is a number
    assert "changes MAE by −1e−06 nats" in verdict.verdict_table(small)["reads as"].iloc[0]


def test_forest_plot_encodes_delta_mae_and_its_ci_with_a_zero_rule():
    spec = verdict.forest_plot(ROWS).to_dict()
    zero, bars, points = spec["spec"]["layer"]
    assert bars["encoding"]["x"]["field"] == "ci_low" and bars["encoding"]["x2"]["field"] == "ci_high"
    assert points["encoding"]["x"]["field"] == "delta_mae" and points["encoding"]["color"]["field"] == "cv"
    assert zero["transform"] == [{"calculate": "0", "as": "zero"}] and zero["mark"]["type"] == "rule"
    assert spec["facet"]["row"]["field"] == "fraction"
    plotted = pd.DataFrame(spec["datasets"][spec["data"]["name"]])
    assert sorted(plotted["family"]) == ["everything", "scale_free", "weight_norm", "weights_vr"]  # skipped: no CI


def test_partial_rho_heatmap_shows_the_mean_over_runs():
    partial = pd.DataFrame(
        {"feature": ["vr_tp0"] * 3 + ["np_norm"], "control": ["w_fro", "w_fro", "step", "w_fro"],
         "partial_rho": [0.2, 0.4, -0.5, None]}
    )  # fmt: skip
    spec = verdict.partial_rho_heatmap(partial).to_dict()
    cells = pd.DataFrame(spec["datasets"][spec["data"]["name"]]).set_index(["feature", "control"])
    assert abs(cells.loc[("vr_tp0", "w_fro"), "partial_rho"] - 0.3) < 1e-12
    assert cells.loc[("vr_tp0", "w_fro"), "runs"] == 2 and ("np_norm", "w_fro") not in cells.index
    assert spec["layer"][0]["encoding"]["color"]["field"] == "partial_rho"


def test_an_old_warehouse_says_why_the_section_is_empty_and_the_section_comes_first():
    con = duckdb.connect()
    con.execute("CREATE TABLE checkpoints (rung VARCHAR, seed INT, step INT, val_loss DOUBLE)")
    doc = contents.build(frames.load(con))
    assert isinstance(doc.verdict, frames.Missing) and "topology_verdict" in doc.verdict.reason
    assert "partial_spearman" in doc.verdict_figures["partial_rho"].reason
    page = html.render_html(doc, "/* no bundle */")
    lead = page.index("<h2>What topology adds</h2>")
    assert lead < page.index("<h2>Figures</h2>") < page.index('<h3 id="t-table-1')
    assert "not available: the warehouse cannot answer `verdict`" in page[lead : page.index("<h2>Figures</h2>")]


def test_empty_views_become_missing_with_the_stage_that_fills_them():
    loaded = {
        "verdict": frames.need(ROWS.iloc[:0], "verdict"),
        "partial": frames.need(pd.DataFrame(), "partial"),
    }
    table, figures = verdict.section(loaded)
    assert "incremental_validity" in table.reason and "`verdict` is empty" in table.reason
    assert "partial Spearman" in figures["partial_rho"].reason and "`verdict`" in figures["topology_forest"].reason
    skipped = verdict.forest_plot(ROWS.iloc[2:3])
    assert "skipped: fewer than 3 groups" in skipped.reason


def test_the_sentences_state_the_loss_unit_the_analysis_used():
    final = pd.DataFrame({"loss_unit": ["bpb", "bpb"]})
    assert verdict.loss_unit(final) == "bpb" and verdict.loss_unit(final.iloc[:0]) == "nats"
    table = verdict.verdict_table(ROWS, verdict.loss_unit(final))
    reads = dict(zip(table["family"], table["reads as"], strict=True))
    assert "changes MAE by −0.004 bits per byte [95% bounds −0.01, 0.001; cells as units]" in reads["weights_vr"]
    assert not any("nats" in r for r in table["reads as"])
