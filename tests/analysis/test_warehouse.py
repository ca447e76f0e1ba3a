"""The warehouse file and its SQL views: atomic builds, read-only use, and views checked against numpy/scipy.

The synthetic ladder in the input contract (configs, steps/checkpoints CSVs, features/diagrams Parquet,
corpus source.json) is ``write_inputs`` of tests/analysis/helpers.py.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tests.analysis.helpers import RUNGS, _write_parquet, write_inputs
from tests.repo_params import PARAMS_YAML, analysis_params
from topometrics.analysis import warehouse
from topometrics.analysis.warehouse import Inputs, WarehouseError

REPO = Path(__file__).resolve().parents[2]
VIEWS = ("np_series", "final_checkpoints", "feature_loss_spearman", "phases", "scaling", "prediction_mae")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("wh")
    inputs = write_inputs(root / "data", rungs={k: RUNGS[k] for k in ("tiny", "small", "medium")})
    path = warehouse.build_warehouse(
        root / "data" / "warehouse.duckdb", inputs, analysis_params().settings(), {"code_version": "test"}
    )
    return path, inputs


def _con(path):
    return duckdb.connect(str(path), read_only=True)


# --- the file --------------------------------------------------------------------------------------


def test_build_leaves_one_file_with_schema_version_and_no_wal(built):
    path, _ = built
    assert sorted(p.name for p in path.parent.iterdir() if "warehouse" in p.name) == ["warehouse.duckdb"]
    with _con(path) as con:
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        assert meta["schema_version"] == str(warehouse.SCHEMA_VERSION)
        assert meta["code_version"] == "test"
        assert {f"sql:{p.name}" for p in warehouse.sql_files()} <= set(meta)
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (3,)
        assert con.execute("SELECT count(*) FROM checkpoints").fetchone() == (3 * 41,)
        assert con.execute("SELECT count(*) FROM steps").fetchone() == (3 * 2000,)
        assert con.execute("SELECT DISTINCT corpus_used, corpus_fallback FROM runs").fetchall() == [
            ("python-docs", True)
        ]


def test_every_view_answers_when_opened_read_only(built):
    path, _ = built
    with _con(path) as con:
        for view in (*VIEWS, "early_stopping"):
            assert con.execute(f"SELECT count(*) FROM {view}").fetchone()[0] >= 0
        assert con.execute("SELECT count(*) FROM feature_loss_spearman").fetchone()[0] > 0
        with pytest.raises(duckdb.Error, match="read-only"):
            con.execute("CREATE TABLE x (a INT)")


def test_null_feature_keeps_its_reason(built):
    path, _ = built
    with _con(path) as con:
        rows = con.execute("SELECT reason FROM features WHERE value IS NULL").fetchall()
    assert rows == [("diverged checkpoint",)] * 3


def test_killed_build_leaves_previous_warehouse_intact(built, tmp_path):
    path, inputs = built
    target = tmp_path / "warehouse.duckdb"
    warehouse.build_warehouse(target, inputs, analysis_params().settings(), {"code_version": "v1"})
    ready = tmp_path / "ready"
    # The child builds a new warehouse but stalls after loading the inputs, as a long build would.
    child = f"""
import time
from pathlib import Path, PosixPath
from topometrics.analysis import warehouse
from topometrics.params import load_params
from topometrics.analysis.warehouse import Inputs
real = warehouse.load_parquet
def slow(con, table, files, *constants):
    real(con, table, files, *constants)
    if table == "diagrams":
        Path({str(ready)!r}).touch(); time.sleep(60)
