"""Evidence IV's arms (experiments/evidence4/arms.py): each arm differs from its comparator in
exactly its declared lever, every family member compares an arm with its comparator, and the
shuffled control varies by seed (issue 35)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from entropace.train.config import load_config, to_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "evidence4"))
import arms as A  # noqa: E402


def flat(d: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def resolved(arm: A.Arm, seed: int = 7400) -> dict:
    """The arm's run config as the runner trains it (load_config of its overrides)."""
    return flat(to_dict(load_config(A.PRESET, arm.args(seed), check_envs=False)))


#: the recipe's name labels the run; the recipe test (test_config) checks that a recipe
#: differs from its base exactly in its lever
LABELS = {"algorithm.name", "seed"}


@pytest.mark.parametrize("arms", [A.PILOT_ARMS, A.PAPO_PILOT_ARMS, A.GRID_ARMS],
                         ids=["pilots", "papo-pilots", "grid"])  # fmt: skip
def test_each_arm_differs_from_its_comparator_in_exactly_its_lever(arms) -> None:
    by_name = {a.name: a for a in (*A.PILOT_ARMS, *arms)}
    for arm in arms:
        if arm.comparator is None:
            assert arm.lever == ()
            continue
        mine, theirs = resolved(arm), resolved(by_name[arm.comparator])
        diff = {k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k)} - LABELS
        # a lever names a field; a dict field (task_bounds) differs in its entries
        covered = {lever: {k for k in diff if k == lever or k.startswith(lever + ".")}
                   for lever in arm.lever}  # fmt: skip
        assert all(covered.values()), (arm.name, covered)
        assert diff == set().union(*covered.values()), (arm.name, diff)
        assert mine["steps"] == A.STEPS


def test_the_family_compares_arms_with_their_comparators() -> None:
    arms = {a.name: a for a in A.GRID_ARMS}
    assert len(arms) == len(A.GRID_ARMS)  # names are unique
    for c in (*A.FAMILY, *A.SECONDARY):
        assert c.a in arms and c.b in arms, c.name
        assert arms[c.a].comparator == c.b or arms[c.b].comparator == c.a, c.name
    assert {c.name for c in A.FAMILY}.isdisjoint({c.name for c in A.SECONDARY})


def test_seeds_are_fresh_and_blocked() -> None:
    assert len(A.SEEDS) == 24 and len(set(A.SEEDS)) == 24
    assert not set(A.SEEDS) & set(A.PILOT_SEEDS)
    assert not set(A.SEEDS) & set(range(7300, 7312)) & set(range(9101, 9105))
    assert [s for b in A.BLOCKS for s in b] == list(A.SEEDS)
    assert 0 < A.CALIBRATED_ALPHA < 1


def test_the_calibrated_dose_and_the_shuffled_control_vary_by_seed() -> None:
    """The grid's shuffled arm hands each seed its own permutations (ClipSettings.seed)."""
    from entropace.control import build_clip_rule
    from entropace.train.algorithms import clip_settings

    arm = next(a for a in A.GRID_ARMS if a.name == "eppo-dose-shuffled")
    rules = []
    for seed in (7400, 7401):
        cfg = load_config(A.PRESET, arm.args(seed), check_envs=False)
        assert cfg.algorithm.pacer.alpha == A.CALIBRATED_ALPHA and cfg.algorithm.pacer.shuffle
        rules.append(build_clip_rule("pacer", clip_settings(cfg.algorithm, seed=cfg.seed)))
    tasks = list(A.TASKS)
    draws = []
    for rule in rules:
        out = []
        for s in range(12):
            rule.pacer.update({t: 1.0 - 0.02 * s * (k + 1) for k, t in enumerate(tasks)})
            out.append(tuple(rule.pacer.eps().values()))
        draws.append(out)
    assert draws[0] != draws[1]
