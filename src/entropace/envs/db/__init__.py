"""``db``: answer questions about, or change, real SQLite sample databases with SQL.

See :mod:`entropace.envs.db.env` for the episode, :mod:`entropace.envs.db.templates` and
:mod:`entropace.envs.db.write_templates` for the tasks, :mod:`entropace.envs.db.sandbox` for
the query sandbox and :mod:`entropace.envs.db.private` for the per-episode private copy that
write tasks run on.
"""

from entropace.envs.db.actions import answer_matches, parse_action
from entropace.envs.db.build import SOURCES, data_credits, database_path, licence_credits
from entropace.envs.db.env import DbEnv, db_oracle, make_db_env
from entropace.envs.db.private import PrivateDb
from entropace.envs.db.questions import Instance, generate, pool_counts
from entropace.envs.db.sandbox import connect_readonly, run_query
from entropace.envs.registry import EnvSpec, register

SPEC = register(
    EnvSpec(
        name="db",
        factory=make_db_env,
        oracle=db_oracle,
        description="Text-to-SQL: answer questions about 17 real SQLite databases (Chinook "
        "music store, NYC flights 2013, 15 one-table data sets) by running read-only SELECT "
        "queries, or (kinds option) change them with INSERT/UPDATE/DELETE on a private copy, "
        "scored by the final tables.",
        options={
            "difficulty": "easy (one table) | medium (joins, aggregates, top-k) | hard (nested "
            "subqueries, HAVING); default easy",
            "database": f"any | {' | '.join(sorted(SOURCES))}; default any (each seed picks one)",
            "timeout_s": "wall-clock limit of one query in seconds; default 1.0",
            "max_rows": "rows of a query result shown to the agent; default 20",
            "kinds": "task kinds: comma-separated subset of select, insert, update, delete, or "
            "all; default select (read-only questions, as before)",
            "style": "entropace | agentbench (default entropace): agentbench = AgentBench's "
            "first message (table names and headers) and raw results (str(rows), cut at 800 "
            "characters plus [TRUNCATED])",
            "scoring": "lenient | agentbench (default lenient): agentbench = AgentBench's "
            "compare_results (exact, case-sensitive, floats within 0.01) and write tasks "
            "compared on all tables of the database",
        },
        data_source=data_credits(SOURCES.values()),
        license=licence_credits(SOURCES.values()),
        requires=tuple(dict.fromkeys(s.package for s in SOURCES.values())),
        splits=("train", "test", "test_unseen"),
        pools=pool_counts,
    )
)

__all__ = [
    "SOURCES",
    "SPEC",
    "DbEnv",
    "PrivateDb",
    "Instance",
    "answer_matches",
    "connect_readonly",
    "database_path",
    "db_oracle",
    "generate",
    "make_db_env",
    "parse_action",
    "run_query",
]
