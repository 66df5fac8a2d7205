"""Issue 21 item 7: one process per run directory (``entropace.train.rundir``).

Two real ``python -m entropace.cli train`` processes started together on one directory: one
trains, the other fails at once naming the first (pid, command, since when); the survivor is
then killed with SIGKILL, and its stale lock file does not block ``--resume``; the log holds
each step once. The in-process tests cover the lock itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import entropace
from entropace.cli import main
from entropace.train.checkpoint import PREFIX, latest_checkpoint
from entropace.train.config import load_config
from entropace.train.metrics_log import read_metrics
from entropace.train.rundir import (
    LOCK_FILE,
    RunDirError,
    RunDirLocked,
    lock_run_dir,
    read_holder,
)
from entropace.train.trainer import train

#: The tiny lab task, one prompt x 2 samples a step: a step takes well under a second.
LAB = ["tasks=lab-easy", "P=1", "G=2", "log.checkpoint_every=1", "log.keep_last=1",
       "log.progress=false", "log.tensorboard=false", "log.report=false"]  # fmt: skip


def test_a_second_lock_names_the_holder_and_release_frees_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    lock = lock_run_dir(run)
    holder = read_holder(run)
    assert holder["pid"] == os.getpid() and holder["command"] and holder["started"]
    # flock locks open files: a second open in this very process is refused too
    with pytest.raises(RunDirLocked, match=rf"in use by pid {os.getpid()} on .*, running `.*` "
                       rf"since {holder['started'][:10]}") as info:  # fmt: skip
        lock_run_dir(run)
    assert info.value.holder == holder
    with pytest.raises(RunDirLocked):  # train refuses before touching anything
        train(load_config("lab", LAB), run)
    assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE]
    lock.release()
    assert read_holder(run) == {}  # cleared on release; the file stays
    with lock_run_dir(run) as again:
        assert again.held and read_holder(run)["pid"] == os.getpid()
    assert not again.held


def test_a_lock_on_a_file_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RunDirError, match="not writable"):
        lock_run_dir(blocker / "run")


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    src = str(Path(entropace.__file__).resolve().parents[1])  # this checkout's package
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    return env


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow  # two Python + torch start-ups and a resume: ~12 s CPU, 48 s wall at load 9
def test_two_processes_on_one_run_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "entropace.cli", "train", "--preset", "lab", *LAB,
            "steps=100000", "--run-dir", str(run), "--no-report"]  # fmt: skip
    procs = [
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), text=True
        )  # fmt: skip
        for _ in range(2)
    ]
    try:
        _wait(lambda: any(p.poll() is not None for p in procs), 180, "one train to give up")
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        err = loser.communicate()[1]
        assert loser.returncode == 2, err
        assert f"is in use by pid {winner.pid} on " in err, err
        assert "entropace.cli train --preset lab" in err and " since 20" in err
        assert winner.poll() is None  # the first run goes on
        ckpts = run / "checkpoints"

        def two_checkpoints() -> bool:
            last = latest_checkpoint(ckpts) if ckpts.is_dir() else None
            return last is not None and int(last.name[len(PREFIX) :]) >= 2

        _wait(two_checkpoints, 180, "two checkpointed steps")
        winner.send_signal(signal.SIGKILL)  # no handler runs: the lock file stays behind
        winner.wait(30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert read_holder(run)["pid"] == winner.pid  # stale text of a dead holder
    done = int(latest_checkpoint(ckpts).name[len(PREFIX) :])
    # the kernel released the flock with the process: the resume takes it normally
    assert main(["train", "--resume", str(run), f"steps={done + 1}", "--no-report"]) == 0
    assert [r["step"] for r in read_metrics(run)] == list(range(1, done + 2))
    assert read_holder(run) == {}  # released at the end of the resumed run
