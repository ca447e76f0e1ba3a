"""The DuckDB metrics store: every run's logs, checkpoints, features and analysis in one file.

The warehouse is built by exactly one stage, into a temporary file beside the target that is
renamed into place only after ``CHECKPOINT`` and a clean close, so readers never see a half-built
file and a crash leaves the previous warehouse intact. Tables are created by
``sql/00_schema.sql``; the views (``sql/[1-9]*.sql``) are pure SQL over those tables, so ad hoc
queries from the ``duckdb`` CLI need no project code. See ``docs/warehouse.md``.

The same :func:`populate` also fills an in-memory connection, which is how the analysis stage
runs the views before the file exists (one writer per artifact: analysis -> warehouse).

Why over 400 lines: discovering the inputs, validating them and loading them are one promise (every
declared run's files are in the warehouse or named as missing, before any table is replaced); the SQL
itself lives in ``sql/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import duckdb
import pandas as pd
import psutil

import topometrics
from topometrics.atomic import replacing
from topometrics.errors import TopometricsError, disk_full
from topometrics.execution.shards import params_digest, split_by_params
from topometrics.params import BASE_VARIANT, Params, ViewSettings, as_dict

SCHEMA_VERSION = 5  # 2: runs lost the always-NULL fingerprint column; 3: a variant column keys every run;
# 4: checkpoints.val_bpb and settings.loss_unit; 5: runs.tokens_per_s
SQL_DIR = Path(__file__).parent / "sql"
# Analysis tables the warehouse stage loads from the analysis stage's Parquet files.
ANALYSIS_TABLES = (
    "predictions", "fits", "tests", "incremental_validity", "incremental_errors", "prediction_intervals", "stopping",
    "scale_up",
)  # fmt: skip
# Columns a Parquet file may lack (they become NULL), per table: why a value or a loss is NULL.
_OPTIONAL_COLUMNS = {"features": {"reason": "VARCHAR"}, "checkpoints": {"reason": "VARCHAR", "val_bpb": "DOUBLE"}}


class WarehouseError(TopometricsError, ValueError):
    """An input that cannot go into the warehouse; the message names the file and the fix."""


@dataclass(frozen=True)
class Inputs:
    """Every file the warehouse is built from."""

    configs: list[Path]  # data/config/<name>.json; the run directory is runs_dir / <name>
    runs_dir: Path  # holds <name>/steps.csv and <name>/checkpoints.csv per config
    corpus_source: Path | None = None  # data/corpus/source.json (requested, used, sha256, reason, fallback)
    feature_files: list[Path] = field(default_factory=list)  # features/distances.parquet of every rung and series
    diagram_files: list[Path] = field(default_factory=list)  # diagrams.parquet of every rung and series
    analysis_files: dict[str, Path] = field(default_factory=dict)  # table name -> Parquet; none for the analysis
    not_read: list[str] = field(default_factory=list)  # one line per folder of shards from other feature params
    # checkpoints.parquet directly in a feature directory: losses of external series (data/series/checkpoints.parquet)
    checkpoint_files: list[Path] = field(default_factory=list)
    rung_files: list[Path] = field(default_factory=list)  # rungs.parquet likewise: the series' model shapes


class Sources(NamedTuple):
    """Where a stage reads the runs from: its ``--configs``, ``--runs``, ``--corpus`` and ``--features``."""

    config_dir: Path  # data/config: one <run>.json per run
    runs_dir: Path  # data/runs: <run>/steps.csv and <run>/checkpoints.csv
    corpus_source: Path | None  # data/corpus/source.json (None, or a missing file: no corpus row)
    feature_dirs: Sequence[Path]  # feature folders: per-run folders, rung=... shards, series tables


def discover_inputs(
    sources: Sources, analysis_dir=None, runs: Iterable[str] | None = None, feature_params: str | None = None
) -> Inputs:
    """Collect the input files under the stage's directories (missing directories hold nothing).

    ``runs`` (the names ``<rung>-<seed>`` that params.yaml declares) restricts the configs and the
    per-run feature directories ``<feature dir>/<name>/`` to those runs: DVC never deletes the
    outputs of a rung or seed that was removed from params.yaml, and they must not be analysed.
    Tables directly in a feature directory (``data/series/rung=.../``, ``data/series/features.parquet``)
    are always loaded. Feature rows are ``features.parquet`` and ``distances.parquet`` shards.

    ``feature_params`` (:func:`topometrics.execution.shards.params_digest` of the feature params) keeps only
    the shards (files in ``rung=...`` partition folders) computed with those params; the others are
    listed, one line per folder, in ``not_read``. Files outside shard folders are always read. None
    reads every file.
    """
    config_dir, runs_dir, corpus_source, feature_dirs = sources
    declared = None if runs is None else set(runs)
    found: dict[str, list[Path]] = {"features": [], "distances": [], "diagrams": []}
    not_read = []
    for root in map(Path, feature_dirs):
        for name, files in found.items():
            paths = []
            for path in sorted(root.glob(f"**/{name}.parquet")):
                parts = path.relative_to(root).parts
                if declared is None or len(parts) == 1 or parts[0].startswith("rung=") or parts[0] in declared:
                    paths.append(path)
            if feature_params is not None:  # shards (in rung=... folders) carry their params; other files do not
                shards = [p for p in paths if any(part.startswith("rung=") for part in p.relative_to(root).parts)]
                matching, other = split_by_params(shards, feature_params)
                paths = [p for p in paths if p not in set(shards)] + matching
                if other:
                    not_read.append(
                        f"{root}: {len(other)} {name} shards computed with other feature params are not read "
                        f"(e.g. {other[0]})"
                    )
            files += paths
    feature_files, diagram_files = found["features"] + found["distances"], found["diagrams"]
    analysis = {}
    if analysis_dir is not None:
        analysis = {t: Path(analysis_dir) / f"{t}.parquet" for t in ANALYSIS_TABLES}
        analysis = {t: p for t, p in analysis.items() if p.exists()}
    source = corpus_source if corpus_source is not None and Path(corpus_source).exists() else None
    if declared is None:
        configs = sorted(Path(config_dir).glob("*.json"))
    else:
        configs = [Path(config_dir) / f"{name}.json" for name in sorted(declared)]
        for path in configs:
            if not path.exists():
                raise WarehouseError(f"{path} not found; run `dvc repro config` first")
    losses, shapes = (
        [Path(root) / name for root in feature_dirs if (Path(root) / name).exists()]
        for name in ("checkpoints.parquet", "rungs.parquet")
    )
    return Inputs(configs, Path(runs_dir), source, feature_files, diagram_files, analysis, not_read, losses, shapes)


def sql_files() -> list[Path]:
    """The versioned SQL files in the order they are applied: schema first, then views."""
    return sorted(SQL_DIR.glob("*.sql"))


def populate(con: duckdb.DuckDBPyConnection, inputs: Inputs, settings: ViewSettings, meta: Mapping[str, str]) -> None:
    """Create the schema in an empty database, load every input, and create the views."""
    schema, *views = sql_files()
    con.execute(schema.read_text())
    _insert(con, "settings", pd.DataFrame([asdict(settings)]))
    corpus = json.loads(Path(inputs.corpus_source).read_text()) if inputs.corpus_source is not None else {}
    code = meta.get("code_version")
    variant_of = {}  # run name -> recipe variant; a run's feature files sit under a folder named after it
    for config_path in inputs.configs:
        variant_of[config_path.stem] = load_run(con, config_path, inputs.runs_dir / config_path.stem, corpus, code)
    for table, files in (("features", inputs.feature_files), ("diagrams", inputs.diagram_files)):
        by_variant: dict[str, list[Path]] = {}
        for path in files:
            run = next((p.name for p in Path(path).parents if p.name in variant_of), None)
            by_variant.setdefault(variant_of.get(run, BASE_VARIANT), []).append(path)
        for variant, paths in by_variant.items():
            load_parquet(con, table, paths, {"variant": variant})
    load_parquet(con, "checkpoints", inputs.checkpoint_files, {"variant": BASE_VARIANT})  # external series
    load_parquet(con, "rungs", inputs.rung_files)  # the series' shapes; a series without one gets a bare row below
    _add_series_runs(con, corpus, code)
    for table, path in inputs.analysis_files.items():
        load_parquet(con, table, [path])
    for view in views:
        con.execute(view.read_text())
    sql_hashes = {f"sql:{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in sql_files()}
    rows = {"schema_version": str(SCHEMA_VERSION), "duckdb_version": duckdb.__version__} | sql_hashes | dict(meta)
    _insert(con, "meta", pd.DataFrame({"key": list(rows), "value": [str(v) for v in rows.values()]}))


def build_declared(params: Params, sources: Sources, analysis: Path, out: Path, log=print) -> Inputs:
    """The warehouse stage: :func:`build_warehouse` of the runs ``params`` declares from the feature shards of its
    feature params (a ``log`` line per folder of others) and the analysis stage's tables in ``analysis``;
    ``meta`` holds the git version and the params."""
    digest = params_digest(params.features)
    inputs = discover_inputs(sources, analysis, params.run_names(), digest)
    for line in inputs.not_read:
        log(f"warehouse: {line}")
    declared = {k: v for k, v in as_dict(params).items() if k != "compute"}  # where it ran is not a result
    meta = {"code_version": git_describe(), "params": json.dumps(declared, sort_keys=True)}
    build_warehouse(out, inputs, params.analysis.settings(), meta)
    return inputs


def build_warehouse(path: Path, inputs: Inputs, settings: ViewSettings, meta: Mapping[str, str]) -> Path:
    """Build the warehouse file atomically.

    Built in ``.<name>.<pid>.tmp`` beside ``path`` (same filesystem, so :func:`os.replace` is atomic),
    ended with ``CHECKPOINT`` and a clean close so no ``.wal`` is left, then renamed over ``path``.
    An exception removes the temporary file; a killed build leaves it behind, and the next build
    removes temporaries whose process is gone. The previous ``path`` is untouched until the rename.
    """
    path = Path(path)
    check_no_writer(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with replacing(path, tmp), duckdb_errors_named(path):
            con = duckdb.connect(str(tmp))
            try:
                populate(con, inputs, settings, meta)
                con.execute("CHECKPOINT")
            finally:
                con.close()
            # A write-ahead log left by a killed writer of the old file must not be replayed on the new one.
            Path(f"{path}.wal").unlink(missing_ok=True)
    finally:
        Path(f"{tmp}.wal").unlink(missing_ok=True)
    return path


@contextlib.contextmanager
def duckdb_errors_named(path: Path) -> Iterator[None]:
    """DuckDB's own forms of a full disk and of Ctrl-C (it catches the signal and raises its own error) as the
    project's: :class:`DiskFullError` naming ``path``, and ``KeyboardInterrupt`` (the stage's exit status 130)."""
    try:
        yield
    except duckdb.InterruptException as err:
        raise KeyboardInterrupt from err
    except RuntimeError as err:  # what this duckdb raises for a query that SIGINT stopped
        if str(err).strip().lower() == "query interrupted":
            raise KeyboardInterrupt from err
        raise
    except duckdb.Error as err:
        if "no space left on device" in str(err).lower() or "disk quota exceeded" in str(err).lower():
            raise disk_full(path) from err
        raise


def check_no_writer(path: Path) -> None:
    """Refuse to replace a warehouse another process holds open for writing, naming that process.

    Such a process would keep writing to the replaced file and leave a write-ahead log that the
    next reader replays onto the new one. DuckDB's own lock says who holds it.
    """
    path = Path(path)
    if not path.exists():
        return
    try:
        duckdb.connect(str(path), read_only=True).close()
    except duckdb.IOException as err:
        if "lock" not in str(err).lower():
            return  # unreadable for another reason: the build replaces it
        raise WarehouseError(
            f"{path} is open for writing by {_holder(str(err), path)}; close that connection (read with "
            f"duckdb.connect(..., read_only=True) or `duckdb -readonly`) and re-run"
        ) from err
    except duckdb.Error:
        return


def connect_read_only(path: Path) -> duckdb.DuckDBPyConnection:
    """Open the warehouse read-only, with a one-line error when it is missing or held by a writer."""
    path = Path(path)
    if not path.exists():
        raise WarehouseError(f"{path} not found; build it with `dvc repro warehouse`")
    try:
        return duckdb.connect(str(path), read_only=True)
    except duckdb.Error as err:
        if not isinstance(err, duckdb.IOException) or "lock" not in str(err).lower():
            raise damaged(path, err) from err
        raise WarehouseError(
            f"{path} is open for writing by {_holder(str(err), path)}; close that connection and re-run"
        ) from err


def damaged(path: Path, err: Exception) -> WarehouseError:
    """The one-line error of a warehouse file DuckDB cannot read (a damaged header or block), with the fix."""
    why = (str(err).splitlines() or [type(err).__name__])[0]
    return WarehouseError(f"{path} cannot be read ({why}); it is damaged: rebuild it with `dvc repro -f warehouse`")


def _holder(message: str, path: Path) -> str:
    """'PID 123 (python3 -c ...)' from DuckDB's lock message, or any process with the file open."""
    match = re.search(r"PID (\d+)", message)
    pids = [int(match.group(1))] if match else []
    if not pids:
        target = os.path.realpath(path)
        for proc in psutil.process_iter(["pid"]):
            try:
                if any(f.path == target for f in proc.open_files()):
                    pids.append(proc.pid)
            except (psutil.Error, OSError):
                continue
    if not pids:
        return "another process (not found; is the file on a network drive?)"
    described = []
    for pid in pids:
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())[:80]
        except psutil.Error:
            cmd = "?"
        described.append(f"PID {pid} ({cmd})")
    return ", ".join(described)


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Delete ``.<name>.<pid>.tmp`` files (and their ``.wal``) left by builds whose process is gone."""
    removed = []
    for tmp in path.parent.glob(f".{path.name}.*.tmp*"):
        pid = tmp.name[len(path.name) + 2 :].split(".")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def git_describe(repo: Path = Path(".")) -> str:
    """``git describe --always --dirty`` of ``repo`` (the commit, ``-dirty`` with uncommitted changes), or the
    package version outside a git checkout: the ``code_version`` the warehouse records."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=repo, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return f"topometrics {topometrics.__version__}"
    return out.stdout.strip() if out.returncode == 0 else f"topometrics {topometrics.__version__}"


