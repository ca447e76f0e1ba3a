"""End to end: `dvc repro` on a tiny ladder in a temporary git repo, `dvc exp run -S` re-running
only the rungs that inherit the changed value, and `dvc push` / `dvc pull` through a local remote."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
import yaml

from tests.pipeline.helpers import commit, dvc_env, make_project, run

pytestmark = pytest.mark.slow


def test_repro_experiment_and_remote_round_trip(tmp_path):
    project = make_project(tmp_path / "project")
    out = run(["dvc", "repro"], project)
    assert "OFFLINE FALLBACK" in out
    for run_dir in ("a-42", "b-42"):  # one run per rung x train.seeds ([42] by default)
        assert len(list((project / "data/runs" / run_dir).glob("step_*.safetensors"))) == 5
        shards = list((project / "data/features" / run_dir).glob("rung=*/variant=base/seed=42/step=*/features.parquet"))
        assert len(shards) == 5  # one shard per checkpoint
    assert (project / "data/warehouse.duckdb").exists() and (project / "reports/report.html").exists()
    metrics = json.loads((project / "reports/metrics.json").read_text())
    assert metrics["corpus"]["used"] == "python-docs-offline"
    with duckdb.connect(str(project / "data/warehouse.duckdb"), read_only=True) as con:
        n = con.execute("select count(distinct step) from features where rung = 'b'").fetchone()[0]
        assert n == 5
        assert con.execute("select count(*) from feature_loss_spearman").fetchone()[0] > 0
        assert con.execute("select count(*) from runs where tokens_per_s > 0").fetchone()[0] == 2  # measured
    # The real report's answer: what an answer needs, its training time from the runs' measured throughput, and
    # the one command (2 rungs: 24 recipes make 48 cells; 40 steps, so the drawn recipes' schedules fit 40 steps).
    page = (project / "reports/report.html").read_text()
    needs = r"An answer needs 96 runs: 48 cells \(24 recipes x 2 rungs\), 2 seeds each, the layout whose power"
    needs += r".*this project declares 2 runs in 2 cells\. Training them takes about [\d.]+ (min|h) here "
    needs += r"\(\d+ processes"
    assert len(re.findall(needs, page)) == 1, page[page.index('<section id="answer"') :][:3000]
    assert "For an answer: <code>dvc exp run $(python tools/sample_recipes.py --n 23 --seed 2026 --steps 40)" in page
    assert "didn't change" in run(["dvc", "repro"], project).replace("Stage 'corpus'", "")
    train = [sys.executable, "stages/train.py", "--configs", "data/config", "--corpus", "data/corpus", "--runs",
             "data/runs", "--metrics", "reports/train", "--curves", "reports/curves"]  # fmt: skip
    assert "train: 1 runs, 1 complete, 0 to train" in run([*train, "--run", "a-42"], project)  # one run alone
    wrong = subprocess.run([*train, "--run", "a-7"], cwd=project, capture_output=True, text=True)
    assert wrong.returncode == 1 and "--run a-7 is not declared in params.yaml; runs are a-42, b-42" in wrong.stderr
    commit(project, "trained")

    # rung b inherits train.hidden, rung a overrides it: only b is retrained and its features recomputed,
    # a's files are not touched, and the metrics show the change.
    a_files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (project / "data/runs/a-42").iterdir()}
    exp = run(["dvc", "exp", "run", "-S", "train.hidden=16", "analysis"], project)
    assert "1 complete, 1 to train" in exp and "[b-42] step 40/40" in exp and "[a-42] step" not in exp
    assert "features@b-42: 5 checkpoints, 5 computed" in exp and "features@a-42:" not in exp  # a's shards: current
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (project / "data/runs/a-42").iterdir()} == a_files
    assert "train.hidden" in run(["dvc", "exp", "show", "--no-pager", "--csv"], project)
    diff = run(["dvc", "metrics", "diff", "--all", "--md"], project)
    assert "reports/metrics.json" in diff and "final_val_loss.b" in diff
    assert "reports/train" not in diff and "b-42" not in diff  # a run's numbers are outputs, not metrics
    assert len(diff.splitlines()) <= 2 + 22  # one screen: a header and at most every headline value

    # overriding one rung re-runs only its chain; adding a rung adds its stages
    exp = run(["dvc", "exp", "run", "-S", "ladder.a.hidden=12", "-S", "ladder.a.heads=2", "train"], project)
    assert "[a-42] step 40/40" in exp and "[b-42] step" not in exp
    exp = run(["dvc", "exp", "run", "-S", "+ladder.c={hidden: 4, layers: 1, heads: 1}", "features"], project)
    assert "[c-42] step 40/40" in exp and "[a-42] step" not in exp and "features@c-42: 5 checkpoints, 5 computed" in exp
    back_to_baseline(project)

    # a second seed trains only the new runs, and one warehouse holds both seeds with across-seed CIs
    exp = run(["dvc", "exp", "run", "-S", "train.seeds=[42,7]"], project)
    assert "2 complete, 2 to train" in exp and "features@b-7: 5 checkpoints, 5 computed" in exp
    assert "[a-42] step" not in exp and "features@b-42:" not in exp
    with duckdb.connect(str(project / "data/warehouse.duckdb"), read_only=True) as con:
        seeds = con.execute("select rung, list(distinct seed order by seed) from checkpoints group by rung").fetchall()
        assert sorted(seeds) == [("a", [7, 42]), ("b", [7, 42])]
        across = con.execute(
            "select n from tests where kind = 'spearman_across_seeds' and rung = 'a' and feature = 'vr_tp0'"
            " and layer = 'all'"
        ).fetchall()
        assert across == [(2,)]  # MAE intervals need fits, which 5 checkpoints do not allow
    metrics = json.loads((project / "reports/metrics.json").read_text())
    assert metrics["runs"] == 4 and set(metrics["final_val_loss"]) == {"a", "b"}  # a column per rung, not per run
    back_to_baseline(project)

    # a recipe variant adds only its runs; the warehouse keys every run by variant, the analysis reads one variant
    exp = run(["dvc", "exp", "run", "-S", "+variants.lr_hi={lr: 0.006}"], project)
    assert "2 complete, 2 to train" in exp and "features@b-lr_hi-42: 5 checkpoints, 5 computed" in exp
    assert "features@b-42:" not in exp
    with duckdb.connect(str(project / "data/warehouse.duckdb"), read_only=True) as con:
        runs = con.execute("select rung, variant, seed, lr from runs where kind = 'ladder' order by all").fetchall()
        assert runs == [("a", "base", 42, 0.003), ("a", "lr_hi", 42, 0.006), ("b", "base", 42, 0.003),
                        ("b", "lr_hi", 42, 0.006)]  # fmt: skip
        n = con.execute("select count(distinct (rung, variant, seed)) from feature_loss_spearman").fetchone()[0]
        assert n == 4 and con.execute("select distinct variant from predictions").fetchall() == [("base",)]
    back_to_baseline(project)

    # kill -9 of the whole `dvc repro` mid-training, then `dvc repro` again: every run ends bit-identical to an
    # uninterrupted one (variant `again` has the base recipe, so its runs must equal the base runs byte for byte)
    params = yaml.safe_load((project / "params.yaml").read_text()) | {"variants": {"again": {}}}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = subprocess.Popen(["dvc", "repro", "train"], cwd=project, env=dvc_env(), start_new_session=True)
    mark = project / "data/runs/b-again-42/step_000010.json"
    deadline = time.time() + 300
    while not mark.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (project / "data/runs/b-again-42/step_000040.json").exists(), "the kill came too late"
    assert "[b-again-42] resuming from step" in run(["dvc", "repro", "train"], project)
    for rung in ("a", "b"):
        for name in ("step_000040.safetensors", "steps.csv", "checkpoints.csv"):
            again = (project / f"data/runs/{rung}-again-42/{name}").read_bytes()
            assert again == (project / f"data/runs/{rung}-42/{name}").read_bytes(), (rung, name)
    back_to_baseline(project)

    # share through a local-folder remote and pull in a second clone
    remote = tmp_path / "remote"
    run(["dvc", "remote", "add", "-d", "local", str(remote)], project)
    run(["git", "add", ".dvc/config"], project)
    run(["git", "commit", "-qm", "remote"], project)
    run(["dvc", "push"], project)
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(project), str(clone)], tmp_path)
    run(["dvc", "pull"], clone)
    assert (clone / "data/runs/b-42/step_000020.safetensors").read_bytes() == (
        project / "data/runs/b-42/step_000020.safetensors"
    ).read_bytes()
    status = run(["dvc", "status", "train", "config"], clone)
    assert "up to date" in status, status


def test_exp_show_grows_by_no_column_per_run(reproduced):
    """An 8-run sweep of the one-rung project: the metric columns of `dvc exp show` stay the headline's, and the
    columns that differ between the experiments (`--only-changed`, data hashes dropped) fit in 40."""
    before = metric_columns(reproduced)
    assert 0 < len(before) <= 40 and "final_val_loss.a" in before
    run(["dvc", "exp", "run", "-S", "train.seeds=[42,43,44,45,46,47,48,49]"], reproduced)  # 7 new runs of rung a
    assert metric_columns(reproduced) == before
    changed = run(["dvc", "exp", "show", "--no-pager", "--csv", "--only-changed", "--drop", "data/"], reproduced)
    header = changed.splitlines()[0].split(",")
    assert "train.seeds" in header and "runs" in header and len(header) <= 40, header
    assert not [c for c in header if "-4" in c], header  # no run's name (a-42 ... a-49)
    diff = run(["dvc", "metrics", "diff"], reproduced)
    assert "runs" in diff and len(diff.splitlines()) <= 24, diff


def metric_columns(project: Path) -> list[str]:
    """The workspace's metric columns in `dvc exp show` (every leaf of every metrics file, dotted)."""
    shown, _ = json.JSONDecoder().raw_decode(run(["dvc", "exp", "show", "--no-pager", "--json"], project))
    workspace = shown[0]
    assert workspace["rev"] == "workspace"

    def leaves(tree: dict, prefix: str = "") -> list[str]:
        out = []
        for key, value in tree.items():
            out += leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]
        return out

    return sorted(c for f in workspace["data"]["metrics"].values() for c in leaves(f["data"]))


