"""Mapping -> frozen dataclass, checked key by key: the machinery under topometrics.params.

:func:`build` rejects unknown keys (naming the known ones, or the new name of a renamed key) and
checks each value against its field's type (a float must be finite: YAML's ``.nan`` and ``.inf`` are
refused, since no param means anything at either); :func:`positive`, :func:`non_negative` and
:func:`within` check ranges. Every failure is a :class:`ParamsError` whose message names the key and
the fix.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import fields

from topometrics.errors import TopometricsError


class ParamsError(TopometricsError, ValueError):
    """An invalid params.yaml entry; the message names the key."""


# keys that were renamed, with what to write instead
_RENAMED = {"train.seed": "train.seed became train.seeds, a list (one run per rung and seed): write seeds: [42]"}


def reject_unknown(raw: dict, cls: type, prefix: str) -> None:
    known = {f.name for f in fields(cls)}
    for key in raw:
        if f"{prefix}{key}" in _RENAMED:
            raise ParamsError(f"unknown param {prefix}{key}: {_RENAMED[prefix + key]}")
        if key not in known:
            raise ParamsError(f"unknown param {prefix}{key}; known keys: {', '.join(sorted(known))}")


def build(cls: type, raw: object, prefix: str):
    if not isinstance(raw, dict):
        raise ParamsError(f"{prefix} must be a mapping, got {type(raw).__name__}")
    reject_unknown(raw, cls, prefix + ".")
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
            raise ParamsError(f"{key} must be a list of {item.__name__}, got {value!r}")
        return tuple(coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool) or not isinstance(value, hint):
        raise ParamsError(f"{key} must be {hint.__name__}, got {value!r} ({type(value).__name__})")
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
