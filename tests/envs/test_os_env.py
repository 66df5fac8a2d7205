"""Tests of the ``os`` family: parser, tree/task generation, the bubblewrap sandbox, the env.

Sandbox tests need the ``bwrap`` binary; they are skipped only when it is not installed at all
(CI installs it). If bwrap is installed but cannot create namespaces they fail, loudly.
"""

from __future__ import annotations

import hashlib
import os
import random
import shlex
import shutil
import socket
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropace.envs import DIFFICULTIES, make, seeds, spec
from entropace.envs.checks import HOSTILE_ACTIONS, check_env, oracle_success_rate, run_episode
from entropace.envs.os import sandbox as sandbox_mod
from entropace.envs.os.actions import (
    Answer,
    Bash,
    Done,
    answers_match,
    format_observation,
    normalize_answer,
    observation_output,
    parse_action,
)
from entropace.envs.os.sandbox import Sandbox, SandboxLimits, SandboxUnavailableError
from entropace.envs.os.tasks import BY_DIFFICULTY, TASKS
from entropace.envs.os.tree import generate_tree
from entropace.envs.os.worktree import FileSpec, build_archive, read_tree

HAS_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap (bwrap) is not installed")

#: Family-specific nasty actions (valid syntax, hostile commands), all cheap with a 1 s limit.
OS_NASTY: tuple[str, ...] = (
    "bash: rm -rf / --no-preserve-root",
    "bash: :(){ :|:& };:",
    "bash: while :; do :; done",
    "bash: yes",
    "bash: head -c 50000000 /dev/zero > big",
    "bash: cat /dev/urandom | head -c 300000",
    "bash: setsid sleep 100 & disown",
    "bash: kill -9 -1",
    "bash: kill -9 $PPID",
    "bash: exec 1>&- 2>&-",
    "bash: touch /usr/x /etc/x /x",
    "bash: printf '\\x00\\xff\\xfe'",
    "bash: " + "x" * 50_000,
    "bash: echo \x00",
    "bash: ```\n```",
    "answer: " + "9" * 10_000,
    "done",
)


# ----------------------------------------------------------------------------- parser


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bash: ls -la", Bash("ls -la")),
        ("  BASH:ls\n", Bash("ls")),
        ("bash: cd docs\nls | wc -l", Bash("cd docs\nls | wc -l")),
        ("bash: ```bash\nls -la\n```", Bash("ls -la")),
        ("bash:\n```sh\necho 'a b'\n```\n", Bash("echo 'a b'")),
        ("answer: 42", Answer("42")),
        ("Answer:   worker  \nbecause it logs most", Answer("worker")),
        ("answer:\n\n  x.csv\n", Answer("x.csv")),
        ("done", Done()),
        ("  Done.\n", Done()),
        ("DONE", Done()),
        ("", None),
        ("bash:", None),
        ("bash:   \n ", None),
        ("bash: ```\n```", None),
        ("answer:", None),
        ("ls -la", None),
        ("done now", None),
        ("I will run bash: ls", None),
        ("bash ls", None),
    ],
)
def test_parse_action_examples(text: str, expected: object) -> None:
    assert parse_action(text) == expected


@given(st.text())
@settings(max_examples=300, deadline=None)
def test_parse_action_never_raises(text: str) -> None:
    result = parse_action(text)
    assert result is None or isinstance(result, Bash | Answer | Done)
    if isinstance(result, Bash):
        assert result.command and result.command == result.command.strip()


@given(st.text(min_size=1).filter(lambda c: c.strip() and not c.strip().startswith("```")))
@settings(max_examples=300, deadline=None)
def test_bash_action_round_trips(command: str) -> None:
    assert parse_action(f"bash: {command}") == Bash(command.strip())
    assert parse_action(f"BASH:{command}") == Bash(command.strip())


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Zl", "Zp")), min_size=1))
@settings(max_examples=300, deadline=None)
def test_answer_action_round_trips(text: str) -> None:
    if not text.strip() or len(text.splitlines()) != 1:
        return
    assert parse_action(f"answer: {text}") == Answer(text.strip())


