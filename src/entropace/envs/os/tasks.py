"""Task kinds of the ``os`` family: a question (answer it) or a goal (change the files).

Each kind is a function ``(rng, tree) -> Task`` in the :data:`TASKS` registry; :data:`BY_DIFFICULTY`
lists the kinds each difficulty draws from. The gold answer of a question is computed in
Python from the :class:`~entropace.envs.os.tree.Tree` (not by running the oracle's command),
so the oracle tests cross-check the two. A goal's ``check`` inspects the final work tree read
back from the sandbox (:func:`~entropace.envs.os.worktree.read_tree`).

Kinds (AgentBench-OS style):

========== ========================================================================
easy       ``count_lines`` (lines of a log with a level), ``count_files`` (files with an
           extension, recursively, hidden dirs included), ``config_value`` (a setting's
           value), ``create_file`` (goal: a file with a given line)
medium     ``largest_file`` (in ``data/``), ``sum_column`` (amounts of a region in a CSV),
           ``count_users`` (distinct users of the access log), ``fix_permissions``
           (goal: make ``scripts/*.sh`` owner-executable, nothing else)
hard       ``product_total`` (amounts of a product over all CSVs), ``top_component``
           (component with most WARN lines over all logs), ``rename_docs`` (goal:
           ``docs/*.txt`` -> ``*.md``, names with spaces), ``collect_errors`` (goal:
           all ERROR lines, sorted, into ``errors.txt``)
========== ========================================================================
"""

from __future__ import annotations

import random
import shlex
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from entropace.envs.os.procs import FileInfo, ProcessInfo
from entropace.envs.os.tree import LEVELS, PRODUCTS, REGIONS, WORDS, LogLine, Tree
from entropace.envs.os.worktree import WorkTree

__all__ = ["BY_DIFFICULTY", "TASKS", "SystemState", "Task"]


@dataclass(frozen=True)
class SystemState:
    """What the verifiers of the persistent-shell kinds see after the episode
    (:mod:`entropace.envs.os.tasks_shell`). Nothing here is the agent's shell's own word:
    a verifier that asked that shell (``command -v``, ``type``, ...) would trust functions,
    aliases, builtins and ``hash`` entries the agent defined there.

    Attributes:
        tree: the final work tree (paths relative to ``/work``), read after every process
            was stopped.
        etc: final ``/etc`` files by name (``"passwd"``, ``"group"``).
        processes: the sandbox's live processes at the end (PIDs as seen inside), read by
            the host from ``/proc``.
        started: the processes right after the task's ``setup`` (before the first turn).
        variables: the values of the task's ``live_vars`` in the agent's shell (None: not
            readable), read through redirections alone, which nothing the agent defines
            can intercept (:meth:`~entropace.envs.os.session.ShellSession.read_variables`).
        fresh: outputs of the task's ``probe_fresh`` commands, run in a new shell after
            every process of the agent was stopped.
        files: the task's ``watch_files`` as the host read them from the sandbox while the
            processes still ran (None: missing or not a regular file).
        time: the wall-clock time those files were read (seconds since the epoch).
    """

    tree: WorkTree
    etc: dict[str, bytes]
    processes: tuple[ProcessInfo, ...]
    started: tuple[ProcessInfo, ...]
    variables: dict[str, str | None]
    fresh: tuple[str, ...]
    files: dict[str, FileInfo | None] = field(default_factory=dict)
    time: float = 0.0


