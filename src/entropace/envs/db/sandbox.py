"""Run one untrusted SELECT against a SQLite database without any way to change or escape it.

Layers of defence (each one alone stops writes; together they also give clear messages):

1. The file is opened read-only (``file:...?mode=ro`` URI) and ``PRAGMA query_only=ON``.
2. A ``set_authorizer`` callback allows only reads (``SQLITE_SELECT``, ``SQLITE_READ``,
   ``SQLITE_RECURSIVE``) and function calls other than those in :data:`_DENIED_FUNCTIONS`
   (``load_extension``, file access, ``printf``/``format``); every other action
   (ATTACH, PRAGMA, CREATE, INSERT, UPDATE, DELETE, DROP, ALTER, VACUUM, transactions, ...)
   is denied at prepare time.
3. The statement must be a single ``SELECT`` / ``WITH ... SELECT`` / ``VALUES`` statement;
   several statements are rejected before anything runs.
4. A progress handler (:class:`StatementGuard`) aborts queries that exceed a wall-clock limit
   (infinite recursive CTEs, huge cross joins) or make SQLite's heap grow by more than
   :data:`MAX_STATEMENT_MEMORY` (a full sort of a cross join); ``SQLITE_LIMIT_LENGTH`` caps
   any string or blob a query builds. Where SQLite's memory counter is readable (Linux with
   the system ``libsqlite3``), temporary tables and sorters are kept in memory
   (``temp_store=MEMORY``), so no query writes temporary files, and the memory cap bounds
   them; elsewhere ``temp_store`` keeps SQLite's default and only the time limit applies.
5. At most ``max_rows`` rows are fetched (``fetchmany``), each cell and the rendered table
   are capped in characters.

:func:`run_query` never raises: every failure becomes a :class:`QueryResult` with an ``error``
message meant for the agent.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from entropace.envs.base import WHITESPACE

#: Authorizer action codes a read-only query may use.
_ALLOWED_ACTIONS: frozenset[int] = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}
)
#: Functions denied by name: extension loading and file access (not compiled in by default,
#: denied anyway), and printf/format, whose width argument ('%.*c', 1e9) builds a huge string
#: in one uninterruptible call before the length limit applies.
_DENIED_FUNCTIONS: frozenset[str] = frozenset(
    {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer", "printf", "format"}
)
_FIRST_WORD = re.compile(r"^\s*([A-Za-z]+)")

#: Longest string or blob a query may build (bytes); beyond, SQLite fails the query.
MAX_VALUE_BYTES = 100_000
#: Longest SQL text accepted (characters).
MAX_SQL_CHARS = 10_000
#: Growth of SQLite's heap (bytes, process-wide counter) at which a statement is stopped.
MAX_STATEMENT_MEMORY = 256 * 1024 * 1024


def _memory_counter() -> Callable[[], int] | None:
    """``sqlite3_memory_used`` of the SQLite library behind :mod:`sqlite3`, or None.

    Read through ``ctypes`` from the ``_sqlite3`` extension (its symbol table includes the
    library it links); None where the symbol is missing or memory statistics are compiled
    out (the counter stays 0 with a connection open).
    """
    try:
        import _sqlite3
        import ctypes

        fn = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used
    except (ImportError, OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int64
    fn.argtypes = []
    probe = sqlite3.connect(":memory:")
    try:
        probe.execute("CREATE TABLE t (x)")
        used = int(fn())
    finally:
        probe.close()
    return (lambda: int(fn())) if used > 0 else None


#: SQLite's heap counter (None where unavailable: then no memory cap, default temp_store).
MEMORY_USED: Callable[[], int] | None = _memory_counter()


class StatementGuard:
    """Progress handler of one untrusted statement: stops it past ``timeout_s`` of wall-clock
    time, or once SQLite's heap has grown by :data:`MAX_STATEMENT_MEMORY` since it started.

    The memory counter is process-wide (all SQLite connections of the process), so heavy
    concurrent statements in other threads count too; legitimate statements use a few MB.
    ``stopped`` is ``"time"`` or ``"memory"`` after an abort, else None.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadline = time.perf_counter() + timeout_s
        self.start = MEMORY_USED() if MEMORY_USED is not None else 0
        self.calls = 0
        self.stopped: str | None = None

    def __call__(self) -> int:
        if time.perf_counter() > self.deadline:
            self.stopped = "time"
            return 1  # non-zero aborts the running statement
        if MEMORY_USED is not None:
            self.calls += 1
            if self.calls % 16 == 0 and MEMORY_USED() - self.start > MAX_STATEMENT_MEMORY:
                self.stopped = "memory"
                return 1
        return 0

    def message(self) -> str:
        """The agent's error message for the abort (``stopped`` must be set)."""
        if self.stopped == "memory":
            return (
                f"query stopped: it needed more than {MAX_STATEMENT_MEMORY // 2**20} MiB of "
                "memory (a sort or temporary result too large): narrow it down (WHERE, LIMIT) "
                "or avoid unbounded joins"
            )
        return (
            f"query timed out (limit {self.timeout_s:g} s): narrow it down (WHERE, LIMIT) "
            "or avoid unbounded joins and recursion"
        )


