"""What a newcomer sees: the progress bar's numbers, a refused rerun, ``envs play`` with tools."""

from __future__ import annotations

import io
import re
import sys
from typing import Any

import pytest

from entropace.cli import main
from entropace.envs.toy import register_letter_envs
from entropace.train.config import load_config
from entropace.train.metrics_log import read_metrics
from entropace.train.trainer import train

register_letter_envs("letter", "letter2")

BASE = [  # the command's default preset (quick) on the tiny model: no SmolLM2 adapter or warm start
    "model=tiny", "model.lora=false", "warm_start.source=none", "eval.every=0",
    "tasks=letter,letter2", "steps=2", "algo=grpo", "P=1", "G=3",
    "rollout.max_new_tokens_per_turn=6", "rollout.max_episode_tokens=96", "optim.lr=3e-3",
    "ppo.epochs=1", "ppo.num_minibatches=1", "ppo.micro_batch_size=3",
    "log.checkpoint_every=0", "log.trackers=[]", "log.report=false",
]  # fmt: skip


def test_progress_bar_shows_the_numbers_of_the_step_it_names(tmp_path, monkeypatch) -> None:
    """Every refresh that shows a step's numbers (``step k: letter R ...``) carries step k's
    row of metrics.jsonl, and the bar counts k finished steps then; the phase named beside it
    belongs to the step running (k + 1, or k's checkpoint)."""
    import tqdm.auto

    from entropace.train.progress import task_postfix

    screen = io.StringIO()

    class OnScreen(tqdm.auto.tqdm):  # every refresh written to ``screen``
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "file": screen}, mininterval=0, miniters=1)

    monkeypatch.setattr(tqdm.auto, "tqdm", OnScreen)
    run = tmp_path / "run"
    train(load_config(None, [*BASE, "log.progress=true"]), run)
    rows = read_metrics(run)
    shown = [s for s in screen.getvalue().split("\r") if re.search(r", step [12]: ", s)]
    assert shown, screen.getvalue()
    for line in shown:
        k = int(re.search(r", step ([12]): ", line).group(1))
        assert line.rstrip().endswith(task_postfix(rows[k - 1], ["letter", "letter2"])), line
        phase = re.match(r"step (\d)/2 (\w+) ", line)
        assert phase is None or int(phase.group(1)) in (k, k + 1), line


def test_a_refused_rerun_is_not_announced_as_a_run(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", *BASE, "steps=1", "--run-dir", str(run), "--no-report"]) == 0
    assert capsys.readouterr().err.startswith(f"run {run}: grpo")  # a run that starts says so
    assert main(["train", *BASE, "steps=1", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"entropace train: error: {run} already holds a run"), err
    assert not any(line.startswith("run ") for line in err.splitlines())
    # a resume without a checkpoint (checkpoint_every=0 writes one at the end: remove it)
    for path in sorted((run / "checkpoints").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("entropace train: error: --resume: no checkpoint under"), err


def play(monkeypatch: pytest.MonkeyPatch, capsys: Any, stdin: str) -> str:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    argv = ["envs", "play", "db", "--interface", "tools", "--oneline", "--opt", "database=chinook"]
    assert main(argv) == 0
    return capsys.readouterr().out


def test_play_with_tools_says_how_a_person_types_a_call(monkeypatch, capsys) -> None:
    out = play(
        monkeypatch, capsys,
        'hello\nexecute_sql {"query": SELECT 1}\nexec_sql {"query": "SELECT 1"}\n'
        "execute_sql [1]\n"
        'execute_sql {"query": "SELECT 1"}\n',
    )  # fmt: skip
    example = 'execute_sql {"query": "..."} or commit_final_answer {"answers": ["..."]}'
    assert f"a tool call as: {example}; Ctrl-D quits" in out  # the prompt's syntax ...
    # ... is what the hint after the environment's "no tool call" message repeats
    assert "(turn 1, reward 0, user message, tool error: no_call)" in out
    assert f"(in play, type a tool call as: {example})" in out
    # malformed calls are said locally, by what is wrong, and spend no turn
    assert (
        "(not sent: execute_sql: the arguments are not valid JSON (Expecting value: line 1 "
        'column 11 (char 10)); type e.g. execute_sql {"query": "..."})'
    ) in out
    assert "(not sent: there is no tool 'exec_sql'; tools: execute_sql, commit_final_answer)" in out
    assert "(not sent: execute_sql: the arguments must be one JSON object {...}, got list" in out
    assert "(turn 2, reward 0, tool message)" in out and "reward=0 success=False turns=2" in out
    assert "no_call" not in out.split("(turn 2")[1] and "bad_json" not in out