@dataclass(frozen=True)
class Task:
    """One instance's task.

    Attributes:
        kind: the task kind (a key of :data:`TASKS`).
        prompt: what the agent is asked (ends with the expected answer format).
        gold: the gold answer (questions) or a description of the goal state (goals).
        commands: shell commands that solve the task (what the oracle runs).
        check: for goals, ``check(tree) -> (ok, reason)`` on the final work tree; None for
            questions (then the answer is compared with ``gold``).
        verify: persistent-shell kinds: ``verify(state, answer) -> (ok, reason)`` on the final
            :class:`SystemState` (``answer`` is None for goals); replaces ``check``/``gold``.
        goal: whether the task is a goal (``done``) rather than a question; default: it is
            when ``check`` is set.
        setup: commands the environment runs in the persistent shell before the first
            observation (their output is not shown), e.g. to start processes.
        etc: ``/etc`` files of the persistent sandbox by name (``passwd``, ``group``);
            empty: the default ones.
        live_vars: names of variables of the agent's shell read at the end
            (``SystemState.variables``).
        probe_fresh: commands run in a new shell at the end, after every process of the
            agent was stopped (``SystemState.fresh``).
        watch_files: sandbox paths (e.g. a heartbeat under ``/tmp``) the host reads while the
            processes still run (``SystemState.files``); when a process holds a ``/work``
            file open (runs a script), the host waits up to 1 s for each to be modified
            after the youngest such process started.
    """

    kind: str
    prompt: str
    gold: str
    commands: tuple[str, ...]
    check: Callable[[WorkTree], tuple[bool, str]] | None = None
    verify: Callable[[SystemState, str | None], tuple[bool, str]] | None = None
    goal: bool | None = None
    setup: tuple[str, ...] = ()
    etc: dict[str, bytes] = field(default_factory=dict)
    live_vars: tuple[str, ...] = ()
    probe_fresh: tuple[str, ...] = ()
    watch_files: tuple[str, ...] = ()

    @property
    def is_goal(self) -> bool:
        return self.goal if self.goal is not None else self.check is not None


TaskFn = Callable[[random.Random, Tree], Task]
TASKS: dict[str, TaskFn] = {}


def _task(fn: TaskFn) -> TaskFn:
    TASKS[fn.__name__] = fn
    return fn


def _q(path: str) -> str:
    return shlex.quote(path)


# ----------------------------------------------------------------------------- easy


@_task
def count_lines(rng: random.Random, tree: Tree) -> Task:
    name = rng.choice(sorted(tree.logs))
    level = rng.choice(LEVELS)
    gold = sum(line.level == level for line in tree.logs[name])
    prompt = (
        f"How many lines of logs/{name} have the level {level} (the third field of the line)? "
        "Answer with a number."
    )
    return Task("count_lines", prompt, str(gold), (f"grep -c ' {level} ' logs/{name}",))


@_task
def count_files(rng: random.Random, tree: Tree) -> Task:
    paths = [f.path for f in tree.files()]
    exts = sorted({p.rsplit(".", 1)[-1] for p in paths if "." in p.rsplit("/", 1)[-1]})
    ext = rng.choice([e for e in exts if e.isalpha()])
    gold = sum(p.endswith(f".{ext}") for p in paths)
    prompt = (
        f"How many regular files whose name ends with .{ext} are there under /work, counting "
        "all subdirectories (hidden ones included)? Answer with a number."
    )
    return Task("count_files", prompt, str(gold), (f"find /work -type f -name '*.{ext}' | wc -l",))


@_task
def config_value(rng: random.Random, tree: Tree) -> Task:
    name = rng.choice(sorted(tree.configs))
    key = rng.choice(sorted(tree.configs[name]))
    prompt = (
        f"What is the value of the active (not commented-out) setting `{key}` in "
        f"config/{name}? Lines look like `key = value`. Answer with the value only."
    )
    cmd = f"grep -E '^{key}[[:space:]]*=' config/{name} | head -n 1 | cut -d= -f2- | tr -d ' '"
    return Task("config_value", prompt, tree.configs[name][key], (cmd,))


@_task
def create_file(rng: random.Random, tree: Tree) -> Task:
    directory = "/".join(rng.sample(WORDS, rng.randint(1, 2)))
    path = f"{directory}/{rng.choice(WORDS)}.txt"
    text = " ".join(rng.choices(WORDS, k=rng.randint(2, 5)))
    prompt = (
        f"Create the file {path} (relative to /work, creating directories as needed) whose "
        f"content is exactly the single line: {text}\nReply `done` when finished."
    )

    def check(work: WorkTree) -> tuple[bool, str]:
        entry = work.get(path)
        if entry is None or entry.kind != "file":
            return False, f"{path} is not a regular file"
        ok = entry.content.decode("utf-8", "replace") in (text, text + "\n")
        return ok, "ok" if ok else f"{path} has the wrong content"

    cmd = f"mkdir -p {_q(directory)} && printf '%s\\n' {_q(text)} > {_q(path)}"
    return Task("create_file", prompt, f"{path} contains {text!r}", (cmd,), check)


