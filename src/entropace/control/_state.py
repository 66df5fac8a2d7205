"""Validation of the controllers' saved state: every field checked before anything is loaded.

A controller's ``load_state_dict`` reads its state through these helpers, which raise
:class:`StateError` naming the field's path (``rule.tasks['db'].eps``) and what was wrong; the
file-level loader (:func:`read_state_file`, :meth:`entropace.control.TaskStep.load_state_file`)
adds the file's name. Nothing is assigned before the whole state has been checked, so a
rejected state leaves the controller as it was.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "StateError",
    "check_config",
    "check_fields",
    "check_int",
    "check_number",
    "check_optional_number",
    "read_state_file",
]


class StateError(ValueError):
    """A saved controller state that does not fit (malformed, out of range, another run's)."""


def check_fields(state: Any, where: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    """``state`` as a mapping holding exactly ``keys`` (a missing or unknown key is an error)."""
    if not isinstance(state, Mapping):
        raise StateError(f"{where}: expected an object, got {type(state).__name__} {state!r:.60}")
    missing = [k for k in keys if k not in state]
    if missing:
        raise StateError(f"{where}: missing key(s) {missing}")
    extra = sorted(str(k) for k in state if k not in keys)
    if extra:
        raise StateError(f"{where}: unknown key(s) {extra}")
    return state


def check_number(
    value: Any,
    where: str,
    *,
    lo: float = -math.inf,
    hi: float = math.inf,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """``float(value)`` if a finite number in the range (bools refused), else StateError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StateError(f"{where}: expected a number, got {value!r:.60}")
    v = float(value)
    if not math.isfinite(v):
        raise StateError(f"{where}: non-finite value {v!r}")
    below = v <= lo if lo_open else v < lo
    above = v >= hi if hi_open else v > hi
    if below or above:
        left, right = "(" if lo_open else "[", ")" if hi_open else "]"
        raise StateError(f"{where}: value {v!r} outside {left}{lo}, {hi}{right}")
    return v


def check_optional_number(value: Any, where: str, **bounds: Any) -> float | None:
    """None, or :func:`check_number`."""
    return None if value is None else check_number(value, where, **bounds)


def check_int(value: Any, where: str, *, lo: int = 0, hi: int | None = None) -> int:
    """An integer in ``[lo, hi]`` (bools and floats refused), else StateError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise StateError(f"{where}: expected an integer, got {value!r:.60}")
    if value < lo or (hi is not None and value > hi):
        raise StateError(f"{where}: value {value} outside [{lo}, {'inf' if hi is None else hi}]")
    return value


def check_config(owner: str, mine: Mapping[str, Any], saved: Any, where: str) -> None:
    """The saved config must equal this controller's (a StateError lists every difference)."""
    saved = check_fields(saved, where, tuple(mine)) if isinstance(saved, Mapping) else saved
    if not isinstance(saved, Mapping):
        raise StateError(f"{where}: expected an object, got {type(saved).__name__}")
    diff = sorted(k for k in mine if mine[k] != saved[k])
    if diff:
        raise StateError(
            f"{where}: {owner} config mismatch on "
            + ", ".join(f"{k} (saved {saved[k]!r}, here {mine[k]!r})" for k in diff)
        )


def read_state_file(path: str | Path) -> Any:
    """The JSON value in ``path``; a StateError naming the file when it is missing, empty, not
    JSON or nested too deeply."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise StateError(f"{path}: cannot read the controller state ({exc})") from None
    except UnicodeDecodeError as exc:
        raise StateError(f"{path}: not a UTF-8 text file ({exc})") from None
    if not text.strip():
        raise StateError(f"{path}: the controller state file is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StateError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise StateError(f"{path}: JSON nested too deeply") from None
