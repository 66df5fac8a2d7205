"""Content splits: which instances a seed may draw, and how train/test overlap is measured.

A seed belongs to exactly one split by its range (:data:`SPLITS`). A family's ``reset(seed)``
calls :func:`split_of` and draws its instance from that split's *content pool*, so the splits
are disjoint by content, not only by seed:

* ``train``: the training pool;
* ``test``: the same templates and units as ``train``, instances whose fingerprint never
  occurs in ``train`` (:func:`in_test_bucket` assigns an instance key to ``test`` by hash);
* ``test_unseen``: instances built only from *held-out units* (floor plans, databases,
  entities / relation paths, task kinds or trees) that never appear in ``train`` or ``test``.

A family that cannot offer ``test_unseen`` raises :class:`SplitUnavailable` for such seeds.

The fingerprint of an instance is what the agent sees at reset plus the gold answer or target
state (:func:`fingerprint`); :func:`measure_overlap` counts test fingerprints found in train.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, Literal, TypeVar

T = TypeVar("T")

__all__ = [
    "MAX_DRAWS",
    "SPLITS",
    "TEST_FRACTION",
    "Split",
    "SplitUnavailable",
    "draw_in_split",
    "fingerprint",
    "hash_unit",
    "in_test_bucket",
    "split_of",
]

Split = Literal["train", "test", "test_unseen"]

#: Seed ranges of the splits. Disjoint by construction; content disjointness is each family's
#: job (see the module docstring).
SPLITS: dict[str, range] = {
    "train": range(0, 1_000_000),
    "test": range(1_000_000, 1_100_000),
    "test_unseen": range(1_100_000, 1_200_000),
}


#: Share of the instance space (by fingerprint hash) that :func:`draw_in_split` gives ``test``.
TEST_FRACTION = 0.2
#: Candidates :func:`draw_in_split` tries before giving up (with ``TEST_FRACTION`` 0.2, the
#: chance that 200 candidates all miss the test bucket is ``0.8**200 < 1e-19``).
MAX_DRAWS = 200


class SplitUnavailable(ValueError):
    """The family has no such split (e.g. no held-out units for ``test_unseen``)."""


def split_of(seed: int) -> Split:
    """The split whose seed range holds ``seed``; ``ValueError`` outside every range."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    for name, r in SPLITS.items():
        if seed in r:
            return name  # type: ignore[return-value]
    raise ValueError(
        f"seed {seed} lies in no split; ranges: "
        + ", ".join(f"{k} [{r.start}, {r.stop})" for k, r in SPLITS.items())
    )


def hash_unit(key: str, salt: str = "") -> float:
    """A stable pseudo-random number in ``[0, 1)`` for ``key`` (sha256; no process seed)."""
    digest = hashlib.sha256(f"{salt}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def in_test_bucket(key: str, fraction: float, salt: str = "") -> bool:
    """Whether the instance (or unit) ``key`` belongs to the held-out side (share ``fraction``)."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    return hash_unit(key, salt) < fraction


def fingerprint(first_observation: str, gold: Any) -> str:
    """Identity of an instance: the observation at reset plus the gold answer / target state.

    ``gold`` is serialised as canonical JSON (sorted keys; sets as sorted lists), so two
    instances with the same question and the same answer share a fingerprint.
    """

    def canon(x: Any) -> Any:
        if isinstance(x, (set, frozenset)):
            return sorted(canon(v) for v in x)
        if isinstance(x, dict):
            return {str(k): canon(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [canon(v) for v in x]
        return x

    payload = json.dumps([first_observation, canon(gold)], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def draw_in_split(
    seed: int,
    build: Callable[[int], T],
    key: Callable[[T], str],
    *,
    salt: str,
    fraction: float = TEST_FRACTION,
    max_draws: int = MAX_DRAWS,
) -> tuple[T, int]:
    """The instance of ``seed`` in its split, and the attempt that produced it.

    ``build(attempt)`` generates a candidate from the seed's own random stream for that
    attempt (attempt 0 is the family's historical stream; for a ``test_unseen`` seed the
    family's ``build`` draws only from its held-out units); ``key(candidate)`` is its
    fingerprint. A ``train`` seed takes the first candidate whose key lies outside the test
    bucket (:func:`in_test_bucket` with ``fraction`` and ``salt``), a ``test`` or
    ``test_unseen`` seed the first one inside it. The bucket is a function of the
    fingerprint alone, so no fingerprint can be drawn by ``train`` and by a test split:
    overlap 0 by construction, whatever the pool sizes, even where two held-out units
    render the same content as a training unit (two floor plans with the same furniture).

    A template whose instance space is small (a fixed question with few possible answers)
    keeps, in the test splits, only the answers that hash into the bucket; drawing the whole
    candidate again (template included) keeps every seed drawable.
    """
    want_test = split_of(seed) != "train"
    for attempt in range(max_draws):
        candidate = build(attempt)
        if in_test_bucket(key(candidate), fraction, salt) == want_test:
            return candidate, attempt
    raise RuntimeError(  # pragma: no cover - probability < 1e-19 for the defaults
        f"{salt}: no {split_of(seed)} instance in {max_draws} candidates for seed {seed}"
    )