# ----------------------------------------------------------------------------- medium


@_task
def largest_file(rng: random.Random, tree: Tree) -> Task:
    sizes = tree.sizes("data")
    top = max(sizes.values())
    while sum(s == top for s in sizes.values()) > 1:  # make the largest unique
        name = max(n for n in tree.tables if tree.sizes("data")[n] == top)
        rows = tree.tables[name]
        rows.append((rows[-1][0] + 5000, rng.choice(REGIONS), rng.choice(PRODUCTS), 7))
        sizes = tree.sizes("data")
        top = max(sizes.values())
    gold = next(n for n, s in sizes.items() if s == top)
    prompt = (
        "Which regular file directly inside data/ (not in its subdirectories) is the largest, "
        "in bytes? Answer with the file name only (no directory)."
    )
    cmd = "find data -maxdepth 1 -type f -printf '%s %f\\n' | sort -n | tail -n 1 | cut -d' ' -f2-"
    return Task("largest_file", prompt, gold, (cmd,))


@_task
def sum_column(rng: random.Random, tree: Tree) -> Task:
    name = rng.choice(sorted(tree.tables))
    region = rng.choice(sorted({row[1] for row in tree.tables[name]}))
    gold = sum(row[3] for row in tree.tables[name] if row[1] == region)
    prompt = (
        f"data/{name} is a CSV file with the header id,region,product,amount. What is the "
        f"sum of the amount column over the rows whose region is {region}? Answer with a number."
    )
    awk = f"awk -F, 'NR > 1 && $2 == \"{region}\" {{ s += $4 }} END {{ print s + 0 }}'"
    return Task("sum_column", prompt, str(gold), (f"{awk} {_q('data/' + name)}",))


@_task
def count_users(rng: random.Random, tree: Tree) -> Task:
    del rng
    gold = len({line.split(" ", 1)[0] for line in tree.access})
    prompt = (
        "Each line of logs/access.log starts with a user name. How many distinct users "
        "appear in it? Answer with a number."
    )
    cmd = "cut -d' ' -f1 logs/access.log | sort -u | wc -l"
    return Task("count_users", prompt, str(gold), (cmd,))


@_task
def fix_permissions(rng: random.Random, tree: Tree) -> Task:
    names = sorted(tree.scripts)
    for name in names:  # a few scripts may already be executable
        if name.endswith(".sh") and rng.random() < 0.25:
            tree.scripts[name] = (tree.scripts[name][0], 0o755)
    before = {f"scripts/{n}": (text.encode(), mode) for n, (text, mode) in tree.scripts.items()}
    prompt = (
        "Make every file in scripts/ whose name ends with .sh executable by its owner. Do not "
        "change any other file or permission bit.\nReply `done` when finished."
    )

    def check(work: WorkTree) -> tuple[bool, str]:
        for path, (content, mode) in before.items():
            entry = work.get(path)
            if entry is None or entry.kind != "file" or entry.content != content:
                return False, f"{path} is missing or was modified"
            want = mode | 0o100 if path.endswith(".sh") else mode
            if entry.mode != want:
                return False, f"{path} has mode {entry.mode:o}, expected {want:o}"
        return True, "ok"

    gold = "u+x on " + ", ".join(p for p in before if p.endswith(".sh"))
    return Task("fix_permissions", prompt, gold, ("chmod u+x scripts/*.sh",), check)


# ----------------------------------------------------------------------------- hard


@_task
def product_total(rng: random.Random, tree: Tree) -> Task:
    rows = [row for table in tree.tables.values() for row in table]
    product = rng.choice(sorted({row[2] for row in rows}))
    gold = sum(row[3] for row in rows if row[2] == product)
    prompt = (
        "The .csv files directly inside data/ (not its subdirectories, not other extensions) "
        "share the header id,region,product,amount. What is the total of the amount column "
        f"over all their rows whose product is {product}? Answer with a number."
    )
    awk = f"awk -F, 'FNR > 1 && $3 == \"{product}\" {{ s += $4 }} END {{ print s + 0 }}'"
    return Task("product_total", prompt, str(gold), (f"{awk} data/*.csv",))


