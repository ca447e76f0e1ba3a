"""Parquet shards: layout, fingerprints in the metadata, atomic writes, resume after a real kill,
and reading a folder of mixed feature params with DuckDB."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.execution.shards_helpers import frame, in_process, tasks_for
from tests.repo_params import features_params
from topometrics.execution.shards import (
    CONTENT_KEY,
    INFO_KEY,
    META_KEY,
    Fingerprint,
    ShardError,
    ShardKey,
    Task,
    compute_shards,
    content_problem,
    is_current,
    module_source_hash,
    params_digest,
    prune,
    remove_temporaries,
    scan,
    stored_fingerprint,
    stored_info,
    write_shard,
)

ROOT = str(Path(__file__).resolve().parents[2])  # the repository: scripts run here import tests.<folder>.helpers


FP = Fingerprint(inputs="abc", params="p1", code="c1")


# ---------------------------------------------------------------------------
# Keys, fingerprints, versions
# ---------------------------------------------------------------------------


def test_shard_folder_is_hive_partitioned(tmp_path):
    assert ShardKey("tiny", "base", 42, 100).folder(tmp_path) == tmp_path / "rung=tiny/variant=base/seed=42/step=100"


@pytest.mark.parametrize("rung", ["a/b", "a=b", "", ".hidden"])
def test_shard_key_rejects_names_that_cannot_be_folders(rung):
    with pytest.raises(ShardError, match="cannot name a folder"):
        ShardKey(rung, "base", 0, 0)


def test_fingerprint_digest_depends_on_every_part():
    digests = {FP.digest, Fingerprint("abd", "p1", "c1").digest, Fingerprint("abc", "p2", "c1").digest,
               Fingerprint("abc", "p1", "c2").digest}  # fmt: skip
    assert len(digests) == 4
    assert Fingerprint.from_json(FP.to_json()) == FP


def test_params_digest_ignores_workers_and_device_only():
    base = features_params()
    assert (
        params_digest(base) == params_digest(features_params(workers=7)) == params_digest(features_params(device="cpu"))
    )
    assert params_digest(base) != params_digest(features_params(max_points=base.max_points + 1))
    assert params_digest({"a": 1, "b": 2}) == params_digest({"b": 2, "a": 1})


def test_module_source_hash_follows_the_import_closure(tmp_path, monkeypatch):
    pkg = tmp_path / "pkgcv"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkgcv.b import g\nimport numpy\n")
    (pkg / "b.py").write_text("def g():\n    return 1\n")
    (pkg / "c.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = module_source_hash("pkgcv.a")
    (pkg / "c.py").write_text("x = 2\n")  # not imported by a
    assert module_source_hash("pkgcv.a") == before
    (pkg / "b.py").write_text("def g():\n    return 2\n")  # imported by a
    assert module_source_hash("pkgcv.a") != before


def test_module_source_hash_of_features_covers_its_computing_modules():
    assert module_source_hash("topometrics.features.checkpoint") != module_source_hash("topometrics.measures.spectral")


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def test_write_shard_round_trips_tables_and_fingerprint(tmp_path):
    key = ShardKey("tiny", "base", 1, 200)
    folder = write_shard(tmp_path, key, FP, {"features": frame(200), "diagrams": frame(200, 5)})
    assert sorted(p.name for p in folder.iterdir()) == ["diagrams.parquet", "features.parquet"]
    pd.testing.assert_frame_equal(pd.read_parquet(folder / "features.parquet"), frame(200))
    meta = json.loads(pq.read_schema(folder / "diagrams.parquet").metadata[META_KEY.encode()])
    assert meta == {"inputs": "abc", "params": "p1", "code": "c1", "digest": FP.digest}
    assert stored_fingerprint(folder / "features.parquet") == FP
    assert is_current(tmp_path, key, FP, ["features", "diagrams"])
    assert not is_current(tmp_path, key, Fingerprint("abc", "p2", "c1"), ["features"])
    assert not is_current(tmp_path, key, FP, ["features", "distances"])  # a table is missing


def test_a_failed_write_leaves_neither_a_file_nor_a_temporary(tmp_path):
    key = ShardKey("tiny", "base", 1, 0)
    write_shard(tmp_path, key, FP, {"features": frame(0)})
    bad = pd.DataFrame({"value": [1.0, "not a number"]})  # pyarrow cannot type this column
    with pytest.raises(Exception, match="Could not convert|object"):
        write_shard(tmp_path, key, Fingerprint("new", "p1", "c1"), {"features": bad})
    assert [p.name for p in key.folder(tmp_path).iterdir()] == ["features.parquet"]
    assert stored_fingerprint(key.folder(tmp_path) / "features.parquet") == FP  # the old shard is intact


def test_remove_temporaries_and_prune(tmp_path):
    keep, gone = ShardKey("tiny", "base", 1, 0), ShardKey("tiny", "base", 1, 100)
    for key in (keep, gone):
        write_shard(tmp_path, key, FP, {"features": frame(key.step)})
    leftover = keep.folder(tmp_path) / ".features.parquet.123.abcd.tmp"
    leftover.write_bytes(b"half a file")
    assert remove_temporaries(tmp_path) == [leftover]
    assert prune(tmp_path, [keep]) == [gone.folder(tmp_path)]
    assert not gone.folder(tmp_path).exists() and keep.folder(tmp_path).is_dir()


# ---------------------------------------------------------------------------
# compute_shards: reuse, failures, resume after a kill
# ---------------------------------------------------------------------------


def double(job):
    if job < 0:
        raise ValueError(f"negative job {job}")
    return {"features": frame(job)}


def test_compute_shards_reuses_current_shards_and_recomputes_changed_ones(tmp_path):
    run = compute_shards(tmp_path, tasks_for([0, 100, 200]), double, in_process, ("features",))
    assert [k.step for k in run.computed] == [0, 100, 200] and not run.reused
    again = compute_shards(tmp_path, tasks_for([0, 100, 200]), double, in_process, ("features",))
    assert not again.computed and [k.step for k in again.reused] == [0, 100, 200]
    changed = tasks_for([0, 100, 200])
    changed[1] = Task(changed[1].key, Fingerprint("new weights", "p1", "c1"), 100)
    third = compute_shards(tmp_path, changed, double, in_process, ("features",))
    assert [k.step for k in third.computed] == [100] and len(third.reused) == 2


def test_compute_shards_records_a_failed_checkpoint_and_writes_the_others(tmp_path):
    tasks = tasks_for([0, 100]) + [Task(ShardKey("tiny", "base", 1, 200), FP, -1)]
    run = compute_shards(tmp_path, tasks, double, in_process, ("features",))
    assert [k.step for k in run.computed] == [0, 100]
    assert run.failed == {ShardKey("tiny", "base", 1, 200): "negative job -1"}
    assert not ShardKey("tiny", "base", 1, 200).folder(tmp_path).exists()


def test_compute_shards_computes_tasks_of_one_fingerprint_once_when_it_can_relabel_and_each_otherwise(tmp_path):
    """Given ``relabel``, tasks of equal fingerprints (in other roots: other runs of a sweep) are computed once and
    written for each through it; a failure is every such task's; without it each task is computed."""
    calls = []

    def counted(job):
        calls.append(job)
        return double(job)

    def relabel(result, key):
        return {"features": result["features"].assign(seed=key.seed)}

    twins = [
        Task(ShardKey("tiny", v, s, 0), Fingerprint("w", "p1", "c1"), 0, tmp_path / v) for v, s in (("a", 1), ("b", 2))
    ]
    bad = [Task(ShardKey("tiny", v, 1, 50), Fingerprint("bad", "p1", "c1"), -1, tmp_path / v) for v in ("a", "b")]
    run = compute_shards(None, twins + bad, counted, in_process, ("features",), relabel)
    assert calls == [0, -1] and run.computed == [t.key for t in twins] and run.copied == [twins[1].key]
    assert run.failed == {t.key: "negative job -1" for t in bad}
    a, b = (pd.read_parquet(t.key.folder(t.root) / "features.parquet") for t in twins)
    assert (
        b.equals(a.assign(seed=2))
        and stored_fingerprint(twins[1].key.folder(tmp_path / "b") / "features.parquet") == twins[1].fingerprint
    )
    calls.clear()
    again = compute_shards(
        None, [Task(t.key, t.fingerprint, t.job, tmp_path / "c") for t in twins], counted, in_process, ("features",)
    )
    assert calls == [0, 0] and not again.copied
    # one of its fingerprint already current (a recipe added to a finished sweep): read back, nothing computed
    added = Task(ShardKey("tiny", "d", 3, 0), twins[0].fingerprint, 0, tmp_path / "d")
    third = compute_shards(None, [twins[0], added], counted, in_process, ("features",), relabel)
    assert calls == [0, 0] and third.reused == [twins[0].key] and third.computed == third.copied == [added.key]
    d = pd.read_parquet(added.key.folder(tmp_path / "d") / "features.parquet")
    assert d.equals(a.assign(seed=3)) and is_current(tmp_path / "d", added.key, added.fingerprint, ("features",))


