"""More task kinds of the ``os`` family (added with the content splits), fresh-shell kinds.

Same contract as :mod:`entropace.envs.os.tasks` (``(rng, tree) -> Task``, gold computed in
Python from the :class:`~entropace.envs.os.tree.Tree`, the oracle's commands cross-checked by
the oracle tests). :data:`MORE_TASKS` holds them; :mod:`entropace.envs.os.splits` decides which
split draws which kind:

============ ===================================== =========================================
difficulty   added to train / test                  held out for ``test_unseen``
============ ===================================== =========================================
easy         ``count_scripts`` (``scripts/*.sh``)   ``word_count`` (``wc -w`` of a doc),
                                                    ``append_line`` (goal: append a setting)
medium       ``max_amount`` (largest amount of a    ``user_requests`` (a user's GET or POST
             CSV)                                   lines), ``delete_rotated`` (goal: remove
                                                    the non-``.log`` files under ``logs/``)
hard         ``top_region`` (region with the        ``error_components`` (distinct components
             largest total over all CSVs)           with lines of a level), ``merge_tables`` (goal:
                                                    all CSV rows, one header, sorted by id)
============ ===================================== =========================================
"""

from __future__ import annotations

import random
import shlex
from collections import Counter

from entropace.envs.os.tasks import Task, TaskFn
from entropace.envs.os.tree import REGIONS, Tree
from entropace.envs.os.worktree import WorkTree

__all__ = ["MORE_TASKS"]

MORE_TASKS: dict[str, TaskFn] = {}


def _task(fn: TaskFn) -> TaskFn:
    MORE_TASKS[fn.__name__] = fn
    return fn


def _q(path: str) -> str:
    return shlex.quote(path)


# ----------------------------------------------------------------------------- easy


@_task
def count_scripts(rng: random.Random, tree: Tree) -> Task:
    del rng
    gold = sum(name.endswith(".sh") for name in tree.scripts)
    prompt = (
        "How many files directly inside scripts/ have a name ending with .sh? Answer with a number."
    )
    return Task("count_scripts", prompt, str(gold), ("ls scripts | grep -c '\\.sh$'",))


@_task
def word_count(rng: random.Random, tree: Tree) -> Task:
    name = rng.choice(sorted(n for n in tree.docs if n.endswith(".txt")))
    gold = len(tree.docs[name].split())
    prompt = (
        f"How many words (whitespace-separated, as `wc -w` counts them) does docs/{name} "
        "contain? Answer with a number."
    )
    return Task("word_count", prompt, str(gold), (f"wc -w < {_q('docs/' + name)}",))


@_task
def append_line(rng: random.Random, tree: Tree) -> Task:
    name = rng.choice(sorted(tree.config_text))
    key = rng.choice(("max_connections", "keepalive", "region", "owner", "replicas"))
    value = {
        "max_connections": str(rng.randint(10, 5000)),
        "keepalive": str(rng.randint(1, 300)),
        "region": rng.choice(REGIONS),
        "owner": rng.choice(("ops", "platform", "data", "infra")),
        "replicas": str(rng.randint(1, 9)),
    }[key]
    path, before = f"config/{name}", tree.config_text[name]
    line = f"{key} = {value}"
    prompt = (
        f"Add the setting `{line}` as a new last line of {path}, keeping every existing "
        "line as it is.\nReply `done` when finished."
    )

    def check(work: WorkTree) -> tuple[bool, str]:
        entry = work.get(path)
        if entry is None or entry.kind != "file":
            return False, f"{path} is not a regular file"
        ok = entry.content.decode("utf-8", "replace") in (before + line, before + line + "\n")
        return ok, "ok" if ok else f"{path} does not end with the line and keep the rest"

    cmd = f"printf '%s\\n' {_q(line)} >> {_q(path)}"
    return Task("append_line", prompt, f"{path} ends with {line!r}", (cmd,), check)


# ----------------------------------------------------------------------------- medium


@_task
def max_amount(rng: random.Random, tree: Tree) -> Task:
    name = rng.choice(sorted(tree.tables))
    gold = max(row[3] for row in tree.tables[name])
    prompt = (
        f"data/{name} is a CSV file with the header id,region,product,amount. What is the "
        "largest value of its amount column? Answer with a number."
    )
    cmd = f"tail -n +2 {_q('data/' + name)} | cut -d, -f4 | sort -n | tail -n 1"
    return Task("max_amount", prompt, str(gold), (cmd,))


