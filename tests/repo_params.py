"""The repository's params.yaml, for tests: the one place a value lives.

The params dataclasses hold no default for a key params.yaml sets (docs/params.md, *Required keys*), so a
test that needs a section builds it from the file and overrides what it tests: ``features_params(max_points=20)``
is params.yaml's ``features`` with ``max_points`` 20. ``raw_params()`` is the file as a fresh mapping, for tests
that edit it and parse it again.
"""

import copy
import dataclasses
from functools import cache
from pathlib import Path

import yaml

from topometrics.params import AnalysisParams, FeaturesParams, Params, TrainParams, parse_params
from topometrics.params_sources import ComputeParams, SeriesParams

PARAMS_YAML = Path(__file__).resolve().parents[1] / "params.yaml"


@cache
def _raw() -> dict:
    return yaml.safe_load(PARAMS_YAML.read_text())


def raw_params() -> dict:
    """params.yaml as a mapping (a deep copy: edit it freely)."""
    return copy.deepcopy(_raw())


@cache
def repo_params() -> Params:
    """params.yaml, parsed and validated."""
    return parse_params(raw_params())


def features_params(**overrides) -> FeaturesParams:
    return dataclasses.replace(repo_params().features, **overrides)


def train_params(**overrides) -> TrainParams:
    return dataclasses.replace(repo_params().train, **overrides)


def analysis_params(**overrides) -> AnalysisParams:
    return dataclasses.replace(repo_params().analysis, **overrides)


def series_params(**overrides) -> SeriesParams:
    return dataclasses.replace(repo_params().series, **overrides)


def compute_params(**overrides) -> ComputeParams:
    return dataclasses.replace(repo_params().compute, **overrides)