def flip_a_page_byte(path):
    """Flip one bit in the last data page of a Parquet file; the footer (and so the fingerprint) stays whole."""
    data = bytearray(path.read_bytes())
    pages_end = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    data[pages_end - 3] ^= 1
    path.write_bytes(bytes(data))


def test_a_shard_whose_data_pages_changed_is_named_and_recomputed_identically(tmp_path):
    compute_shards(tmp_path, tasks_for([0, 100, 200]), double, in_process, ("features",))
    path = ShardKey("tiny", "base", 1, 100).folder(tmp_path) / "features.parquet"
    good = path.read_bytes()
    flip_a_page_byte(path)
    assert stored_fingerprint(path) == tasks_for([100])[0].fingerprint  # a footer-only check calls it current
    assert content_problem(path).startswith("features.parquet: content changed after it was written (sha256 ")
    run = compute_shards(tmp_path, tasks_for([0, 100, 200]), double, in_process, ("features",))
    assert [k.step for k in run.computed] == [100] and [k.step for k in run.reused] == [0, 200]
    assert run.damaged[ShardKey("tiny", "base", 1, 100)].startswith("features.parquet: content changed after it")
    assert run.damage_note().startswith("; 1 damaged shards recomputed (step 100: features.parquet: content changed")
    assert path.read_bytes() == good and content_problem(path) is None


