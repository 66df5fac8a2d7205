"""``entropace envs play`` with the AgentBench options of kg, household and shop (``--opt``)."""

from __future__ import annotations

import io

from entropace.cli import main
from entropace.envs import make, spec
from entropace.envs.checks import run_episode


def _oracle_lines(name: str, seed: int, **options: object) -> list[str]:
    env = make(name, **options)
    env.reset(seed)
    return run_episode(env, spec(name).oracle(env), seed).actions


def _play(argv: list[str], stdin: str, capsys, monkeypatch) -> str:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert main(["envs", "play", *argv]) == 0
    return capsys.readouterr().out


def test_play_kg_hidden_members_and_final_answer(capsys, monkeypatch) -> None:
    options = {"hide_members": True, "final_answer": True}
    actions = _oracle_lines("kg", 5, difficulty="medium", **options)
    assert actions[-1].endswith("Final Answer: #1")
    stdin = "".join(a + "\n\n" for a in actions)  # multi-line actions end with an empty line
    argv = ["kg", "--seed", "5", "--difficulty", "medium", "--multiline"]
    out = _play(
        [*argv, "--opt", "hide_members=true", "--opt", "final_answer=true"],
        stdin,
        capsys,
        monkeypatch,
    )
    assert "variable #0, which are instances of country" in out and "Final Answer: #id" in out
    assert "Correct. The episode is over." in out
    assert out.rstrip().endswith(f"reward=1 success=True turns={len(actions)}")


def test_play_household_with_all_options(capsys, monkeypatch) -> None:
    stdin = "go to the fridge\nlook\nlook\nlook\n"
    argv = ["household", "--seed", "1", "--difficulty", "medium", "--oneline"]
    opts = ["--opt", "action_list=true", "--opt", "nearest_action=true", "--opt", "repeat_limit=3"]
    out = _play([*argv, *opts], stdin, capsys, monkeypatch)
    assert out.count(" AVAILABLE ACTIONS: look\ninventory\n") == 5  # reset + 4 steps
    assert "repeated the same action 3 times" in out and "episode terminated" in out
    assert out.rstrip().endswith("reward=0 success=False turns=4")


def test_play_shop_webshop_reward(capsys, monkeypatch) -> None:
    actions = _oracle_lines("shop", 2, reward="webshop")
    stdin = "".join(a + "\n" for a in actions)
    out = _play(
        ["shop", "--seed", "2", "--oneline", "--opt", "reward=webshop"], stdin, capsys, monkeypatch
    )
    assert "Reward: 1.000" in out and out.rstrip().endswith(
        "success=True turns=" + str(len(actions))
    )
