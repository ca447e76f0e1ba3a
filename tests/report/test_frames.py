"""The report's queries: a warehouse with several recipe variants shows the variant the analysis ran on."""

import duckdb

from tests.repo_params import analysis_params
from topometrics.analysis import warehouse
from topometrics.report import frames


def _warehouse_with_two_variants() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    schema, *views = warehouse.sql_files()
    con.execute(schema.read_text())
    settings = analysis_params().settings().__dict__
    con.execute(f"INSERT INTO settings ({', '.join(settings)}) VALUES ({', '.join('?' * len(settings))})",
                list(settings.values()))  # fmt: skip
    con.execute("INSERT INTO rungs (rung, kind, n_params) VALUES ('t', 'ladder', 100)")
    for variant, loss in (("base", 2.0), ("lr_hi", 3.0)):
        con.execute("INSERT INTO runs (rung, variant, seed, kind, steps) VALUES ('t', ?, 0, 'ladder', 10)", [variant])
        for step in (0, 10):
            row = [variant, step, loss + step]
            con.execute("INSERT INTO checkpoints (rung, variant, seed, step, val_loss) VALUES ('t', ?, 0, ?, ?)", row)
    for view in views:
        con.execute(view.read_text())
    return con


def test_without_analysis_tables_the_report_shows_the_base_variant():
    loaded = frames.load(_warehouse_with_two_variants())
    assert loaded["checkpoints"]["val_loss"].tolist() == [2.0, 12.0]
    assert loaded["final"]["val_loss"].tolist() == [12.0] and len(loaded["runs"]) == 1


def test_the_report_shows_the_variant_the_analysis_ran_on():
    con = _warehouse_with_two_variants()
    con.execute("""INSERT INTO predictions (method, cv, fraction, rung, variant, seed, status)
                   VALUES ('loss_power_law', 'none', 0.5, 't', 'lr_hi', 0, 'failed')""")
    loaded = frames.load(con)
    assert sorted(loaded["checkpoints"]["val_loss"]) == [3.0, 13.0] and loaded["runs"]["variant"].tolist() == ["lr_hi"]
