"""Helpers shared by tests in more than one folder: the repository's params.yaml as parsed YAML, recipes to vary."""

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def default_raw() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


RECIPES = {"lr_lo": {"lr": 0.001}, "lr_hi": {"lr": 0.006}}  # 3 recipes per rung: cell permutations can pass 5 %
