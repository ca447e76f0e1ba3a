"""Mapping -> frozen dataclass, checked key by key: the machinery under topometrics.params.

:func:`build` rejects unknown keys (naming the known ones, or the new name of a renamed key) and
checks each value against its field's type (a float must be finite: YAML's ``.nan`` and ``.inf`` are
refused, since no param means anything at either); :func:`positive`, :func:`non_negative` and
:func:`within` check ranges. Every failure is a :class:`ParamsError` whose message names the key and
the fix. :func:`check_primary_shape` holds the pre-registered endpoint to the runs the params declare.
"""

from __future__ import annotations

import math
import re
import types
import typing
from dataclasses import MISSING, fields
from math import factorial, prod

from topometrics.errors import TopometricsError


class ParamsError(TopometricsError, ValueError):
    """An invalid params.yaml entry; the message names the key."""


MAX_NAME = 64  # characters of a rung, variant or series name: a run's folder <rung>-<variant>-<seed> stays < 255
MAX_INT32 = 2**31 - 1  # the warehouse stores seeds and steps as INTEGER (32-bit)


# keys that were renamed, with what to write instead
_RENAMED = {"train.seed": "train.seed became train.seeds, a list (one run per rung and seed): write seeds: [42]"}


def reject_unknown(raw: dict, cls: type, prefix: str) -> None:
    known = {f.name for f in fields(cls)}
    for key in raw:
        if f"{prefix}{key}" in _RENAMED:
            raise ParamsError(f"unknown param {prefix}{key}: {_RENAMED[prefix + key]}")
        if key not in known:
            raise ParamsError(f"unknown param {prefix}{key}; known keys: {', '.join(sorted(known))}")


def missing(key: str) -> ParamsError:
    """The one-line error of a required key (one params.yaml sets) that is absent: no code default stands in."""
    return ParamsError(
        f"missing param {key}: add it to params.yaml (docs/params.md, `{key}`, gives its meaning and usual value)"
    )


def required(cls: type) -> list[str]:
    """The fields of ``cls`` without a default: the keys params.yaml must set (docs/params.md, *Required keys*)."""
    return [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]


def build(cls: type, raw: object, prefix: str):
    if not isinstance(raw, dict):
        raise ParamsError(f"{prefix} must be a mapping, got {type(raw).__name__}")
    reject_unknown(raw, cls, prefix + ".")
    if absent := [name for name in required(cls) if name not in raw]:
        raise missing(f"{prefix}.{absent[0]}")
    hints = typing.get_type_hints(cls)
    values = {k: coerce(v, hints[k], f"{prefix}.{k}") for k, v in raw.items()}
    return cls(**values)