def load_run(con, config_path: Path, run_dir: Path, corpus: Mapping, code: str | None) -> str:
    """Insert one trained run: its ``runs`` and ``rungs`` rows, per-step log and checkpoints table.

    Returns the run's recipe variant."""
    cfg = json.loads(Path(config_path).read_text())
    missing = {"rung", "variant", "seed", "model", "recipe"} - set(cfg)
    if missing:
        raise WarehouseError(f"{config_path} lacks {sorted(missing)}; regenerate it with the config stage")
    rung, seed, recipe, model = cfg["rung"], int(cfg["seed"]), cfg["recipe"], cfg["model"]
    variant = cfg["variant"]
    run = {"rung": rung, "variant": variant, "seed": seed, "kind": "ladder"}
    run |= {"config_json": json.dumps(cfg, sort_keys=True), "code_version": code} | _corpus_columns(corpus)
    run |= {k: recipe.get(k) for k in ("steps", "ckpt_every", "lr", "warmup", "min_lr_ratio")}
    run |= _run_status(Path(run_dir) / "run.json") | {"tokens_per_s": _throughput(Path(run_dir) / "summary.json")}
    _insert(con, "runs", pd.DataFrame([run]))
    shape = {k: model.get(k) for k in ("vocab_size", "context", "hidden", "layers", "heads")}
    if not con.execute("SELECT 1 FROM rungs WHERE rung = ?", [rung]).fetchall():
        _insert(con, "rungs", pd.DataFrame([{"rung": rung, "kind": "ladder", "n_params": cfg.get("n_params")} | shape]))
    for table, columns in (("steps", ("train_loss", "grad_norm", "lr")), ("checkpoints", ("val_loss", "train_loss"))):
        csv = Path(run_dir) / f"{table}.csv"
        if not csv.exists():
            raise WarehouseError(f"{csv} not found for {config_path}; run `dvc repro train` first")
        frame = pd.read_csv(csv)
        absent = {"step", *columns} - set(frame.columns)
        if absent:
            raise WarehouseError(f"{csv} lacks columns {sorted(absent)}; expected step,{','.join(columns)}")
        extra = [c for c in ("val_bpb",) if c in frame.columns and table == "checkpoints"]  # absent before bpb
        _insert(con, table, frame[["step", *columns, *extra]].assign(rung=rung, variant=variant, seed=seed), source=csv)
    return variant


