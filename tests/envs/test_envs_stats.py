"""``entropace envs stats`` (pools, distinct instances, measured overlap) and the eval table."""

from __future__ import annotations

from typing import Any

from entropace.cli import main
from entropace.cli.envs_stats import split_stats
from entropace.envs.toy import register_letter_envs


def test_stats_of_shop_count_what_they_print(capsys: Any) -> None:
    assert (
        main(["envs", "stats", "shop", "--difficulty", "medium", "--n", "300", "--n-test", "60"])
        == 0
    )
    out = capsys.readouterr().out
    r = split_stats("shop", "medium", 300, 60)
    assert r["splits"]["train"] == {"seeds": 300, "distinct": 300}
    assert r["splits"]["test"]["in_train"] == 0 and r["splits"]["test_unseen"]["in_train"] == 0
    assert r["pools"]["categories (test_unseen)"] == 4
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line[:5] in ("train", "test ", "test_")
    }
    assert rows["train"][1:4] == ["300", "300", "-"]
    assert rows["test"][1:4] == ["60", str(r["splits"]["test"]["distinct"]), "0"]
    assert "pool  products: 7200" in out


def test_stats_measure_overlap_of_a_family_without_content_splits(capsys: Any) -> None:
    # the letter toy family draws from a tiny pool by seed: its "test" repeats train, and the
    # stats say so (the overlap is measured, not assumed); it has no test_unseen (n/a)
    register_letter_envs("stats_letter")
    r = split_stats("stats_letter", None, 200, 50)
    assert r["splits"]["test"]["in_train"] > 0
    assert r["splits"]["test_unseen"] is None
    assert main(["envs", "stats", "stats_letter", "--n", "50", "--n-test", "10"]) == 0
    assert "test_unseen      n/a" in capsys.readouterr().out


def test_eval_table_shows_na_for_a_missing_split() -> None:
    from entropace.train.evaluation import _summarise, format_table

    records = [
        {"task": "shop", "split": "test", "success": True, "reward": 1.0, "abnormal": False,
         "scores": {}},
        {"task": "shop", "split": "test", "success": False, "reward": 0.5, "abnormal": True,
         "scores": {}},
    ]  # fmt: skip
    test = _summarise(["shop", "letter"], records)
    assert test["tasks"]["shop"] == {"success": 0.5, "reward": 0.75, "abnormal": 0.5, "episodes": 2}
    assert test["tasks"]["letter"] is None and test["mean_success"] == 0.5
    unseen = _summarise(["shop", "letter"], [])
    assert unseen == {"tasks": {"shop": None, "letter": None}, "mean_success": None}
    table = format_table({"by_split": {"test": test, "test_unseen": unseen}})
    lines = table.splitlines()
    assert lines[1].split()[:3] == ["shop", "test", "0.500"]
    assert lines[2].split() == ["letter", "test", "n/a"]
    assert lines[-1].split() == ["mean", "test_unseen", "n/a"]
