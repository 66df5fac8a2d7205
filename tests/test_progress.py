"""The training progress bar (entropace.train.progress) and what ``entropace train`` prints: the
phase within a step, per-task numbers equal to the step's metrics.jsonl row, one legend, and
the end screen whose table is the report's."""

from __future__ import annotations

import io
import re
import time

import pytest

from entropace.cli import main
from entropace.envs.toy import register_letter_envs
from entropace.train.metrics_log import read_metrics
from entropace.train.progress import LEGEND, PHASES, Progress, task_postfix

register_letter_envs("letter", "letter2")


def test_task_postfix_formats_each_task_of_the_row() -> None:
    row = {"step": 3, "task/db/reward": -0.2, "task/db/entropy": 1.23456,
           "task/kg/reward": 0.0, "task/kg/entropy": float("nan"), "time/step": 61.37}  # fmt: skip
    expected = "step 3: db R -0.20 H 1.23 | kg R 0.00 H n/a | 61.4 s/step"
    assert task_postfix(row, ["db", "kg", "os"]) == expected


def test_bar_shows_the_phase_and_the_legend_once() -> None:
    out = io.StringIO()
    progress = Progress(total=3, start=0, tasks=["db"], file=out)
    progress.phase("rollout", 1)
    progress.phase("update", 1)
    progress.step_done({"step": 1, "task/db/reward": 0.5, "task/db/entropy": 2.0, "time/step": 1})
    progress.phase("checkpoint", 1)
    progress.close()
    text = out.getvalue()
    assert text.count(LEGEND) == 1 and text.startswith(LEGEND)
    for name in PHASES:
        assert name in LEGEND
    assert re.search(r"step 1/3 rollout 0:00", text) and re.search(r"step 1/3 update 0:00", text)
    assert re.search(r"step 1/3 checkpoint 0:00 .*step 1: db R 0\.50 H 2\.00 \| 1 s/step", text)
    assert "step 1/3 |" in text.rsplit("\r", 1)[-1]  # closed before the end: where it stopped
    with pytest.raises(ValueError, match="unknown phase 'generate'"):
        Progress(total=1, start=0, tasks=[], enabled=False).phase("generate", 1)
    quiet = io.StringIO()
    off = Progress(total=2, start=0, tasks=["db"], enabled=False, file=quiet)
    off.phase("rollout", 1)
    off.close()
    assert quiet.getvalue() == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_phase_clock_keeps_moving() -> None:
    out = Terminal()
    progress = Progress(total=2, start=0, tasks=["db"], file=out, tick=0.05)
    progress.phase("rollout", 1)
    time.sleep(0.5)
    progress.close()
    assert out.getvalue().count("step 1/2 rollout") >= 4  # redrawn while the phase runs


def test_train_prints_phases_per_task_numbers_and_the_end_screen(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    args = ["model=tiny", "tasks=letter,letter2", "steps=2", "algo=eppo+papo", "P=1", "G=3",
            "rollout.max_new_tokens_per_turn=6", "rollout.max_episode_tokens=96",
            "ppo.epochs=1", "ppo.num_minibatches=1", "log.checkpoint_every=1",
            "log.tensorboard=false", "log.progress=true", "eval.every=2", "eval.n=2"]  # fmt: skip
    assert main(["train", "--preset", "lab", *args, "--run-dir", str(run_dir)]) == 0
    captured = capsys.readouterr()
    err, out = captured.err, captured.out
    assert err.count(LEGEND) == 1
    for step, phase in [(0, "eval"), (1, "rollout"), (1, "update"), (1, "checkpoint"), (2, "rollout"),
                        (2, "update"), (2, "eval"), (2, "checkpoint")]:  # fmt: skip
        assert f"step {step}/2 {phase} " in err, (step, phase)
    for row in read_metrics(run_dir)[1:]:  # each step's own numbers (after step 0's eval row)
        numbers = task_postfix(row, ["letter", "letter2"]).rsplit(" | ", 1)[0]
        assert numbers.startswith(f"step {row['step']}: letter R ") and numbers in err
    # the end screen (stdout): the report's own table rows and what to do next
    md = (run_dir / "report" / "summary.md").read_text()
    for task in ("letter", "letter2"):
        md_row = next(ln for ln in md.splitlines() if ln.startswith(f"| {task} |"))
        cells = [c.strip() for c in md_row.strip("|").split("|")]
        screen_row = next(ln for ln in out.splitlines() if ln.startswith(f"{task} "))
        assert [c for c in re.split(r"\s{2,}", screen_row.strip())] == cells
    assert f"entropace train --resume {run_dir} steps=4" in out
    assert f"Report: {run_dir / 'report' / 'summary.html'}" in out