@given(st.text(), st.text())
@settings(max_examples=200, deadline=None)
def test_answers_match_never_raises(a: str, b: str) -> None:
    assert answers_match(a, b) in (True, False)
    assert answers_match(b, b) is True
    assert answers_match(a, b) == answers_match(normalize_answer(a), b)


@pytest.mark.parametrize(
    ("answer", "gold", "ok"),
    [
        ("42", "42", True),
        (" `42`. ", "42", True),
        ("42.0", "42", True),
        ("41", "42", False),
        ("1e309", "42", False),
        ("Worker", "worker", True),
        ("data/bravo pepper.csv", "bravo pepper.csv", True),
        ("/work/data/x.csv", "x.csv", True),
        ("y.csv", "x.csv", False),
        ("'raven-2.internal'", "raven-2.internal", True),
        ("", "0", False),
    ],
)
def test_answers_match(answer: str, gold: str, ok: bool) -> None:
    assert answers_match(answer, gold) is ok


def test_observation_format_round_trip_and_cap() -> None:
    obs = format_observation(b"hello\nworld\n", 3, max_chars=100)
    assert obs == "hello\nworld\n[exit code: 3]"
    assert observation_output(obs) == "hello\nworld"
    assert observation_output(format_observation(b"", 0, max_chars=100)) == ""
    big = format_observation(b"y\n" * 10_000, 0, max_chars=100)
    assert big.startswith("y\ny\n") and "showing 100 of 20000 chars" in big and len(big) < 200
    assert "\x00" not in format_observation(b"a\x00b\xff", 0, max_chars=100)


# ----------------------------------------------------------------------------- data


def test_archive_is_deterministic_and_reads_back() -> None:
    files = [FileSpec("a/b c.txt", b"x\n", 0o600), FileSpec("z.sh", b"#!/bin/sh\n", 0o755)]
    archive = build_archive(files)
    assert archive == build_archive(list(reversed(files)))
    tree = read_tree(archive)
    assert tree["a/b c.txt"].content == b"x\n" and tree["a/b c.txt"].mode == 0o600
    assert tree["z.sh"].mode == 0o755 and tree["a"].kind == "dir"
    assert set(tree) == {"a", "a/b c.txt", "z.sh"}


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_tree_and_task_generation_is_seeded(difficulty: str) -> None:
    def instance(seed: int) -> tuple[bytes, str, str]:
        rng = random.Random(seed)
        kind = rng.choice(BY_DIFFICULTY[difficulty])
        tree = generate_tree(rng, difficulty)
        task = TASKS[kind](rng, tree)
        return build_archive(tree.files()), task.prompt, task.gold

    assert instance(5) == instance(5)
    assert len({instance(s)[0] for s in range(10)}) == 10
    # Harder levels have bigger trees on average.
    sizes = [len(generate_tree(random.Random(s), difficulty).files()) for s in range(10)]
    assert {"easy": 15, "medium": 25, "hard": 35}[difficulty] <= sum(sizes) / 10


def test_gold_answers_by_brute_force() -> None:
    """Recompute question golds from the rendered files (independent of the tree model)."""
    for seed in range(30):
        rng = random.Random(seed)
        tree = generate_tree(rng, "medium")
        task = TASKS["sum_column"](rng, tree)
        files = {f.path: f.content.decode() for f in tree.files()}
        name = shlex.split(task.commands[0])[-1]
        region = task.prompt.split("region is ")[1].split("?")[0]
        rows = [line.split(",") for line in files[name].splitlines()[1:]]
        assert task.gold == str(sum(int(r[3]) for r in rows if r[1] == region))
        rng = random.Random(seed)
        tree = generate_tree(rng, "medium")
        task = TASKS["largest_file"](rng, tree)
        files = {f.path: f.content for f in tree.files()}
        in_data = {p: len(c) for p, c in files.items() if p.count("/") == 1 and p[:5] == "data/"}
        assert sorted(in_data.values()).count(max(in_data.values())) == 1
        assert "data/" + task.gold == max(in_data, key=in_data.__getitem__)