@_task
def top_component(rng: random.Random, tree: Tree) -> Task:
    present = {line.level for lines in tree.logs.values() for line in lines}
    level = rng.choice([lvl for lvl in ("WARN", "ERROR", "INFO") if lvl in present])
    counts = Counter(
        line.component for lines in tree.logs.values() for line in lines if line.level == level
    )
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:  # break a tie with one more line
        last = sorted(tree.logs)[-1]
        tree.logs[last].append(LogLine(tree.next_ts(rng), level, ranked[0][0], "queue depth is 1"))
        counts[ranked[0][0]] += 1
    gold = counts.most_common(1)[0][0]
    prompt = (
        "Log lines look like `YYYY-MM-DD HH:MM:SS LEVEL component: message`. Over all files "
        f"matching logs/*.log, which component has the most {level} lines? Answer with the "
        "component name only."
    )
    cmd = (
        f"grep -h ' {level} ' logs/*.log | cut -d' ' -f4 | tr -d ':' | sort | uniq -c "
        "| sort -rn | head -n 1 | awk '{ print $2 }'"
    )
    return Task("top_component", prompt, gold, (cmd,))


@_task
def rename_docs(rng: random.Random, tree: Tree) -> Task:
    del rng
    before = {f"docs/{n}": text.encode() for n, text in tree.docs.items()}
    after = {(p[: -len(".txt")] + ".md" if p.endswith(".txt") else p): c for p, c in before.items()}
    prompt = (
        "Rename every file in docs/ whose name ends with .txt so that it ends with .md "
        "instead (keep the rest of the name and the content; some names contain spaces). "
        "Leave every other file alone.\nReply `done` when finished."
    )

    def check(work: WorkTree) -> tuple[bool, str]:
        got = {p: e.content for p, e in work.items() if p.startswith("docs/") and e.kind == "file"}
        if set(got) != set(after):
            missing, extra = sorted(set(after) - set(got)), sorted(set(got) - set(after))
            return False, f"docs/ differs: missing {missing[:3]}, unexpected {extra[:3]}"
        bad = sorted(p for p in after if got[p] != after[p])
        return (not bad), "ok" if not bad else f"content changed: {bad[:3]}"

    cmd = 'cd docs && for f in *.txt; do mv -- "$f" "${f%.txt}.md"; done'
    return Task("rename_docs", prompt, "docs: " + ", ".join(sorted(after)), (cmd,), check)


@_task
def collect_errors(rng: random.Random, tree: Tree) -> Task:
    del rng
    lines = sorted(line.render() for log in tree.logs.values() for line in log)
    expected = [line for line in lines if line.split(" ")[2] == "ERROR"]
    prompt = (
        "Log lines look like `YYYY-MM-DD HH:MM:SS LEVEL component: message`. Create the file "
        "errors.txt in /work containing every line with level ERROR from the files matching "
        "logs/*.log (only those files), sorted by timestamp, oldest first, one per line."
        "\nReply `done` when finished."
    )

    def check(work: WorkTree) -> tuple[bool, str]:
        entry = work.get("errors.txt")
        if entry is None or entry.kind != "file":
            return False, "errors.txt is not a regular file"
        got = entry.content.decode("utf-8", "replace").rstrip("\n").split("\n")
        ok = got == expected
        return ok, "ok" if ok else f"errors.txt has {len(got)} lines, expected {len(expected)}"

    cmd = "grep -h ' ERROR ' logs/*.log | sort > errors.txt"
    return Task("collect_errors", prompt, "\n".join(expected), (cmd,), check)


BY_DIFFICULTY: dict[str, tuple[str, ...]] = {
    "easy": ("count_lines", "count_files", "config_value", "create_file"),
    "medium": ("largest_file", "sum_column", "count_users", "fix_permissions"),
    "hard": ("product_total", "top_component", "rename_docs", "collect_errors"),
}
