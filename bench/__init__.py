"""Benchmarks: ``python -m bench NAME`` (the names in ``bench/__main__.py``).

Each prints its measurements and ends with one JSON line. Speeds are reported as
ratios to a floor or reference measured in the same run, never as timed tests.
"""

from pathlib import Path

PARAMS_YAML = Path(__file__).resolve().parents[1] / "params.yaml"  # the benches' values: the repository's own
