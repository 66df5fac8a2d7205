"""Issue 29 items 4-8: run-directory files someone else made. Writes never go through a
planted symbolic link; reads refuse a FIFO, a device or a link instead of blocking on it;
every number read back is range-checked; ``train --resume``, ``eval``, ``report`` and
``compare --report`` end with one error line and exit 2 on each damaged input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.test_hardening_train import RUN  # registers the one-turn "hecho" family

from entropace._files import UnsafeFileError, read_bytes, write_atomic
from entropace.cli import main
from entropace.train.checkpoint import list_checkpoints
from entropace.train.config import load_config
from entropace.train.metrics_log import read_metrics
from entropace.train.rundir import LOCK_FILE
from entropace.train.trainer import train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("files") / "run"
    train(load_config(None, RUN), run)  # steps 1 and 2, a checkpoint after each
    return run


@pytest.fixture
def run(run_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run_dir, out, symlinks=True)
    return out


@pytest.fixture
def fifo() -> Iterator[Callable[[Path], None]]:
    """``fifo(path)`` makes a FIFO at ``path``; a reader that blocks on it (the bug) is
    released after 30 s by a process that opens its other end, so the test fails instead of
    hanging (neither an alarm nor a thread can: safetensors' open holds the GIL, and Rust
    and C code retry an open interrupted by a signal)."""
    releasers: list[subprocess.Popen[bytes]] = []

    def make(path: Path) -> None:
        os.mkfifo(path)
        releasers.append(subprocess.Popen(["sh", "-c", 'sleep 30; exec 3<>"$0"; sleep 1', path]))

    yield make
    for proc in releasers:
        proc.kill()
        proc.wait()


def _one_error(capsys: pytest.CaptureFixture[str], command: str) -> str:
    """The last stderr line, after checking it is the command's one error line (no
    traceback)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(f"entropace {command}: error: "), err
    return lines[-1]


def _resume(run: Path, *extra: str) -> int:
    return main(["train", "--resume", str(run), "steps=3", *extra, "--no-report"])


def _latest(run: Path) -> Path:
    return list_checkpoints(run / "checkpoints")[-1]


# ------------------------------------------------------------------ the helper itself


def test_the_helper_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("x")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")
    cases = {"link": "is a symbolic link", "fifo": "is a FIFO", ".": "is a directory"}
    for name, says in cases.items():
        with pytest.raises(UnsafeFileError, match=says):
            read_bytes(tmp_path / name)
    with pytest.raises(UnsafeFileError, match="is a character device"):
        read_bytes("/dev/zero")
    (tmp_path / "two").write_bytes(b"ab")
    with pytest.raises(UnsafeFileError, match="2 bytes or more; at most 1 expected"):
        read_bytes(tmp_path / "two", limit=1)
    assert read_bytes(tmp_path / "link", follow_symlinks=True) == b"x"
    write_atomic(tmp_path / "link", "new")  # the link is replaced, its target untouched
    assert not (tmp_path / "link").is_symlink() and target.read_text() == "x"


# --------------------------------------------------------------- item 4: the lock file


