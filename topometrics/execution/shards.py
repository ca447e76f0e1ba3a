"""Per-checkpoint result shards: Parquet files with the fingerprint of their inputs, written atomically.

Layout (Hive-style partition folders; the same columns are also inside every file)::

    <root>/rung=<rung>/variant=<variant>/seed=<seed>/step=<step>/<table>.parquet

``rung`` is a ladder rung or an external series' name. Each file's Parquet key-value metadata
holds, under :data:`META_KEY`, the JSON :class:`Fingerprint` of what it was computed from: the
inputs (weights hash, or hub model and revision), the feature params and the code version. A
shard whose stored fingerprint equals the one the inputs have now, and whose data pages and footer
``info`` (a series' weights hash, a checkpoint's trajectory iterate) are the ones it was written with
(their sha256 with the fingerprint's, under :data:`CONTENT_KEY` in the same metadata), is *current*:
it is not computed again, so a killed stage resumes where it stopped. A shard whose pages or info
changed after it was written (a flipped byte keeps the footer whole) is named and recomputed. Files
are written under a temporary name and renamed, so a shard is either whole or absent.

Readers select shards by feature params (:func:`scan`, DuckDB ``parquet_kv_metadata`` over the
folder, local or ``s3://``): the matching ones are read, the others are counted and reported.

Why over 400 lines: a shard's write, its fingerprint, its integrity check, the resume decision and the read
back are one format; apart, a change to how a shard is hashed could reach the writer and not the checker.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from topometrics.atomic import replacing
from topometrics.errors import TopometricsError

META_KEY = "topometrics"
INFO_KEY = "topometrics.info"
CONTENT_KEY = "topometrics.content"  # sha256 of every data page and the footer's fingerprint and info
# How the work runs, not what it computes: not fingerprinted. The device changes values only within the stated
# tolerance (docs/features.md, "Device"), and "auto" would name a different device on each machine anyway.
EXECUTION_PARAMS = frozenset({"workers", "device"})


class ShardError(TopometricsError, ValueError):
    """A shard key or folder that cannot be used; the message names it."""


@dataclass(frozen=True)
class ShardKey:
    """Which checkpoint a shard belongs to (its partition folder)."""

    rung: str  # ladder rung or series name
    variant: str  # recipe variant ('base' when there is none)
    seed: int
    step: int

    def __post_init__(self) -> None:
        for name in ("rung", "variant"):
            value = getattr(self, name)
            if not value or any(c in value for c in "/\\=") or value.startswith("."):
                raise ShardError(f"shard {name} {value!r} cannot name a folder (no '/', '\\', '=' or leading '.')")

    def folder(self, root: Path) -> Path:
        return Path(root) / f"rung={self.rung}" / f"variant={self.variant}" / f"seed={self.seed}" / f"step={self.step}"


@dataclass(frozen=True)
class Fingerprint:
    """What a shard was computed from; equal fingerprints mean equal shards."""

    inputs: str  # sha256 of the weights, or '<hub model>@<revision>' (+ anything else the input depends on)
    params: str  # params_digest of the feature params
    code: str  # module_source_hash of the computing module

    @property
    def digest(self) -> str:
        return _sha256(json.dumps(asdict(self), sort_keys=True).encode())[:16]

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "digest": self.digest}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Fingerprint:
        values = json.loads(text)
        return cls(values["inputs"], values["params"], values["code"])


def params_digest(params) -> str:
    """A short hash of feature params (a dataclass or mapping), without the execution-only keys."""
    values = asdict(params) if is_dataclass(params) else dict(params)
    values = {k: v for k, v in values.items() if k not in EXECUTION_PARAMS}
    return _sha256(json.dumps(values, sort_keys=True, default=list).encode())[:16]


def module_source_hash(module: str) -> str:
    """A short hash of the source of ``module`` and every module of its package it imports, transitively.

    The same closure a DVC stage lists as deps: a change in any of those files changes the
    version (and so every fingerprint); a change elsewhere in the package does not.
    """
    package = module.split(".")[0]
    todo, seen = [module], {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:  # ``from pkg.mod import name``: name is not a module
            continue
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        source = Path(spec.origin).read_bytes()
        seen[name] = source
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
        todo = [t for t in todo if t == package or t.startswith(package + ".")]
    digest = hashlib.sha256()
    for name in sorted(seen):
        digest.update(name.encode() + b"\0" + seen[name] + b"\0")
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------
# Writing and checking
# ---------------------------------------------------------------------------


def write_shard(
    root: Path,
    key: ShardKey,
    fingerprint: Fingerprint,
    tables: Mapping[str, pd.DataFrame],
    info: Mapping | None = None,
) -> Path:
    """Write each table as ``<folder>/<name>.parquet`` with the fingerprint in its metadata; return the folder.

    Each file goes to a temporary name in the same folder and is renamed over the target, so a
    reader or a killed writer never sees half a file. ``info`` (JSON-able facts about the
    computation, e.g. seconds and files) goes into the metadata too, under ``INFO_KEY``.
    """
    folder = key.folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    extra = {META_KEY.encode(): fingerprint.to_json().encode()}
    if info is not None:
        extra[INFO_KEY.encode()] = json.dumps(info, sort_keys=True).encode()
    for name, frame in tables.items():
        table = pa.Table.from_pandas(frame, preserve_index=False)
        data = _hashed_parquet(table, {**(table.schema.metadata or {}), **extra})
        path = folder / f"{name}.parquet"
        tmp = folder / f".{name}.parquet.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        with replacing(path, tmp):
            tmp.write_bytes(data)
    return folder


def _hashed_parquet(table: pa.Table, metadata: dict[bytes, bytes]) -> bytes:
    """The Parquet file of ``table`` whose footer holds ``metadata`` and its content hash (:func:`_content_sha256`).

    The pages come before the footer and do not depend on its key-value metadata, so the file is encoded twice in
    memory: to hash the pages, then with the hash in the footer (a check that both hold the same pages keeps it so).
    """
    pages = _pages_sha256(_parquet_bytes(table, metadata))
    data = _parquet_bytes(table, metadata | {CONTENT_KEY.encode(): _content_sha256(pages, metadata).encode()})
    if _pages_sha256(data) != pages:
        raise RuntimeError("pyarrow encoded the same table into different pages twice; shards cannot be hashed")
    return data


def _content_sha256(pages: str, metadata: Mapping[bytes, bytes]) -> str:
    """sha256 of the data pages' sha256 ``pages`` and the footer's fingerprint and info in ``metadata``: all a
    shard says but its hash (the info is read as the shard's: a series' weights hash, a trajectory iterate)."""
    footer = {key: value.decode() for key in (META_KEY, INFO_KEY) if (value := metadata.get(key.encode())) is not None}
    return _sha256(f"{pages}\n{json.dumps(footer, sort_keys=True)}".encode())


def _parquet_bytes(table: pa.Table, metadata: dict[bytes, bytes]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(metadata), sink)
    return sink.getvalue().to_pybytes()


def _pages_sha256(data: bytes) -> str:
    """sha256 of a Parquet file's bytes before its footer (layout: pages, footer, 4-byte footer length, PAR1)."""
    footer = int.from_bytes(data[-8:-4], "little")
    return _sha256(data[: max(0, len(data) - 8 - footer)])


