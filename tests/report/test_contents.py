"""The report: tables beside the paper's, 'not available' notes, the stage end to end, and a headless browser.

The tiny warehouse is built with the real builder (``topometrics.analysis.warehouse``) from the warehouse
tests' synthetic ladder, plus representation features, an external series and the analysis tables.
"""

import json
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from tests.analysis.helpers import RUNGS, write_inputs
from tests.repo_params import analysis_params
from tests.report.helpers import CHROMIUM, NO_CHROMIUM, chromium
from topometrics.analysis import tables, warehouse
from topometrics.params import run_name
from topometrics.report import charts, contents, frames, html, paper

REPO = Path(__file__).resolve().parents[2]
SERIES = "EleutherAI/pythia-14m"
TINY = {k: RUNGS[k] for k in ("tiny", "small", "medium", "large")}  # 4 rungs: enough for a + b N^c fit


def _extra_features(root: Path, rungs: dict[str, int]) -> None:
    """The features stage's layer-'all' names the warehouse tests do not write, and a Pythia-like series.

    Also caps the synthetic step-0 loss (the schedule-aware curve starts near 5e5) at ln(128) ~ 4.85,
    the loss of a uniform guess, so the figures look like training curves.
    """
    rng = np.random.default_rng(1)
    for rung, n_params in rungs.items():
        name = run_name(rung, 42)  # write_inputs' one seed
        ck = pd.read_csv(root / "runs" / name / "checkpoints.csv")
        ck["val_loss"] = ck["val_loss"].clip(upper=4.85)
        ck.to_csv(root / "runs" / name / "checkpoints.csv", index=False)
        feats = pd.read_parquet(root / "features" / name / "features.parquet")
        first_tp0 = (feats["feature"] == "vr_tp0") & (feats["step"] == 0)
        feats.loc[first_tp0, "value"] = (
            np.log(n_params) * (6 - 4.85) * np.where(feats["layer"] == "all", 2, 1)[first_tp0]
        )
        steps, loss, size = ck["step"].to_numpy(), ck["val_loss"].to_numpy(), np.log10(n_params)
        values = {"np_norm": 0.5 - 0.05 * loss, "np_shuffled_norm": 0.4 + rng.normal(0, 0.01, len(steps))}
        values |= {"np_norm_std": 0.02 + 0 * loss, "rep_tp0": 10 - loss, "w_rankme": 3 + rng.normal(0, 0.1, len(steps))}
        values |= {"rep_w1_prev": size * np.exp(-steps / 200) + 0.01}
        for dim in (0, 1):
            for i in range(8):
                values[f"rep_betti{dim}_{i:02d}"] = np.maximum(0, (8 - i) * size / (1 + dim) - steps / 200)
        replaced = (feats["layer"] == "all") & feats["feature"].isin(list(values))  # the extra values win
        feats[~replaced].to_parquet(root / "features" / name / "features.parquet", index=False)
        frame = pd.concat([pd.DataFrame({"step": steps, "feature": k, "value": v}) for k, v in values.items()])
        _parquet(root / "features" / f"{rung}-extra" / "features.parquet", frame.assign(rung=rung, layer="all"))
    steps = np.array([0, 1000, 5000, 10000, 50000, 100000, 143000])
    np_mean = 0.34 + 0.3 * (1 - np.exp(-steps / 2e4))
    rows = [
        pd.DataFrame({"step": steps, "layer": layer, "feature": "np_norm", "value": np_mean + d})
        for layer, d in (("a", -0.03), ("b", 0.03))
    ]
    for feature, value in {"np_norm": np_mean, "np_norm_std": 0.03 + 0 * np_mean, "vr_tp0": 70 - steps / 6e3}.items():
        rows.append(pd.DataFrame({"step": steps, "layer": "all", "feature": feature, "value": value}))
    _parquet(root / "features" / "pythia" / "features.parquet", pd.concat(rows).assign(rung=SERIES))