@pytest.mark.parametrize("plant", ["symlink", "hardlink", "fifo"])
def test_a_planted_lock_file_is_refused_and_nothing_outside_changes(
    run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fifo: Callable[[Path], None],
    plant: str,
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious user data\n")
    lock = run / LOCK_FILE
    lock.unlink(missing_ok=True)
    {"symlink": lambda: lock.symlink_to(victim), "hardlink": lambda: os.link(victim, lock),
     "fifo": lambda: fifo(lock)}[plant]()  # fmt: skip
    rows = read_metrics(run)
    assert _resume(run) == 2
    says = {"symlink": "is a symbolic link", "hardlink": "other hard links", "fifo": "is a FIFO"}
    assert says[plant] in _one_error(capsys, "train")
    assert victim.read_text() == "precious user data\n"  # was truncated to 0 bytes, exit 0
    assert read_metrics(run) == rows


# -------------------------------------------------- item 5: numbers of state.json checked


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("step", -5, r"'step' must be an integer in \[0, 1000000\], got -5"),  # trained 9 steps
        ("step", 10**30, r"'step' must be an integer in \[0, 1000000\], got 1000000000000"),
        ("step", 1, "'step' is 1, but the directory is step_00000002"),
        ("step", "2", "'step' must be an integer"),
        ("scheduler_steps", -1, r"'scheduler_steps' must be an integer in \[0, 2147483647\]"),
        ("skipped_steps", 2.5, "'skipped_steps' must be an integer"),
        ("sampler", {"position": {"hecho": -3}}, r"position of 'hecho' must be an integer in"),
    ],
)
def test_numbers_of_state_json_are_range_checked(
    run: Path, capsys: pytest.CaptureFixture[str], key: str, value: object, says: str
) -> None:
    path = _latest(run) / "state.json"
    state = json.loads(path.read_text())
    state[key] = value
    path.write_text(json.dumps(state))
    rows = read_metrics(run)
    assert _resume(run, "steps=4") == 2
    line = _one_error(capsys, "train")
    assert "state.json" in line and re.search(says, line), line
    assert read_metrics(run) == rows  # nothing trained, nothing logged


@pytest.mark.parametrize("last", [-1, "x", 10**30])
def test_steps_of_trackers_json_are_range_checked(
    run: Path, capsys: pytest.CaptureFixture[str], last: object
) -> None:
    (run / "trackers.json").write_text(json.dumps({"tensorboard": {"last_step": last}}))
    assert _resume(run) == 2
    line = _one_error(capsys, "train")
    assert "trackers.json: tensorboard.last_step must be an integer in [0, 2147483647]" in line


# ------------------------------------- items 6 and 7: damaged checkpoints, FIFOs: one line


def _damage(run: Path, name: str, how: str, fifo: Callable[[Path], None]) -> None:
    path = run / "config.yaml" if name == "config.yaml" else _latest(run) / name
    path.unlink()
    if how == "fifo":
        fifo(path)
    elif how == "nan":
        path.write_text('{"step": NaN}')
    else:
        path.symlink_to(how)


DAMAGE = [
    ("state.json", "nan", "'step' must be an integer"),
    ("model.safetensors", "/etc/passwd", "is a symbolic link"),
    ("model.safetensors", "/dev/zero", "is a symbolic link"),
    ("model.safetensors", "fifo", "is a FIFO"),
    ("state.json", "fifo", "is a FIFO"),
    ("config.yaml", "fifo", "is a FIFO"),
    ("config.yaml", "/etc/hostname", "is a symbolic link"),
]


@pytest.mark.parametrize(("name", "how", "says"), DAMAGE)
def test_eval_names_a_damaged_checkpoint_in_one_line(
    run: Path,
    capsys: pytest.CaptureFixture[str],
    fifo: Callable[[Path], None],
    name: str,
    how: str,
    says: str,
) -> None:
    _damage(run, name, how, fifo)
    assert main(["eval", str(run), "--n", "1"]) == 2  # raw traceback, exit 1, or a hang
    line = _one_error(capsys, "eval")
    assert name in line and says in line, line
    assert not (run / "eval.json").exists()


@pytest.mark.parametrize(("name", "how", "says"), [d for d in DAMAGE if d[1] == "fifo"])
def test_resume_never_blocks_on_a_fifo(
    run: Path,
    capsys: pytest.CaptureFixture[str],
    fifo: Callable[[Path], None],
    name: str,
    how: str,
    says: str,
) -> None:
    _damage(run, name, how, fifo)
    assert _resume(run) == 2  # blocked in open() forever
    line = _one_error(capsys, "train")
    assert name in line and says in line, line


# -------------------------------------------------------- writes never follow a link


