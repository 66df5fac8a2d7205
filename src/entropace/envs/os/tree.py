"""Seeded generation of the file tree an ``os`` instance starts from.

The tree is described as data (:class:`Tree`: logs, CSV tables, config files, scripts, docs,
nested source dirs, hidden dirs) so that task generators compute gold answers in Python,
independently of the shell commands the oracle runs. :meth:`Tree.files` renders it to
:class:`~entropace.envs.os.worktree.FileSpec` s. Everything is drawn from the ``random.Random``
the caller passes in (never the global RNG), so a seed fixes the tree byte for byte.

Difficulty scales the tree: more and longer files, deeper nesting, hidden directories,
distractors (commented-out config keys, rotated logs, backup CSVs, archive subdirectories)
and, on ``hard``, file names with spaces.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from entropace.envs.os.worktree import BASE_MTIME, FileSpec

__all__ = ["LEVELS", "LogLine", "Tree", "generate_tree"]

LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARN", "ERROR")
COMPONENTS: tuple[str, ...] = ("auth", "db", "api", "cache", "worker", "scheduler", "mailer")
MESSAGES: tuple[str, ...] = (
    "request {n} handled in {m} ms",
    "connection {n} opened",
    "connection {n} closed after {m} s",
    "retrying job {n} (attempt {m})",
    "cache miss for key k{n}",
    "user u{n} logged in",
    "queue depth is {n}",
    "timeout talking to node {n}",
    "disk usage at {m} percent",
    "failed to parse record {n}",
)
USERS: tuple[str, ...] = (
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
    "mallory", "nina", "oscar", "peggy", "rupert", "sybil", "trent", "victor", "walter", "yara",
)  # fmt: skip
PATHS: tuple[str, ...] = ("/", "/login", "/logout", "/api/items", "/api/orders", "/static/app.js")
REGIONS: tuple[str, ...] = ("north", "south", "east", "west", "central")
PRODUCTS: tuple[str, ...] = ("widget", "gadget", "gizmo", "sprocket", "doohickey")
WORDS: tuple[str, ...] = (
    "alpha", "bravo", "cedar", "delta", "ember", "fjord", "gamma", "harbor", "indigo", "juniper",
    "kepler", "lumen", "maple", "nectar", "onyx", "pepper", "quartz", "raven", "sierra", "tundra",
)  # fmt: skip
SERVICES: tuple[str, ...] = ("server", "database", "proxy", "worker", "scheduler", "mailer")
CONFIG_KEYS: tuple[str, ...] = (
    "host", "port", "timeout", "retries", "log_level", "user", "workers", "cache_size",
)  # fmt: skip

_SIZES: dict[str, dict[str, tuple[int, int]]] = {
    # name -> (min, max) counts per difficulty
    "easy": {"logs": (1, 2), "lines": (8, 14), "csv": (1, 2), "rows": (5, 9), "conf": (1, 2),
             "scripts": (2, 3), "docs": (2, 3), "depth": (1, 1), "misc": (2, 4)},
    "medium": {"logs": (2, 3), "lines": (14, 26), "csv": (2, 4), "rows": (8, 16), "conf": (2, 3),
               "scripts": (3, 5), "docs": (3, 5), "depth": (2, 3), "misc": (4, 7)},
    "hard": {"logs": (3, 5), "lines": (20, 36), "csv": (4, 6), "rows": (10, 22), "conf": (3, 4),
             "scripts": (4, 6), "docs": (4, 7), "depth": (3, 4), "misc": (6, 10)},
}  # fmt: skip


@dataclass(frozen=True)
class LogLine:
    """``YYYY-MM-DD HH:MM:SS LEVEL component: message`` (timestamps unique in a tree)."""

    ts: str
    level: str
    component: str
    message: str

    def render(self) -> str:
        return f"{self.ts} {self.level} {self.component}: {self.message}"


@dataclass
class Tree:
    """The generated instance data, by role. Paths are relative to ``/work``.

    Attributes:
        logs: ``logs/<name>.log`` application logs (the ones tasks ask about).
        access: lines ``<user> <METHOD> <path> <status>`` of ``logs/access.log``.
        tables: ``data/<name>.csv`` tables: rows of (id, region, product, amount).
        configs: ``config/<name>.conf`` -> (key -> value) of the *active* settings.
        config_text: the rendered config files (with distractor lines on medium/hard).
        scripts: ``scripts/<name>`` -> (content, mode).
        docs: ``docs/<name>`` -> content.
        other: every other file (nested sources, hidden caches, distractors) -> content.
        extra: files a task adds with their own mode (path -> (content, mode)).
    """

    difficulty: str
    logs: dict[str, list[LogLine]] = field(default_factory=dict)
    access: list[str] = field(default_factory=list)
    tables: dict[str, list[tuple[int, str, str, int]]] = field(default_factory=dict)
    configs: dict[str, dict[str, str]] = field(default_factory=dict)
    config_text: dict[str, str] = field(default_factory=dict)
    scripts: dict[str, tuple[str, int]] = field(default_factory=dict)
    docs: dict[str, str] = field(default_factory=dict)
    other: dict[str, str] = field(default_factory=dict)
    extra: dict[str, tuple[str, int]] = field(default_factory=dict)
    clock: int = 0  # seconds after the base time of the last log line (keeps ts unique)

    def next_ts(self, rng: random.Random) -> str:
        """A timestamp strictly later than every one issued so far in this tree."""
        import datetime as dt

        self.clock += rng.randint(1, 900)
        t = dt.datetime(2024, 3, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=self.clock)
        return t.strftime("%Y-%m-%d %H:%M:%S")

    @staticmethod
    def table_text(rows: list[tuple[int, str, str, int]]) -> str:
        lines = ["id,region,product,amount", *(f"{i},{r},{p},{a}" for i, r, p, a in rows)]
        return "\n".join(lines) + "\n"

    def files(self) -> list[FileSpec]:
        """Render the tree (deterministic order and mtimes)."""
        out: dict[str, tuple[str, int]] = {}
        for name, lines in self.logs.items():
            out[f"logs/{name}"] = ("".join(line.render() + "\n" for line in lines), 0o644)
        out["logs/access.log"] = ("".join(line + "\n" for line in self.access), 0o644)
        for name, rows in self.tables.items():
            out[f"data/{name}"] = (self.table_text(rows), 0o644)
        for name, text in self.config_text.items():
            out[f"config/{name}"] = (text, 0o644)
        for name, (text, mode) in self.scripts.items():
            out[f"scripts/{name}"] = (text, mode)
        for name, text in self.docs.items():
            out[f"docs/{name}"] = (text, 0o644)
        for path, text in self.other.items():
            out[path] = (text, 0o644)
        out.update(self.extra)
        return [
            FileSpec(path, text.encode(), mode, BASE_MTIME + 60 * i)
            for i, (path, (text, mode)) in enumerate(sorted(out.items()))
        ]

    def sizes(self, prefix: str) -> dict[str, int]:
        """Byte size of every file directly inside directory ``prefix`` (e.g. ``"data"``)."""
        return {
            f.path[len(prefix) + 1 :]: len(f.content)
            for f in self.files()
            if f.path.startswith(prefix + "/") and "/" not in f.path[len(prefix) + 1 :]
        }


def _count(rng: random.Random, difficulty: str, key: str) -> int:
    lo, hi = _SIZES[difficulty][key]
    return rng.randint(lo, hi)


def _name(rng: random.Random, spaces: bool, *, sep: str = "_") -> str:
    a, b = rng.sample(WORDS, 2)
    return f"{a} {b}" if spaces and rng.random() < 0.5 else f"{a}{sep}{b}"


def _log_line(tree: Tree, rng: random.Random, level: str | None = None) -> LogLine:
    msg = rng.choice(MESSAGES).format(n=rng.randint(1, 9999), m=rng.randint(1, 99))
    lvl = level or rng.choices(LEVELS, weights=(2, 5, 2, 1))[0]
    return LogLine(tree.next_ts(rng), lvl, rng.choice(COMPONENTS), msg)


def _config_value(rng: random.Random, key: str) -> str:
    values = {
        "host": lambda: f"{rng.choice(WORDS)}-{rng.randint(1, 9)}.internal",
        "port": lambda: str(rng.randint(1024, 65535)),
        "timeout": lambda: str(rng.randint(1, 120)),
        "retries": lambda: str(rng.randint(0, 9)),
        "log_level": lambda: rng.choice(("debug", "info", "warning", "error")),
        "user": lambda: rng.choice(USERS),
        "workers": lambda: str(rng.randint(1, 64)),
        "cache_size": lambda: f"{rng.randint(1, 512)}M",
    }
    return values[key]()


def generate_tree(rng: random.Random, difficulty: str) -> Tree:
    """Draw a whole tree for ``difficulty`` from ``rng``."""
    tree = Tree(difficulty)
    hard = difficulty == "hard"
    distract = difficulty != "easy"

    for k in range(_count(rng, difficulty, "logs")):
        n = _count(rng, difficulty, "lines")
        lines = [_log_line(tree, rng) for _ in range(n)]
        lines[rng.randrange(n)] = _log_line(tree, rng, "ERROR")  # every log has an ERROR
        lines.sort(key=lambda line: line.ts)
        tree.logs[f"app-{k}.log"] = lines
    users = rng.sample(USERS, rng.randint(3, 8 if distract else 5))
    tree.access = [
        f"{rng.choice(users)} {rng.choice(('GET', 'POST'))} {rng.choice(PATHS)} "
        f"{rng.choice((200, 200, 200, 301, 404, 500))}"
        for _ in range(rng.randint(6, 30))
    ]
    if distract:  # rotated log and archived log: not "*.log directly in logs/"
        rotated = [_log_line(tree, rng, "ERROR").render() for _ in range(3)]
        tree.other["logs/app-0.log.1"] = "\n".join(rotated) + "\n"
        tree.other["logs/archive/old.log"] = _log_line(tree, rng, "WARN").render() + "\n"

    ids = iter(range(1, 10_000))
    for _ in range(_count(rng, difficulty, "csv")):
        rows = [
            (next(ids), rng.choice(REGIONS), rng.choice(PRODUCTS), rng.randint(1, 999))
            for _ in range(_count(rng, difficulty, "rows"))
        ]
        name = f"{_name(rng, hard, sep='-')}.csv"
        while name in tree.tables:
            name = f"{_name(rng, hard, sep='-')}.csv"
        tree.tables[name] = rows
    if distract:
        first = next(iter(tree.tables.values()))
        tree.other["data/archive/2023.csv"] = Tree.table_text(first[:3])
    if hard:
        tree.other["data/sales.csv.bak"] = Tree.table_text(first[:2])

    for service in rng.sample(SERVICES, _count(rng, difficulty, "conf")):
        keys = rng.sample(CONFIG_KEYS, rng.randint(4, len(CONFIG_KEYS)))
        settings = {key: _config_value(rng, key) for key in keys}
        lines = [f"# {service} configuration"]
        for key, value in settings.items():
            if distract and rng.random() < 0.5:  # a commented-out older value first
                lines.append(f"# {key} = {_config_value(rng, key)}")
            if distract and rng.random() < 0.3:  # a longer key with the same prefix
                lines.append(f"{key}_backup = {_config_value(rng, key)}")
            lines.append(f"{key} = {value}")
        tree.configs[f"{service}.conf"] = settings
        tree.config_text[f"{service}.conf"] = "\n".join(lines) + "\n"

    for _ in range(_count(rng, difficulty, "scripts")):
        name = f"{rng.choice(WORDS)}_{rng.randint(1, 99)}.sh"
        body = f"#!/bin/sh\necho {rng.choice(WORDS)}\n"
        tree.scripts[name] = (body, 0o644)
    tree.scripts["README.txt"] = ("helper scripts\n", 0o644)

    for _ in range(_count(rng, difficulty, "docs")):
        name = f"{_name(rng, hard)}.txt"
        tree.docs[name] = " ".join(rng.choices(WORDS, k=rng.randint(5, 40))) + "\n"
    tree.docs["index.md"] = "# docs\n"

    depth = _count(rng, difficulty, "depth")
    for _ in range(_count(rng, difficulty, "misc")):
        parts = ["src", *rng.sample(WORDS, rng.randint(1, depth))]
        ext = rng.choice(("py", "txt", "md", "json"))
        tree.other["/".join([*parts, f"{rng.choice(WORDS)}.{ext}"])] = f"{rng.choice(WORDS)}\n"
    if distract:
        for _ in range(rng.randint(1, 3)):
            name = f"{rng.choice(WORDS)}.{rng.choice(('txt', 'json'))}"
            tree.other[f".cache/{rng.choice(WORDS)}/{name}"] = "cached\n"
    return tree