@_task
def user_requests(rng: random.Random, tree: Tree) -> Task:
    user = rng.choice(sorted({line.split(" ", 1)[0] for line in tree.access}))
    method = rng.choice(("GET", "POST"))
    gold = sum(line.split(" ")[:2] == [user, method] for line in tree.access)
    prompt = (
        "Each line of logs/access.log looks like `<user> <METHOD> <path> <status>`. How many "
        f"{method} requests did the user {user} make? Answer with a number."
    )
    cmd = f'awk \'$1 == "{user}" && $2 == "{method}"\' logs/access.log | wc -l'
    return Task("user_requests", prompt, str(gold), (cmd,))


def _rendered(tree: Tree) -> dict[str, bytes]:
    return {f.path: f.content for f in tree.files()}


@_task
def delete_rotated(rng: random.Random, tree: Tree) -> Task:
    for _ in range(rng.randint(1, 3)):  # rotated / compressed copies with varying names
        log = rng.choice(sorted(tree.logs))
        suffix = rng.choice((f".{rng.randint(1, 9)}", f".{rng.randint(1, 9)}.gz", ".old"))
        tree.other[f"logs/{log}{suffix}"] = "rotated\n"
    files = _rendered(tree)
    remove = sorted(p for p in files if p.startswith("logs/") and not p.endswith(".log"))
    keep = {p: c for p, c in files.items() if p not in remove}
    prompt = (
        "Delete every regular file under logs/ (subdirectories included) whose name does not "
        "end with .log. Leave every other file alone.\nReply `done` when finished."
    )

    def check(work: WorkTree) -> tuple[bool, str]:
        got = {p: e.content for p, e in work.items() if e.kind == "file"}
        left = sorted(p for p in remove if p in got)
        if left:
            return False, f"still present: {left[:3]}"
        changed = sorted(p for p, c in keep.items() if got.get(p) != c)
        return (not changed), "ok" if not changed else f"missing or changed: {changed[:3]}"

    cmd = "find logs -type f ! -name '*.log' -delete"
    return Task("delete_rotated", prompt, "removed: " + ", ".join(remove), (cmd,), check)


# ----------------------------------------------------------------------------- hard


@_task
def top_region(rng: random.Random, tree: Tree) -> Task:
    totals: Counter[str] = Counter()
    for rows in tree.tables.values():
        for row in rows:
            totals[row[1]] += row[3]
    ranked = totals.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:  # break a tie with one more row
        name = sorted(tree.tables)[-1]
        rows = tree.tables[name]
        rows.append((max(r[0] for r in rows) + 5000, ranked[0][0], rows[-1][2], 1))
        totals[ranked[0][0]] += 1
    gold = totals.most_common(1)[0][0]
    del rng
    prompt = (
        "The .csv files directly inside data/ (not its subdirectories, not other extensions) "
        "share the header id,region,product,amount. Which region has the largest total "
        "amount over all their rows? Answer with the region name only."
    )
    cmd = (
        "awk -F, 'FNR > 1 { s[$2] += $4 } END { for (r in s) print s[r], r }' data/*.csv "
        "| sort -rn | head -n 1 | cut -d' ' -f2"
    )
    return Task("top_region", prompt, gold, (cmd,))


@_task
def error_components(rng: random.Random, tree: Tree) -> Task:
    level = rng.choice(("ERROR", "WARN", "INFO"))
    name = rng.choice(["*.log", *sorted(tree.logs)])  # all logs, or one of them
    logs = tree.logs.values() if name == "*.log" else [tree.logs[name]]
    gold = len({ln.component for log in logs for ln in log if ln.level == level})
    where = "the files matching logs/*.log" if name == "*.log" else f"logs/{name}"
    prompt = (
        "Log lines look like `YYYY-MM-DD HH:MM:SS LEVEL component: message`. How many "
        f"distinct components have at least one {level} line in {where}? Answer with a number."
    )
    cmd = f"grep -h ' {level} ' logs/{name} | cut -d' ' -f4 | sort -u | wc -l"
    return Task("error_components", prompt, str(gold), (cmd,))


@_task
def merge_tables(rng: random.Random, tree: Tree) -> Task:
    del rng
    rows = sorted(row for table in tree.tables.values() for row in table)
    expected = Tree.table_text(rows).encode()
    prompt = (
        "The .csv files directly inside data/ share the header id,region,product,amount. "
        "Create /work/all.csv holding that header once, then every data row of those files, "
        "sorted by id (numerically, ascending).\nReply `done` when finished."
    )

    def check(work: WorkTree) -> tuple[bool, str]:
        entry = work.get("all.csv")
        if entry is None or entry.kind != "file":
            return False, "all.csv is not a regular file"
        ok = entry.content in (expected, expected.rstrip(b"\n"))
        return ok, "ok" if ok else "all.csv does not hold the sorted rows under one header"

    cmd = "{ echo id,region,product,amount; tail -q -n +2 data/*.csv | sort -t, -k1,1n; } > all.csv"
    return Task("merge_tables", prompt, expected.decode(), (cmd,), check)
