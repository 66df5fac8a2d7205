"""The ``db`` environment: answer a question about, or change, a real SQLite database.

Episode: the first observation shows the database schema and the task. Each turn the agent
sends ``SQL: <one statement>`` (it sees at most ``max_rows`` rows of the result) or
``Answer: <value(s)>``, which ends the episode.

* ``select`` tasks (the default ``kinds``): reward 1 when the answer matches the gold result
  (the result of the instance's gold SQL; see :mod:`entropace.envs.db.actions` for matching),
  0 otherwise. Only read-only statements run, on the shared read-only connection.
* ``insert`` / ``update`` / ``delete`` tasks (``kinds`` option): the agent changes the database
  with INSERT / UPDATE / DELETE statements, one per action, on a private in-memory copy made
  at ``reset`` (:mod:`entropace.envs.db.private`; the shared file is never written), then
  sends ``Answer: <anything>`` (``Answer: done``; the text is ignored, as AgentBench ignores
  ``commit_final_answer``'s argument for modification tasks). Reward 1 when the final
  contents of the touched tables equal the gold final contents, compared as multisets of rows
  (every column, order ignored, floats rounded to 6 decimals; see
  :meth:`entropace.envs.db.private.PrivateDb.diff`), 0 otherwise. This is the exact-multiset
  form of AgentBench's check, which compares an MD5 of the sorted per-row hashes of each
  touched table after the agent's statements with the same hash after the gold SQL.

Options for AgentBench DBBench's behaviour (:mod:`entropace.envs.db.agentbench`; off by default):
``style="agentbench"`` words the first observation as AgentBench's first message (table names
and headers, then the question) and shows results as MySQL's raw ``str(rows)``, cut at 800
characters plus ``[TRUNCATED]``; ``scoring="agentbench"`` checks answers as AgentBench's
``compare_results`` (exact and case-sensitive, numbers within 0.01) and write tasks on *all*
tables of the database (every table is writable then, as in AgentBench, and the final state of
each must equal the gold's).

Seeds draw from their split's content (:mod:`entropace.envs.db.questions`): ``test_unseen``
seeds only the held-out databases, ``train`` and ``test`` seeds disjoint instances of the
others.

This is the text-to-SQL agent setting of AgentBench's DBBench (Liu et al., 2023, "AgentBench:
Evaluating LLMs as Agents") on real sample databases.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from entropace.envs.base import Policy, StepResult, action_too_long, check_difficulty
from entropace.envs.db import agentbench
from entropace.envs.db.actions import answer_matches, format_answer, parse_action
from entropace.envs.db.build import SOURCES, database_path
from entropace.envs.db.private import PrivateDb, diff_digest
from entropace.envs.db.questions import (
    Instance,
    generate,
    parse_kinds,
    schema_text,
    table_columns,
)
from entropace.envs.db.sandbox import connect_readonly, format_result, run_query
from entropace.envs.splits import split_of

#: Longest observation the environment returns (characters).
MAX_OBSERVATION_CHARS = 4000
#: Values of the ``style`` and ``scoring`` options.
STYLES = ("entropace", "agentbench")
SCORINGS = ("lenient", "agentbench")

SYSTEM_PROMPT = """\
You answer questions about a SQLite database by querying it. Each turn, reply with exactly one \
action on its own line (any thinking must come before it):

SQL: <one SELECT statement>
    Runs one read-only query (SELECT or WITH ... SELECT; no other statements, no ';' \
separated statements; PRAGMA, printf and format are disabled). You see at most {max_rows} rows of the result. Queries are stopped \
after {timeout:g} s.
Answer: <value(s)>
    Your final answer; it ends the episode. Give one value, or several values separated by \
commas or newlines, or a JSON list such as ["AC/DC", "Accept"] when values contain commas. \
Numbers without thousands separators. Give values in order only when the question asks for \
an ordered list.