def test_every_kind_is_drawn() -> None:
    for difficulty, kinds in BY_DIFFICULTY.items():
        drawn = {random.Random(f"entropace.os/{difficulty}/{s}").choice(kinds) for s in range(50)}
        assert drawn == set(kinds)


# ----------------------------------------------------------------------------- sandbox


@pytest.fixture(scope="module")
def box() -> Sandbox:
    if not HAS_BWRAP:
        pytest.skip("bubblewrap (bwrap) is not installed")
    return Sandbox(SandboxLimits(timeout_s=1.0))


def _files(state: bytes) -> dict[str, bytes]:
    return {p: e.content for p, e in read_tree(state).items() if e.kind == "file"}


def test_state_persists_and_inputs_are_copies(box: Sandbox) -> None:
    initial = build_archive([FileSpec("in.txt", b"orig\n")])
    r1 = box.run("echo new >> in.txt && mkdir d && echo 7 > d/f && id -u && pwd", initial)
    assert r1.error is None and r1.exit_code == 0 and r1.output == b"1000\n/work\n"
    assert r1.state is not None and _files(r1.state) == {"in.txt": b"orig\nnew\n", "d/f": b"7\n"}
    assert _files(initial) == {"in.txt": b"orig\n"}  # the input archive is untouched
    r2 = box.run("cat d/f in.txt; exit 3", r1.state)
    assert (r2.output, r2.exit_code) == (b"7\norig\nnew\n", 3)


def test_no_network(box: Sandbox) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    try:
        py = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=0.5)"
        r = box.run(
            f'python3 -c "{py}" || echo PYFAIL; echo x >/dev/tcp/127.0.0.1/{port}', _empty()
        )
        assert b"PYFAIL" in r.output and b"Connection refused" in r.output and r.exit_code != 0
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever reached the host's listener
        r = box.run("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '", _empty())
        assert r.output == b"lo\n"  # only the sandbox's own loopback
    finally:
        server.close()


def _empty() -> bytes:
    return sandbox_mod.empty_state()


