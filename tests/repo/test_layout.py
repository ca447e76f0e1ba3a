"""The package's folders and the direction of their imports (docs/layout.md): every arrow points down.

A folder may import the shared modules at the package's top and the folders listed under it in
:data:`MAY_IMPORT`, nothing else; the shared modules import no folder. Imports are read from the
source with ``ast`` (lazy ones inside functions too), as the DVC deps test reads them.

The tests mirror the package (docs/developing.md): every module has its test file in the same folder under
tests/, every folder there is a package, and no test file imports another.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "topometrics"
# the modules at the top
SHARED = {
    "errors",
    "atomic",
    "params",
    "params_schema",
    "params_sources",
    "params_variants",
    "remote_secrets",
    "vocabulary",
}
MAY_IMPORT = {  # folder -> the folders it may import (besides SHARED); lower floors first
    "models": set(),
    "measures": set(),
    "landscape": {"models", "measures"},
    "execution": set(),
    "dynamics": {"measures"},  # the trajectory's dimension: H0 persistence of its iterates
    "training": {"models", "measures", "execution"},  # measures: the sketch's projection
    "features": {"models", "measures", "landscape", "execution", "training", "dynamics"},  # training: log, sketch
    "series": {"models", "measures", "landscape", "execution", "training", "features", "dynamics"},
    "verdict": set(),  # pure statistics over tables of runs
    "analysis": {"models", "execution", "dynamics", "verdict"},  # dynamics: the changepoints of a run's series
    "report": {"analysis", "verdict"},
}


def imported_parts(path: Path) -> set[str]:
    """The top-level parts of the package (a folder or a shared module) that one file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == PACKAGE.name and len(parts) > 1 and _is_part(parts[1]):
                found.add(parts[1])
    return found


def _is_part(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


FOLDERS = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file())


def test_the_folders_are_the_declared_ones():
    assert set(FOLDERS) == set(MAY_IMPORT)
    assert {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"} == SHARED


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_folder_imports_only_shared_modules_and_folders_below_it(folder):
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        up = imported_parts(path) - SHARED - MAY_IMPORT[folder] - {folder}
        assert not up, f"{path.relative_to(PACKAGE)} imports {sorted(up)}, above or beside {folder}/"


def test_shared_modules_import_no_folder():
    for name in sorted(SHARED):
        assert imported_parts(PACKAGE / f"{name}.py") <= SHARED, name


def test_the_allowed_imports_point_down():
    # MAY_IMPORT itself has no cycle: a floor for every folder, each above all it may import
    floor: dict[str, int] = {}
    while len(floor) < len(MAY_IMPORT):
        ready = [f for f, below in MAY_IMPORT.items() if f not in floor and below <= floor.keys()]
        assert ready, f"a cycle among {sorted(set(MAY_IMPORT) - floor.keys())}"
        floor |= {f: 1 + max((floor[b] for b in MAY_IMPORT[f]), default=0) for f in ready}


@pytest.mark.parametrize("folder", FOLDERS)
def test_folders_hold_at_most_ten_modules_of_at_most_450_lines(folder):
    modules = [p for p in (PACKAGE / folder).glob("*.py") if p.name != "__init__.py"]
    assert 1 <= len(modules) <= 10
    long = {p.name: n for p in modules if (n := len(p.read_text().splitlines())) > 450}
    assert not long, long


def test_shared_modules_hold_at_most_450_lines():
    long = {n: k for n in sorted(SHARED) if (k := len((PACKAGE / f"{n}.py").read_text().splitlines())) > 450}
    assert not long, long


TESTS = Path(__file__).resolve().parents[1]


def test_every_module_has_its_test_file_in_the_mirrored_folder():
    # topometrics/<folder>/<module>.py -> tests/<folder>/test_<module>.py; a shared module -> tests/test_<module>.py
    modules = sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    missing = [str(m) for m in modules if not (TESTS / m.parent / f"test_{m.name}").is_file()]
    assert not missing, f"no tests/<folder>/test_<module>.py for {missing}"


def test_every_tests_folder_is_a_package():
    # test files of two same-named modules (features/checkpoint.py, series/checkpoint.py) import as
    # tests.features.test_checkpoint and tests.series.test_checkpoint only when their folders are packages
    folders = {p.parent for p in TESTS.rglob("*.py")}
    assert not [str(f.relative_to(TESTS.parent)) for f in sorted(folders) if not (f / "__init__.py").is_file()]


SCRIPT_IMPORT = re.compile(r"^\s*(?:from|import) (?:[\w.]+\.)?(?:test_\w+|conftest)\b", re.M)


def test_no_test_file_imports_another_test_file():
    # shared helpers live in a folder's helpers.py or conftest.py (docs/developing.md)
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(n.rsplit(".", 1)[-1].startswith("test_") or n.endswith("conftest") for n in names):
                found.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}")
        # and the scripts a test runs in a subprocess (strings), which import by name
        found += [f"{path.relative_to(TESTS.parent)}: {m}" for m in re.findall(SCRIPT_IMPORT, path.read_text())]
    assert not found, found


# A module is one idea in ≲ 400 lines (docs/developing.md); a longer one says in its docstring why it stays one.
LONG = 400


def test_a_module_over_400_lines_says_why_in_its_docstring():
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        lines = len(source.splitlines())  # counted as the 450-line tests above count
        if lines > LONG and "Why over 400 lines:" not in (ast.get_docstring(ast.parse(source)) or ""):
            unexplained.append(f"{path.relative_to(PACKAGE)} ({lines} lines)")
    assert not unexplained, f"over {LONG} lines without 'Why over 400 lines:' in the docstring: {unexplained}"