Example (a made-up table, not from your database):
SQL: SELECT COUNT(*) FROM orders WHERE status = 'open'
  you see:
  COUNT(*)
  12
  (1 row)
Answer: 12

You have at most {max_turns} actions; a wrong answer ends the episode with no reward."""

WRITE_SYSTEM_PROMPT = """\
You work with a SQLite database: some tasks ask a question about it, others ask you to change \
it. Each turn, reply with exactly one action on its own line (any thinking must come before it):

SQL: <one SQL statement>
    Runs one statement. To read: SELECT (or WITH ... SELECT); you see at most {max_rows} rows \
of the result. To change the database, when the task asks for it: one INSERT, UPDATE or DELETE \
per action, on the tables the task is about. No ';' separated statements, no CREATE, DROP, \
ALTER, PRAGMA, ATTACH or transactions; printf and format are disabled. Statements are stopped \
after {timeout:g} s.
Answer: <value(s)>
    Ends the episode. For a question: your final answer. Give one value, or several values \
separated by commas or newlines, or a JSON list such as ["AC/DC", "Accept"] when values contain \
commas. Numbers without thousands separators. Give values in order only when the question asks \
for an ordered list. For a change: reply "Answer: done" once every change is made; the final \
contents of the changed tables are compared with the expected ones.

Example (a made-up table, not from your database):
SQL: UPDATE orders SET status = 'closed' WHERE order_id = 7
  you see:
  OK: 1 row changed.
Answer: done