def test_writes_outside_work_fail(box: Sandbox) -> None:
    targets = ["/usr/x", "/etc/x", "/tmp/../root/x", "/x", "/proc/x", "/bin/x"]
    before = {t: os.path.exists(os.path.normpath(t)) for t in targets}
    for target in targets:
        r = box.run(f"touch {target} && echo WROTE", _empty())
        assert r.exit_code != 0 and b"WROTE" not in r.output, target
    assert {t: os.path.exists(os.path.normpath(t)) for t in targets} == before


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        h.update(str(path).encode() + oct(path.stat().st_mode).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def test_hostile_commands_are_bounded_and_leave_the_host_alone(
    box: Sandbox, tmp_path: Path
) -> None:
    sentinel = tmp_path / "sentinel"
    (sentinel / "sub").mkdir(parents=True)
    (sentinel / "a.txt").write_text("keep me\n")
    (sentinel / "sub" / "b.bin").write_bytes(os.urandom(64))
    digest = _digest(sentinel)
    state = build_archive([FileSpec("mine.txt", b"x\n")])
    marker = f"{random.randrange(10**6)}.5"
    commands = [
        f"rm -rf {sentinel} ; echo pwned > {sentinel}/a.txt",
        "rm -rf / --no-preserve-root",
        ":(){ :|:& };:",
        "while :; do :; done",
        f"setsid sleep {marker} & nohup sleep {marker} >/dev/null 2>&1 &",
    ]
    for command in commands:  # chained: each runs on the state the previous one left
        start = time.monotonic()
        r = box.run(command, state)
        assert time.monotonic() - start < 1.0 + 4.0, command
        state = r.state if r.state is not None else state
    # The sandbox still works afterwards; the endless loop hit the time limit.
    alive = box.run("echo alive > after.txt && cat after.txt", state)
    assert alive.output == b"alive\n" and alive.state is not None
    loop = box.run("while :; do :; done", state)
    assert loop.timed_out and loop.exit_code == 137 and loop.state is not None
    assert _digest(sentinel) == digest
    leftovers = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            leftovers += (
                [pid] if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() else []
            )
        except OSError:
            continue
    assert leftovers == []  # background processes died with their sandbox


def test_limits(box: Sandbox) -> None:
    flood = box.run("yes", _empty())
    assert len(flood.output) <= box.limits.output_bytes and flood.output.startswith(b"y\ny\n")
    assert flood.state is not None
    big = box.run("head -c 50000000 /dev/zero > big; echo rc=$?", _empty())
    assert big.state is not None and len(_files(big.state)["big"]) <= box.limits.work_bytes
    assert b"rc=1" in big.output
    mem = box.run("python3 -c 'x = bytearray(2 * 1024**3)'", _empty())
    assert mem.exit_code != 0 and b"MemoryError" in mem.output
    fork = (
        "python3 -c 'import os, time\nn = 0\ntry:\n while n < 500:\n"
        "  if os.fork() == 0:\n   time.sleep(2); os._exit(0)\n  n += 1\n"
        "except OSError:\n print(n)'"
    )
    r = box.run(fork, _empty())
    assert r.output.strip().isdigit() and int(r.output) < box.limits.max_processes


def test_commands_that_break_the_sandbox_are_rolled_back(box: Sandbox) -> None:
    state = build_archive([FileSpec("keep.txt", b"1\n")])
    killed = box.run("echo 2 > keep.txt; kill -9 -1", state)  # also kills the wrapper shell
    assert killed.state is None and killed.error is not None and "discarded" in killed.error
    # Writing garbage into the wrapper's stdout (the tar stream): refused (the pipe belongs to
    # the host's uid) or detected; either way no exception and no half-read tree.
    corrupt = box.run("echo 2 > keep.txt; head -c 5000 /dev/urandom > /proc/2/fd/1", state)
    assert corrupt.state is None or _files(corrupt.state) == {"keep.txt": b"2\n"}
    # Killing `timeout` (the command's parent) or wiping the capture dirs keeps the changes.
    for command in (
        "echo 2 > keep.txt; kill -9 $PPID",
        "echo 2 > keep.txt; rm -rf /.meta/* /.io/*",
    ):
        r = box.run(command, state)
        assert r.state is not None and _files(r.state) == {"keep.txt": b"2\n"} and not r.timed_out
    nul = box.run("echo \x00", state)
    assert nul.state is None and "NUL" in (nul.error or "")
    huge = box.run("x" * 20_000, state)
    assert huge.state is None and "limit" in (huge.error or "")


def test_missing_bwrap_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sandbox_mod.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        make("os")
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox_mod.shutil, "which", lambda name: str(fake))
    with pytest.raises(SandboxUnavailableError, match="user namespaces.*|No permissions"):
        make("os")


# ----------------------------------------------------------------------------- env


@needs_bwrap
def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="difficulty"):
        make("os", difficulty="extreme")
    with pytest.raises(ValueError, match="timeout_s"):
        make("os", command_timeout=0)
    with pytest.raises(ValueError, match="command_timeout"):
        make("os", command_timeout="soon")
    with pytest.raises(ValueError, match="output_chars"):
        make("os", output_chars=5)
    with pytest.raises(ValueError, match="output_chars"):
        make("os", output_chars="4000")
    with pytest.raises(TypeError, match="unknown option"):
        make("os", colour="red")
    env = make("os")
    assert "bash: <command>" in env.system_prompt and "answer: <text>" in env.system_prompt
    assert env.max_turns == 10 and spec("os").license