def test_writes_replace_planted_links_and_never_write_through_them(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victims = {}
    for name in ("eval.json", "report/summary.md", "report/summary.json"):
        victims[name] = tmp_path / f"victim-{name.replace('/', '-')}"
        victims[name].write_text("precious\n")
        (run / name).parent.mkdir(exist_ok=True)
        (run / name).symlink_to(victims[name])
    assert main(["eval", str(run), "--n", "1", "--split", "train"]) == 0
    assert main(["report", str(run)]) == 0
    for name, victim in victims.items():
        assert victim.read_text() == "precious\n", name
        assert (run / name).is_file() and not (run / name).is_symlink(), name
    capsys.readouterr()
    shutil.rmtree(run / "report")
    (run / "report").symlink_to(tmp_path)  # a whole directory elsewhere
    assert main(["report", str(run)]) == 2
    assert "report: is a symbolic link" in _one_error(capsys, "report")
    assert not (tmp_path / "summary.md").exists()


def test_a_linked_metrics_file_stops_the_resume(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim.jsonl"
    shutil.move(run / "metrics.jsonl", victim)
    before = victim.read_text()
    (run / "metrics.jsonl").symlink_to(victim)
    assert _resume(run) == 2
    assert "metrics.jsonl: is a symbolic link" in _one_error(capsys, "train")
    assert victim.read_text() == before


def test_a_resume_drops_a_last_line_cut_by_a_kill(run: Path) -> None:
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "loss": 0.1')  # killed while writing step 3, before its checkpoint
    assert _resume(run) == 0  # was a raw JSONDecodeError traceback
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]


# ------------------------------------------- item 8: malformed metrics.jsonl in reports


def _metrics(path: Path, extra: str = "", *, first: str = "") -> Path:
    path.mkdir(parents=True)
    rows = [json.dumps({"step": s, "reward/mean": 0.1 * s, "entropy": 1.0 / s}) for s in (1, 2, 3)]
    (path / "metrics.jsonl").write_text(first + "\n".join(rows) + "\n" + extra)
    return path


@pytest.mark.parametrize(
    ("first", "says"),
    [
        ('{"step": 1000000000000000000000000000000, "reward/mean": 1}\n',
         r"metrics.jsonl:1: 'step' must be an int in [0, 2**53], got 1000000000000"),
        ('{"step": -1}\n', "metrics.jsonl:1: 'step' must be an int in [0, 2**53], got -1"),
        ("[" * 100_000 + "]" * 100_000 + "\n", "metrics.jsonl:1: not valid JSON (nested too deeply)"),
        ('{"step": 1, "x": ' + "9" * 5000 + "}\n", "metrics.jsonl:1: not valid JSON (Exceeds"),
        ('{"step": 1, "name": "\xff"}\n', "metrics.jsonl: not UTF-8 text (byte 21: invalid"),
    ],
)  # fmt: skip
def test_report_and_compare_name_a_malformed_metrics_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], first: str, says: str
) -> None:
    run = _metrics(tmp_path / "grid" / "grpo" / "seed0", first=first)
    if "\xff" in first:  # a byte that is not UTF-8
        data = (run / "metrics.jsonl").read_bytes().replace("\xff".encode(), b"\xff")
        (run / "metrics.jsonl").write_bytes(data)
    _metrics(tmp_path / "grid" / "grpo" / "seed1")
    assert main(["report", str(run)]) == 2  # OverflowError / RecursionError tracebacks
    assert says in _one_error(capsys, "report")
    assert main(["compare", "--report", str(tmp_path / "grid")]) == 2
    assert says in _one_error(capsys, "compare")


def test_a_value_outside_float64_is_read_as_nan_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _metrics(tmp_path / "run", '{"step": 4, "reward/mean": ' + "9" * 400 + "}\n")
    assert main(["report", str(run)]) == 0  # an OverflowError traceback before
    summary = json.loads((run / "report" / "summary.json").read_text())
    assert "values outside float64 or not finite, read as NaN: reward/mean" in " ".join(
        summary["notes"]
    )


def test_a_fifo_metrics_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fifo: Callable[[Path], None]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    fifo(run / "metrics.jsonl")
    assert main(["report", str(run)]) == 2
    assert "metrics.jsonl: is a FIFO" in _one_error(capsys, "report")