def content_problem(path: Path) -> str | None:
    """``<file>: <why>`` when a shard file's pages, fingerprint and info are not those its footer hashes, else None.

    Reads the whole file (a footer-only read cannot see a changed page). A file without the hash
    was written before shards carried one, and one whose hash covers its pages only before it covered
    the info: both are recomputed rather than trusted.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        metadata = pq.read_schema(pa.BufferReader(data)).metadata or {}
    except (OSError, pa.ArrowInvalid):
        return f"{path.name}: damaged footer (not a Parquet file)"
    if (recorded := metadata.get(CONTENT_KEY.encode())) is None:
        return f"{path.name}: no content hash (written before shards carried one)"
    pages = _pages_sha256(data)
    if (digest := _content_sha256(pages, metadata)) == recorded.decode():
        return None
    if pages == recorded.decode():
        return f"{path.name}: its content hash covers its data pages only (written before it covered the info)"
    hashes = f"sha256 {digest[:12]}..., its footer's {recorded[:12].decode()}..."
    return f"{path.name}: content changed after it was written ({hashes})"


def stored_fingerprint(path: Path) -> Fingerprint | None:
    """The fingerprint in a shard file's metadata (None: no such file, or not a shard)."""
    try:
        metadata = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid):
        return None
    raw = metadata.get(META_KEY.encode())
    return Fingerprint.from_json(raw) if raw else None


def stored_info(path: Path) -> dict | None:
    """The ``info`` a shard file was written with (None: none, or no such file)."""
    try:
        raw = (pq.read_schema(path).metadata or {}).get(INFO_KEY.encode())
    except (OSError, pa.ArrowInvalid):
        return None
    return json.loads(raw) if raw else None