@needs_bwrap
@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_check_env_hostile(difficulty: str) -> None:
    env = make("os", difficulty=difficulty, command_timeout=1.0)
    actions = HOSTILE_ACTIONS + (OS_NASTY if difficulty == "hard" else OS_NASTY[:2])
    check_env(env, seed=11, actions=actions, max_observation_chars=env.output_chars + 500)


@needs_bwrap
@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_oracle_solves_everything(difficulty: str) -> None:
    train = list(seeds("train", 45))
    test = list(seeds("test", 5))
    assert oracle_success_rate("os", train + test, difficulty=difficulty) == 1.0


@needs_bwrap
def test_reset_is_deterministic_and_restores_the_inputs() -> None:
    a, b = make("os", difficulty="hard"), make("os", difficulty="hard")
    for seed in (0, 7, 1_000_003):
        (obs_a, info_a), (obs_b, info_b) = a.reset(seed), b.reset(seed)
        assert (obs_a, info_a) == (obs_b, info_b) and a.initial_state == b.initial_state
    env = make("os", difficulty="easy")
    env.reset(3)
    initial = env.initial_state
    env.step("bash: rm -rf ./* ./.cache && echo gone > only.txt")
    assert _files(env.state) == {"only.txt": b"gone\n"}
    env.reset(3)
    assert env.state == initial and env.initial_state == initial


@needs_bwrap
def test_garbage_policy_scores_zero() -> None:
    rng = random.Random(0)
    pool = ["ls", "bash: ls -la", "answer: 12", "answer: worker", "done", "answer: x.csv", "?"]
    wins = 0
    for difficulty in DIFFICULTIES:
        for seed in range(8):
            env = make("os", difficulty=difficulty, max_turns=3)
            ep = run_episode(env, lambda obs: rng.choice(pool), seed)
            wins += ep.success
    assert wins <= 1


@needs_bwrap
def test_answers_and_goals_are_verified() -> None:
    env = make("os", difficulty="easy")
    by_kind: dict[str, int] = {}
    for seed in range(40):
        by_kind.setdefault(env.reset(seed)[1]["kind"], seed)
    # A wrong answer ends the episode without reward; `done` on a question does not end it.
    env.reset(by_kind["count_lines"])
    gold = env.task.gold
    assert env.step("done")[2:4] == (False, False)
    obs, reward, terminated, _, info = env.step(f"answer: {int(gold) + 1}")
    assert (reward, terminated, info["success"]) == (0.0, True, False) and obs == "Wrong answer."
    env.reset(by_kind["count_lines"])
    assert env.step(f"answer: {gold}.")[1] == 1.0
    # A goal: the wrong content fails, the right content passes, `answer:` does not end it.
    seed = by_kind["create_file"]
    env.reset(seed)
    path = env.task.gold.split(" contains ")[0]
    assert env.step("answer: done")[2] is False
    env.step(f"bash: mkdir -p $(dirname {path}) && echo wrong > {path}")
    obs, reward, terminated, _, info = env.step("done")
    assert (reward, terminated) == (0.0, True) and "wrong content" in obs
    env.reset(seed)
    text = env.task.gold.split(" contains ")[1].strip("'")
    env.step(f"bash: mkdir -p $(dirname {path}) && echo '{text}' > {path}")
    assert env.step("done")[1] == 1.0
    # fix_permissions: chmod-ing everything also touches README.txt, which must stay 644.
    env = make("os", difficulty="medium")
    seed = next(s for s in range(40) if env.reset(s)[1]["kind"] == "fix_permissions")
    env.reset(seed)
    env.step("bash: chmod -R a+x scripts")
    obs, reward, *_ = env.step("done")
    assert reward == 0.0 and "mode" in obs