def with_info(job):
    """A job whose shard keeps facts in its footer's info, as the series' weights hash and the trajectory's
    iterate are kept."""
    return double(job) | {"info": {"weights_sha256": f"{job:064x}", "iterate": [0.25, float(job)]}}


@pytest.mark.parametrize("changed", ["iterate", "weights_sha256"])
def test_a_shard_whose_footer_info_changed_is_named_and_recomputed_identically(tmp_path, changed):
    """The content hash covered the data pages only: an iterate or weights hash edited in the footer was read as
    the shard's (the trajectory's distances, the series' duplicate check)."""
    compute_shards(tmp_path, tasks_for([0, 100]), with_info, in_process, ("features",))
    path = ShardKey("tiny", "base", 1, 100).folder(tmp_path) / "features.parquet"
    good = path.read_bytes()
    table = pq.read_table(path)
    info = json.loads(table.schema.metadata[INFO_KEY.encode()])
    info[changed] = [0.25, 101.0] if changed == "iterate" else "0" * 64
    edited = table.schema.metadata | {INFO_KEY.encode(): json.dumps(info, sort_keys=True).encode()}
    pq.write_table(table.replace_schema_metadata(edited), path)  # the same pages, another info
    assert stored_info(path) == info and stored_fingerprint(path) == tasks_for([100])[0].fingerprint
    assert content_problem(path).startswith("features.parquet: content changed after it was written (sha256 ")
    run = compute_shards(tmp_path, tasks_for([0, 100]), with_info, in_process, ("features",))
    assert [k.step for k in run.computed] == [100] and [k.step for k in run.reused] == [0]
    assert run.damaged[ShardKey("tiny", "base", 1, 100)].startswith("features.parquet: content changed after it")
    assert path.read_bytes() == good and content_problem(path) is None


def test_a_shard_whose_content_hash_covers_its_pages_only_is_recomputed_saying_why(tmp_path):
    """As shards were written before the hash covered the footer's fingerprint and info."""
    (task,) = tasks_for([0])
    compute_shards(tmp_path, [task], with_info, in_process, ("features",))
    path = task.key.folder(tmp_path) / "features.parquet"
    good = path.read_bytes()
    table = pq.read_table(path)
    pages = hashlib.sha256(good[: len(good) - 8 - int.from_bytes(good[-8:-4], "little")]).hexdigest()
    pq.write_table(table.replace_schema_metadata(table.schema.metadata | {CONTENT_KEY.encode(): pages.encode()}), path)
    why = "features.parquet: its content hash covers its data pages only (written before it covered the info)"
    assert content_problem(path) == why
    run = compute_shards(tmp_path, [task], with_info, in_process, ("features",))
    assert run.damaged == {task.key: why} and path.read_bytes() == good


