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
from typing import Any, Literal

__all__ = [
    "SPLITS",
    "Split",
    "SplitUnavailable",
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
