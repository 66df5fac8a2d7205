"""Fuzz every family's ``step()`` with random and adversarial actions (hypothesis).

For each family: short episodes (reset, then 1-3 generated actions) where every action is
random text, a family keyword glued to junk, one piece repeated up to 300,000 times (so some
replies exceed :data:`~entropace.envs.base.MAX_ACTION_CHARS`), a valid action followed by
junk, or one of :data:`~entropace.envs.checks.HOSTILE_ACTIONS`. Asserted for every step:

* it never raises and returns the protocol's 5-tuple (str observation, finite reward, bools,
  an info dict with ``success`` / ``parse_error``);
* it finishes within a wall-clock bound (``STEP_BOUND_S``; for ``os`` the command's own time
  limit plus ``OS_SLACK_S``);
* the host is unchanged: the ``db`` database files hash the same; for ``os``, a sentinel
  directory on the host (named in the commands, which try to delete and overwrite it) hashes
  the same and no process a command started outlives its step.

Examples are derandomized (same inputs on every run) and bounded so the file runs in well
under a minute on a loaded 2-core machine.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from entropace.envs import make
from entropace.envs.base import MAX_ACTION_CHARS
from entropace.envs.checks import HOSTILE_ACTIONS

HAS_BWRAP = shutil.which("bwrap") is not None

#: Bound of one non-``os`` step (the slowest measured is a few ms; generous for a loaded box).
STEP_BOUND_S = 1.0
#: Extra time an ``os`` step may take beyond its command's time limit (sandbox start, copies).
OS_SLACK_S = 4.0
OS_TIMEOUT_S = 1.0

_PIECES: tuple[str, ...] = (
    "'", '"', "`", "```", ";", ".", " ", "\n", "\r\n", "\t", "(", ")", "[", "]", "#0", "#999999",
    ",", "\x00", "\\", "\U0001f600", "\u202e", "\ufeff", "%s", "{", "}", "1e309", "-0", "nan",
    "<", ">", "*", "_", "> ", "a", "9", "'.", " ;",
)  # fmt: skip

_KEYWORDS: dict[str, tuple[str, ...]] = {
    "db": ("SQL:", "Answer:", "**Answer:**", "SQL: SELECT ", "```sql\n", " FROM ", "WITH "),
    "kg": (
        "Action: ",
        "get_relations(",
        "get_neighbors(",
        "intersection(",
        "argmax(",
        "filter(#0, population, >, ",
        "count(#",
        "answer(",
        "France",
        "location.country.neighbours",
    ),
    "reasoning": ("<answer>", "</answer>", "Answer:", "<ANSWER>", "42", "-1/0"),
    "household": (
        "go to ",
        "take ",
        " from ",
        "open ",
        "move ",
        " to ",
        "think:",
        "Action:",
        "cabinet 1",
        "look",
        "help",
        "inventory",
    ),  # fmt: skip
    "shop": ("search[", "click[", "]", "Buy Now", "Back to Search", "Next >", "< Prev", "B0"),
    "os": ("bash: ", "answer: ", "done", "```bash\n", "```", "ANSWER:", "Done."),
}

_VALID: dict[str, tuple[str, ...]] = {
    "db": ("SQL: SELECT 1", "Answer: 42"),
    "kg": ("Action: get_relations(France)", "Action: answer(#0)"),
    "reasoning": ("<answer>42</answer>",),
    "household": ("look", "go to cabinet 1", "inventory"),
    "shop": ("search[shoes]", "click[Back to Search]", "click[Buy Now]"),
    "os": ("bash: ls", "answer: 42", "done"),
}


def _actions(family: str) -> st.SearchStrategy[str]:
    pieces = st.sampled_from(_PIECES + _KEYWORDS[family])
    return st.one_of(
        st.text(max_size=200),
        st.lists(pieces | st.text(max_size=8), max_size=30).map("".join),
        st.tuples(pieces, st.integers(1, 300_000)).map(lambda t: t[0] * t[1]),
        st.tuples(st.sampled_from(_VALID[family]), pieces, st.integers(0, 300_000)).map(
            lambda t: t[0] + t[1] * t[2]
        ),
        st.sampled_from(HOSTILE_ACTIONS),
    )


#: Two-character junk whose repetition made parsers quadratic before (``" ;"`` in strip_sql,
#: ``"'."`` in normalize_answer) or could for a backtracking regex.
_PAIRS: tuple[str, ...] = (" ;", "'.", "()", "[]", "\n ", "` ", "#0", ": ")


def _worst_cases(family: str) -> list[str]:
    """Each valid action followed by each pair repeated to just under the cap, just over it,
    and to 1 MiB (the size of the issue's inputs)."""
    out = []
    for valid in _VALID[family]:
        for pair in _PAIRS:
            for total in (MAX_ACTION_CHARS, MAX_ACTION_CHARS + 2, 1 << 20):
                out.append(valid + pair * ((total - len(valid)) // 2))
    return out


def _check_step(result: Any) -> None:
    obs, reward, terminated, truncated, info = result
    assert isinstance(obs, str) and isinstance(info, dict)
    assert isinstance(reward, float) and math.isfinite(reward)
    assert isinstance(terminated, bool) and isinstance(truncated, bool)
    assert isinstance(info["success"], bool) and isinstance(info["parse_error"], bool)


_ENVS: dict[str, Any] = {}


def _env(family: str) -> Any:
    if family not in _ENVS:
        options = {"command_timeout": OS_TIMEOUT_S} if family == "os" else {}
        _ENVS[family] = make(family, difficulty="medium", **options)
    return _ENVS[family]


def _play(family: str, seed: int, actions: list[str], bound_s: float) -> None:
    env = _env(family)
    env.reset(seed)
    for action in actions:
        start = time.perf_counter()
        result = env.step(action)
        seconds = time.perf_counter() - start
        _check_step(result)
        assert seconds < bound_s, (family, action[:80], len(action), seconds)
        if len(action) > MAX_ACTION_CHARS:
            assert result[4]["parse_error"] is True
        if result[2] or result[3]:
            return


_FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for root in paths:
        for path in sorted([root, *root.rglob("*")] if root.is_dir() else [root]):
            h.update(str(path).encode() + oct(path.lstat().st_mode).encode())
            if path.is_file() and not path.is_symlink():
                h.update(path.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("family", ["db", "kg", "reasoning", "household", "shop"])
def test_fuzz_step_never_raises_and_is_bounded(family: str) -> None:
    db_files: list[Path] = []
    if family == "db":
        from entropace.envs.db.build import SOURCES, database_path

        db_files = [Path(database_path(name)) for name in sorted(SOURCES)]
    before = _digest(db_files)
    # A db query may legitimately run until its own time limit (an endless recursive CTE).
    bound = STEP_BOUND_S + (_env("db").timeout_s if family == "db" else 0.0)
    for action in _worst_cases(family):
        _play(family, 1, [action], bound)

    @_FUZZ
    @given(seed=st.integers(0, 40), actions=st.lists(_actions(family), min_size=1, max_size=3))
    def run(seed: int, actions: list[str]) -> None:
        _play(family, seed, actions, bound)

    run()
    assert _digest(db_files) == before  # the databases were never modified


def _leftovers(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


@pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap (bwrap) is not installed")
def test_fuzz_os_step_never_raises_and_leaves_the_host_alone(tmp_path: Path) -> None:
    sentinel = tmp_path / "sentinel"
    (sentinel / "sub").mkdir(parents=True)
    (sentinel / "a.txt").write_text("keep me\n")
    (sentinel / "sub" / "b.bin").write_bytes(bytes(range(256)))
    before = _digest([sentinel])
    marker = "4242.125"  # a `sleep` argument no other process on the host uses
    attacks = (
        f"rm -rf {sentinel}",
        f"echo pwned > {sentinel}/a.txt",
        f"ln -sf /etc/passwd {sentinel}/sub/b.bin",
        f"setsid sleep {marker} & nohup sleep {marker} >/dev/null 2>&1 &",
        "rm /.io/out; ln -s out /.io/out",
        "rm /.io/out; ln -s nonexistent /.io/out",
        "ln -s /work /.meta/rc",
        "truncate -s 8M s1 s2",
        "i=0; while { : > f$i; } 2>/dev/null; do i=$((i+1)); done; echo $i",
        "unshare -rm true",
        "head -c 5000 /dev/urandom > /proc/1/fd/1",
        ":(){ :|:& };:",
        "cat /dev/zero > /tmp/z",
        "exec 1>&- 2>&-",
    )
    commands = st.one_of(
        st.sampled_from(attacks),
        st.text(max_size=60),
        st.lists(st.sampled_from(_PIECES + ("ls", "cat", "|", "&&", "$(", "rm -rf *")), max_size=12)
        .map(" ".join),
    )  # fmt: skip
    os_actions = st.one_of(commands.map(lambda c: f"bash: {c}"), _actions("os"))

    @settings(_FUZZ, max_examples=30)
    @given(seed=st.integers(0, 40), actions=st.lists(os_actions, min_size=1, max_size=2))
    def run(seed: int, actions: list[str]) -> None:
        _play("os", seed, actions, OS_TIMEOUT_S + OS_SLACK_S)

    run()
    for action in _worst_cases("os"):
        _play("os", 1, [action], OS_TIMEOUT_S + OS_SLACK_S)
    # Every attack runs at least once, in order on one episode (the unwrapped env: no turn
    # limit), whatever hypothesis drew; the episode still works after all of them.
    inner = _env("os").env
    inner.reset(0)
    for attack in attacks:
        start = time.perf_counter()
        result = inner.step(f"bash: {attack}")
        _check_step(result)
        assert time.perf_counter() - start < OS_TIMEOUT_S + OS_SLACK_S, attack
    assert inner.step("bash: echo alive")[0] == "alive\n[exit code: 0]"
    assert _digest([sentinel]) == before
    assert _leftovers(marker) == []  # nothing a command started outlived its sandbox
