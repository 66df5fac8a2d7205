"""Generate ``db`` instances (question + gold SQL + gold result) deterministically from a seed.

``generate(seed, difficulty, databases)``:

1. ``rng = random.Random(f"db/{difficulty}/{seed}/{attempt}")`` for ``attempt = 0, 1, ...``;
2. pick a database, a template of that difficulty, and its parameters from the pools;
3. run the gold SQL on a trusted read-only connection; keep the instance only when the gold
   result is a usable answer (1 to :data:`MAX_ANSWER_VALUES` values, no NULL, no duplicates
   for ``set`` answers, no tie in the top ``k + 1`` sort keys for ``top`` answers); otherwise
   try the next attempt (so the same seed always gives the same instance).
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from entropace.envs.db.build import database_path
from entropace.envs.db.templates import Template, templates_for

#: Longest gold answer (number of values) an instance may have.
MAX_ANSWER_VALUES = 10
#: Attempts before giving up on a seed (never reached with the shipped templates).
MAX_ATTEMPTS = 200


@dataclass(frozen=True)
class Instance:
    """One question.

    Attributes:
        database: database name.
        template: template name.
        question: the full question text, with the answer format instruction.
        sql: the gold SQL (what the oracle runs; ``top`` queries also select the sort key).
        gold: the gold answer values (first result column).
        ordered: whether the answer is an ordered list.
        decimals: numbers are to be rounded to this many decimals (None: exact, tol 1e-4).
    """

    database: str
    template: str
    question: str
    sql: str
    gold: tuple[object, ...]
    ordered: bool
    decimals: int | None


#: Serialises use of the shared trusted connections (environments may live in threads).
_LOCK = threading.RLock()


def trusted_connection(database: str) -> sqlite3.Connection:
    """A read-only connection (no authorizer) for gold SQL and pools; one per file and process.

    Keyed by process id too: a connection must not be used across ``fork``.
    """
    return _open_trusted(str(database_path(database)), os.getpid())


@cache
def _open_trusted(path: str, pid: int) -> sqlite3.Connection:
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.execute("PRAGMA query_only=ON")
    return conn


def _pool(database: str, sql: str) -> tuple[tuple, ...]:
    return _pool_at(str(database_path(database)), sql)


@cache
def _pool_at(path: str, sql: str) -> tuple[tuple, ...]:
    with _LOCK:
        rows = _open_trusted(path, os.getpid()).execute(sql).fetchall()
    rows = [r for r in rows if all(v is not None for v in r)]
    return tuple(sorted(set(rows), key=lambda r: tuple(str(v) for v in r)))


def sql_literal(value: object) -> str:
    """``value`` as a SQL literal (strings quoted, quotes doubled)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"cannot write {value!r} as a SQL literal")
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def _answer_instruction(t: Template, k: int) -> str:
    if t.kind == "set":
        text = "Give all of them, in any order."
    elif t.kind == "top" and k > 1:
        text = f"Give exactly {k} values, in order."
    else:
        text = "Answer with a single value."
    if t.decimals is not None:
        text += f" Round numbers to {t.decimals} decimals."
    return text


def _usable(t: Template, rows: Sequence[tuple], k: int) -> bool:
    """Whether ``rows`` (gold SQL run with LIMIT k + 1 for ``top``) make an unambiguous answer."""
    if not rows or any(v is None for r in rows for v in r):
        return False
    if t.kind == "top":
        keys = [r[-1] for r in rows]
        return len(rows) >= k and len(set(keys)) == len(keys)
    if t.kind == "one":
        return len(rows) == 1
    values = [r[0] for r in rows]
    return len(values) <= MAX_ANSWER_VALUES and len(set(values)) == len(values)


def _try(database: str, t: Template, rng: random.Random) -> Instance | None:
    text_args: dict[str, object] = {}
    sql_args: dict[str, str] = {}
    for names, pool_spec in t.params.items():
        pool = _pool(database, pool_spec) if isinstance(pool_spec, str) else pool_spec
        if not pool:
            return None
        choice = rng.choice(pool)
        values = choice if isinstance(choice, tuple) else (choice,)
        for name, value in zip(names.split(","), values):
            text_args[name] = value
            sql_args[name] = sql_literal(value)
    k = rng.choice(t.ks) if t.kind == "top" else 1
    probe_sql = t.sql.format(**sql_args, k=k + 1)
    with _LOCK:
        rows = trusted_connection(database).execute(probe_sql).fetchmany(MAX_ANSWER_VALUES + 2)
    if not _usable(t, rows, k):
        return None
    gold = tuple(r[0] for r in rows[:k]) if t.kind == "top" else tuple(r[0] for r in rows)
    question = t.question.format(**text_args, k=k) + " " + _answer_instruction(t, k)
    return Instance(
        database=database,
        template=t.name,
        question=question,
        sql=t.sql.format(**sql_args, k=k),
        gold=gold,
        ordered=t.kind == "top",
        decimals=t.decimals,
    )


def generate(seed: int, difficulty: str, databases: Sequence[str]) -> Instance:
    """The instance of ``seed`` at ``difficulty`` over ``databases`` (deterministic)."""
    dbs = sorted(databases)
    for attempt in range(MAX_ATTEMPTS):
        rng = random.Random(f"db/{difficulty}/{seed}/{attempt}")
        database = rng.choice(dbs)
        templates = templates_for(database, difficulty)
        if not templates:
            raise ValueError(f"no {difficulty} templates for database {database!r}")
        inst = _try(database, rng.choice(templates), rng)
        if inst is not None:
            return inst
    raise RuntimeError(f"db: no usable instance for seed {seed} after {MAX_ATTEMPTS} attempts")


def schema_text(database: str) -> str:
    """The schema of ``database``: one line per table with columns, keys and row count."""
    return _schema_text_at(str(database_path(database)))


@cache
def _schema_text_at(path: str) -> str:
    with _LOCK:
        return _read_schema(path)


def _read_schema(path: str) -> str:
    conn = _open_trusted(path, os.getpid())
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY rowid"
        ).fetchall()
    ]
    lines = []
    for table in tables:
        fks = {
            row[3]: f"{row[2]}.{row[4]}"
            for row in conn.execute(f"PRAGMA foreign_key_list({table})").fetchall()
        }
        cols = []
        for _, name, ctype, _, _, pk in conn.execute(f"PRAGMA table_info({table})").fetchall():
            col = f"{name} {ctype}"
            if pk:
                col += " PK"
            if name in fks:
                col += f" -> {fks[name]}"
            cols.append(col)
        (n_rows,) = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
        lines.append(f"  {table}({', '.join(cols)})  [{n_rows} rows]")
    return "\n".join(lines)
