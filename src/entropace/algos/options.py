"""The one builder of a registry entry's validated options (policy losses, advantage
estimators): a frozen dataclass from plain options, errors naming the entry and the option."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["build_options"]


def build_options(owner: str, config_cls: type, options: Mapping[str, Any] | None) -> Any:
    """``config_cls(**options)``; ``ValueError`` starting with ``owner`` (e.g. ``"policy loss
    'ppo'"``) for an unknown option (listing the allowed ones) or a value its
    ``__post_init__`` refuses."""
    options = dict(options or {})
    fields = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ValueError(f"{owner}: unknown option(s) {unknown}; allowed: {fields}")
    try:
        return config_cls(**options)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{owner}: {exc}") from None
