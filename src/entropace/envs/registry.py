"""Registry of environment families and their seed-range task sets.

``make(name, **options)`` builds a fresh, turn-limited environment. A *task set* is a seed
range: the ``train`` and ``test`` splits never overlap, and the same seed always gives the
same instance and gold answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from entropace.envs.base import Policy, TextEnv, TurnLimit

Split = Literal["train", "test"]

#: Seed ranges of the two splits. Disjoint by construction.
SPLITS: dict[str, range] = {
    "train": range(0, 1_000_000),
    "test": range(1_000_000, 1_100_000),
}


@dataclass(frozen=True)
class EnvSpec:
    """Everything the library and the CLI know about one family.

    Attributes:
        name: family name, e.g. ``"db"``.
        factory: ``factory(**options) -> TextEnv`` (unwrapped).
        oracle: ``oracle(env) -> Policy``; called after ``env.reset(seed)`` it returns a scripted
            policy that solves that instance (used by tests and ``envs sample``).
        description: one line for ``entropace envs list``.
        options: option name -> help text (with allowed values and default).
        data_source: where the family's data comes from.
        license: the licence(s) of that data.
        requires: pip packages the family needs (named in the error when missing).
    """

    name: str
    factory: Callable[..., TextEnv]
    oracle: Callable[[Any], Policy]
    description: str
    options: dict[str, str] = field(default_factory=dict)
    data_source: str = "generated"
    license: str = "n/a"
    requires: tuple[str, ...] = ()


_REGISTRY: dict[str, EnvSpec] = {}
_BUILTIN_MODULES: tuple[str, ...] = (
    "entropace.envs.db",
    "entropace.envs.kg",
    "entropace.envs.reasoning",
    "entropace.envs.os",
    "entropace.envs.household",
    "entropace.envs.shop",
)
_loaded = False
#: builtin family module -> why it could not be imported (a missing optional dependency)
UNAVAILABLE: dict[str, str] = {}


def register(spec: EnvSpec) -> EnvSpec:
    """Register a family; re-registering the same name replaces it."""
    _REGISTRY[spec.name] = spec
    return spec


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    import importlib
    import importlib.util

    for mod in _BUILTIN_MODULES:
        if importlib.util.find_spec(mod) is None:
            continue
        try:
            importlib.import_module(mod)
        except ImportError as exc:  # one family's missing dependency must not hide the others
            UNAVAILABLE[mod.rsplit(".", 1)[-1]] = (
                f"{exc}; install the environment extras: pip install 'entropace[envs]'"
            )
    _loaded = True


def specs() -> dict[str, EnvSpec]:
    """All registered families by name."""
    _load_builtins()
    return dict(sorted(_REGISTRY.items()))


def spec(name: str) -> EnvSpec:
    """The spec of family ``name``; an unknown name lists the known ones."""
    known = specs()
    if name not in known:
        if name in UNAVAILABLE:
            raise ImportError(f"environment {name!r} is unavailable: {UNAVAILABLE[name]}")
        raise KeyError(f"unknown environment {name!r}; known: {sorted(known)}")
    return known[name]


def make(name: str, *, max_turns: int | None = None, **options: Any) -> TurnLimit:
    """Build a fresh environment of family ``name`` wrapped in :class:`TurnLimit`.

    Unknown options raise ``TypeError`` naming the family's options.
    """
    s = spec(name)
    unknown = sorted(set(options) - set(s.options))
    if unknown:
        raise TypeError(f"{name}: unknown option(s) {unknown}; options: {sorted(s.options)}")
    return TurnLimit(s.factory(**options), max_turns=max_turns)


def seeds(split: Split, n: int, *, offset: int = 0) -> range:
    """The first ``n`` seeds of ``split`` starting at ``offset`` within it."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    r = SPLITS[split]
    if offset < 0 or n < 0 or offset + n > len(r):
        raise ValueError(f"{split} split has {len(r)} seeds; asked for [{offset}, {offset + n})")
    return r[offset : offset + n]