warehouse.load_parquet = slow
inputs = {inputs!r}
settings = load_params({str(PARAMS_YAML)!r}).analysis.settings()
warehouse.build_warehouse(Path({str(target)!r}), inputs, settings, {{"code_version": "v2"}})
"""
    proc = subprocess.Popen([sys.executable, "-c", child], cwd=REPO)
    try:
        deadline = time.time() + 30
        while not ready.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the child build never reached the stall point"
        assert list(tmp_path.glob(".warehouse.duckdb.*.tmp")), "the build must write a temporary file"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with _con(target) as con:
        assert con.execute("SELECT value FROM meta WHERE key = 'code_version'").fetchone() == ("v1",)
        assert con.execute("SELECT count(*) FROM checkpoints").fetchone() == (3 * 41,)
    warehouse.build_warehouse(target, inputs, analysis_params().settings(), {"code_version": "v3"})
    assert not list(tmp_path.glob(".warehouse.duckdb.*")), "stale temporaries of dead builds are removed"


def test_a_full_disk_during_the_build_is_one_error_naming_the_warehouse_and_keeps_the_previous_one(built, tiny_disk):
    from topometrics.errors import DiskFullError

    path, inputs = built
    target = tiny_disk("1m") / "warehouse.duckdb"  # the inputs' steps and features do not fit in 1 MiB
    target.write_bytes(b"the previous warehouse")
    with pytest.raises(DiskFullError, match=f"^{target}: no space left on its disk; free space there"):
        warehouse.build_warehouse(target, inputs, analysis_params().settings(), {"code_version": "test"})
    assert target.read_bytes() == b"the previous warehouse"
    assert sorted(p.name for p in target.parent.iterdir()) == ["warehouse.duckdb"]  # no temporary, no log


INTERRUPTED = """
import signal
import time
from pathlib import Path, PosixPath
# A stage run from a terminal has Python's Ctrl-C handler; one started by a background job inherits SIGINT
# ignored (POSIX), and Python then installs none: put it back, as a terminal would have it.
signal.signal(signal.SIGINT, signal.default_int_handler)
from topometrics.analysis import warehouse
from topometrics.analysis.warehouse import Inputs
from topometrics.errors import run_stage
from topometrics.params import load_params
real = warehouse.populate
def long_build(con, *args):
    real(con, *args)
    Path({ready!r}).touch()
    while True:  # a long build: many DuckDB queries (this duckdb polls no signal inside one long query)
        con.execute("SELECT sum(range) FROM range(200000)").fetchall()