def apply_temp_store(conn: sqlite3.Connection) -> None:
    """Keep ``conn``'s temporary tables and sorters in memory when the memory cap works."""
    if MEMORY_USED is not None:
        conn.execute("PRAGMA temp_store = MEMORY")


def _authorizer(action: int, arg1: str | None, arg2: str | None, db: str | None, src: str | None):
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() not in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def connect_readonly(path: str | Path) -> sqlite3.Connection:
    """Open ``path`` read-only, with the authorizer and limits of this module installed."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.execute("PRAGMA query_only=ON")
    apply_temp_store(conn)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(_authorizer)
    return conn


@dataclass
class QueryResult:
    """The outcome of one agent query.

    Attributes:
        columns: result column names.
        rows: at most ``max_rows`` fetched rows.
        truncated: True when the query had more than ``max_rows`` rows.
        error: a message for the agent when the query was rejected or failed, else None.
    """

    columns: list[str] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)
    truncated: bool = False
    error: str | None = None


def strip_sql(sql: str) -> str:
    """Remove surrounding whitespace, code fences and trailing semicolons from ``sql``.

    Linear in ``len(sql)``: the trailing run of semicolons and whitespace goes in one
    ``rstrip`` (stripping one ``;`` at a time copied the string each time: quadratic).
    """
    s = sql.strip()
    if s.startswith("```"):
        s = re.sub(r"^```[A-Za-z]*\s*", "", s)
        s = re.sub(r"\s*```\s*$", "", s)
    return s.strip().rstrip(WHITESPACE + ";")


def code_only(sql: str) -> str:
    """``sql`` with comments removed and string literals / quoted names replaced by ``''``.

    A small scanner (not regexes) so that ``'--'`` inside a literal or ``;`` inside a comment
    are handled the way SQLite's tokenizer handles them.
    """
    out: list[str] = []
    i, n = 0, len(sql)
    closers = {"'": "'", '"': '"', "`": "`", "[": "]"}
    while i < n:
        ch = sql[i]
        if ch in closers:
            end = sql.find(closers[ch], i + 1)
            while end != -1 and ch != "[" and sql.startswith(closers[ch] * 2, end):
                end = sql.find(closers[ch], end + 2)  # doubled quote is an escaped quote
            out.append("''")
            i = n if end == -1 else end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            out.append(" ")
            i = n if end == -1 else end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            out.append(" ")
            i = n if end == -1 else end + 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


#: First words of a read-only statement.
READ_FIRST_WORDS: tuple[str, ...] = ("SELECT", "WITH", "VALUES")


def check_statement(sql: str, first_words: tuple[str, ...] = READ_FIRST_WORDS) -> str | None:
    """Why ``sql`` (already stripped) is not one allowed statement, or None if it is.

    ``first_words``: the keywords the statement may start with (default: read-only
    statements; write tasks also allow INSERT / UPDATE / DELETE / REPLACE).
    """
    read_only = first_words == READ_FIRST_WORDS
    if not sql:
        if not read_only:
            return "empty query: write one SQL statement after 'SQL:'"
        return "empty query: write one SELECT statement after 'SQL:'"
    if "\x00" in sql:
        return "the query contains a NUL character"
    if len(sql) > MAX_SQL_CHARS:
        return f"query too long ({len(sql)} characters; at most {MAX_SQL_CHARS})"
    body = code_only(sql)
    m = _FIRST_WORD.match(body)
    first = m.group(1).upper() if m else ""
    if first not in first_words:
        shown = first or body.strip()[:20]
        if not read_only:
            return (
                f"only {', '.join(first_words)} statements are allowed (no DDL, PRAGMA, "
                f"ATTACH or transactions); got {shown!r}"
            )
        return (
            "only read-only queries are allowed: one SELECT (or WITH ... SELECT) statement; "
            f"got {shown!r}"
        )
    if ";" in body:
        if not read_only:
            return "only one statement per action: remove the ';' and send one statement"
        return "only one statement per action: remove the ';' and send a single SELECT"
    return None


def run_query(
    conn: sqlite3.Connection, sql: str, *, max_rows: int = 20, timeout_s: float = 1.0
) -> QueryResult:
    """Run untrusted ``sql`` on ``conn`` (from :func:`connect_readonly`); never raises.

    The length limit applies to the text as sent, before any stripping (a query padded with
    a megabyte of ``" ;"`` is refused, not stripped down to a short one).
    """
    if len(sql) > MAX_SQL_CHARS:
        return QueryResult(error=f"query too long ({len(sql)} characters; at most {MAX_SQL_CHARS})")
    sql = strip_sql(sql)
    problem = check_statement(sql)
    if problem is not None:
        return QueryResult(error=problem)
    guard = StatementGuard(timeout_s)
    conn.set_progress_handler(guard, 1000)
    try:
        cur = conn.execute(sql)
        rows = cur.fetchmany(max_rows + 1)
        columns = [d[0] for d in cur.description or ()]
        cur.close()
    except sqlite3.DatabaseError as exc:
        if guard.stopped is not None:
            return QueryResult(error=guard.message())
        msg = str(exc)
        if "not authorized to use function" in msg:
            msg += " (disabled in this sandbox)"
        elif "not authorized" in msg or "prohibited" in msg or "readonly" in msg:
            msg += " (only reading with one SELECT statement is allowed)"
        return QueryResult(error=f"SQL error: {msg}")
    except (sqlite3.Error, ValueError, OverflowError, MemoryError) as exc:
        return QueryResult(error=f"SQL error: {type(exc).__name__}: {exc}")
    finally:
        conn.set_progress_handler(None, 0)
    return QueryResult(
        columns=columns, rows=rows[:max_rows], truncated=len(rows) > max_rows, error=None
    )


def _cell(value: object, max_cell_chars: int) -> str:
    if value is None:
        text = "NULL"
    elif isinstance(value, bytes):
        text = f"<blob {len(value)} bytes>"
    elif isinstance(value, float):
        text = (
            repr(round(value, 6)) if value == value and abs(value) != float("inf") else str(value)
        )
    else:
        text = str(value)
    text = text.replace("\n", "\\n").replace("|", "/")
    return text if len(text) <= max_cell_chars else text[: max_cell_chars - 3] + "..."


def format_result(
    result: QueryResult, *, max_rows: int = 20, max_cell_chars: int = 80, max_chars: int = 3000
) -> str:
    """Render ``result`` as a small pipe-separated table the agent reads (capped in size)."""
    if result.error is not None:
        return result.error
    if not result.rows:
        header = " | ".join(result.columns)
        return f"{header}\n(0 rows)" if header else "(0 rows)"
    lines = [" | ".join(_cell(c, max_cell_chars) for c in result.columns)]
    lines += [" | ".join(_cell(v, max_cell_chars) for v in row) for row in result.rows]
    text = "\n".join(lines)
    note = (
        f"({len(result.rows)} rows shown; more rows exist, at most {max_rows} are shown)"
        if result.truncated
        else f"({len(result.rows)} row{'s' if len(result.rows) != 1 else ''})"
    )
    if len(text) > max_chars:
        text = text[:max_chars] + "\n... (output cut)"
    return f"{text}\n{note}"
