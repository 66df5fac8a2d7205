"""Typed nested dataclasses from plain dicts: the machinery behind the trainer's config.

``build_dataclass(cls, data)`` checks every key against the dataclass fields (unknown keys get a
difflib suggestion and the list of allowed keys) and every value against the field's type hint
(``Literal`` values listed on error; ints accepted for floats; comma strings for lists), and
reports the dotted key of the offending entry.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Literal


class ConfigError(ValueError):
    """A bad configuration: the message names the key and what is allowed."""


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
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported field type {tp!r}")  # pragma: no cover


def build_dataclass(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """``cls(**data)`` with unknown keys and bad values reported by their dotted key."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(f"unknown config key {dotted!r}{suggest(str(key), names)}")
        kwargs[key] = coerce(value, hints[key], dotted)
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
