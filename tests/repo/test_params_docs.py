"""docs/params.md against params.yaml: every key params.yaml sets is documented, with the value it has there."""

from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OPEN_MAPS = {"ladder": "ladder.<rung>", "variants": "variants.<name>", "series.sources": "series.sources.<name>"}
# ^ user-named entries below these: documented once, under the placeholder name


def params_keys(tree: dict, prefix: str = "") -> dict[str, object]:
    """``section.key`` -> value for every key params.yaml sets, down to the open maps (documented whole)."""
    keys = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and name not in OPEN_MAPS and not prefix.startswith("data.tokenizer"):
            keys |= params_keys(value, f"{name}.")
        else:
            keys[name] = value
    return keys


def _split_top_level(text: str) -> list[str]:
    """``"1000, [10, 20], 1.0"`` -> ``["1000", "[10, 20]", "1.0"]``: commas outside brackets and braces."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += (char in "[{") - (char in "]}")
        if char == "," and depth == 0:
            parts, current = [*parts, current.strip()], ""
        else:
            current += char
    return [*parts, current.strip()]


@cache
def documented() -> dict[str, str]:
    """``key`` -> the default column of docs/params.md's tables (rows ``| `key` | default | meaning |``)."""
    rows = {}
    for line in (ROOT / "docs" / "params.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = [n.strip().strip("`") for n in cells[0].split(",")]  # `a.b`, `a.c` or `a.b`, `.c`
        names = [names[0].rsplit(".", 1)[0] + n if n.startswith(".") else n for n in names]
        defaults = _split_top_level(cells[1])
        for i, name in enumerate(names):
            rows[name] = defaults[i] if len(defaults) == len(names) else cells[1]
    return rows


PARAMS = params_keys(yaml.safe_load((ROOT / "params.yaml").read_text()))


@pytest.mark.parametrize("key", sorted(PARAMS))
def test_every_key_params_yaml_sets_has_a_row_in_docs_params(key):
    name = OPEN_MAPS.get(key, key)
    rows = documented()
    assert name in rows or any(row.startswith(f"{name}.") for row in rows), (
        f"docs/params.md has no row for `{name}`, which params.yaml sets"
    )


@pytest.mark.parametrize("key", sorted(k for k, v in PARAMS.items() if isinstance(v, int | float | str)))
def test_a_documented_default_is_the_value_params_yaml_has(key):
    shown = documented().get(key, "").strip("`")
    try:
        shown_value = yaml.safe_load(shown)
    except yaml.YAMLError:
        pytest.skip(f"docs/params.md describes `{key}`'s default in words: {shown!r}")
    if not isinstance(shown_value, int | float | str) or isinstance(shown_value, str) and " " in shown_value:
        pytest.skip(f"docs/params.md describes `{key}`'s default in words: {shown!r}")
    assert shown_value == PARAMS[key], f"docs/params.md says `{key}` is {shown!r}; params.yaml has {PARAMS[key]!r}"
