"""Generate ``db`` instances (question + gold SQL + gold result) deterministically from a seed.

``generate(seed, difficulty, databases, kinds)``:

1. ``rng = random.Random(f"db/{difficulty}/{seed}/{attempt}")`` for ``attempt = 0, 1, ...``;
2. pick a database; then a kind among ``kinds`` that has templates for that database and
   difficulty (no draw when only one kind is possible, so ``kinds=("select",)`` gives exactly
   the instances of the read-only family); then a template of that kind and its parameters;
3. ``select``: run the gold SQL on a trusted read-only connection; keep the instance only when
   the gold result is a usable answer (1 to :data:`MAX_ANSWER_VALUES` values, no NULL, no
   duplicates for ``set`` answers, no tie in the top ``k + 1`` sort keys for ``top`` answers);
4. ``insert`` / ``update`` / ``delete``: run the gold statements, in order, on a private copy
   (:class:`entropace.envs.db.private.PrivateDb`, through the same sandbox the agent uses);
   keep the instance only when every statement succeeds and changes at least one row, the
   statements change at most :data:`MAX_GOLD_CHANGES` rows in all, and the final state of the
   touched tables differs from the original; the gold is that final state (its diff);
5. otherwise try the next attempt (so the same seed always gives the same instance).

Content splits (:mod:`entropace.envs.splits`): the seed's split (:func:`split_of`) decides
the databases and instances it may draw. ``test_unseen`` draws only the held-out databases
(:data:`UNSEEN_DATABASES`), ``train`` and ``test`` only the others; among those, an instance
belongs to ``test`` when its key ``database + "\n" + question`` hashes into
:data:`TEST_FRACTION` (salt ``"db/test"``), else to ``train``, and an attempt drawing an
instance of the other side is rejected before any SQL runs. The first observation is a function
of (database, question) and the gold of the question, so two instances share a fingerprint
(first observation + gold) exactly when they share that key: no ``test`` or ``test_unseen``
instance equals a ``train`` one.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from entropace.envs.db.build import TABLE_SOURCES, database_path
from entropace.envs.db.table_templates import table_templates, table_write_templates
from entropace.envs.db.templates import Template, templates_for
from entropace.envs.db.trusted import TRUSTED_LOCK as _LOCK
from entropace.envs.db.trusted import _open_trusted, trusted_connection
from entropace.envs.db.write_templates import WriteTemplate, write_templates_for
from entropace.envs.splits import Split, SplitUnavailable, in_test_bucket, split_of

#: Longest gold answer (number of values) an instance may have.
MAX_ANSWER_VALUES = 10
#: Attempts before giving up on a seed (never reached with the shipped templates; a ``test``
#: seed rejects about 9 in 10 draws before any SQL runs, so the budget is generous).
MAX_ATTEMPTS = 5000
#: Databases held out for ``test_unseen`` (never drawn by ``train`` or ``test`` seeds).
UNSEEN_DATABASES: tuple[str, ...] = ("burtin", "la_riots", "penguins", "seattle_weather")
#: Share of the seen databases' instances (by key) that form ``test``.
TEST_FRACTION = 0.1
#: Most rows the gold statements of a write instance may change in all.
MAX_GOLD_CHANGES = 5000
#: Task kinds, in the canonical order of the ``kinds`` option.
KINDS: tuple[str, ...] = ("select", "insert", "update", "delete")
#: Wall-clock limit of one gold statement while generating an instance (seconds).
GOLD_TIMEOUT_S = 20.0


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
        kind: ``select`` (answer a question) or ``insert`` / ``update`` / ``delete`` (change
            the database; scored by the final state of ``tables``).
        tables: write tasks: the tables the gold statements change, the only ones the agent
            may write; ``()`` for ``select``.
        statements: write tasks: the gold statements, in order (``sql`` joins them with
            ``";\n"``); ``()`` for ``select``.
        gold_diff: write tasks: the net change the gold statements make to ``tables``
            (:data:`entropace.envs.db.private.StateDiff`); ``()`` for ``select``.
        gold_digest: write tasks: SHA-256 of ``gold_diff``
            (:func:`entropace.envs.db.private.diff_digest`); ``""`` for ``select``.
    """

    database: str
    template: str
    question: str
    sql: str
    gold: tuple[object, ...]
    ordered: bool
    decimals: int | None
    kind: str = "select"
    tables: tuple[str, ...] = ()
    statements: tuple[str, ...] = ()
    gold_diff: tuple = ()
    gold_digest: str = ""


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