def _parquet(path: Path, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.assign(seed=42 if "pythia" not in str(path) else 0, reason=None).to_parquet(path, index=False)


def build_tiny_warehouse(root: Path, with_analysis=True, with_features=True) -> Path:
    """A four-rung warehouse (optionally without features/analysis), built as the pipeline does.

    As in the pipeline, the analysis runs on an in-memory warehouse and its tables (Parquet) go
    into the file that the builder writes.
    """
    write_inputs(root, rungs=TINY, steps=600, ckpt_every=50)
    if with_features:
        _extra_features(root, TINY)
    else:
        shutil.rmtree(root / "features")
    source = root / "corpus" / "source.json"
    sources = warehouse.Sources(root / "config", root / "runs", source, [root / "features"])
    inputs = warehouse.discover_inputs(sources)
    if with_analysis:
        with duckdb.connect() as con:
            warehouse.populate(con, inputs, analysis_params().settings(), {"code_version": "test"})
            for name, frame in tables.run_analysis(con, analysis_params(bootstrap=200)).items():
                frame.to_parquet(root / f"{name}.parquet", index=False)
        inputs = warehouse.discover_inputs(sources, root)
    meta = {"code_version": "test", "params": json.dumps({"train": {"steps": 600}})}
    return warehouse.build_warehouse(root / "warehouse.duckdb", inputs, analysis_params().settings(), meta)


def _status(computed: int) -> dict:
    """The series stage's status.json (topometrics.series.source_shards.series_shards) for a 7-checkpoint series."""
    checkpoints = [
        {"revision": f"step{s}", "step": s} | ({"status": "computed", "reason": None} if i < computed else {})
        for i, s in enumerate((0, 1000, 5000, 10000, 50000, 100000, 143000))
    ]
    for c in checkpoints:
        c.setdefault("status", "skipped")
        c.setdefault("reason", "not cached, hub unreachable")
    entry = {"name": "pythia-14m", "model": SERIES, "computed": computed, "skipped": 7 - computed}
    return {"series": [entry | {"checkpoints": checkpoints}]}


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    path = build_tiny_warehouse(tmp_path_factory.mktemp("full"))
    with duckdb.connect(str(path), read_only=True) as con:
        loaded = frames.load(con)
    return path, loaded, contents.build(loaded, _status(computed=7))


@pytest.fixture(scope="module")
def stage_out(full, tmp_path_factory):
    """``stages/report.py`` run as DVC runs it, on the full tiny warehouse."""
    out = tmp_path_factory.mktemp("reports")
    status = out.parent / "status.json"
    status.write_text(json.dumps(_status(computed=0)))
    cmd = [sys.executable, "stages/report.py", "--warehouse", str(full[0]), "--series-status", str(status)]
    done = subprocess.run([*cmd, "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out, done.stdout


# --- tables ----------------------------------------------------------------------------------------


def test_table1_puts_the_paper_beside_our_final_loss(full):
    _, loaded, doc = full
    t1 = doc.tables["Table 1 — model configurations and final loss"]
    assert list(t1["rung"]) == ["tiny", "small", "medium", "large", SERIES]
    tiny = t1.iloc[0]
    assert tiny["paper n_params"] == 2936 and tiny["paper final loss"] == 2.466
    final = loaded["final"].set_index("rung").loc["tiny", "val_loss"]
    assert tiny["final loss (nats/token)"] == pytest.approx(final)


def test_table2_rho_p_and_ci_come_from_the_analysis_tests(full):
    _, loaded, doc = full
    t2 = doc.tables["Table 2 — ρ(VR H0 total persistence, loss)"]
    assert list(t2["rung"]) == ["tiny", "small", "medium", "large"]
    assert (t2["ci_low"] <= t2["rho"]).all() and (t2["rho"] <= t2["ci_high"]).all()
    view = loaded["rho"].query("feature == 'vr_tp0'").set_index("rung")["rho"]
    assert t2.set_index("rung")["rho"].to_dict() == pytest.approx(view.to_dict(), abs=1e-9)
    assert t2.iloc[0]["paper rho"] == -0.590


def test_rho_tables_fall_back_to_the_view_without_analysis():
    rho = pd.DataFrame({"rung": ["small", "tiny"], "seed": 1, "feature": "vr_tp1", "n": 5, "rho": [0.1, 0.2]})
    table = contents.rho_table(frames.Missing("no tests"), rho, ("vr_tp1",), paper.PAPER_TABLE4)
    assert list(table["rung"]) == ["tiny", "small"]
    assert table["note"].str.contains("not available").all()
    assert table["paper rho"].tolist() == [-0.641, -0.636]


def test_table5_maps_the_paper_methods_and_keeps_the_improvement(full):
    _, loaded, doc = full
    t5 = doc.tables["Table 5 — final-loss prediction MAE"]
    row = t5[(t5["method"] == "loss_topology") & (t5["fraction"] == 0.3) & (t5["cv"] == "rung")].iloc[0]
    assert row["paper mae"] == 0.0903 and row["paper improvement %"] == 10.6
    assert set(t5["method"]) == set(loaded["mae"]["method"])


def test_table8_joins_the_series_with_pythia_steps(full):
    t8 = full[2].tables["Table 8 — checkpoint-series validation"]
    assert t8["step"].tolist() == [0, 1000, 5000, 10000, 50000, 100000, 143000]
    assert t8["NP mean"].iloc[0] == pytest.approx(0.34)
    assert t8["paper H0 total"].iloc[-1] == 45.4


def test_shuffled_null_and_topo_vs_spectral_tables(full):
    doc = full[2]
    null = doc.tables["Shuffled null — ρ(NP, loss) vs ρ(NP of shuffled weights, loss)"]
    assert np.allclose(null["abs_gap"], null["rho"].abs() - null["rho_shuffled"].abs())
    topo = doc.tables["Topological vs spectral — Δ|ρ| (Steiger z; * Bonferroni-significant)"]
    assert list(topo.columns) == ["topological", "spectral", "tiny", "small", "medium", "large"]
    assert "w_rankme" in set(topo["spectral"])


def test_banner_is_loud_about_the_fallback_corpus_and_names_the_series(full):
    doc = full[2]
    assert doc.corpus_fallback
    assert doc.banner["corpus"].startswith("OFFLINE FALLBACK CORPUS: python-docs")
    assert doc.banner["validation series"] == "pythia-14m: ran (7 checkpoints computed, 0 skipped)"
    assert doc.banner["params digest"].endswith("(sha256 of meta.params)")
    # why predictions failed, grouped by cause (the analysis stage's summary): 600 steps, a checkpoint every 50
    assert doc.banner["predictions"].startswith("120 predictions (56 failed: 24 need ≥ 4-6 checkpoints after step 0")


def test_the_banner_says_which_loss_each_series_rho_is_against_or_why_none(full):
    doc = full[2]
    assert doc.banner["series ρ against"] == (
        f"{SERIES}: none: no loss at its checkpoints (hub revisions carry none; a run folder needs a losses file)"
    )
    runs = pd.DataFrame({"rung": ["mine", "theirs", "a"], "kind": ["series", "series", "ladder"]})
    rho = pd.DataFrame({"rung": ["mine", "a"], "kind": ["series", "ladder"], "loss": ["train_loss", "val_loss"]})
    assert contents.series_loss_line(runs, rho) == (
        "mine: the training loss (no validation loss logged); theirs: none: no loss at its checkpoints "
        "(hub revisions carry none; a run folder needs a losses file)"
    )


def test_missing_features_and_analysis_become_notes_not_crashes(tmp_path):
    path = build_tiny_warehouse(tmp_path, with_analysis=False, with_features=False)
    with duckdb.connect(str(path), read_only=True) as con:
        doc = contents.build(frames.load(con))
    assert not isinstance(doc.figures["loss_curves"], frames.Missing)
    assert doc.figures["np_evolution"].reason.startswith("`np` is empty")
    assert "analysis stage" in doc.tables["Table 5 — final-loss prediction MAE"].reason
    assert doc.banner["validation series"].startswith("not run")
    assert "not available: " in html.render_html(doc, "/* no bundle */")


def test_a_warehouse_without_a_view_is_reported_not_raised():
    con = duckdb.connect()
    con.execute("CREATE TABLE checkpoints (rung VARCHAR, seed INT, step INT, val_loss DOUBLE)")
    loaded = frames.load(con)
    assert isinstance(loaded["phases"], frames.Missing) and "phases" in loaded["phases"].reason
    doc = contents.build(loaded)
    assert doc.banner["corpus"].startswith("unknown")


# --- the stage and the page ------------------------------------------------------------------------


def test_stage_writes_html_figures_and_dvc_plots(stage_out):
    out, stdout = stage_out
    # one seed per rung: no verdict and no stopping curve
    assert stdout.startswith(f"report: {out / 'report.html'}, 11/13 figures")
    names = {p.name for p in (out / "figures").iterdir()}
    assert {"loss_curves.svg", "loss_curves.png", "validation_series.png", "scaling.svg"} <= names
    assert (out / "figures" / "tp0_vs_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loss = pd.read_csv(out / "plots" / "loss.csv")
    assert list(loss.columns) == ["step", "rung", "val_loss"]
    assert list(loss["rung"].unique()) == ["tiny", "small", "medium", "large"]  # ladder only, in rung order
    assert list(pd.read_csv(out / "plots" / "np.csv").columns) == ["step", "rung", "np"]


def test_html_is_self_contained_and_shows_the_skipped_series(stage_out):
    page = (stage_out[0] / "report.html").read_text()
    assert "vegaEmbed" in page and page.count('data-chart="') == 11
    assert 'class="terms"' not in page  # no verdict, no sentences of results: no terms to define
    lead, figures = page.index("<h2>What topology adds</h2>"), page.index("<h2>Figures</h2>")
    assert lead < figures and 'data-chart="partial_rho"' in page[lead:figures]
    assert "not available: `verdict` is empty (the analysis stage has not filled" in page[lead:figures]
    assert not any(s in page for s in ('src="http', "cdn.jsdelivr", 'href="http'))
    assert "pythia-14m: SKIPPED (0 checkpoints computed, 7 skipped); why: not cached, hub unreachable" in page
    assert 'class="banner fallback"' in page


FIRST_SCREEN = (1400, 900)  # the window a researcher opens the report in: what must show without scrolling

# Injected into a copy of the page: once the charts have rendered (virtual time), the page boxes of the answer
# and of every rendered chart go into a <pre id="layout"> that --dump-dom prints.
LAYOUT_SCRIPT = """<script>
setTimeout(function () {
  function box(el) { var r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }
  var out = {answer: box(document.getElementById("answer")), charts: []};
  document.querySelectorAll("div.chart svg.marks").forEach(function (svg) { out.charts.push(box(svg)); });
  var pre = document.createElement("pre"); pre.id = "layout"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 5000);
</script>"""


def first_screen_layout(page: Path, profile: Path) -> dict:
    """The answer's and the rendered charts' page boxes ([left, top, right, bottom], CSS px) in a first-screen
    window, from the DOM (a layout check, so no pixel threshold decides it)."""
    probe = page.with_name("layout-probe.html")
    head, tail = page.read_text().rsplit("</body>", 1)  # the page's own end (the inlined bundle may spell it too)
    probe.write_text(head + LAYOUT_SCRIPT + "</body>" + tail)
    dom = chromium(probe, profile, "--dump-dom", size=FIRST_SCREEN).stdout
    found = re.search(r'<pre id="layout">(.*?)</pre>', dom, flags=re.S)
    assert found, "the layout probe did not run"
    return json.loads(unescape(found.group(1)))


def on_first_screen(box: list[float]) -> bool:
    left, top, right, bottom = box
    return left >= 0 and top >= 0 and right <= FIRST_SCREEN[0] and bottom <= FIRST_SCREEN[1]


@pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)
def test_report_renders_in_headless_chromium_with_the_answer_and_a_figure_on_the_first_screen(stage_out, tmp_path):
    page = stage_out[0] / "report.html"
    dom = chromium(page, tmp_path / "profile", "--dump-dom")
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    # vega-embed puts an <svg class="marks"> in each chart div; a failed chart holds only its error text
    charts_in_report = len(re.findall(r'<div class="chart" id="chart-', page.read_text()))
    assert charts_in_report >= 10
    assert len(re.findall(r'<svg [^>]*class="marks"', dom.stdout)) == charts_in_report, "every chart rendered"
    # the first screen: the answer and at least one whole chart, without scrolling
    layout = first_screen_layout(page, tmp_path / "profile")
    assert on_first_screen(layout["answer"]), layout
    assert any(on_first_screen(box) for box in layout["charts"]), layout
    shot = tmp_path / "report.png"
    chromium(page, tmp_path / "profile", f"--screenshot={shot}", size=FIRST_SCREEN)
    pixels = _png_pixels(shot.read_bytes())
    assert pixels.shape[:2] == FIRST_SCREEN[::-1] and pixels.std() > 20, "the screenshot is blank"
    # The lead figure is in view: its lines are drawn in the rung colours.
    rung_rgb = np.array([[int(c[i : i + 2], 16) for i in (1, 3, 5)] for c in charts.RUNG_COLORS], dtype=float)
    distance = np.abs(pixels[:, :, None, :] - rung_rgb[None, None]).max(axis=-1)
    assert (distance.min(axis=-1) < 24).sum() > 1000, "no chart marks in the rung colours on the first screen"


def _png_pixels(data: bytes) -> np.ndarray:
    """(height, width, 3) RGB array of a PNG."""
    from io import BytesIO

    from PIL import Image

    return np.asarray(Image.open(BytesIO(data)).convert("RGB"), dtype=float)


def test_dvc_template_colours_by_rung_and_dashes_by_revision(stage_out):
    from dvc_render.vega import VegaRenderer

    rows = pd.read_csv(stage_out[0] / "plots" / "loss.csv").astype(str).assign(rev="workspace")
    renderer = VegaRenderer(
        rows.to_dict("records"), "loss", template=str(REPO / ".dvc" / "plots" / "by_rung.json"), x="step", y="val_loss"
    )
    spec = renderer.get_filled_template()
    assert spec["encoding"]["x"]["field"] == "step" and spec["encoding"]["y"]["field"] == "val_loss"
    assert spec["encoding"]["color"]["field"] == "rung"
    assert spec["encoding"]["color"]["scale"]["range"] == list(charts.RUNG_COLORS)
    assert spec["encoding"]["strokeDash"]["field"] == "rev"
    assert len(spec["data"]["values"]) == len(rows)


def test_the_banner_names_diverged_runs_and_their_reason():
    ladder = pd.DataFrame(
        {"rung": ["a", "b"], "seed": [42, 42], "kind": ["ladder", "ladder"], "status": ["complete", "diverged"],
         "status_reason": [None, "loss is nan at step 7; kept checkpoints up to step 0"]}
    )  # fmt: skip
    assert contents.runs_line(ladder) == (
        "2 runs, 1 complete, 1 DIVERGED (left out of fits and predictions) — "
        "b-42: loss is nan at step 7; kept checkpoints up to step 0"
    )
    assert contents.runs_line(ladder.iloc[:1]) == "1 runs, 1 complete"


@pytest.mark.slow
def test_dvc_repro_of_a_diverging_recipe_records_the_run_as_diverged_through_to_the_report(reproduced):
    import yaml

    from tests.pipeline.helpers import run

    params = yaml.safe_load((reproduced / "params.yaml").read_text())
    params["train"]["lr"] = 1e30  # finite (params refuse .inf): the first update overflows every weight
    (reproduced / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = run(["dvc", "repro"], reproduced)
    assert "a-42: STOPPED, diverged: loss is nan at step 2; kept checkpoints up to step 0" in out
    with duckdb.connect(str(reproduced / "data/warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT status, status_reason FROM runs").fetchall() == [
            ("diverged", "loss is nan at step 2; kept checkpoints up to step 0")
        ]
        statuses = con.execute("SELECT DISTINCT status, reason FROM predictions").fetchall()
        assert statuses == [("excluded", "run diverged: loss is nan at step 2; kept checkpoints up to step 0")]
    metrics = json.loads((reproduced / "reports/metrics.json").read_text())
    assert metrics["diverged_runs"] == 1 and metrics["final_val_loss"] == {}  # named in the report
    assert "1 DIVERGED (left out of fits and predictions)" in (reproduced / "reports/report.html").read_text()


def test_the_changepoints_table_sits_beside_the_threshold_rule(full):
    _, loaded, built = full
    table = next(t for title, t in built.tables.items() if title.startswith("Changepoints (PELT)"))
    assert not isinstance(table, frames.Missing) and len(table) == len(loaded["changepoints"]) > 0
    assert {"val_loss", "lr"} <= set(table["series"]) and "np_threshold_step" in table
    assert (table["first_step"].notna() | table["reason"].notna()).all()  # a NULL says why