def test_a_shard_written_without_a_content_hash_is_recomputed_not_trusted(tmp_path):
    (task,) = tasks_for([0])
    folder = task.key.folder(tmp_path)
    folder.mkdir(parents=True)
    table = pa.Table.from_pandas(frame(0), preserve_index=False)
    pq.write_table(table.replace_schema_metadata({META_KEY: task.fingerprint.to_json()}), folder / "features.parquet")
    run = compute_shards(tmp_path, [task], double, in_process, ("features",))
    assert run.damaged == {task.key: "features.parquet: no content hash (written before shards carried one)"}
    assert content_problem(folder / "features.parquet") is None


RESUME_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {repo!r})  # the repository, for tests.<folder>.helpers
    from tests.execution.shards_helpers import frame, in_process, tasks_for
    from topometrics.execution.shards import compute_shards

    def slow(job):
        time.sleep(0.3)
        print(job, flush=True)
        return {{"features": frame(job)}}

    run = compute_shards(Path(sys.argv[1]), tasks_for(range(0, 1000, 100)), slow, in_process, ("features",))
    print("computed", len(run.computed), "reused", len(run.reused), flush=True)
    """
)


def test_a_killed_run_resumes_where_it_stopped(tmp_path):
    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT.format(repo=ROOT))
    root = tmp_path / "shards"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, str(script), str(root)], stdout=subprocess.PIPE, text=True, env=env)
    while len(list(root.glob("**/features.parquet"))) < 3:
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = {p: p.stat().st_mtime_ns for p in root.glob("**/features.parquet")}
    assert 3 <= len(done) < 10
    out = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.splitlines()[-1] == f"computed {10 - len(done)} reused {len(done)}"
    assert all(p.stat().st_mtime_ns == t for p, t in done.items())  # finished shards were not rewritten
    con = duckdb.connect()
    rows = con.execute(f"SELECT step, count(*) FROM {scan(con, root, 'features', 'p1').relation()} GROUP BY step")
    assert sorted(rows.fetchall()) == [(s, 3) for s in range(0, 1000, 100)]  # none missing, none twice


# ---------------------------------------------------------------------------
# Reading with DuckDB
# ---------------------------------------------------------------------------


def test_scan_reads_only_matching_params_and_reports_the_rest(tmp_path):
    for step in (0, 100, 200):
        write_shard(tmp_path, ShardKey("tiny", "base", 1, step), FP, {"features": frame(step)})
    other = Fingerprint("abc", "p2", "c1")
    write_shard(tmp_path, ShardKey("small", "base", 1, 0), other, {"features": frame(0)})
    write_shard(tmp_path, ShardKey("small", "base", 1, 100), other, {"features": frame(100)})
    stray = tmp_path / "rung=x" / "features.parquet"
    stray.parent.mkdir()
    frame(7).to_parquet(stray)  # a Parquet file without a fingerprint
    con = duckdb.connect()
    found = scan(con, tmp_path, "features", "p1")
    assert len(found.matching) == 3 and sorted(found.other) == ["none", "p2"] and len(found.other["p2"]) == 2
    got = con.execute(f"SELECT * FROM {found.relation()} ORDER BY step, feature").df()
    pd.testing.assert_frame_equal(got, pd.concat([frame(s) for s in (0, 100, 200)], ignore_index=True))
    line = found.report()
    assert "\n" not in line
    assert line.startswith(f"{tmp_path}: 3 features shards computed with other feature params are not read: ")
    assert "2 with params p2" in line and "1 with params none" in line


def test_scan_of_an_empty_or_missing_folder_reads_no_rows(tmp_path):
    con = duckdb.connect()
    found = scan(con, tmp_path / "missing", "features", "p1")
    assert found.matching == [] and found.report() is None
    assert con.execute(f"SELECT count(*) FROM {found.relation()}").fetchone() == (0,)


def test_a_full_disk_while_writing_a_shard_names_the_file_and_keeps_the_shard_before_it(tiny_disk):
    from topometrics.errors import DiskFullError

    root, key = tiny_disk("256k"), ShardKey("tiny", "base", 1, 0)
    write_shard(root, key, FP, {"features": frame(0)})
    big = pd.DataFrame({"value": np.random.default_rng(0).standard_normal(200_000)})  # 1.6 MB of random floats
    path = key.folder(root) / "features.parquet"
    with pytest.raises(DiskFullError, match=f"^{path}: no space left on its disk; free space there"):
        write_shard(root, key, Fingerprint("new", "p1", "c1"), {"features": big})
    assert stored_fingerprint(path) == FP and content_problem(path) is None
    assert [p.name for p in key.folder(root).iterdir()] == ["features.parquet"]