def coerce(value: object, hint: object, key: str) -> object:
    """Check a YAML scalar against a field's type; ints are accepted where floats are."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ParamsError(f"{key} must map names to strings, e.g. {{attn.q: 'h\\.(\\d+)\\.q\\.weight'}}")
        return dict(value)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if not isinstance(value, list | tuple):
            raise ParamsError(f"{key} must be a list of {item.__name__}, got {shown(value)}")
        return tuple(coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool) or not isinstance(value, hint):
        raise ParamsError(f"{key} must be {hint.__name__}, got {shown(value)} ({type(value).__name__})")
    if hint is float and not math.isfinite(value):
        raise ParamsError(f"{key} must be a finite number, got {value}; write a number such as 0.001")
    return value


def positive(obj: object, prefix: str, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and value <= 0:
            raise ParamsError(f"{prefix}.{name} must be positive, got {value}")


def non_negative(obj: object, prefix: str, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(obj, name) < 0:
            raise ParamsError(f"{prefix}.{name} must be >= 0, got {getattr(obj, name)}")


def within(obj: object, prefix: str, name: str, low: float, high: float, why: str) -> None:
    """``low <= value <= high`` for ``<prefix>.<name>``; ``why`` says what the bounds mean (in the message)."""
    value = getattr(obj, name)
    if not low <= value <= high:
        raise ParamsError(f"{prefix}.{name} must be between {low} and {high} ({why}), got {value}")


def at_least(obj: object, prefix: str, names: tuple[str, ...], minimum: int, why: str) -> None:
    """``value >= minimum`` for each ``<prefix>.<name>``; ``why`` says what a smaller value would mean."""
    for name in names:
        value = getattr(obj, name)
        if value < minimum:
            raise ParamsError(f"{prefix}.{name} must be at least {minimum} ({why}), got {value}")


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters: a 10 MB string is named, not echoed back."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def check_name(key: str, name: object, extra: str, example: str) -> None:
    """A rung, variant or series name (``key`` says which): 1 to :data:`MAX_NAME` ASCII letters, digits and the
    characters of ``extra``, starting with a letter or digit (folder names, DVC stage keys and SQL values)."""
    pattern = f"[A-Za-z0-9][A-Za-z0-9{re.escape(extra)}]{{0,{MAX_NAME - 1}}}"
    if not isinstance(name, str) or not re.fullmatch(pattern, name):
        chars = ", ".join(f"'{c}'" for c in extra)
        raise ParamsError(f"{key}: the name {shown(name)} must be 1 to {MAX_NAME} ASCII letters, digits or {chars}, "
                          f"starting with a letter or digit; e.g. {example}")  # fmt: skip


def check_seeds(key: str, seeds: tuple[int, ...]) -> None:
    """Seeds from 0 to :data:`MAX_INT32`, checked before any run trains (a larger one overflows torch's seed or the
    warehouse's seed column only after the training it wasted)."""
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ParamsError(f"{key} must be a non-empty list of distinct integers >= 0, e.g. [42, 43]")
    if bad := next((seed for seed in seeds if not 0 <= seed <= MAX_INT32), None):
        raise ParamsError(f"{key}: seed {shown(bad)} is outside 0 to 2**31-1 (the warehouse's 32-bit seed column); "
                          "use a smaller seed, e.g. 42")  # fmt: skip


def check_run_names(runs: list[str], rungs: list[str], series: list[str]) -> None:
    """Every run name once, and no series named like a rung (its rows would mix into the rung's)."""
    if twice := sorted({n for n in runs if runs.count(n) > 1}):
        raise ParamsError(f"runs {twice} are declared twice (a rung name with '-' meets a variant); rename one")
    if both := sorted(set(rungs) & set(series)):
        raise ParamsError(f"series.sources.{both[0]}: a series may not share a rung's name (its rows would mix into "
                          f"ladder.{both[0]}'s); rename the series, e.g. {both[0]}-series")  # fmt: skip


def check_primary_shape(p, groups: dict[str, int], fractions: tuple[float, ...], alpha: float) -> None:
    """``analysis.primary`` (a PrimaryParams) against the declared runs: ``groups`` = seeds, recipes per rung
    (``variant``) and rungs. A level the runs cannot carry (too few recipes per rung for the cell permutations
    to reach ``alpha``, one seed per cell for the within-cell test) is one :class:`ParamsError` naming what it needs."""
    need = _cells_needed(groups["rung"], alpha)
    problems = [
        (not p.family or len(p.features) > 3, f"declare a family and at most 3 features, got {p.family!r}"),
        (p.fraction not in fractions, f"fraction {p.fraction} is not in analysis.fractions"),
        (p.level not in ("between", "within"), f"level {p.level!r} is not 'between' or 'within'"),
        (p.level == "between" and groups.get(p.cv, 0) < 3,
         f"cv {p.cv!r} needs >= 3 groups among the declared runs ({groups})"),
        (p.level == "between" and groups["variant"] < need,
         f"the between-cell test permutes recipes within each rung: {groups['variant']} recipes per rung give a "
         f"smallest p above alpha={alpha}; declare >= {need} recipes per rung (variants)"),
        (p.level == "within" and groups["seed"] < 2,
         f"the within-cell test shuffles seeds within each cell: {groups['seed']} seed per cell; declare >= 2 seeds"),
        (p.baseline.split("+")[0] not in ("recipe", "norm"),
         f"baseline {p.baseline!r}: 'recipe', 'norm' or either + '+<geometric family>'"),
        (p.power is not None and not 0 < p.power <= 1, f"power {p.power} is not a share in (0, 1]"),
        (p.needed_runs is not None and (p.power is None or p.power >= 0.8 or p.needed_runs <= prod(groups.values())),
         f"needed_runs {p.needed_runs} goes with a power below 0.8 and more than the {prod(groups.values())} runs"),
    ]  # fmt: skip
    for bad, why in problems:
        if bad:
            raise ParamsError(f"analysis.primary: {why}; fix it in params.yaml before the sweep")


def _cells_needed(rungs: int, alpha: float) -> int:
    """The fewest recipes per rung whose cell-block permutations can give a p below ``alpha``: the smallest c
    with (c!)^rungs > 1 / alpha (and >= 3, for leave-one-recipe-out)."""
    c = 3
    while factorial(c) ** max(rungs, 1) * alpha <= 1:
        c += 1
    return c