def back_to_baseline(project: Path) -> None:
    """The committed, fully reproduced baseline: params and every DVC output."""
    run(["git", "checkout", "--", "."], project)
    run(["dvc", "checkout", "--force"], project)


def test_invalid_params_stop_repro_before_any_work(tmp_path):
    project = make_project(tmp_path / "project")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["train"]["hidden_size"] = 8
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(AssertionError, match="unknown param train.hidden_size"):
        run(["dvc", "repro"], project)
    assert not (project / "data" / "corpus").exists()


def test_dvc_repro_names_and_recomputes_content_that_changed_and_the_warehouse_is_as_before(reproduced):
    """One flipped bit in a finished checkpoint, one in a feature shard's data page (their headers and footers
    whole) and a truncated train.u8: each used to be trusted (a run called complete, a shard "already current",
    the half corpus "kept"). `dvc repro` names all three, restores each byte for byte, and the warehouse's
    features are the ones before."""
    checkpoint = reproduced / "data/runs/a-42/step_000020.safetensors"
    shard = reproduced / "data/features/a-42/rung=a/variant=base/seed=42/step=10/features.parquet"
    tokens = reproduced / "data/corpus/train.u8"
    good = {path: path.read_bytes() for path in (checkpoint, shard, tokens)}
    query = "SELECT rung, step, layer, feature, value FROM features ORDER BY ALL"
    with duckdb.connect(str(reproduced / "data/warehouse.duckdb"), read_only=True) as con:
        features = con.execute(query).fetchall()
    for path, offset in ((checkpoint, -1), (shard, -(8 + int.from_bytes(good[shard][-8:-4], "little")) - 3)):
        data = bytearray(good[path])
        data[offset] ^= 1
        path.write_bytes(bytes(data))
    tokens.write_bytes(good[tokens][: len(good[tokens]) // 2])
    out = run(["dvc", "repro"], reproduced)
    assert f"corpus: {Path('data/corpus/train.u8')}: " in out and "(truncated or extended); rewriting" in out
    assert "step_000020.safetensors: content changed after it was written (sha256 " in out
    assert "1 damaged shards recomputed (step 10: features.parquet: content changed after it was written" in out
    assert {path: path.read_bytes() for path in good} == good
    with duckdb.connect(str(reproduced / "data/warehouse.duckdb"), read_only=True) as con:
        assert con.execute(query).fetchall() == features
