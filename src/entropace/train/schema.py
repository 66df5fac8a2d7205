"""Typed nested dataclasses from plain dicts: the machinery behind the trainer's config.

``build_dataclass(cls, data)`` checks every key against the dataclass fields (unknown keys get a
difflib suggestion and the list of allowed keys) and every value against the field's type hint
(``Literal`` values listed on error; ints accepted for floats; comma strings for lists), and
reports the dotted key of the offending entry. Every number is checked against its range
(:class:`Range`, registered per dataclass with :func:`register_ranges`, else the default of its
type: a finite float, an int in ``[0, 2**31 - 1]``) before the dataclass is built, so NaN, inf
and 21-digit integers never reach a dataclass's own checks or the trainer.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


class ConfigError(ValueError):
    """A bad configuration: the message names the key and what is allowed."""


@dataclass(frozen=True)
class Range:
    """The values a numeric config key may take: finite, within ``lo``..``hi`` (each bound
    inclusive unless ``lo_open`` / ``hi_open``). ``str(Range(0, 1, hi_open=True))`` is
    ``"in [0, 1)"``; an unbounded side reads ``"> 0"`` / ``">= 0"``; ``Range()`` is any finite
    number. Integer bounds (``Range(1, 1024)``) word the error for an integer key; ``note``
    is appended to the error (why the range is what it is)."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False
    note: str = ""

    def __contains__(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below

    def __str__(self) -> str:
        def num(x: float) -> str:
            return str(int(x)) if float(x).is_integer() and abs(x) < 2**53 else repr(x)

        lo, hi = math.isfinite(self.lo), math.isfinite(self.hi)
        if lo and hi:
            left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
            return f"in {left}{num(self.lo)}, {num(self.hi)}{right}"
        if lo:
            return f"{'>' if self.lo_open else '>='} {num(self.lo)}"
        if hi:
            return f"{'<' if self.hi_open else '<='} {num(self.hi)}"
        return ""

    def check(self, key: str, value: float) -> None:
        """Raise :class:`ConfigError` naming ``key`` unless ``value`` is in the range."""
        if value not in self:
            integer = isinstance(self.lo, int) and isinstance(value, int)
            what = " ".join(
                filter(None, ["an integer" if integer else "a finite number", str(self)])
            )
            note = f": {self.note}" if self.note else ""
            raise ConfigError(f"{key} must be {what}, got {value!r}{note}")


#: The range of an int key whose dataclass registers none (a count or an index).
INT_RANGE = Range(0, 2**31 - 1)
#: The range of a float key whose dataclass registers none.
FLOAT_RANGE = Range()

_RANGES: dict[type, dict[str, Range]] = {}


def register_ranges(cls: type, ranges: dict[str, Range]) -> None:
    """Give fields of the dataclass ``cls`` their own ranges (others keep their type's
    default, :data:`INT_RANGE` / :data:`FLOAT_RANGE`); a list or mapping of numbers gets the
    range of each entry."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(ranges) - names)
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}")
    _RANGES.setdefault(cls, {}).update(ranges)


def _numeric_type(tp: Any) -> type | None:
    """``int`` / ``float`` for a numeric hint (also inside ``X | None``, ``list[X]`` and
    ``dict[str, X]``), else None."""
    if tp in (int, float):
        return tp
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _numeric_type(args[0])
    if origin is list and args:
        return _numeric_type(args[0])
    if origin is dict and len(args) == 2:
        return _numeric_type(args[1])
    return None


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, resolved once per class (it compiles every annotation)."""
    return typing.get_type_hints(cls)


def field_range(cls: type, name: str) -> Range | None:
    """The range field ``name`` of dataclass ``cls`` is checked against (None: not a number)."""
    numeric = _numeric_type(type_hints(cls)[name])
    if numeric is None:
        return None
    return _RANGES.get(cls, {}).get(name, INT_RANGE if numeric is int else FLOAT_RANGE)


def _check_number(key: str, value: Any, rng: Range) -> None:
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_number(f"{key}[{i}]", v, rng)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_number(f"{key}.{k}", v, rng)
    elif value is not None and not isinstance(value, bool) and isinstance(value, int | float):
        rng.check(key, value)


def check_ranges(obj: Any, prefix: str = "") -> None:
    """Check every number of the dataclass ``obj``, nested dataclasses included, against its
    range (:func:`field_range`); :class:`ConfigError` names the dotted key."""
    for f in dataclasses.fields(obj):
        key = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            check_ranges(value, key)
            continue
        rng = field_range(type(obj), f.name)
        if rng is not None:
            _check_number(key, value, rng)


def did_you_mean(value: str, allowed: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest allowed value, or ``""``."""
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def suggest(key: str, allowed: list[str]) -> str:
    """`` (did you mean 'x'?); allowed keys: [...]`` for an unknown key."""
    return f"{did_you_mean(key, allowed)}; allowed keys: {sorted(allowed)}"


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the type hint ``tp`` (int -> float is allowed); return it."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return build_dataclass(tp, value, key)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}: {value!r} is not allowed; allowed values: {list(allowed)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: bad value {value!r}")
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):  # "db,kg" on the command line
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        kt, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return {coerce(k, kt, key): coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-6" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            return float(value)
        except OverflowError:  # an int past float's range
            raise ConfigError(f"{key}: {value!r} is out of range for a number") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported field type {tp!r}")  # pragma: no cover


def build_dataclass(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """``cls(**data)`` with unknown keys and bad values reported by their dotted key."""
    hints = type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(f"unknown config key {dotted!r}{suggest(str(key), names)}")
        kwargs[key] = coerce(value, hints[key], dotted)
        rng = field_range(cls, key)
        if rng is not None:  # before cls(): its own checks never see NaN or a 21-digit int
            _check_number(dotted, kwargs[key], rng)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # a foreign dataclass's own validation
        raise ConfigError(f"{prefix or cls.__name__}: {exc}") from exc


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts/lists (YAML-ready)."""
    return dataclasses.asdict(cfg)


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: ``update`` wins; nested dicts merge key by key."""
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def nest(dotted: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


def check_in(key: str, value: Any, allowed: list[str] | tuple[str, ...]) -> None:
    if value not in allowed:
        hint = did_you_mean(str(value), allowed)
        raise ConfigError(f"{key}: {value!r} is not allowed{hint}; allowed values: {list(allowed)}")


def check_positive(key: str, value: float, *, strict: bool = True) -> None:
    """``value > 0`` (``>= 0`` unless ``strict``) and finite: NaN and inf are refused too."""
    bad = not math.isfinite(value) or ((value <= 0) if strict else (value < 0))
    if bad:
        raise ConfigError(
            f"{key} must be a finite number {'> 0' if strict else '>= 0'}, got {value!r}"
        )


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim.lr": 1e-6, "tasks.names": ["db", "kg"], ...}``: nested dicts by dotted key."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flat_config(value, dotted))
        else:
            out[dotted] = value
    return out