warehouse.populate = long_build
inputs = {inputs!r}
settings = load_params({params_yaml!r}).analysis.settings()
run_stage(lambda argv: warehouse.build_warehouse(Path({target!r}), inputs, settings, {{}}), [])
"""


def test_ctrl_c_inside_a_duckdb_query_of_the_build_exits_130_in_one_line_and_keeps_the_previous_one(built, tmp_path):
    """Regression: DuckDB turns SIGINT into its own error, so the stage printed a traceback and exited 1."""
    path, inputs = built
    target, ready = tmp_path / "warehouse.duckdb", tmp_path / "ready"
    warehouse.build_warehouse(target, inputs, analysis_params().settings(), {"code_version": "v1"})
    code = INTERRUPTED.format(ready=str(ready), inputs=inputs, target=str(target), params_yaml=str(PARAMS_YAML))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "the build never reached its long query"
    time.sleep(0.5)  # inside the query
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.splitlines() == ["error: interrupted (Ctrl-C); finished work is kept, rerun `dvc repro` to go on"]
    with _con(target) as con:
        assert con.execute("SELECT value FROM meta WHERE key = 'code_version'").fetchone() == ("v1",)
    assert sorted(p.name for p in tmp_path.iterdir() if "warehouse" in p.name) == ["warehouse.duckdb"]


def corrupt_blocks(path: Path) -> None:
    """Overwrite bytes inside the data blocks of a DuckDB file, its header (the first 12 KiB) left whole."""
    data = bytearray(path.read_bytes())
    for offset in range(3 * 4096 + 262_144, len(data), 262_144):
        data[offset + 100 : offset + 164] = b"\xff" * 64
    path.write_bytes(bytes(data))


def test_a_warehouse_with_a_whole_header_and_damaged_blocks_is_named_with_the_fix(built, tmp_path):
    path, _ = built
    damaged = tmp_path / "warehouse.duckdb"
    damaged.write_bytes(path.read_bytes())
    corrupt_blocks(damaged)
    expected = rf"^{damaged} cannot be read \(.+\); it is damaged: rebuild it with `dvc repro -f warehouse`$"
    with pytest.raises(WarehouseError, match=expected):  # the report stage's path: open, then every frame
        from topometrics.report.html import write_report

        write_report(damaged, tmp_path / "no-status.json", tmp_path / "reports")
    (tmp_path / "header.duckdb").write_bytes(b"\0" * 8192)
    with pytest.raises(WarehouseError, match=r"header.duckdb cannot be read \(.+\); it is damaged: rebuild it"):
        warehouse.connect_read_only(tmp_path / "header.duckdb")


def test_missing_run_log_names_the_file_and_the_fix(tmp_path):
    inputs = write_inputs(tmp_path, rungs={"tiny": 2936})
    (tmp_path / "runs" / "tiny-42" / "steps.csv").unlink()
    with pytest.raises(WarehouseError, match=r"runs/tiny-42/steps.csv not found .* run `dvc repro train` first$"):
        warehouse.build_warehouse(tmp_path / "w.duckdb", inputs, analysis_params().settings(), {})
    assert not (tmp_path / "w.duckdb").exists()
    assert not list(tmp_path.glob(".w.duckdb*")), "a failed build removes its temporary file"


def test_a_config_without_its_variant_names_the_fix(tmp_path):
    inputs = write_inputs(tmp_path, rungs={"tiny": 2936})
    config = tmp_path / "config" / "tiny-42.json"
    config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != "variant"}))
    with pytest.raises(WarehouseError, match=r"tiny-42\.json lacks \['variant'\]; regenerate it with the config stage"):
        warehouse.build_warehouse(tmp_path / "w.duckdb", inputs, analysis_params().settings(), {})


def test_only_declared_runs_are_loaded(tmp_path):
    """DVC keeps the outputs of a rung or seed removed from params.yaml; the warehouse must not load them."""
    write_inputs(tmp_path, rungs={"tiny": 2936, "small": 7408}, seeds=(42, 7))
    _write_parquet(tmp_path / "features" / "features.parquet", pd.DataFrame())  # a root-level table is always kept
    args = (warehouse.Sources(tmp_path / "config", tmp_path / "runs", None, [tmp_path / "features"]),)
    inputs = warehouse.discover_inputs(*args, runs=["tiny-42", "small-7"])
    assert [p.stem for p in inputs.configs] == ["small-7", "tiny-42"]
    assert sorted(str(p.relative_to(tmp_path / "features")) for p in inputs.feature_files) == [
        "features.parquet",
        "small-7/features.parquet",
        "tiny-42/features.parquet",
    ]
    assert len(warehouse.discover_inputs(*args).configs) == 4  # without a declaration: every config found
    with pytest.raises(WarehouseError, match=r"config/xl-42\.json not found; run `dvc repro config` first"):
        warehouse.discover_inputs(*args, runs=["xl-42"])


def test_external_series_gets_runs_and_rungs_rows(tmp_path):
    inputs = write_inputs(tmp_path, rungs={"tiny": 2936})
    series = pd.DataFrame(
        {"rung": "EleutherAI/pythia-14m", "seed": 0, "step": [0, 1000], "layer": "all", "feature": "vr_tp0"}
        | {"value": [69.7, 69.4]}
    )  # no reason column: optional
    _write_parquet(tmp_path / "series" / "pythia-14m" / "features.parquet", series)
    inputs = Inputs(
        **(
            inputs.__dict__
            | {"feature_files": [*inputs.feature_files, *sorted((tmp_path / "series").glob("*/*.parquet"))]}
        )
    )
    con = duckdb.connect()
    warehouse.populate(con, inputs, analysis_params().settings(), {})
    assert con.execute("SELECT kind FROM runs WHERE rung = 'EleutherAI/pythia-14m'").fetchall() == [("series",)]
    assert con.execute("SELECT kind, n_params FROM rungs ORDER BY rung").fetchall() == [
        ("series", None),
        ("ladder", 2936),
    ]


# --- views against independent computations ------------------------------------------------------


def test_feature_loss_spearman_equals_scipy_with_ties(built):
    path, _ = built
    with _con(path) as con:
        view = con.execute("SELECT * FROM feature_loss_spearman").df()
        pairs = con.execute(
            """SELECT f.rung, f.seed, f.feature, f.layer, f.value, c.val_loss FROM features f
               JOIN checkpoints c USING (rung, seed, step) WHERE f.value IS NOT NULL"""
        ).df()
    assert pairs["val_loss"].duplicated().any() and pairs["value"].duplicated().any(), "the data must contain ties"
    merged = view.set_index(["rung", "seed", "feature", "layer"])
    for key, g in pairs.groupby(["rung", "seed", "feature", "layer"]):
        expected = stats.spearmanr(g["value"], g["val_loss"]).statistic
        assert merged.loc[key, "n"] == len(g)
        assert merged.loc[key, "rho"] == pytest.approx(expected, abs=1e-9)


def test_spearman_view_on_a_hand_made_tie_case():
    con = _hand_made_db(np_values=None)
    x, y = [1.0, 2.0, 2.0, 3.0, 5.0, 5.0], [3.0, 1.0, 1.0, 2.0, 0.5, 0.5]
    _features_rows(con, "t", "vr_tp0", "all", x)
    _checkpoint_rows(con, "t", y)
    (rho,) = con.execute("SELECT rho FROM feature_loss_spearman WHERE feature = 'vr_tp0'").fetchone()
    assert rho == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def test_a_series_with_only_a_training_loss_is_correlated_against_it_and_says_so():
    con = _hand_made_db(np_values=None)
    x, val, train = [1.0, 2.0, 4.0, 3.0, 5.0], [3.0, 2.5, 2.0, 1.5, 1.0], [3.0, 1.0, 2.0, 0.5, 0.7]
    for rung in ("both", "train-only", "none"):
        _features_rows(con, rung, "vr_tp0", "all", x)
    for i, (v, t) in enumerate(zip(val, train, strict=True)):
        rows = [("both", v, t), ("train-only", None, t), ("none", None, None)]
        for rung, vl, tl in rows:
            con.execute("INSERT INTO checkpoints VALUES (?, 'base', 0, ?, ?, ?, NULL, NULL)", [rung, i * 100, vl, tl])
    got = {r[0]: r[1:] for r in con.execute("SELECT rung, loss, n, rho FROM feature_loss_spearman").fetchall()}
    assert got["both"] == ("val_loss", 5, pytest.approx(stats.spearmanr(x, val).statistic))
    assert got["train-only"] == ("train_loss", 5, pytest.approx(stats.spearmanr(x, train).statistic))
    assert "none" not in got  # no loss at all: no row (the report's banner says why)


def test_phases_on_a_hand_made_np_series():
    # |dNP| = .01 .04 .10 .05 .02 .012 .004 ...: peak at step 300, first below 10% of it at step 700
    deltas = [0.01, 0.04, 0.10, 0.05, 0.02, 0.012, 0.004, 0.02, 0.001, 0.0]
    con = _hand_made_db(np_values=0.3 + np.concatenate([[0], np.cumsum(deltas)]))
    row = con.execute("SELECT * FROM phases").df().iloc[0]
    assert (row.peak_step, row.diminishing_step, row.total_steps) == (300, 700, 1000)
    assert row.peak_abs_delta == pytest.approx(0.10)
    assert (row.peak_fraction, row.diminishing_fraction) == pytest.approx((0.3, 0.7))
    assert row.np_source == "all/np_norm"


def test_phases_fall_back_to_the_mean_of_layer_np_norm():
    con = _hand_made_db(np_values=None)
    _features_rows(con, "t", "np_norm", "block0.attn.qkv", [0.2, 0.3, 0.3, 0.3])
    _features_rows(con, "t", "np_norm", "block0.mlp.in", [0.4, 0.5, 0.9, 0.9])
    series = con.execute("SELECT np FROM np_series ORDER BY step").fetchall()
    assert np.allclose([r[0] for r in series], [0.3, 0.4, 0.6, 0.6])
    row = con.execute("SELECT peak_step, diminishing_step, np_source FROM phases").fetchone()
    assert row == (200, 300, "avg(layer np_norm)")
    _features_rows(con, "t", "np_norm", "all", [0.1, 0.5, 0.5, 0.5])  # the features stage's layer-'all' mean
    assert con.execute("SELECT DISTINCT np_source FROM np_series").fetchall() == [("all/np_norm",)]
    assert con.execute("SELECT peak_step FROM phases").fetchall() == [(100,)]


def test_early_stopping_follows_rieck_patience_rule():
    # NP improves by more than min_delta (0.001) up to step 300, then wobbles: patience 3 fires at step 600
    np_values = [0.30, 0.32, 0.34, 0.36, 0.3605, 0.359, 0.3609, 0.40, 0.41, 0.42, 0.43]
    con = _hand_made_db(np_values=np_values, settings=analysis_params(np_patience=3, loss_patience=2).settings())
    # val loss improves until step 500, then stalls: patience 2 fires at step 700
    _checkpoint_rows(con, "t", [4.0, 3.0, 2.5, 2.2, 2.1, 2.0, 2.0, 2.0, 1.99, 1.98, 1.97])
    row = con.execute("SELECT * FROM early_stopping").df().iloc[0]
    assert (row.np_stop_step, row.np_steps_saved, bool(row.np_fired)) == (600, 400, True)
    assert (row.loss_stop_step, row.loss_steps_saved, row.loss_stop_val_loss) == (700, 300, 2.0)
    assert row.final_val_loss == 1.97


def test_prediction_mae_equals_numpy():
    con = _hand_made_db(np_values=None)
    rng = np.random.default_rng(1)
    actual = rng.uniform(1.5, 2.5, 5)
    rows = []
    for method, noise in (("loss_power_law", 0.1), ("loss_topology", 0.05)):
        for fraction in (0.2, 0.5):
            pred = actual + rng.normal(0, noise, 5)
            for i, rung in enumerate("abcde"):
                failed = method == "loss_topology" and fraction == 0.5 and i == 0
                rows.append({"method": method, "cv": "rung", "fraction": fraction, "rung": rung, "seed": 0}
                            | {"predicted": None if failed else pred[i], "actual": actual[i]}
                            | {"status": "failed" if failed else "ok", "reason": "x" if failed else None})  # fmt: skip
    frame = pd.DataFrame(rows)
    con.register("p", frame)
    con.execute("INSERT INTO predictions BY NAME SELECT * FROM p")
    view = con.execute("SELECT * FROM prediction_mae").df().set_index(["method", "fraction"])
    ok = frame[frame.status == "ok"]
    for (method, fraction), g in ok.groupby(["method", "fraction"]):
        mae = np.mean(np.abs(g.predicted - g.actual))
        assert view.loc[(method, fraction), "mae"] == pytest.approx(mae, abs=1e-12)
        base = frame[(frame.method == "loss_power_law") & (frame.fraction == fraction) & frame.rung.isin(g.rung)]
        base_mae = np.mean(np.abs(base.predicted.to_numpy() - base.actual.to_numpy()))
        assert view.loc[(method, fraction), "baseline_mae"] == pytest.approx(base_mae, abs=1e-12)
        assert view.loc[(method, fraction), "improvement_pct"] == pytest.approx(100 * (base_mae - mae) / base_mae)
    assert view.loc[("loss_topology", 0.5), ["n", "n_failed", "n_paired"]].tolist() == [4, 1, 4]


def test_scaling_view_holds_final_values_and_final_loss(built):
    path, _ = built
    with _con(path) as con:
        rows = con.execute(
            "SELECT rung, n_params, step, value FROM scaling WHERE feature = 'val_loss' ORDER BY n_params"
        ).fetchall()
        final = con.execute("SELECT rung, val_loss FROM checkpoints WHERE step = 2000 ORDER BY rung").fetchall()
    assert [(r[0], r[3]) for r in rows] == sorted(final, key=lambda r: RUNGS[r[0]])
    assert [r[1] for r in rows] == [2936, 7408, 20640] and {r[2] for r in rows} == {2000}


# --- hand-made databases -------------------------------------------------------------------------


def _hand_made_db(np_values, settings=None) -> duckdb.DuckDBPyConnection:
    """An in-memory warehouse with one run 't' (1000 steps) and, optionally, an NP series every 100 steps."""
    con = duckdb.connect()
    schema, *views = warehouse.sql_files()
    con.execute(schema.read_text())
    values = list((settings or analysis_params().settings()).__dict__.values())
    con.execute(f"INSERT INTO settings VALUES ({', '.join('?' * len(values))})", values)
    con.execute("INSERT INTO runs (rung, seed, kind, steps) VALUES ('t', 0, 'ladder', 1000)")
    if np_values is not None:
        _features_rows(con, "t", "np_norm", "all", np_values)
    for view in views:
        con.execute(view.read_text())
    return con


def _features_rows(con, rung, feature, layer, values, every=100):
    for i, v in enumerate(values):
        row = [rung, i * every, layer, feature, v]
        con.execute("INSERT INTO features (rung, seed, step, layer, feature, value) VALUES (?, 0, ?, ?, ?, ?)", row)


def _checkpoint_rows(con, rung, losses, every=100):
    for i, v in enumerate(losses):
        con.execute("INSERT INTO checkpoints (rung, seed, step, val_loss) VALUES (?, 0, ?, ?)", [rung, i * every, v])


def test_feature_shards_of_other_params_are_reported_not_read(tmp_path):
    from topometrics.execution.shards import Fingerprint, ShardKey, write_shard

    root = tmp_path / "data"
    write_inputs(root, rungs={"tiny": RUNGS["tiny"]})
    flat = pd.read_parquet(root / "features" / "tiny-42" / "features.parquet")
    (root / "features" / "tiny-42" / "features.parquet").unlink()
    shards = root / "features" / "tiny-42"
    for step, part in flat.groupby("step"):  # the same rows as per-checkpoint shards; every 4th from other params
        params = "other" if step % 200 == 0 else "mine"
        write_shard(shards, ShardKey("tiny", "base", 42, int(step)), Fingerprint("w", params, "c"), {"features": part})
    args = (warehouse.Sources(root / "config", root / "runs", root / "corpus" / "source.json", [root / "features"]),)
    inputs = warehouse.discover_inputs(*args, feature_params="mine")
    assert inputs.not_read == [
        f"{root / 'features'}: 11 features shards computed with other feature params are not read "
        f"(e.g. {shards / 'rung=tiny/variant=base/seed=42/step=0/features.parquet'})",
    ]  # the run's diagrams.parquet is not a shard: read as before
    con = duckdb.connect()
    warehouse.populate(con, inputs, analysis_params().settings(), {})
    got = con.execute("SELECT DISTINCT step FROM features ORDER BY step").fetchall()
    assert [s for (s,) in got] == sorted(s for s in flat.step.unique() if s % 200)
    assert con.execute("SELECT count(*) FROM features").fetchone()[0] == (flat.step % 200 != 0).sum()
    assert len(warehouse.discover_inputs(*args).feature_files) == flat.step.nunique()  # no params: every shard


def test_series_losses_reach_the_checkpoints_table_and_the_views(tmp_path):
    inputs = write_inputs(tmp_path, rungs={"tiny": 2936})
    steps = [0, 100, 200, 300, 400]
    np_values, val = [0.20, 0.30, 0.25, 0.24, 0.23], [5.0, 4.0, 3.5, 3.4, np.nan]
    series = pd.DataFrame({"rung": "my-run", "seed": 0, "step": steps, "layer": "all", "feature": "np_norm",
                           "value": np_values, "reason": None})  # fmt: skip
    _write_parquet(tmp_path / "series" / "features.parquet", series)
    losses = pd.DataFrame({"rung": "my-run", "seed": 0, "step": steps, "val_loss": val, "train_loss": 1.0,
                           "reason": [None] * 4 + ["trainer_state.json logs no eval_loss at step 400"]})  # fmt: skip
    _write_parquet(tmp_path / "series" / "checkpoints.parquet", losses)
    found = warehouse.discover_inputs(
        warehouse.Sources(tmp_path / "config", tmp_path / "runs", None, [tmp_path / "series"])
    )
    assert found.checkpoint_files == [tmp_path / "series" / "checkpoints.parquet"]
    files = {"feature_files": [*inputs.feature_files, tmp_path / "series" / "features.parquet"]}
    inputs = Inputs(**(inputs.__dict__ | files | {"checkpoint_files": found.checkpoint_files}))
    con = duckdb.connect()
    warehouse.populate(con, inputs, analysis_params(np_patience=2).settings(), {})
    rows = con.execute("SELECT step, val_loss, reason FROM checkpoints WHERE rung = 'my-run' ORDER BY step").fetchall()
    assert rows[-1] == (400, None, "trainer_state.json logs no eval_loss at step 400") and rows[0] == (0, 5.0, None)
    assert con.execute("SELECT reason FROM checkpoints WHERE rung = 'tiny' LIMIT 1").fetchone() == (None,)
    rho = con.execute("SELECT rho, n FROM feature_loss_spearman WHERE rung = 'my-run'").fetchone()
    assert rho == pytest.approx((stats.spearmanr(np_values[:4], val[:4]).statistic, 4))
    stop = con.execute("SELECT np_fired, np_stop_step FROM early_stopping WHERE rung = 'my-run'").fetchone()
    assert stop == (True, 300)  # best 0.30 at step 100, then two checkpoints without a rise


@pytest.mark.slow
def test_kill_9_of_dvc_repro_during_the_warehouse_stage_keeps_the_previous_warehouse(reproduced):
    """DVC deletes a non-persistent output before running its stage; the warehouse is `persist: true`,
    so a SIGKILL of `dvc repro` (and the stage) mid-build leaves the previous file, whole."""
    from tests.pipeline.helpers import dvc_env

    path = reproduced / "data/warehouse.duckdb"
    before = path.read_bytes()
    proc = subprocess.Popen(
        ["dvc", "repro", "--single-item", "--force", "warehouse"], cwd=reproduced, env=dvc_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 600  # a guard against a hang only
        while not list(path.parent.glob(".warehouse.duckdb.*.tmp")) and proc.poll() is None:
            assert time.time() < deadline, "the warehouse stage never started its build"
            time.sleep(0.001)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the stage finished before the kill; nothing was tested"
    assert path.read_bytes() == before
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM checkpoints").fetchone() == (5,)


@pytest.mark.slow
def test_a_held_writer_stops_the_warehouse_stage_naming_the_process(reproduced):
    from tests.pipeline.helpers import error_lines, failing

    path = reproduced / "data/warehouse.duckdb"
    before = path.read_bytes()
    code = f"import duckdb, sys, time; c = duckdb.connect({str(path)!r}); print('open', flush=True); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "open\n"
        out = failing(["dvc", "repro", "--single-item", "--force", "warehouse"], reproduced)
    finally:
        holder.kill()
        holder.wait()
    [line] = error_lines(out)
    assert line.startswith(f"error: data/warehouse.duckdb is open for writing by PID {holder.pid} ({sys.executable} -c")
    assert line.endswith(
        "); close that connection (read with duckdb.connect(..., read_only=True) or `duckdb -readonly`) and re-run"
    )
    assert path.read_bytes() == before


@pytest.mark.parametrize("unit", ["nats", "bpb"])
def test_analysis_loss_unit_picks_the_final_loss_the_scaling_fit_and_the_curves_read(unit):
    import dataclasses

    from topometrics.analysis.tables import CHOSEN_LOSS

    con = _hand_made_db(None, dataclasses.replace(analysis_params().settings(), loss_unit=unit))
    con.execute("INSERT INTO rungs (rung, kind, n_params) VALUES ('t', 'ladder', 1000)")
    for step, nats in ((0, 4.0), (500, 2.0), (1000, 1.5)):
        bpb = nats * 100 / 130 / np.log(2)  # 100 scored tokens standing for 130 bytes
        con.execute("INSERT INTO checkpoints (rung, seed, step, val_loss, val_bpb) VALUES ('t', 0, ?, ?, ?)",
                    [step, nats, bpb])  # fmt: skip
    final = con.execute("SELECT val_loss, val_bpb, loss FROM final_checkpoints").fetchone()
    assert final[:2] == (1.5, pytest.approx(1.5 * 100 / 130 / np.log(2)))
    assert final[2] == (final[0] if unit == "nats" else final[1])
    scaled = con.execute("SELECT value FROM scaling WHERE feature = 'val_loss'").fetchone()[0]
    assert scaled == final[2]
    curve = con.execute(f"SELECT {CHOSEN_LOSS} FROM checkpoints ORDER BY step").df().iloc[:, 0].tolist()
    assert curve[0] == (4.0 if unit == "nats" else pytest.approx(4.0 * 100 / 130 / np.log(2)))


def test_a_checkpoint_tables_bits_per_byte_reaches_the_warehouse_and_older_tables_give_null(tmp_path):
    inputs = write_inputs(tmp_path / "data", rungs={"tiny": 2936, "small": 11_824})
    table = tmp_path / "data" / "runs" / "tiny-42" / "checkpoints.csv"
    frame = pd.read_csv(table)
    frame.assign(val_bpb=frame["val_loss"] * 0.9).to_csv(table, index=False)  # the train stage's column
    target = tmp_path / "warehouse.duckdb"
    warehouse.build_warehouse(target, inputs, analysis_params().settings(), {"code_version": "test"})
    with duckdb.connect(str(target), read_only=True) as con:
        rows = con.execute("SELECT rung, val_loss, val_bpb FROM checkpoints ORDER BY rung, step").df()
        unit = con.execute("SELECT loss_unit FROM settings").fetchone()[0]
    tiny, small = rows[rows["rung"] == "tiny"], rows[rows["rung"] == "small"]
    assert np.allclose(tiny["val_bpb"], tiny["val_loss"] * 0.9) and small["val_bpb"].isna().all()
    assert unit == "nats"


def test_a_runs_throughput_is_its_summarys_and_null_without_one_and_a_broken_summary_names_the_file(tmp_path):
    inputs = write_inputs(tmp_path, rungs={"tiny": 2936, "small": 7408})
    (tmp_path / "runs" / "tiny-42" / "summary.json").write_text(json.dumps({"tokens_per_s": 1234.5, "device": "cpu"}))
    (tmp_path / "runs" / "small-42" / "summary.json").write_text(json.dumps({"tokens_per_s": None}))
    target = warehouse.build_warehouse(tmp_path / "w.duckdb", inputs, analysis_params().settings(), {})
    with warehouse.connect_read_only(target) as con:
        rows = con.execute("SELECT rung, tokens_per_s FROM runs ORDER BY rung").fetchall()
    assert rows == [("small", None), ("tiny", 1234.5)]
    (tmp_path / "runs" / "tiny-42" / "summary.json").write_text("[1, 2")
    with pytest.raises(WarehouseError, match=r"runs/tiny-42/summary\.json is not a JSON object .*re-run its train"):
        warehouse.build_warehouse(tmp_path / "w2.duckdb", inputs, analysis_params().settings(), {})
