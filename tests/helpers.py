"""Helpers shared by tests in more than one folder: the repository's params.yaml as parsed YAML."""

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def default_raw() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())