You have at most {max_turns} actions; a wrong answer ends the episode with no reward."""

#: Appended to the task text of write tasks in the first observation (interface-neutral: the
#: text interface finishes with ``Answer: done``, the tools one with ``commit_final_answer``).
WRITE_DONE_TEXT = (
    'When every change is made, give the final answer "done" (its text is not checked); the '
    "changed tables are then compared with the expected ones."
)

_PARSE_HELP = (
    "Could not find an action. Reply with exactly one action on its own line:\n"
    "SQL: <one SELECT statement>\n"
    "Answer: <value(s)>"
)


class DbEnv:
    """Text-to-SQL question answering over real SQLite databases (see module doc).

    Args:
        difficulty: ``easy`` (one table), ``medium`` (joins, aggregates, top-k) or ``hard``
            (nested subqueries, HAVING, 3+ table joins).
        database: ``"any"`` (each seed picks one) or one of :data:`SOURCES`.
        timeout_s: wall-clock limit of one agent query.
        max_rows: rows of a query result shown to the agent.
        max_turns: number of actions before truncation.
        kinds: task kinds to draw from, comma-separated subset of ``select``, ``insert``,
            ``update``, ``delete``, or ``all`` (:func:`entropace.envs.db.questions.parse_kinds`).
            The default ``"select"``: read-only questions.
        style: ``"entropace"`` (schema and aligned result tables) or ``"agentbench"``
            (AgentBench's first message and raw results; see the module docstring).
        scoring: ``"lenient"`` (:func:`~entropace.envs.db.actions.answer_matches`; touched
            tables for writes) or ``"agentbench"`` (AgentBench's check; all tables).
    """

    name = "db"

    def __init__(
        self,
        difficulty: str = "easy",
        database: str = "any",
        timeout_s: float = 1.0,
        max_rows: int = 20,
        max_turns: int = 10,
        kinds: str = "select",
        style: str = "entropace",
        scoring: str = "lenient",
    ) -> None:
        self.difficulty = check_difficulty(difficulty)
        self.kinds: tuple[str, ...] = parse_kinds(kinds)
        if style not in STYLES:
            raise ValueError(f"db: style must be one of {list(STYLES)}, got {style!r}")
        if scoring not in SCORINGS:
            raise ValueError(f"db: scoring must be one of {list(SCORINGS)}, got {scoring!r}")
        self.style = style
        self.scoring = scoring
        if database != "any" and database not in SOURCES:
            raise ValueError(
                f"database must be 'any' or one of {sorted(SOURCES)}, got {database!r}"
            )
        if not (isinstance(timeout_s, int | float) and 0 < float(timeout_s) <= 60):
            raise ValueError(f"timeout_s must be a number in (0, 60], got {timeout_s!r}")
        if not (isinstance(max_rows, int) and 1 <= max_rows <= 1000):
            raise ValueError(f"max_rows must be an int in [1, 1000], got {max_rows!r}")
        self.databases: tuple[str, ...] = (
            tuple(sorted(SOURCES)) if database == "any" else (database,)
        )
        self.timeout_s = float(timeout_s)
        self.max_rows = max_rows
        self.max_turns = int(max_turns)
        prompt = SYSTEM_PROMPT if self.kinds == ("select",) else WRITE_SYSTEM_PROMPT
        self.system_prompt = prompt.format(
            max_rows=max_rows, timeout=self.timeout_s, max_turns=self.max_turns
        )
        self.instance: Instance | None = None
        self._conns: dict[str, sqlite3.Connection] = {}
        self._private: PrivateDb | None = None

    def close(self) -> None:
        """Free the private database copy of a write episode (idempotent)."""
        if self._private is not None:
            self._private.close()
            self._private = None

    def _conn(self, database: str) -> sqlite3.Connection:
        if database not in self._conns:
            self._conns[database] = connect_readonly(database_path(database))
        return self._conns[database]

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.close()
        inst = generate(seed, self.difficulty, self.databases, self.kinds)
        self.instance = inst
        if inst.kind != "select":
            writable = inst.tables
            if self.scoring == "agentbench":  # AgentBench hashes every table of the sample
                writable = tuple(sorted(name for name, _ in table_columns(inst.database)))
            self._private = PrivateDb(inst.database, writable)
        obs = first_observation(inst, self.style)
        info = {
            "task": self.name,
            "seed": seed,
            "split": split_of(seed),
            "difficulty": self.difficulty,
            "gold": format_answer(inst.gold) if inst.kind == "select" else inst.sql,
            "database": inst.database,
            "template": inst.template,
            "question": inst.question,
            "gold_sql": inst.sql,
            "kind": inst.kind,
            "writable": inst.tables,
        }
        if inst.kind != "select":
            info["gold_digest"] = inst.gold_digest
        return obs, info

    def step(self, action: str) -> StepResult:
        inst = self.instance
        if inst is None:
            raise RuntimeError("db: step() called before reset()")
        info: dict[str, Any] = {"success": False, "parse_error": False, "sql_error": False}
        too_long = action_too_long(action)
        if too_long is not None:
            info["parse_error"] = True
            return too_long, 0.0, False, False, info
        parsed = parse_action(action)
        if parsed is None:
            info["parse_error"] = True
            return _PARSE_HELP, 0.0, False, False, info
        if parsed.kind == "sql":
            if not parsed.arg:
                info["parse_error"] = True
                return (
                    "Empty query. Write one SELECT statement after 'SQL:'.",
                    0.0,
                    False,
                    False,
                    info,
                )
            if self._private is not None:
                return self._write_step(parsed.arg, info)
            result = run_query(
                self._conn(inst.database),
                parsed.arg,
                max_rows=self.max_rows,
                timeout_s=self.timeout_s,
            )
            info["sql_error"] = result.error is not None
            if self.style == "agentbench" and result.error is None:
                return agentbench.raw_result(result.rows, result.truncated), 0.0, False, False, info
            obs = format_result(result, max_rows=self.max_rows)
            return _cap(obs), 0.0, False, False, info
        if inst.kind != "select":
            return self._finish_write(info)
        if not parsed.arg:
            info["parse_error"] = True
            return "Empty answer. Write your value(s) after 'Answer:'.", 0.0, False, False, info
        if self.scoring == "agentbench":
            right = agentbench.answers_match(_answer_list(parsed.arg), inst.gold)
        else:
            right = answer_matches(
                parsed.arg, inst.gold, ordered=inst.ordered, decimals=inst.decimals
            )
        if right:
            info["success"] = True
            return "Correct.", 1.0, True, False, info
        return "Wrong answer. The episode is over.", 0.0, True, False, info

    def _write_step(self, sql: str, info: dict[str, Any]) -> StepResult:
        """One ``SQL:`` action of a write task, on the episode's private copy."""
        assert self._private is not None
        result = self._private.execute(sql, max_rows=self.max_rows, timeout_s=self.timeout_s)
        info["sql_error"] = result.error is not None
        info["rows_changed"] = result.rows_changed
        if self.style == "agentbench" and result.error is None:
            # MySQL's cursor has no rows after a write: the raw response is "[]"
            return agentbench.raw_result(result.rows, result.truncated), 0.0, False, False, info
        if result.error is None and not result.columns:
            n = result.rows_changed
            obs = f"OK: {n} row{'s' if n != 1 else ''} changed."
        else:
            obs = format_result(result, max_rows=self.max_rows)
            if result.error is None and result.rows_changed:
                obs += f"\nOK: {result.rows_changed} rows changed."
        return _cap(obs), 0.0, False, False, info

    def _finish_write(self, info: dict[str, Any]) -> StepResult:
        """``Answer:`` in a write task: compare the final state of the touched tables."""
        inst, private = self.instance, self._private
        if inst is None or private is None:
            raise RuntimeError("db: the write episode has no private database copy")
        diff = private.diff()
        self.close()
        info["state_digest"] = diff_digest(diff)
        info["gold_digest"] = inst.gold_digest
        if diff == inst.gold_diff:
            info["success"] = True
            return "Correct: the tables are in the expected final state.", 1.0, True, False, info
        return (
            "Wrong: the tables are not in the expected final state. The episode is over.",
            0.0,
            True,
            False,
            info,
        )


def first_observation(inst: Instance, style: str = "entropace") -> str:
    """The first observation of ``inst``: entropace's (database, schema with keys and row
    counts, question) or AgentBench's first message (:func:`agentbench.first_message`)."""
    if style == "agentbench":
        return agentbench.first_message(table_columns(inst.database), inst.question)
    question = inst.question if inst.kind == "select" else f"{inst.question} {WRITE_DONE_TEXT}"
    return (
        f"Database: {inst.database} (SQLite). Tables:\n{schema_text(inst.database)}\n\n"
        f"Question: {question}"
    )


def _answer_list(text: str) -> list[str]:
    """The answer values as AgentBench receives them (``commit_final_answer``'s list): a JSON
    list as given, any other text as one value."""
    try:
        values = json.loads(text)
    except (ValueError, RecursionError):
        return [text]
    if isinstance(values, list):
        return [v if isinstance(v, str) else json.dumps(v) for v in values]
    return [text]


def _cap(text: str) -> str:
    if len(text) <= MAX_OBSERVATION_CHARS:
        return text
    return text[: MAX_OBSERVATION_CHARS - 20] + "\n... (output cut)"


def make_db_env(**options: Any) -> DbEnv:
    """Factory registered as the ``db`` family."""
    return DbEnv(**options)


def db_oracle(env: Any) -> Policy:
    """Scripted solver (after ``env.reset``): run the gold SQL, then answer.

    It acts only through real actions: ``SQL: <gold sql>`` then ``Answer: <JSON list>`` for a
    question; ``SQL: <statement>`` for each gold statement, then ``Answer: done`` for a write.
    """
    inst: Instance | None = env.instance
    if inst is None:
        raise RuntimeError("db_oracle: call env.reset(seed) before building the oracle")
    if inst.kind == "select":
        actions = [f"SQL: {inst.sql}", f"Answer: {format_answer(inst.gold)}"]
    else:
        actions = [f"SQL: {s}" for s in inst.statements] + ["Answer: done"]

    def policy(observation: str) -> str:
        return actions.pop(0) if len(actions) > 1 else actions[0]

    return policy
