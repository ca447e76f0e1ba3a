"""dvc.yaml's stage deps list exactly the topometrics/ modules each stage script imports, directly or not.

A folder the stage imports every module of is listed as the folder (:func:`folder_deps`).
The import closure is computed from the source with ``ast`` (every ``import``/``from ... import``
anywhere in a module, lazy imports inside functions included), so a change to any module a stage
runs re-runs that stage, and no stage re-runs for a module it never loads. Package ``__init__.py``
files run nothing (the top one holds the version string, each folder's only its docstring, tested
below) and are not listed. A stage whose closure reaches
``warehouse.py`` also reads the versioned SQL files, so it depends on ``topometrics/analysis/sql``.
One exception, :data:`LIVE_VIEW_ONLY`, says which module's imports are not its stage's deps, and why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "topometrics"


def module_path(name: str) -> Path | None:
    """The file of a dotted module name inside the package (None for anything outside it)."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    base = REPO.joinpath(*name.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


TOP_INIT = REPO / PACKAGE / "__init__.py"


def imported_modules(path: Path) -> set[Path]:
    """Package files imported by one file (``from topometrics import x`` counts submodule x). The package's own
    ``__init__.py`` counts only its module-level imports: its ``features_of`` imports its module when a user
    calls it, never when a stage imports the package."""
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body if path == TOP_INIT else ast.walk(tree):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            candidates = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in candidates:
            parts = name.split(".")
            # importing a.b.c runs a/__init__, a/b/__init__ and a/b/c
            found |= {p for i in range(1, len(parts) + 1) if (p := module_path(".".join(parts[:i])))}
    return found


def import_closure(script: Path, excluded: frozenset[Path] = frozenset()) -> set[Path]:
    """Every package file the script loads, transitively, except ``excluded`` and what only they load."""
    seen, todo = set(), [script]
    while todo:
        for module in imported_modules(todo.pop()) - seen - excluded:
            seen.add(module)
            todo.append(module)
    return seen


def listed_module_deps(deps: list[str]) -> set[str]:
    return {d for d in deps if d.startswith(f"{PACKAGE}/") and d.endswith(".py")}


SQL = f"{PACKAGE}/analysis/sql"  # the warehouse's SQL files: a folder of data, not of modules
# A stage that imports every module of a folder lists the folder instead of its modules: one column in
# `dvc exp show` instead of up to ten. Not fewer than every module: a train stage that listed models/ for most
# of it would retrain every run when the linear-layer finder (models/architectures.py, a measure's) changed.


def folder_modules(folder: str) -> set[str]:
    """The modules of one package folder (``topometrics/verdict``), its ``__init__.py`` left out."""
    return {p.relative_to(REPO).as_posix() for p in (REPO / folder).glob("*.py") if p.name != "__init__.py"}


def folder_deps(modules: set[str]) -> set[str]:
    """The package folders (below the top one) ``modules`` hold every module of."""
    folders = {m.rsplit("/", 1)[0] for m in modules if m.count("/") >= 2}
    return {f for f in folders if folder_modules(f) <= modules}


def listed_folder_deps(deps: list[str]) -> set[str]:
    return {d for d in deps if d.startswith(f"{PACKAGE}/") and (REPO / d).is_dir() and d != SQL}


def expected_module_deps(script: Path, excluded: frozenset[Path] = frozenset()) -> set[str]:
    closure = {p for p in import_closure(script, excluded) if p.name != "__init__.py"}
    return {p.relative_to(REPO).as_posix() for p in closure}


STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]

# The one exception: stage -> a module its script imports whose own imports are not the stage's deps.
# stages/train.py opens a live monitor per run when train.monitor_every > 0 (topometrics.features.monitor, imported
# lazily). The monitor's log is a live view written beside the checkpoints, never read to make the pipeline's
# results (the features stages recompute every measure from the checkpoints; a series of a log, which a user
# configures, reads it as it was measured), and the checkpoints are bit-identical with or without it
# (training/test_train.py::test_a_monitored_run_writes_the_same_bytes_and_the_monitor_sees_the_checkpoints_weights).
# So the modules reached only through the monitor are not deps of train: a change to a measure does not
# retrain. Each measurement records the code version and params that made it
# (topometrics.training.monitor_log.measured_with), so a log measured by other code stays detectable. Every other
# module the train stage imports is checked as for any stage.
LIVE_VIEW_ONLY = {"train": REPO / "topometrics" / "features" / "monitor.py"}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_deps_are_the_import_closure_of_its_script(stage):
    deps = STAGES[stage]["deps"]
    name = re.match(r"python stages/(\w+)\.py", STAGES[stage]["cmd"]).group(1)
    assert name == stage
    script = REPO / "stages" / f"{name}.py"
    assert f"stages/{name}.py" in deps
    excluded = frozenset({LIVE_VIEW_ONLY[stage]} if stage in LIVE_VIEW_ONLY else ())
    assert excluded <= imported_modules(script)  # the exception names a module the script does import
    expected = expected_module_deps(script, excluded)
    folders = folder_deps(expected)
    assert listed_folder_deps(deps) == folders  # a folder the stage imports most of, and no other
    expected -= {m for f in folders for m in folder_modules(f)}
    listed = listed_module_deps(deps)
    assert listed == expected, f"missing: {sorted(expected - listed)}; not imported: {sorted(listed - expected)}"
    needs_sql = f"{PACKAGE}/analysis/warehouse.py" in expected | {m for f in folders for m in folder_modules(f)}
    assert (SQL in deps or f"{PACKAGE}/analysis" in folders) == needs_sql


def test_the_closure_follows_lazy_and_package_imports(tmp_path):
    # stages/report.py imports report.html, which imports report.contents, which imports charts: all are found.
    closure = expected_module_deps(REPO / "stages" / "report.py")
    assert {"topometrics/report/contents.py", "topometrics/report/charts.py"} <= closure
    assert all((REPO / p).is_file() for p in closure)


# What computes or names a feature: the measures and features folders, the vocabulary, and the linear-layer
# finder the monitor uses.
MEASURES = ("measures/", "features/", "vocabulary.py", "models/architectures.py")


@pytest.mark.parametrize("module", ["train", "run_queue"])
def test_training_imports_no_measure(module):
    closure = {
        p.relative_to(REPO / PACKAGE).as_posix() for p in import_closure(REPO / PACKAGE / "training" / f"{module}.py")
    }
    found = sorted(p for p in closure if p.startswith(MEASURES))
    assert closure and not found, found


def test_package_inits_run_nothing():
    # Not listed as deps, so they must hold no code a stage could depend on: each folder's __init__.py is
    # its docstring (the folder's map) and re-exports nothing; the package's own holds the version string.
    for init in sorted((REPO / PACKAGE).rglob("__init__.py")):
        body = ast.parse(init.read_text()).body
        docstring = [n for n in body[:1] if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)]
        rest = [ast.unparse(n) for n in body[len(docstring) :]]
        assert docstring, f"{init}: no docstring naming the folder's entry points"
        if init == TOP_INIT:  # the version, and the one-call API delegating to its module on first use
            assert rest[0] == "__version__ = '0.1.0'" and len(rest) == 2, init
            (function,) = body[-1:]
            assert isinstance(function, ast.FunctionDef) and function.name == "features_of"
            assert [type(n).__name__ for n in function.body] == ["Expr", "ImportFrom", "Return"]
            continue
        assert rest == [], f"{init}: a folder's __init__.py holds only its docstring"