def _throughput(path: Path) -> float | None:
    """The training throughput (tokens per second) the run's ``summary.json`` records (None when it has none)."""
    try:
        value = json.loads(path.read_text()).get("tokens_per_s")
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, AttributeError) as err:
        raise WarehouseError(f"{path} is not a JSON object ({err}); re-run its train stage (dvc repro)") from err
    return float(value) if isinstance(value, int | float) and value > 0 else None


def _run_status(path: Path) -> dict:
    """``status`` and ``status_reason`` from the train stage's ``run.json`` (NULL when absent)."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return {"status": None, "status_reason": None}
    except json.JSONDecodeError as err:
        raise WarehouseError(f"{path} is not valid JSON ({err}); re-run its train stage (dvc repro)") from err
    return {"status": record.get("status"), "status_reason": record.get("reason") or None}


def load_parquet(con, table: str, files: list[Path], constants: Mapping[str, str] | None = None) -> None:
    """Append Parquet files to ``table`` by column name, in one ``read_parquet`` over the list.

    Optional columns absent from a file become NULL; a file that lacks a required column is an
    error naming it. ``constants`` fills columns the files do not hold (a run's ``variant``). The
    partition folders of shards (``rung=...``) are not read as columns.
    """
    if not files:
        return
    table_columns = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
    listing = "[" + ", ".join(f"'{_quote(path)}'" for path in files) + "]"
    columns: dict[str, set[str]] = {str(path): set() for path in files}
    for file_name, column in con.execute(f"SELECT file_name, name FROM parquet_schema({listing})").fetchall():
        columns[file_name].add(column)
    optional = _OPTIONAL_COLUMNS.get(table, {})
    for path in files:
        missing = [c for c in table_columns if c not in columns[str(path)] and c not in optional]
        missing = [c for c in missing if c not in (constants or {})]
        if missing and table not in ANALYSIS_TABLES:
            raise WarehouseError(f"{path} lacks columns {missing} of table {table}; see docs/warehouse.md")
    present = set().union(*columns.values())
    select = ", ".join(_column(c, present, optional, constants or {}) for c in table_columns)
    rel = f"read_parquet({listing}, union_by_name = true, hive_partitioning = false)"
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT {select} FROM {rel}")
    except duckdb.ConstraintException as err:
        where = str(files[0]) if len(files) == 1 else f"{len(files)} files from {files[0].parent} on"
        raise WarehouseError(f"{where}: duplicate rows for table {table} ({err}); rebuild those files") from err


def _column(name: str, present: set[str], optional: Mapping[str, str], constants: Mapping[str, str]) -> str:
    """The SELECT expression of one table column: the file's, a constant where files lack it, or NULL."""
    if name in constants:
        value = f"'{_quote(constants[name])}'"
        return f"coalesce({name}, {value}) AS {name}" if name in present else f"{value} AS {name}"
    return name if name in present else f"NULL::{optional.get(name, 'VARCHAR')} AS {name}"


def _add_series_runs(con, corpus: Mapping, code: str | None) -> None:
    """External series appear only in features: give each (rung, seed) a ``runs`` and ``rungs`` row."""
    series = con.execute(
        "SELECT DISTINCT rung, variant, seed FROM features ANTI JOIN runs USING (rung, variant, seed) ORDER BY ALL"
    ).df()
    if series.empty:
        return
    _insert(con, "runs", series.assign(kind="series", code_version=code, **_corpus_columns(corpus)))
    new = series[["rung"]].drop_duplicates()
    new = new[~new["rung"].isin(con.execute("SELECT rung FROM rungs").df()["rung"])]
    _insert(con, "rungs", new.assign(kind="series"))


def _corpus_columns(corpus: Mapping) -> dict:
    keys = ("requested", "used", "sha256", "fallback", "reason")
    return {f"corpus_{k}": corpus.get(k) for k in keys}


def _insert(con, table: str, frame: pd.DataFrame, source: Path | None = None) -> None:
    con.register("_incoming", frame)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _incoming")
    except duckdb.ConstraintException as err:
        raise WarehouseError(f"{source or table}: duplicate keys ({err}); remove the repeated rows") from err
    finally:
        con.unregister("_incoming")


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")