def _bind(
    database: str, params: dict[str, str | tuple], rng: random.Random
) -> tuple[dict[str, object], dict[str, str]] | None:
    """Draw the parameters of a template: (text arguments, SQL-literal arguments), or None."""
    text_args: dict[str, object] = {}
    sql_args: dict[str, str] = {}
    for names, pool_spec in params.items():
        pool = _pool(database, pool_spec) if isinstance(pool_spec, str) else pool_spec
        if not pool:
            return None
        choice = rng.choice(pool)
        values = choice if isinstance(choice, tuple) else (choice,)
        for name, value in zip(names.split(","), values):
            text_args[name] = value
            sql_args[name] = sql_literal(value)
    return text_args, sql_args


def _try(
    database: str, t: Template, rng: random.Random, split: Split | None = None
) -> Instance | None:
    bound = _bind(database, t.params, rng)
    if bound is None:
        return None
    text_args, sql_args = bound
    k = rng.choice(t.ks) if t.kind == "top" else 1
    question = t.question.format(**text_args, k=k) + " " + _answer_instruction(t, k)
    if split is not None and not in_split(database, question, split):
        return None
    probe_sql = t.sql.format(**sql_args, k=k + 1)
    rows = _probe(database, probe_sql)
    if not _usable(t, rows, k):
        return None
    gold = tuple(r[0] for r in rows[:k]) if t.kind == "top" else tuple(r[0] for r in rows)
    return Instance(
        database=database,
        template=t.name,
        question=question,
        sql=t.sql.format(**sql_args, k=k),
        gold=gold,
        ordered=t.kind == "top",
        decimals=t.decimals,
    )


def _try_write(
    database: str, t: WriteTemplate, rng: random.Random, split: Split | None = None
) -> Instance | None:
    bound = _bind(database, t.params, rng)
    if bound is None:
        return None
    text_args, sql_args = bound
    if split is not None and not in_split(database, t.question.format(**text_args), split):
        return None
    statements = tuple(s.format(**sql_args) for s in t.statements)
    diff, digest = _gold(database, statements, t.tables)
    if not diff:
        return None
    return Instance(
        database=database,
        template=t.name,
        question=t.question.format(**text_args),
        sql=";\n".join(statements),
        gold=(),
        ordered=False,
        decimals=None,
        kind=t.kind,
        tables=tuple(sorted(t.tables)),
        statements=statements,
        gold_diff=diff,
        gold_digest=digest,
    )


@functools.lru_cache(maxsize=8192)
def _probe(database: str, sql: str) -> tuple[tuple, ...]:
    """The first rows of a gold query (cached: templates with few parameters repeat them, and
    some flights queries take 0.2 s)."""
    with _LOCK:
        rows = trusted_connection(database).execute(sql).fetchmany(MAX_ANSWER_VALUES + 2)
    return tuple(rows)


def gold_diff(database: str, statements: tuple[str, ...], tables: tuple[str, ...]) -> tuple:
    """The net change of ``statements`` run in order on a fresh private copy of ``database``.

    ``()`` when the instance is unusable: a statement fails or changes no row, more than
    :data:`MAX_GOLD_CHANGES` rows change, or the final state equals the original.
    """
    from entropace.envs.db.private import PrivateDb

    db = PrivateDb(database, tables)
    try:
        total = 0
        for stmt in statements:
            res = db.execute(stmt, max_rows=1, timeout_s=GOLD_TIMEOUT_S)
            if res.error is not None or res.rows_changed < 1:
                return ()
            total += res.rows_changed
        if total > MAX_GOLD_CHANGES:
            return ()
        return db.diff()
    finally:
        db.close()


@functools.lru_cache(maxsize=256)  # a diff holds up to ~10k rows: keep the cache small
def _gold(database: str, statements: tuple[str, ...], tables: tuple[str, ...]) -> tuple:
    from entropace.envs.db.private import diff_digest

    diff = gold_diff(database, statements, tables)
    return diff, diff_digest(diff)


def parse_kinds(kinds: str | Sequence[str]) -> tuple[str, ...]:
    """The ``kinds`` option as a tuple in canonical order (``"all"``: every kind).

    Accepts ``"select,insert"`` (comma-separated, any order, spaces ignored), ``"all"`` or a
    sequence of names; raises ``ValueError`` naming the allowed values otherwise.
    """
    items = kinds.split(",") if isinstance(kinds, str) else list(kinds)
    names = {str(k).strip().lower() for k in items if str(k).strip()}
    if names == {"all"}:
        return KINDS
    bad = sorted(names - set(KINDS))
    if bad or not names:
        raise ValueError(
            f"kinds must be 'all' or a comma-separated subset of {list(KINDS)}, got {kinds!r}"
        )
    return tuple(k for k in KINDS if k in names)


