"""The ``db`` environment: answer a question about a real SQLite database by querying it.

Episode: the first observation shows the database schema and the question. Each turn the
agent sends ``SQL: <one SELECT>`` (it sees at most ``max_rows`` rows of the result) or
``Answer: <value(s)>``, which ends the episode with reward 1 when it matches the gold result
(the result of the instance's gold SQL; see :mod:`entropace.envs.db.actions` for matching)
and 0 otherwise. This is the text-to-SQL agent setting of AgentBench's DBBench (Liu et al.,
2023, "AgentBench: Evaluating LLMs as Agents") on real sample databases.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from entropace.envs.base import Policy, StepResult, action_too_long, check_difficulty
from entropace.envs.db.actions import answer_matches, format_answer, parse_action
from entropace.envs.db.build import SOURCES, database_path
from entropace.envs.db.questions import Instance, generate, schema_text
from entropace.envs.db.sandbox import connect_readonly, format_result, run_query

#: Longest observation the environment returns (characters).
MAX_OBSERVATION_CHARS = 4000

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
    """

    name = "db"

    def __init__(
        self,
        difficulty: str = "easy",
        database: str = "any",
        timeout_s: float = 1.0,
        max_rows: int = 20,
        max_turns: int = 10,
    ) -> None:
        self.difficulty = check_difficulty(difficulty)
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
        self.system_prompt = SYSTEM_PROMPT.format(
            max_rows=max_rows, timeout=self.timeout_s, max_turns=self.max_turns
        )
        self.instance: Instance | None = None
        self._conns: dict[str, sqlite3.Connection] = {}

    def _conn(self, database: str) -> sqlite3.Connection:
        if database not in self._conns:
            self._conns[database] = connect_readonly(database_path(database))
        return self._conns[database]

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        inst = generate(seed, self.difficulty, self.databases)
        self.instance = inst
        obs = (
            f"Database: {inst.database} (SQLite). Tables:\n{schema_text(inst.database)}\n\n"
            f"Question: {inst.question}"
        )
        info = {
            "task": self.name,
            "seed": seed,
            "difficulty": self.difficulty,
            "gold": format_answer(inst.gold),
            "database": inst.database,
            "template": inst.template,
            "question": inst.question,
            "gold_sql": inst.sql,
        }
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
            result = run_query(
                self._conn(inst.database),
                parsed.arg,
                max_rows=self.max_rows,
                timeout_s=self.timeout_s,
            )
            info["sql_error"] = result.error is not None
            obs = format_result(result, max_rows=self.max_rows)
            return _cap(obs), 0.0, False, False, info
        if not parsed.arg:
            info["parse_error"] = True
            return "Empty answer. Write your value(s) after 'Answer:'.", 0.0, False, False, info
        if answer_matches(parsed.arg, inst.gold, ordered=inst.ordered, decimals=inst.decimals):
            info["success"] = True
            return "Correct.", 1.0, True, False, info
        return "Wrong answer. The episode is over.", 0.0, True, False, info


def _cap(text: str) -> str:
    if len(text) <= MAX_OBSERVATION_CHARS:
        return text
    return text[: MAX_OBSERVATION_CHARS - 20] + "\n... (output cut)"


def make_db_env(**options: Any) -> DbEnv:
    """Factory registered as the ``db`` family."""
    return DbEnv(**options)


def db_oracle(env: Any) -> Policy:
    """Scripted solver (after ``env.reset``): run the gold SQL, then answer the gold values.

    It acts only through real actions: ``SQL: <gold sql>`` then ``Answer: <JSON list>``.
    """
    inst: Instance | None = env.instance
    if inst is None:
        raise RuntimeError("db_oracle: call env.reset(seed) before building the oracle")
    actions = [f"SQL: {inst.sql}", f"Answer: {format_answer(inst.gold)}"]

    def policy(observation: str) -> str:
        return actions.pop(0) if len(actions) > 1 else actions[0]

    return policy
