"""Ad hoc SQL on the warehouse from the shell, with what the lock installs: ``python -m topometrics.analysis.query``.

    python -m topometrics.analysis.query "SELECT * FROM phases"                    # data/warehouse.duckdb
    python -m topometrics.analysis.query --db other.duckdb "FROM prediction_mae" --csv
    echo "SHOW TABLES" | python -m topometrics.analysis.query

The ``duckdb`` command-line shell is not in the lock: PyPI's ``duckdb-cli`` (1.5.6) cannot read a file written
by the ``duckdb`` Python package the lock pins (2.0.0, storage version 69 against at most 68), so this opens
the file read-only with the same package that built it (:func:`topometrics.analysis.warehouse.connect_read_only`:
a missing or busy file is one line) and prints each statement's result as DuckDB's own table (``--csv``: CSV).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import duckdb

from topometrics.analysis.warehouse import connect_read_only
from topometrics.errors import TopometricsError, one_line


def run_sql(db: Path, sql: str, csv: bool = False) -> str:
    """The printed result of ``sql`` (its last statement) on ``db``, opened read-only."""
    with connect_read_only(db) as con:
        try:
            result = con.sql(sql)
        except duckdb.Error as err:
            raise TopometricsError(f"{db}: {str(err).splitlines()[0]}") from err
        if result is None:  # a statement without rows (SET, PRAGMA ...)
            return ""
        if csv:
            return result.df().to_csv(index=False)
        return str(result.limit(10_000))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sql", nargs="?", help="the SQL (default: read from stdin)")
    parser.add_argument("--db", type=Path, default=Path("data/warehouse.duckdb"), help="the warehouse file")
    parser.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    args = parser.parse_args(argv)
    try:
        print(run_sql(args.db, args.sql if args.sql is not None else sys.stdin.read(), args.csv), end="")
    except TopometricsError as err:
        print(one_line(err), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
