"""A private, writable, in-memory copy of a ``db`` database for one write episode.

Write tasks (INSERT / UPDATE / DELETE) never touch the shared database file: at ``reset`` the
environment copies the database into a fresh in-memory SQLite database with SQLite's online
backup API (:meth:`sqlite3.Connection.backup`, from the trusted read-only connection), and the
agent's statements run on that copy only. The copy is thrown away at the next ``reset`` or
:meth:`PrivateDb.close`. The shared file is opened read-only (``mode=ro``) and only ever read.

Sandbox of the copy (in addition to everything in :mod:`entropace.envs.db.sandbox`):

1. The authorizer allows reads of every table, and ``INSERT`` / ``UPDATE`` / ``DELETE`` on the
   task's writable tables of the ``main`` schema only. Everything else is denied: DDL (CREATE /
   DROP / ALTER of tables, views, triggers, indexes), ATTACH / DETACH, PRAGMA (and ``pragma_*``
   table functions), transactions and savepoints, VACUUM, ANALYZE, REINDEX, ``load_extension``,
   file functions and ``printf``/``format``.
2. One statement per action (first word SELECT / WITH / VALUES / INSERT / UPDATE / DELETE /
   REPLACE; a ``;`` outside literals and comments is refused), the same per-statement
   wall-clock limit as reads (a progress handler), ``SQLITE_LIMIT_LENGTH`` on built values,
   ``SQLITE_LIMIT_ATTACHED = 0``.
3. Growth cap: ``PRAGMA max_page_count`` lets the copy grow by at most
   :data:`MAX_GROWTH_BYTES` (then ``database or disk is full`` and the statement is undone);
   the temp schema (the change logs) is capped the same way; sorts and temporary results are
   bounded by the statement guard's memory cap (:class:`~entropace.envs.db.sandbox.StatementGuard`).
4. Rows-changed budget: each agent statement runs inside a savepoint; a statement that would
   take the episode past :data:`MAX_CHANGED_ROWS` changed rows is rolled back and refused.

Change tracking (what scoring reads): for each writable table ``t`` the copy holds a temp
table ``_log_t(rid)`` filled by three temp triggers (after INSERT / UPDATE / DELETE on
``main.t``; ``recursive_triggers`` is on so that rows deleted by ``REPLACE`` are logged too)
with the rowid of every row the episode inserted, updated or deleted. Rows whose rowid is not
logged are unchanged, so the episode's net effect on ``t`` is computed from the logged rowids
alone (:meth:`PrivateDb.diff`), in time linear in the number of changed rows rather than the
table size (27,004 flights). The agent can read the logs but not write them: the authorizer
allows writes into ``temp._log_*`` only from inside the logging triggers, which the agent can
neither create nor drop.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from entropace.envs.db.sandbox import (
    _ALLOWED_ACTIONS,
    _DENIED_FUNCTIONS,
    MAX_SQL_CHARS,
    MAX_VALUE_BYTES,
    QueryResult,
    StatementGuard,
    apply_temp_store,
    check_statement,
    strip_sql,
)
from entropace.envs.db.trusted import TRUSTED_LOCK as _LOCK
from entropace.envs.db.trusted import trusted_connection

#: First words a statement of a write task may start with.
WRITE_FIRST_WORDS: tuple[str, ...] = (
    "SELECT",
    "WITH",
    "VALUES",
    "INSERT",
    "UPDATE",
    "DELETE",
    "REPLACE",
)
#: How much a private copy may grow over the original (bytes), main and temp schema each.
MAX_GROWTH_BYTES = 4 * 1024 * 1024
#: Rows an episode may insert, update or delete in all (counted per statement, top level).
MAX_CHANGED_ROWS = 100_000

#: A canonical row: column values with floats rounded to 6 decimals (integral floats as int).
Row = tuple[object, ...]
#: The net change of an episode: ``(table, row, count)`` with ``count`` the number of copies
#: of ``row`` added (> 0) or removed (< 0), sorted; empty when the tables are unchanged.
StateDiff = tuple[tuple[str, Row, int], ...]


def canonical_value(value: object) -> object:
    """The value used in row comparisons: floats rounded to 6 decimals, integral ones as int.

    ``None``, ``int`` and ``str`` are kept as they are (strings compare exactly, case and
    whitespace included, as AgentBench's MD5 does); blobs become ``("blob", hex)``.
    """
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return repr(value)
        x = round(value, 6)
        return int(x) if x.is_integer() and abs(x) < 2**53 else x
    if isinstance(value, bytes):
        return ("blob", value.hex())
    return value


def canonical_row(row: Iterable[object]) -> Row:
    """``row`` with :func:`canonical_value` applied to every column (as a tuple)."""
    row = tuple(row)
    for v in row:
        if type(v) is float or type(v) is bytes:
            return tuple(canonical_value(v) for v in row)
    return row


def diff_digest(diff: StateDiff) -> str:
    """SHA-256 (hex) of a :data:`StateDiff`: equal digests <=> equal final table states."""
    text = json.dumps([[t, list(r), n] for t, r, n in diff], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _sort_key(item: tuple[str, Row, int]) -> tuple[str, str, int]:
    """Deterministic order of diff items (``repr`` of canonical rows is stable across runs)."""
    return item[0], repr(item[1]), item[2]


@dataclass
class WriteResult(QueryResult):
    """A :class:`QueryResult` plus the number of rows the statement changed."""

    rows_changed: int = 0


class PrivateDb:
    """An in-memory copy of ``database`` where ``writable`` tables may be changed.

    Args:
        database: a name of :data:`entropace.envs.db.build.SOURCES`.
        writable: the tables of ``main`` the agent may insert into, update and delete from.
    """

    def __init__(self, database: str, writable: Iterable[str]) -> None:
        self.database = database
        self.writable: tuple[str, ...] = tuple(sorted(set(writable)))
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        with _LOCK:
            trusted_connection(database).backup(conn)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for t in self.writable:
            if t not in tables or not t.isidentifier():
                conn.close()
                raise ValueError(f"{database!r} has no table {t!r}")
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        growth = MAX_GROWTH_BYTES // page_size
        conn.execute(f"PRAGMA max_page_count = {pages + growth}")
        apply_temp_store(conn)
        conn.execute("PRAGMA recursive_triggers = ON")
        self._triggers: set[str] = set()
        self._logs: set[str] = set()
        for t in self.writable:
            log = f"_log_{t}"
            conn.execute(f"CREATE TEMP TABLE {log} (rid INTEGER)")
            body = {
                "i": f"INSERT INTO {log} VALUES (NEW.rowid);",
                "u": f"INSERT INTO {log} VALUES (OLD.rowid); INSERT INTO {log} SELECT NEW.rowid "
                "WHERE NEW.rowid IS NOT OLD.rowid;",
                "d": f"INSERT INTO {log} VALUES (OLD.rowid);",
            }
            event = {"i": "INSERT", "u": "UPDATE", "d": "DELETE"}
            for k, sql in body.items():
                name = f"{log}_{k}"
                conn.execute(
                    f"CREATE TEMP TRIGGER {name} AFTER {event[k]} ON main.{t} BEGIN {sql} END"
                )
                self._triggers.add(name)
            self._logs.add(log)
        conn.execute(f"PRAGMA temp.max_page_count = {growth}")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        self.changed_rows = 0
        self._conn: sqlite3.Connection | None = conn
        conn.set_authorizer(self._authorize)

    # ------------------------------------------------------------------------------ sandbox
    def _authorize(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, src: str | None
    ) -> int:
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            ok = (arg2 or "").lower() not in _DENIED_FUNCTIONS
            return sqlite3.SQLITE_OK if ok else sqlite3.SQLITE_DENY
        if action in (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE):
            if src is None and db == "main" and arg1 in self.writable:
                return sqlite3.SQLITE_OK
            if (
                action == sqlite3.SQLITE_INSERT
                and db == "temp"
                and arg1 in self._logs
                and src in self._triggers
            ):
                return sqlite3.SQLITE_OK
        return sqlite3.SQLITE_DENY

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("db: the private database copy is closed")
        return self._conn

    def _trusted(self, sql: str) -> list[tuple]:
        """Run our own (not the agent's) ``sql`` with the authorizer lifted."""
        conn = self.conn
        conn.set_authorizer(None)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.set_authorizer(self._authorize)

    def execute(self, sql: str, *, max_rows: int = 20, timeout_s: float = 1.0) -> WriteResult:
        """Run one untrusted statement (read or write) on the copy; never raises."""
        if len(sql) > MAX_SQL_CHARS:
            return WriteResult(
                error=f"query too long ({len(sql)} characters; at most {MAX_SQL_CHARS})"
            )
        sql = strip_sql(sql)
        problem = check_statement(sql, WRITE_FIRST_WORDS)
        if problem is not None:
            return WriteResult(error=problem)
        conn = self.conn
        guard = StatementGuard(timeout_s)
        before = conn.total_changes
        self._trusted("SAVEPOINT agent_statement")
        conn.set_progress_handler(guard, 1000)
        error: str | None = None
        rows: list[tuple] = []
        columns: list[str] = []
        cur: sqlite3.Cursor | None = None
        try:
            cur = conn.execute(sql)
            rows = cur.fetchmany(max_rows + 1)
            columns = [d[0] for d in cur.description or ()]
        except sqlite3.DatabaseError as exc:
            error = _error_text(exc, guard, self.writable)
        except (sqlite3.Error, ValueError, OverflowError, MemoryError) as exc:
            error = f"SQL error: {type(exc).__name__}: {exc}"
        finally:
            if cur is not None:
                _close(cur)
            conn.set_progress_handler(None, 0)
        changed = 0
        if error is None and conn.total_changes != before:
            (changed,) = self._trusted("SELECT changes()")[0]
        if error is None and self.changed_rows + changed > MAX_CHANGED_ROWS:
            error = (
                f"refused: this statement changes {changed} rows and the episode may change at "
                f"most {MAX_CHANGED_ROWS} rows in all ({self.changed_rows} so far); it was undone"
            )
        self._end_savepoint(undo=error is not None)
        if error is not None:
            return WriteResult(error=error)
        self.changed_rows += changed
        return WriteResult(
            columns=columns,
            rows=rows[:max_rows],
            truncated=len(rows) > max_rows,
            rows_changed=changed,
        )

    def _end_savepoint(self, *, undo: bool) -> None:
        """Release (or undo, then release) the savepoint around the agent's statement.

        When SQLite already rolled the transaction back (an interrupted or ``full`` write),
        there is nothing left to release. Should releasing fail, the whole transaction (this
        one statement) is rolled back, so the copy never stays inside a transaction.
        """
        if not self.conn.in_transaction:
            return
        try:
            if undo:
                self._trusted("ROLLBACK TO agent_statement")
            self._trusted("RELEASE agent_statement")
        except sqlite3.Error:
            self._trusted("ROLLBACK")

    # ------------------------------------------------------------------------------ scoring
    def diff(self) -> StateDiff:
        """The net change of the writable tables against the original database.

        For each writable table: the rows now at the logged rowids minus the original rows at
        those rowids, as a signed multiset of :func:`canonical_row` (rowids themselves are not
        compared; an ``INTEGER PRIMARY KEY`` is a column and is). Two episodes from the same
        database end with the same table contents (as multisets of canonical rows) exactly
        when their diffs are equal.
        """
        out: list[tuple[str, Row, int]] = []
        for t in self.writable:
            rids = [r for (r,) in self._trusted(f"SELECT DISTINCT rid FROM temp._log_{t}")]
            if not rids:
                continue
            now = self._trusted(
                f"SELECT * FROM main.{t} WHERE rowid IN (SELECT rid FROM temp._log_{t})"
            )
            with _LOCK:
                before = (
                    trusted_connection(self.database)
                    .execute(
                        f"SELECT * FROM {t} WHERE rowid IN (SELECT value FROM json_each(?))",
                        (json.dumps(rids),),
                    )
                    .fetchall()
                )
            # Identical raw rows cancel at C speed; only what is left is canonicalised (rows
            # equal up to float round-off then cancel in the second count).
            raw: Counter[tuple] = Counter(now)
            raw.subtract(before)
            count: Counter[Row] = Counter()
            for row, n in raw.items():
                if n:
                    count[canonical_row(row)] += n
            out += [(t, row, n) for row, n in count.items() if n != 0]
        return tuple(sorted(out, key=_sort_key))

    def close(self) -> None:
        """Free the copy (idempotent)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _close(cur: sqlite3.Cursor) -> None:
    try:
        cur.close()
    except sqlite3.Error:  # closing a statement that failed mid-way: nothing more to do
        pass


def _error_text(exc: sqlite3.Error, guard: StatementGuard, writable: tuple) -> str:
    if guard.stopped is not None:
        return guard.message() + "; nothing it changed was kept"
    msg = str(exc)
    if "not authorized to use function" in msg:
        return f"SQL error: {msg} (disabled in this sandbox)"
    if "not authorized" in msg or "prohibited" in msg:
        return (
            f"SQL error: {msg} (this task may read every table and INSERT / UPDATE / DELETE "
            f"rows of {', '.join(writable)} only, one statement per action; no DDL, PRAGMA, "
            "ATTACH or transactions)"
        )
    if "full" in msg:
        return (
            f"SQL error: {msg} (the copy may grow by at most {MAX_GROWTH_BYTES // 2**20} MiB; "
            "the statement was undone)"
        )
    return f"SQL error: {msg}"
