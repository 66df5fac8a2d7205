"""Generic question and write templates for the one-table databases (``build.TABLE_SOURCES``).

AgentBench DBBench's samples are one table each, with questions of the kinds ``other``
(look-ups), ``counting``, ``comparison``, ``ranking`` and ``aggregation-SUM/MIN/MAX/AVG``, and
INSERT / UPDATE tasks (``data/dbbench/standard.jsonl`` at commit 578c5e9). The templates here
cover those kinds over any table, from the roles of its columns, read from the built database:

* **numeric**: an INTEGER or REAL column with at least 5 distinct values;
* **category**: a column with 2 to 30 distinct values, each on 2 rows or more on average;
* **label**: a TEXT column with at least 10 values that occur on exactly one row (the rows a
  look-up can name; only those values are drawn).

Levels: ``easy`` (count by category, look-up by label, min / max by category; write: update one
row by label, insert a row), ``medium`` (average and sum by category, count above a value,
top-k by a numeric column; write: update and delete by category), ``hard`` (the category with
the highest average, overall or among rows over a threshold, averages and counts under two
conditions, counts against the table's average, labels under two conditions; write:
scale a column under two conditions, delete under two conditions). Column and table names
appear verbatim, as AgentBench's questions use the table's headers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

from entropace.envs.db.build import TABLE_SOURCES, database_path
from entropace.envs.db.templates import Template
from entropace.envs.db.trusted import TRUSTED_LOCK, _open_trusted
from entropace.envs.db.write_templates import WriteTemplate

#: Most columns of each role used in templates (keeps wide tables from dominating).
MAX_NUMERIC, MAX_CATEGORY, MAX_LABEL = 5, 3, 2


@dataclass(frozen=True)
class Roles:
    """The columns of a one-table database by role (see the module docstring)."""

    table: str
    columns: tuple[str, ...]
    numeric: tuple[str, ...]
    category: tuple[str, ...]
    label: tuple[str, ...]


def _q(name: str) -> str:
    return f'"{name}"'


@cache
def roles(database: str) -> Roles:
    """The column roles of the one-table database ``database`` (read once per process)."""
    table = TABLE_SOURCES[database].table
    with TRUSTED_LOCK:
        conn = _open_trusted(str(database_path(database, progress=False)), os.getpid())
        info = conn.execute(f"PRAGMA table_info({_q(table)})").fetchall()
        (n_rows,) = conn.execute(f"SELECT COUNT(*) FROM {_q(table)}").fetchone()
        stats = {}
        for _, col, ctype, *_ in info:
            distinct, single = conn.execute(
                f"SELECT COUNT(*), SUM(n = 1) FROM (SELECT COUNT(*) AS n FROM {_q(table)} "
                f"WHERE {_q(col)} IS NOT NULL GROUP BY {_q(col)})"
            ).fetchone()
            stats[col] = (ctype, distinct, single or 0)
    columns = tuple(c for _, c, *_ in info)
    numeric = [c for c in columns if stats[c][0] in ("INTEGER", "REAL") and stats[c][1] >= 5]
    category = [c for c in columns if 2 <= stats[c][1] <= 30 and stats[c][1] * 2 <= n_rows]
    label = sorted(
        (c for c in columns if stats[c][0] == "TEXT" and stats[c][2] >= 10),
        key=lambda c: -stats[c][2],
    )
    return Roles(
        table=table,
        columns=columns,
        numeric=tuple(c for c in numeric if c not in category)[:MAX_NUMERIC],
        category=tuple(category)[:MAX_CATEGORY],
        label=tuple(label)[:MAX_LABEL],
    )


def _unique(t: str, col: str, *also: str) -> str:
    """Pool: values of ``col`` on exactly one row (with ``also`` columns not NULL)."""
    cond = " AND ".join(f"{_q(c)} IS NOT NULL" for c in (col, *also))
    return f"SELECT {_q(col)} FROM {_q(t)} WHERE {cond} GROUP BY {_q(col)} HAVING COUNT(*) = 1"


def _distinct(t: str, col: str) -> str:
    return f"SELECT DISTINCT {_q(col)} FROM {_q(t)} WHERE {_q(col)} IS NOT NULL"


@cache
def table_templates(database: str, difficulty: str) -> tuple[Template, ...]:
    """The question templates of the one-table database ``database`` at ``difficulty``."""
    r = roles(database)
    t, T = r.table, _q(r.table)
    out: list[Template] = []

    def add(what: str, question: str, sql: str, params: dict | None = None, **kw: object) -> None:
        params = params or {}
        out.append(Template(f"{database}.{difficulty}.{what}", question, sql, params, **kw))

    if difficulty == "easy":
        for c in r.category:
            add(
                f"count.{c}",
                f"How many rows of the {t} table have {c} equal to {{v}}?",
                f"SELECT COUNT(*) FROM {T} WHERE {_q(c)} = {{v}}",
                {"v": _distinct(t, c)},
            )
            for n in r.numeric:
                for fn, word in (("MAX", "largest"), ("MIN", "smallest")):
                    add(
                        f"{fn.lower()}.{c}.{n}",
                        f"What is the {word} {n} among the rows of the {t} table with {c} "
                        "equal to {v}?",
                        f"SELECT {fn}({_q(n)}) FROM {T} WHERE {_q(c)} = {{v}}",
                        {"v": _distinct(t, c)},
                    )
        for k in r.label:
            for col in (*r.numeric, *r.category):
                add(
                    f"lookup.{k}.{col}",
                    f"What is the {col} of the row of the {t} table whose {k} is {{v}}?",
                    f"SELECT {_q(col)} FROM {T} WHERE {_q(k)} = {{v}}",
                    {"v": _unique(t, k, col)},
                )
    elif difficulty == "medium":
        for c in r.category:
            for n in r.numeric:
                for fn, word in (("AVG", "average"), ("SUM", "total")):
                    add(
                        f"{fn.lower()}.{c}.{n}",
                        f"What is the {word} {n} of the rows of the {t} table with {c} equal "
                        "to {v}?",
                        f"SELECT ROUND({fn}({_q(n)}), 2) FROM {T} WHERE {_q(c)} = {{v}}",
                        {"v": _distinct(t, c)},
                        decimals=2,
                    )
        for n in r.numeric:
            add(
                f"count_gt.{n}",
                f"How many rows of the {t} table have {n} greater than {{x}}?",
                f"SELECT COUNT(*) FROM {T} WHERE {_q(n)} > {{x}}",
                {"x": _distinct(t, n)},
            )
            for k in r.label:
                add(
                    f"top.{k}.{n}",
                    f"Which {{k}} rows of the {t} table have the largest {n}? Give their {k}, "
                    "the largest first.",
                    f"SELECT {_q(k)}, {_q(n)} FROM {T} WHERE {_q(n)} IS NOT NULL "
                    f"ORDER BY {_q(n)} DESC LIMIT {{k}}",
                    kind="top",
                    ks=(1, 2, 3, 4, 5),
                )
    else:
        for c in r.category:
            for n in r.numeric:
                add(
                    f"best_group.{c}.{n}",
                    f"Which {c} has the highest average {n} in the {t} table?",
                    f"SELECT {_q(c)}, AVG({_q(n)}) AS a FROM {T} WHERE {_q(c)} IS NOT NULL "
                    f"GROUP BY {_q(c)} ORDER BY a DESC LIMIT {{k}}",
                    kind="top",
                )
                add(
                    f"above_avg.{c}.{n}",
                    f"How many rows of the {t} table with {c} equal to {{v}} have {n} greater "
                    f"than the average {n} of the whole table?",
                    f"SELECT COUNT(*) FROM {T} WHERE {_q(c)} = {{v}} AND {_q(n)} > "
                    f"(SELECT AVG({_q(n)}) FROM {T})",
                    {"v": _distinct(t, c)},
                )
                for m in r.numeric:
                    add(
                        f"avg_two.{c}.{n}.{m}",
                        f"What is the average {n} of the rows of the {t} table with {c} equal "
                        f"to {{v}} and {m} greater than {{x}}?",
                        f"SELECT ROUND(AVG({_q(n)}), 2) FROM {T} WHERE {_q(c)} = {{v}} "
                        f"AND {_q(m)} > {{x}}",
                        {"v": _distinct(t, c), "x": _distinct(t, m)},
                        decimals=2,
                    )
                    add(
                        f"best_group_where.{c}.{n}.{m}",
                        f"Considering only the rows of the {t} table with {m} greater than "
                        f"{{x}}, which {c} has the highest average {n}?",
                        f"SELECT {_q(c)}, AVG({_q(n)}) AS a FROM {T} WHERE {_q(c)} IS NOT NULL "
                        f"AND {_q(m)} > {{x}} GROUP BY {_q(c)} ORDER BY a DESC LIMIT {{k}}",
                        {"x": _distinct(t, m)},
                        kind="top",
                    )
                for k in r.label:
                    add(
                        f"labels.{k}.{c}.{n}",
                        f"List the {k} of the rows of the {t} table with {c} equal to {{v}} and "
                        f"{n} greater than {{x}}.",
                        f"SELECT {_q(k)} FROM {T} WHERE {_q(c)} = {{v}} AND {_q(n)} > {{x}}",
                        {"v": _distinct(t, c), "x": _distinct(t, n)},
                        kind="set",
                    )
    return tuple(out)


@cache
def table_write_templates(database: str, difficulty: str, kind: str) -> tuple[WriteTemplate, ...]:
    """The write templates of the one-table database ``database`` at ``difficulty`` of ``kind``."""
    r = roles(database)
    t, T = r.table, _q(r.table)
    out: list[WriteTemplate] = []

    def add(what: str, question: str, statement: str, wkind: str, params: dict) -> None:
        name = f"{database}.{difficulty}.{what}"
        out.append(WriteTemplate(name, question, (statement,), (t,), wkind, params))  # type: ignore[arg-type]

    if difficulty == "easy":
        for k in r.label:
            for n in r.numeric:
                add(
                    f"set_one.{k}.{n}",
                    f"In the {t} table, set {n} to {{x}} for the row whose {k} is {{v}}.",
                    f"UPDATE {T} SET {_q(n)} = {{x}} WHERE {_q(k)} = {{v}}",
                    "update",
                    {"v": _unique(t, k), "x": _distinct(t, n)},
                )
        if len(r.columns) <= 12:
            # a new row mixing two neighbouring rows' values (never an exact copy of one)
            names = [f"c{i}" for i in range(len(r.columns))]
            picks = ", ".join(
                f"{'a' if i % 2 == 0 else 'b'}.{_q(c)}" for i, c in enumerate(r.columns)
            )
            shown = ", ".join(f"{c} = {{{n}}}" for c, n in zip(r.columns, names))
            add(
                "insert",
                f"Insert a new row into the {t} table with {shown}.",
                f"INSERT INTO {T} ({', '.join(map(_q, r.columns))}) VALUES "
                f"({', '.join('{' + n + '}' for n in names)})",
                "insert",
                {",".join(names): f"SELECT {picks} FROM {T} a JOIN {T} b ON b.rowid = a.rowid + 1"},
            )
    elif difficulty == "medium":
        for c in r.category:
            add(
                f"delete.{c}",
                f"Delete every row of the {t} table with {c} equal to {{v}}.",
                f"DELETE FROM {T} WHERE {_q(c)} = {{v}}",
                "delete",
                {"v": _distinct(t, c)},
            )
            for n in r.numeric:
                add(
                    f"set_group.{c}.{n}",
                    f"In the {t} table, set {n} to {{x}} for every row with {c} equal to {{v}}.",
                    f"UPDATE {T} SET {_q(n)} = {{x}} WHERE {_q(c)} = {{v}}",
                    "update",
                    {"v": _distinct(t, c), "x": _distinct(t, n)},
                )
    else:
        for c in r.category:
            for n in r.numeric:
                add(
                    f"scale.{c}.{n}",
                    f"In the {t} table, multiply {n} by {{f}} and round it to 2 decimals, for "
                    f"every row with {c} equal to {{v}} whose {n} is greater than {{x}}.",
                    f"UPDATE {T} SET {_q(n)} = ROUND({_q(n)} * {{f}}, 2) "
                    f"WHERE {_q(c)} = {{v}} AND {_q(n)} > {{x}}",
                    "update",
                    {"v": _distinct(t, c), "x": _distinct(t, n), "f": (0.5, 1.1, 1.25, 2, 3)},
                )
                add(
                    f"delete_two.{c}.{n}",
                    f"Delete every row of the {t} table with {c} equal to {{v}} and {n} less "
                    "than {x}.",
                    f"DELETE FROM {T} WHERE {_q(c)} = {{v}} AND {_q(n)} < {{x}}",
                    "delete",
                    {"v": _distinct(t, c), "x": _distinct(t, n)},
                )
    return tuple(w for w in out if w.kind == kind)
