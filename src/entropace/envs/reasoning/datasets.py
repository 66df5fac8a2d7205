"""The reasoning-gym datasets of the ``reasoning`` family and their difficulty knobs.

Each dataset is one entry of :data:`DATASETS`: the reasoning-gym name, the config keyword
arguments of each difficulty (reasoning-gym's own knobs, e.g. number of terms or people), and an
optional *answer guard* that rejects answers the scorer must not see (countdown's scorer calls
``sympy.parse_expr``, which ``eval``s its input, so only plain arithmetic reaches it).

Datasets are built lazily, once per (name, difficulty), with a fixed base seed; instance ``i`` is
``dataset[i]``, which reasoning-gym generates from ``random.Random(base_seed + i)`` -- cheap and
deterministic, with no pre-generation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from entropace.envs.base import check_difficulty

#: reasoning-gym is a required dependency of this family (named in the error when missing).
REQUIREMENT = "reasoning-gym"

#: Longest extracted answer passed to a scorer (longer answers score 0 without scoring).
MAX_ANSWER_CHARS = 4000

_COUNTDOWN_SAFE = re.compile(r"[0-9\s+\-*/().]*")


def _countdown_guard(answer: str) -> str | None:
    """Only digits, spaces, ``+ - * / ( )`` and no ``**`` (power towers hang sympy)."""
    if len(answer) > 500:
        return "countdown answers are at most 500 characters"
    if not _COUNTDOWN_SAFE.fullmatch(answer):
        return "countdown answers may only contain numbers, + - * / and parentheses"
    if "**" in answer:
        return "countdown answers may not contain '**'"
    return None


@dataclass(frozen=True)
class DatasetSpec:
    """One reasoning-gym dataset: its config per difficulty and an optional answer guard.

    Attributes:
        name: reasoning-gym dataset name (``reasoning_gym.create_dataset(name, ...)``).
        configs: difficulty -> config keyword arguments.
        guard: ``guard(answer) -> reason | None``; a reason means "do not score, reward 0".
    """

    name: str
    configs: Mapping[str, Mapping[str, Any]]
    guard: Callable[[str], str | None] | None = None


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "basic_arithmetic",
            {
                "easy": dict(min_terms=2, max_terms=3, min_digits=1, max_digits=2),
                "medium": dict(min_terms=3, max_terms=5, min_digits=1, max_digits=3),
                "hard": dict(min_terms=5, max_terms=8, min_digits=2, max_digits=4),
            },
        ),
        DatasetSpec(
            "chain_sum",
            {
                "easy": dict(min_terms=2, max_terms=3, min_digits=1, max_digits=2),
                "medium": dict(min_terms=3, max_terms=5, min_digits=2, max_digits=3),
                "hard": dict(
                    min_terms=5, max_terms=8, min_digits=3, max_digits=4, allow_negation=True
                ),
            },
        ),
        DatasetSpec(
            "countdown",
            {
                "easy": dict(
                    min_numbers=3, max_numbers=3, max_value=20, min_target=10, max_target=99
                ),
                "medium": dict(min_numbers=4, max_numbers=4, min_target=100, max_target=500),
                "hard": dict(min_numbers=5, max_numbers=6, min_target=100, max_target=999),
            },
            guard=_countdown_guard,
        ),
        DatasetSpec(
            "word_sorting",
            {
                "easy": dict(min_words=3, max_words=5, min_word_length=3, max_word_length=8),
                "medium": dict(min_words=5, max_words=10, min_word_length=3, max_word_length=12),
                "hard": dict(min_words=10, max_words=20, min_word_length=3, max_word_length=12),
            },
        ),
        DatasetSpec(
            "knights_knaves",
            {
                "easy": dict(n_people=2, depth_constraint=2, width_constraint=2),
                "medium": dict(n_people=3, depth_constraint=2, width_constraint=2),
                "hard": dict(n_people=4, depth_constraint=2, width_constraint=2),
            },
        ),
    )
}

#: Base seed of every dataset: instance ``i`` is generated from ``Random(BASE_SEED + i)``.
BASE_SEED = 0

#: Virtual size passed to reasoning-gym (covers both seed splits; nothing is pre-generated).
VIRTUAL_SIZE = 1_100_000


def parse_datasets(datasets: str | None) -> tuple[str, ...]:
    """Validate the comma-separated ``datasets`` option (``None`` or ``"all"``: every dataset).

    Raises:
        ValueError: empty selection, unknown or duplicated names (the message lists the
            available ones).
    """
    if datasets is None:
        return tuple(DATASETS)
    if not isinstance(datasets, str):
        raise ValueError(
            f"datasets must be a comma-separated string, got {type(datasets).__name__}"
        )
    if datasets.strip() == "all":
        return tuple(DATASETS)
    names = [n.strip() for n in datasets.split(",") if n.strip()]
    if not names:
        raise ValueError(f"datasets is empty; available: {','.join(DATASETS)}")
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise ValueError(f"unknown reasoning dataset(s) {unknown}; available: {','.join(DATASETS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"datasets lists a name twice: {datasets!r}")
    return tuple(names)


def _import_reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            f"the 'reasoning' environment needs {REQUIREMENT}: pip install {REQUIREMENT}"
        ) from exc
    return reasoning_gym


@cache
def build_dataset(name: str, difficulty: str) -> Any:
    """The reasoning-gym ``ProceduralDataset`` of ``name`` at ``difficulty`` (cached)."""
    check_difficulty(difficulty)
    if name not in DATASETS:
        raise ValueError(f"unknown reasoning dataset {name!r}; available: {','.join(DATASETS)}")
    rg = _import_reasoning_gym()
    kwargs = dict(DATASETS[name].configs[difficulty])
    return rg.create_dataset(name, seed=BASE_SEED, size=VIRTUAL_SIZE, **kwargs)
