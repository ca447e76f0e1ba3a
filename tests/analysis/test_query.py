"""python -m topometrics.analysis.query: ad hoc SQL on a warehouse file, read-only, with what the lock installs."""

import subprocess
import sys
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[2]


def warehouse(path: Path) -> Path:
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE runs AS SELECT * FROM (VALUES ('a-42', 4.25), ('b-42', 3.5)) t(run, final_val_loss)")
        con.execute("CREATE VIEW best AS SELECT run FROM runs ORDER BY final_val_loss LIMIT 1")
    return path


def query(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "topometrics.analysis.query", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, cwd=REPO, timeout=300)


def test_a_query_prints_duckdbs_table_or_csv_and_leaves_the_file_as_it_was(tmp_path):
    db = warehouse(tmp_path / "warehouse.duckdb")
    before = db.read_bytes()
    table = query("--db", str(db), "SELECT * FROM best")
    assert table.returncode == 0 and "│ b-42    │" in table.stdout, table.stderr
    csv = query("--db", str(db), "--csv", stdin="FROM runs ORDER BY run")
    assert csv.stdout == "run,final_val_loss\na-42,4.25\nb-42,3.5\n"
    refused = query("--db", str(db), "DROP TABLE runs")  # read-only: the warehouse has one writer
    assert refused.returncode == 1 and refused.stderr.startswith(f"error: {db}: ") and "read-only" in refused.stderr
    assert db.read_bytes() == before


def test_a_missing_warehouse_or_bad_sql_is_one_line(tmp_path):
    missing = query("--db", str(tmp_path / "absent.duckdb"), "FROM runs")
    assert missing.returncode == 1 and missing.stderr.splitlines() == [
        f"error: {tmp_path / 'absent.duckdb'} not found; build it with `dvc repro warehouse`"
    ]
    bad = query("--db", str(warehouse(tmp_path / "w.duckdb")), "SELECT nope FROM runs")
    assert bad.returncode == 1 and len(bad.stderr.splitlines()) == 1 and "nope" in bad.stderr