def in_split(database: str, question: str, split: Split) -> bool:
    """Whether the instance (``database``, ``question``) belongs to ``split`` (module doc)."""
    if database in UNSEEN_DATABASES:
        return split == "test_unseen"
    if split == "test_unseen":
        return False
    return in_test_bucket(f"{database}\n{question}", TEST_FRACTION, "db/test") == (split == "test")


def split_databases(databases: Sequence[str], split: Split) -> list[str]:
    """The databases of ``databases`` that ``split`` draws (sorted); may be empty."""
    return sorted(d for d in databases if (d in UNSEEN_DATABASES) == (split == "test_unseen"))


def pool_counts(difficulty: str) -> dict[str, int]:
    """Sizes of the content pools (``EnvSpec.pools`` / ``envs stats``): databases per side and
    templates of each kind at ``difficulty`` (the instances are their parameter spaces)."""
    from entropace.envs.db.build import SOURCES

    out = {
        "databases train/test": len(split_databases(SOURCES, "train")),
        "databases test_unseen": len(split_databases(SOURCES, "test_unseen")),
    }
    for kind in KINDS:
        out[f"templates {kind}"] = sum(len(_templates_of(d, difficulty, kind)) for d in SOURCES)
    return out


def _templates_of(database: str, difficulty: str, kind: str) -> tuple:
    if database in TABLE_SOURCES:
        if kind == "select":
            return table_templates(database, difficulty)
        return table_write_templates(database, difficulty, kind)
    if kind == "select":
        return templates_for(database, difficulty)
    return write_templates_for(database, difficulty, kind)


def generate(
    seed: int,
    difficulty: str,
    databases: Sequence[str],
    kinds: Sequence[str] = ("select",),
) -> Instance:
    """The instance of ``seed`` at ``difficulty`` over ``databases`` (deterministic).

    ``kinds``: the task kinds to draw from (see :func:`parse_kinds`); the default gives the
    read-only instances exactly as before write tasks existed.
    """
    split = split_of(seed)
    wanted = parse_kinds(kinds)
    dbs = [
        d
        for d in split_databases(databases, split)
        if any(_templates_of(d, difficulty, k) for k in wanted)
    ]
    if not dbs:
        raise SplitUnavailable(
            f"db: no database of {sorted(databases)} has {difficulty} templates of kinds "
            f"{list(wanted)} in split {split!r} (held out for test_unseen: "
            f"{list(UNSEEN_DATABASES)})"
        )
    for attempt in range(MAX_ATTEMPTS):
        rng = random.Random(f"db/{difficulty}/{seed}/{attempt}")
        database = rng.choice(dbs)
        avail = [k for k in wanted if _templates_of(database, difficulty, k)]
        kind = avail[0] if len(avail) == 1 else rng.choice(avail)
        templates = _templates_of(database, difficulty, kind)
        if kind == "select":
            inst = _try(database, rng.choice(templates), rng, split)
        else:
            inst = _try_write(database, rng.choice(templates), rng, split)
        if inst is not None:
            return inst
    raise RuntimeError(f"db: no usable instance for seed {seed} after {MAX_ATTEMPTS} attempts")


def table_columns(database: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The tables of ``database`` with their column names, in creation order."""
    return _table_columns_at(str(database_path(database)))


@cache
def _table_columns_at(path: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    with _LOCK:
        conn = _open_trusted(path, os.getpid())
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                "'sqlite_%' ORDER BY rowid"
            ).fetchall()
        ]
        return tuple(
            (t, tuple(r[1] for r in conn.execute(f'PRAGMA table_info("{t}")').fetchall()))
            for t in tables
        )


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
            for row in conn.execute(f'PRAGMA foreign_key_list("{table}")').fetchall()
        }
        cols = []
        for _, name, ctype, _, _, pk in conn.execute(f'PRAGMA table_info("{table}")').fetchall():
            col = f"{name} {ctype}"
            if pk:
                col += " PK"
            if name in fks:
                col += f" -> {fks[name]}"
            cols.append(col)
        (n_rows,) = conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()
        lines.append(f"  {table}({', '.join(cols)})  [{n_rows} rows]")
    return "\n".join(lines)
