"""topometrics.features.sweep: one sweep over several runs writes each run's shards as run_shards alone would."""

import pytest

from tests.features.helpers import PARAMS, STEPS, read_back, same_rows


def test_one_sweep_over_several_runs_writes_each_runs_shards_as_alone_and_names_a_run_without_checkpoints(
    tiny, tmp_path
):
    import json
    import shutil

    from topometrics.features.sweep import RunShards, sweep_shards
    from topometrics.models.checkpoints import CheckpointError

    root, features, diagrams = tiny
    shutil.copytree(root / "run", tmp_path / "a")
    shutil.copytree(root / "run", tmp_path / "b")
    for sidecar in (tmp_path / "b").glob("step_*.json"):  # the same weights, recorded as another seed
        sidecar.write_text(json.dumps(json.loads(sidecar.read_text()) | {"seed": 7}))
    (tmp_path / "empty").mkdir()
    runs = [RunShards(tmp_path / name, tmp_path / "out" / name) for name in ("a", "b", "empty")]
    lines = []
    with pytest.raises(CheckpointError, match=r"empty: no complete checkpoints"):
        sweep_shards(runs, root / "corpus", PARAMS, progress=lines.append)
    for name, seed in (("a", 42), ("b", 7)):  # written before the error, each as run_shards alone writes it
        got_features, got_diagrams = read_back(tmp_path / "out" / name)
        assert set(got_features["seed"]) == {seed}
        same_rows(got_features.assign(seed=42), features, ["step", "layer", "feature"])
        same_rows(got_diagrams.assign(seed=42), diagrams, ["step", "source", "layer", "dim", "birth", "death"])
    assert "features@a: 4 checkpoints, 4 computed, 0 already current, 0 failed" in lines[0]
    assert lines[-1].startswith("features: 3 runs, 8 checkpoints, 0 failed, 1 runs without checkpoints")
    # b's weights are a's: its shards were written from a's results, not computed again
    assert lines[-1].endswith("; 4 the same as another run's (equal weights), computed once")

    lines = []  # every shard current: nothing computed, no line per run, one summary
    done = sweep_shards(runs[:2], root / "corpus", PARAMS, progress=lines.append)
    assert all(not r.computed and {k.step for k in r.reused} == set(STEPS) for r in done.values())
    assert len(lines) == 1 and lines[0].startswith("features: 2 runs, 8 checkpoints, 0 failed, 0 runs without")


def test_checkpoints_of_several_runs_with_equal_weights_are_computed_once_and_a_changed_config_is_not_equal(
    tiny, tmp_path
):
    """A sweep's recipes of one rung and seed share their initial weights: the first checkpoint is computed once
    and written for each run. The config is part of what is equal: the same bytes read with another number of
    the residual stream cut are another model (and another shard, before and after)."""
    import json
    import shutil

    from topometrics.features.sweep import RunShards, sweep_shards

    root, features, _ = tiny
    for name, seed, residual in (("same", 7, True), ("cut", 9, False)):
        shutil.copytree(root / "run", tmp_path / name)
        for sidecar in (tmp_path / name).glob("step_*.json"):
            meta = json.loads(sidecar.read_text())
            sidecar.write_text(json.dumps(meta | {"seed": seed, "config": meta["config"] | {"residual": residual}}))
    runs = [RunShards(tmp_path / name, tmp_path / "out" / name) for name in ("same", "cut")]
    done = sweep_shards(runs, root / "corpus", PARAMS)
    for name in ("same", "cut"):  # (computed: the checkpoints' shards, then their distances')
        assert {k.step for k in done[tmp_path / name].computed} == set(STEPS) and not done[tmp_path / name].copied
    same, _ = read_back(tmp_path / "out" / "same")
    same_rows(same.assign(seed=42), features, ["step", "layer", "feature"])
    cut, _ = read_back(tmp_path / "out" / "cut")
    losses = [frame.query("feature == 'batch_loss'").sort_values("step")["value"].to_numpy() for frame in (cut, same)]
    assert (abs(losses[0] - losses[1]) > 1e-5).all()  # 100x float32 rounding: near-uniform at a random init
    for sidecar in (tmp_path / "cut").glob("step_*.json"):  # the residual stream back: now equal to 'same'
        meta = json.loads(sidecar.read_text())
        sidecar.write_text(json.dumps(meta | {"config": meta["config"] | {"residual": True}}))
    again = sweep_shards(runs, root / "corpus", PARAMS)
    assert {k.step for k in again[tmp_path / "cut"].computed} == set(STEPS)  # the config is in the fingerprint
    cut, _ = read_back(tmp_path / "out" / "cut")
    same_rows(cut.assign(seed=42), features, ["step", "layer", "feature"])


def test_a_run_added_to_a_finished_sweep_reads_its_shared_checkpoints_back_byte_for_byte(tiny, tmp_path):
    """A recipe added to a finished sweep starts from weights the sweep has: their current shards are read back
    and written under the new run's keys, the same bytes (the trajectory iterate in the footer included) as a
    sweep of both runs at once writes from the computed result."""
    import json
    import shutil

    from topometrics.features.sweep import RunShards, sweep_shards

    root, _, _ = tiny
    shutil.copytree(root / "run", tmp_path / "b")
    for sidecar in (tmp_path / "b").glob("step_*.json"):
        sidecar.write_text(json.dumps(json.loads(sidecar.read_text()) | {"seed": 7}))
    shutil.copytree(root / "expected", tmp_path / "later" / "a")  # the finished sweep: a's shards, current

    def sweep(out):
        return sweep_shards([RunShards(root / "run", out / "a"), RunShards(tmp_path / "b", out / "b")],
                            root / "corpus", PARAMS)  # fmt: skip

    later, together = sweep(tmp_path / "later"), sweep(tmp_path / "together")
    assert not later[root / "run"].computed and {k.step for k in later[tmp_path / "b"].copied} == set(STEPS)
    assert {k.step for k in together[tmp_path / "b"].copied} == set(STEPS)
    files = sorted(p.relative_to(tmp_path / "together") for p in (tmp_path / "together" / "b").rglob("*.parquet"))
    assert len(files) == 3 * len(STEPS)  # features, diagrams, distances
    assert all((tmp_path / "later" / f).read_bytes() == (tmp_path / "together" / f).read_bytes() for f in files)
