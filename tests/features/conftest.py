"""Fixtures of the features tests: a tiny run directory and the features computed in memory from it."""

import pytest

from tests.features.helpers import STEPS, run_tables, write_run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    write_run(root, STEPS)
    features, diagrams = run_tables(root / "run", root / "corpus", root / "expected")  # the tests' reference
    return root, features, diagrams