def split_by_params(files: Iterable[Path], params: str) -> tuple[list[Path], list[Path]]:
    """Shard files computed with feature params ``params`` (a :func:`params_digest`), and the others
    (other params, or no fingerprint at all). Footers only are read."""
    matching, other = [], []
    for path in files:
        found = stored_fingerprint(path)
        (matching if found is not None and found.params == params else other).append(path)
    return matching, other


def is_current(root: Path, key: ShardKey, fingerprint: Fingerprint, tables: Iterable[str]) -> bool:
    """Whether every table of the shard exists with this fingerprint and its data pages unchanged."""
    return shard_state(root, key, fingerprint, tables) is None


def shard_state(root: Path, key: ShardKey, fingerprint: Fingerprint, tables: Iterable[str]) -> str | None:
    """None when every table of the shard is current; else why not: ``'stale'`` (missing, or made from other
    inputs: computed as a matter of course) or a damage (``<file>: <why>``, :func:`content_problem`)."""
    folder = key.folder(root)
    paths = [folder / f"{name}.parquet" for name in tables]
    if any(stored_fingerprint(path) != fingerprint for path in paths):
        return "stale"
    return next((problem for path in paths if (problem := content_problem(path))), None)


def remove_temporaries(root: Path) -> list[Path]:
    """Delete temporary files left under ``root`` by killed writers (call before writing starts)."""
    found = list(Path(root).glob("**/.*.parquet.*.tmp")) if Path(root).is_dir() else []
    for path in found:
        path.unlink(missing_ok=True)
    return found


def prune(root: Path, keep: Iterable[ShardKey]) -> list[Path]:
    """Delete the shard folders under ``root`` whose checkpoint is not in ``keep`` (e.g. retrained away)."""
    wanted = {key.folder(root) for key in keep}
    removed = []
    for folder in sorted(Path(root).glob("rung=*/variant=*/seed=*/step=*")):
        if folder not in wanted:
            for path in folder.iterdir():
                path.unlink()
            folder.rmdir()
            removed.append(folder)
    return removed


@dataclass(frozen=True)
class Task:
    """One checkpoint's work: its shard key, the fingerprint it will have, and the job for ``fn``."""

    key: ShardKey
    fingerprint: Fingerprint
    job: object
    root: Path | None = None  # its shard root when not the one compute_shards is given (one sweep, many runs)


@dataclass
class ShardRun:
    """What :func:`compute_shards` did: keys computed, reused (current), failed and found damaged (recomputed)."""

    computed: list[ShardKey] = field(default_factory=list)
    reused: list[ShardKey] = field(default_factory=list)
    failed: dict[ShardKey, str] = field(default_factory=dict)
    damaged: dict[ShardKey, str] = field(default_factory=dict)
    copied: list[ShardKey] = field(default_factory=list)  # computed ones written from another task's result

    def merge(self, other: ShardRun) -> ShardRun:
        return ShardRun(self.computed + other.computed, self.reused + other.reused, self.failed | other.failed,
                        self.damaged | other.damaged, self.copied + other.copied)  # fmt: skip

    def damage_note(self) -> str:
        """``; N damaged shards recomputed (step S: <why>)`` for a progress line ('' when none)."""
        if not self.damaged:
            return ""
        key, why = next(iter(self.damaged.items()))
        return f"; {len(self.damaged)} damaged shards recomputed (step {key.step}: {why})"


def compute_shards(
    root: Path | None,
    tasks: list[Task],
    fn: Callable,
    map_jobs: Callable[[Callable, list], Iterator[tuple[int, object]]],
    tables: tuple[str, ...],
    relabel: Callable[[dict, ShardKey], dict] | None = None,
) -> ShardRun:
    """Compute the shards of ``tasks`` that are not current; reuse the rest.

    ``fn(job)`` returns ``{table name: DataFrame}`` for one checkpoint, optionally with ``'info'``
    (a JSON-able dict kept in the shard's metadata); a failed job's exception is recorded as the
    checkpoint's failure; ``map_jobs(fn, jobs)`` runs it wherever the execution seam says and
    yields ``(index, result)``. Each result is written as soon as it arrives, so a killed run keeps
    what it finished. A shard whose pages changed after it was written is recomputed and listed in
    ``damaged``. A task with its own ``root`` is written there (``root`` may then be None): the jobs of
    every run of a sweep share one pool. ``relabel(result, key)``, ``result`` as ``key``'s tables: given, tasks of
    one fingerprint (equal shards but for their keys: a sweep's recipes from the same initial weights) are
    computed once, or read back from a current shard of it, and written for the others through it (``copied``).
    """
    for folder in {task.root or root for task in tasks}:
        remove_temporaries(folder)
    run, todo, current = ShardRun(), [], {}
    for task in tasks:
        state = shard_state(task.root or root, task.key, task.fingerprint, tables)
        if state is None:
            run.reused.append(task.key)
            current.setdefault(task.fingerprint, task)
            continue
        todo.append(task)
        if state != "stale":
            run.damaged[task.key] = state

    def write(source: Task | None, result, tasks: list[Task]) -> None:  # source: whose result it is (None: read)
        for task in tasks:
            if isinstance(result, BaseException):
                run.failed[task.key] = str(result)
                continue
            found = result if task is source else relabel(result, task.key)
            write_shard(task.root or root, task.key, task.fingerprint, {t: found[t] for t in tables}, found.get("info"))
            run.computed.append(task.key)
            run.copied += [] if task is source else [task.key]

    unique, copies = _once_each(todo, relabel is not None)
    held = [current.get(task.fingerprint) if relabel else None for task in unique]  # a current shard of it
    for i, source in ((i, h) for i, h in enumerate(held) if h is not None):
        write(None, read_shard(source.root or root, source.key, tables), [unique[i], *copies[i]])
    jobs = [i for i, source in enumerate(held) if source is None]
    for j, result in map_jobs(fn, [unique[i].job for i in jobs]):
        write(unique[jobs[j]], result, [unique[jobs[j]], *copies[jobs[j]]])
    return run


