"""Content splits of household, shop and os: overlap 0, held-out units, pools.

Each test fingerprints thousands of instances (first observation plus gold, the measure of
issue 20) and counts the test instances that occur in train: zero by construction
(:func:`entropace.envs.splits.draw_in_split`), measured here. os instances are drawn with
:func:`entropace.envs.os.splits.draw_task` (the instance generator ``OsEnv.reset`` calls,
without building the sandbox archive).
"""

from __future__ import annotations

import pytest

from entropace.envs import make
from entropace.envs.base import DIFFICULTIES
from entropace.envs.registry import has_split, seeds, spec
from entropace.envs.splits import (
    SPLITS,
    TEST_FRACTION,
    draw_in_split,
    fingerprint,
    in_test_bucket,
)


def _prints(env, split: str, n: int) -> list[dict]:
    return [env.reset(int(s))[1] for s in seeds(split, n)]


# ------------------------------------------------------------------------------ the helper


def test_draw_in_split_puts_each_fingerprint_on_one_side() -> None:
    # a pool of 10 keys: train seeds only ever get the keys outside the bucket, test and
    # test_unseen seeds only those inside it
    keys = [f"k{i}" for i in range(10)]
    inside = {k for k in keys if in_test_bucket(k, TEST_FRACTION, "t")}
    assert 0 < len(inside) < len(keys)  # the salt "t" splits this pool (else the test is void)
    for split in ("train", "test", "test_unseen"):
        for seed in seeds(split, 200):  # type: ignore[arg-type]
            key, attempt = draw_in_split(
                seed, lambda a, s=seed: keys[(s * 7 + a * 3) % 10], lambda k: k, salt="t"
            )
            assert (key in inside) == (split != "train"), (split, seed, key, attempt)
            # attempt 0 is kept whenever it already lies on the seed's side
            if (keys[(seed * 7) % 10] in inside) == (split != "train"):
                assert attempt == 0


def test_families_declare_their_splits() -> None:
    for name in ("household", "shop", "os"):
        assert spec(name).splits == tuple(SPLITS)
        assert has_split(name, "test_unseen")
    with pytest.raises(ValueError, match="split must be one of"):
        has_split("shop", "validation")


# ------------------------------------------------------------------------------ household


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_household_test_never_equals_train(difficulty: str) -> None:
    from entropace.envs.household.splits import UNSEEN_SCENES

    env = make("household", difficulty=difficulty)
    train = _prints(env, "train", 2000)
    train_prints = {i["fingerprint"] for i in train}
    assert len(train_prints) >= 1700  # distinct instances in 2000 seeds (measured: 1784+)
    assert not {i["scene"] for i in train} & UNSEEN_SCENES  # held-out plans never in train
    test = _prints(env, "test", 500)
    unseen = _prints(env, "test_unseen", 500)
    assert sum(i["fingerprint"] in train_prints for i in test) == 0
    assert sum(i["fingerprint"] in train_prints for i in unseen) == 0
    assert not {i["scene"] for i in test} & UNSEEN_SCENES
    assert {i["scene"] for i in unseen} <= UNSEEN_SCENES
    # the fingerprint is the documented one: first observation plus gold
    obs, info = make("household", difficulty=difficulty).reset(int(seeds("test", 1)[0]))
    assert info["fingerprint"] == fingerprint(obs, info["gold"])
    assert info["split"] == "test"


def test_household_unseen_plans_cover_every_task_type() -> None:
    from entropace.envs.household.generate import LEVELS, candidates
    from entropace.envs.household.splits import UNSEEN_SCENES

    for difficulty, level in LEVELS.items():
        for task_type in level.task_types:
            assert set(candidates(difficulty, task_type)) & UNSEEN_SCENES, (difficulty, task_type)


def test_household_agentbench_mix_draws_six_task_types() -> None:
    from entropace.envs.household import TASK_TYPES

    env = make("household", profile="agentbench")
    infos = [env.reset(int(s))[1] for s in seeds("test", 300)]
    assert {i["task_type"] for i in infos} == set(TASK_TYPES)
    assert {i["difficulty"] for i in infos} == set(DIFFICULTIES)
    # a seed's difficulty is a function of the seed
    again = make("household", profile="agentbench")
    assert [again.reset(int(s))[1]["difficulty"] for s in seeds("test", 50)] == [
        i["difficulty"] for i in infos[:50]
    ]


# ------------------------------------------------------------------------------ shop


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_shop_test_never_equals_train(difficulty: str) -> None:
    from entropace.envs.shop.splits import UNSEEN_CATEGORIES

    env = make("shop", difficulty=difficulty)
    train = _prints(env, "train", 3000)
    train_prints = {i["fingerprint"] for i in train}
    assert len(train_prints) >= 2990
    assert not {i["category"] for i in train} & UNSEEN_CATEGORIES
    test = _prints(env, "test", 1000)
    unseen = _prints(env, "test_unseen", 1000)
    assert sum(i["fingerprint"] in train_prints for i in test) == 0
    assert sum(i["fingerprint"] in train_prints for i in unseen) == 0
    assert not {i["category"] for i in test} & UNSEEN_CATEGORIES
    assert {i["category"] for i in unseen} == set(UNSEEN_CATEGORIES)


# ------------------------------------------------------------------------------ os


@pytest.mark.parametrize(
    "difficulty",
    [
        "easy",
        "medium",
        # slow: a hard tree takes ~5-10 ms to generate, and a test seed draws ~5 candidates
        # (the test bucket holds 20% of the fingerprints): ~30 s on a loaded 2-core machine
        pytest.param("hard", marks=pytest.mark.slow),
    ],
)
def test_os_test_never_equals_train(difficulty: str) -> None:
    from entropace.envs.os.splits import TRAIN_KINDS, UNSEEN_KINDS, draw_task, task_fingerprint

    def draws(split: str, n: int) -> list[tuple[str, str]]:
        out = []
        for s in seeds(split, n):  # type: ignore[arg-type]
            kind, _tree, task = draw_task(int(s), difficulty, TRAIN_KINDS[difficulty])
            out.append((kind, task_fingerprint(task)))
        return out

    train = draws("train", 800)
    train_prints = {p for _, p in train}
    assert not {k for k, _ in train} & set(UNSEEN_KINDS[difficulty])
    assert {k for k, _ in train} == set(TRAIN_KINDS[difficulty])
    test, unseen = draws("test", 150), draws("test_unseen", 150)
    assert sum(p in train_prints for _, p in test) == 0
    assert sum(p in train_prints for _, p in unseen) == 0
    assert {k for k, _ in unseen} == set(UNSEEN_KINDS[difficulty])
    assert not {k for k, _ in test} & set(UNSEEN_KINDS[difficulty])


def test_os_refuses_held_out_kinds_for_training() -> None:
    from entropace.envs.os import OsEnv

    with pytest.raises(ValueError, match="held out for the test_unseen split"):
        OsEnv(kinds="count_lines,word_count")