def read_shard(root: Path, key: ShardKey, tables: Iterable[str]) -> dict:
    """A shard's tables by name and its ``info`` (if any) as its job returned them: written again, the same bytes
    (the columns its writer held as Python objects are objects again, not the strings pandas would infer)."""
    out = {}
    for name in tables:
        table = pq.read_table(key.folder(root) / f"{name}.parquet")
        held = json.loads(table.schema.metadata[b"pandas"])["columns"]
        out[name] = table.to_pandas().astype({c["name"]: object for c in held if c["numpy_type"] == "object"})
    info = table.schema.metadata.get(INFO_KEY.encode())  # every file of a shard holds it: the last one read
    return out if info is None else out | {"info": json.loads(info)}


def _once_each(tasks: list[Task], share: bool) -> tuple[list[Task], list[list[Task]]]:
    """``(unique, copies)``: one task per fingerprint, and for each the others of it (unless ``share``: none)."""
    unique, copies, first = [], [], {}
    for task in tasks:
        if share and task.fingerprint in first:
            copies[first[task.fingerprint]].append(task)
            continue
        first[task.fingerprint] = len(unique)
        unique.append(task)
        copies.append([])
    return unique, copies


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardScan:
    """The shard files of one table under a root, split by whether their feature params match."""

    root: str
    table: str
    matching: list[str]
    other: dict[str, list[str]]  # params digest ('none': not a shard) -> files

    def report(self) -> str | None:
        """One line on the shards that are not read (None when all match)."""
        if not self.other:
            return None
        n = sum(map(len, self.other.values()))
        kinds = ", ".join(f"{len(f)} with params {digest} (e.g. {f[0]})" for digest, f in self.other.items())
        return f"{self.root}: {n} {self.table} shards computed with other feature params are not read: {kinds}"

    def relation(self) -> str:
        """SQL for the matching files' rows (``read_parquet`` over the list); no rows when none match."""
        if not self.matching:
            return "(SELECT NULL LIMIT 0)"
        files = ", ".join("'" + f.replace("'", "''") + "'" for f in self.matching)
        return f"read_parquet([{files}], union_by_name = true, hive_partitioning = false)"


def scan(con, root: str | Path, table: str, params: str) -> ShardScan:
    """Find ``<root>/**/<table>.parquet`` with DuckDB and split the files by feature-params digest; only footers
    are read. ``root``: a local folder or an object-store URL (``s3://bucket/prefix``; DuckDB's httpfs, credentials
    from a DuckDB secret, never from params.yaml).
    """
    pattern = f"{str(root).rstrip('/')}/**/{table}.parquet"
    files = sorted(r[0] for r in con.execute("SELECT file FROM glob(?)", [pattern]).fetchall())
    if not files:
        return ShardScan(str(root), table, [], {})
    rows = con.execute(
        "SELECT file_name, decode(value) FROM parquet_kv_metadata(?) WHERE decode(key) = ?", [files, META_KEY]
    ).fetchall()
    digests = {file: json.loads(value)["params"] for file, value in rows}
    matching = [f for f in files if digests.get(f) == params]
    other: dict[str, list[str]] = {}
    for f in files:
        if digests.get(f) != params:
            other.setdefault(digests.get(f, "none"), []).append(f)
    return ShardScan(str(root), table, matching, other)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
