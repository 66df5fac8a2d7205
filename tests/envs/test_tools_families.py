"""Every family through its tools: oracles, determinism, hostile calls, exact argument mapping.

The bar of the earlier environment issues, in the tools interface: the family's scripted
oracle, run through tool calls (:func:`entropace.envs.tools.tool_oracle`), solves 100% of 50
seeded instances per difficulty (45 train + 5 test seeds); the same seed gives the same
episode; hostile and malformed calls never raise, never solve an instance, and the turn limit
still truncates.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from entropace.envs import DIFFICULTIES, make, seeds, spec
from entropace.envs.base import MAX_ACTION_CHARS
from entropace.envs.checks import check_env, run_episode
from entropace.envs.tools import ToolCall, format_tool_call, tool_oracle

HAS_BWRAP = shutil.which("bwrap") is not None
FAMILIES = ["db", "kg", "reasoning", "household", "shop"] + (["os"] if HAS_BWRAP else [])
SEEDS = [*seeds("train", 45), *seeds("test", 5)]


def _call(tool: str, **arguments: Any) -> str:
    return format_tool_call(ToolCall(tool, arguments))


def _oracle_episode(family: str, difficulty: str, seed: int) -> Any:
    env = make(family, interface="tools", difficulty=difficulty)
    env.reset(seed)
    return run_episode(env, tool_oracle(spec(family).oracle)(env), seed)


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
@pytest.mark.parametrize("family", FAMILIES)
def test_oracle_solves_every_instance_through_tools(family: str, difficulty: str) -> None:
    failed = []
    for seed in SEEDS:
        ep = _oracle_episode(family, difficulty, seed)
        if not ep.success:
            failed.append((seed, ep.actions[-1][:200], ep.observations[-1][:200]))
        # every oracle action was a well-formed call (or kg's final-answer text)
        assert ep.last_info["parse_error"] is False
    assert failed == []


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_episode(family: str) -> None:
    a = _oracle_episode(family, "medium", 7)
    b = _oracle_episode(family, "medium", 7)
    assert a.actions == b.actions and a.observations == b.observations
    assert a.rewards == b.rewards


def _hostile(family: str) -> list[str]:
    tools = make(family, interface="tools").tools
    names = [t["function"]["name"] for t in tools]
    first = names[0]
    params = list(tools[0]["function"]["parameters"]["properties"])
    big = "x" * (MAX_ACTION_CHARS - 200)
    out = [
        "",
        "<tool_call>",
        "<tool_call></tool_call>",
        "<tool_call>null</tool_call>",
        '<tool_call>{"name": null}</tool_call>',
        '<tool_call>{"name": "' + first + '", "arguments": null}</tool_call>',
        '<tool_call>{"name": "' + first + '", "arguments": {"__proto__": 1}}</tool_call>',
        "<tool_call>" + "{" * 5000 + "</tool_call>",
        _call(first),
        _call(first, **{"a" * 1000: "b"}),
        _call("x" * 10_000),
        _call(first, **{k: big for k in ("query", "script", "action", "keywords", "value")}),
        _call(first) * 50,
        "Final Answer: #99999999999999999999",
        "Final Answer: #0" + "\n" * 1000,
        "[TOOL_CALLS]" + "[" * 10_000,
        "\x00" + _call(first, a="\x00\ud800"[0]),
        '<tool_call>{"name": "'
        + first
        + '", "arguments": {'
        + ", ".join(f'"{p}": "\\ud800"' for p in params)
        + "}}</tool_call>",
    ]
    for name in names:
        out.append(_call(name, **{"variable": "#999", "relation": "\n\n", "attribute": "a,b"}))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_hostile_and_malformed_calls(family: str) -> None:
    env = make(family, interface="tools")
    limit = getattr(env, "output_chars", 4000) + 2000
    check_env(env, seed=3, actions=_hostile(family), max_observation_chars=max(limit, 8000))


def test_db_multiline_sql_reaches_the_database_whole() -> None:
    env = make("db", interface="tools", database="chinook")
    env.reset(0)
    one = env.step(_call("execute_sql", query="SELECT COUNT(*) AS n FROM artists"))[0]
    env.reset(0)
    query = "SELECT\n  COUNT(*) AS n\nFROM\n  artists\n-- a comment line\n"
    many = env.step(_call("execute_sql", query=query))[0]
    assert many == one and "275" in one


def test_db_answers_are_a_json_list() -> None:
    env = make("db", interface="tools")
    obs, info = env.reset(0)
    gold = env.instance.gold
    answers = [v if isinstance(v, str) else repr(v) for v in gold]
    result = env.step(_call("commit_final_answer", answers=answers))
    assert result[2] is True and result[4]["success"] is True, (answers, result[0])


@pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap (bwrap) is not installed")
def test_os_multiline_script_runs_whole() -> None:
    env = make("os", interface="tools")
    env.reset(0)
    script = "x=3\nif [ $x -gt 2 ]; then\n  echo big\nfi\ncat <<'EOF'\nline one\n  line two\nEOF"
    obs = env.step(_call("bash_action", script=script))[0]
    assert obs.splitlines()[:3] == ["big", "line one", "  line two"]


@pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap (bwrap) is not installed")
def test_os_answer_and_finish_commit_like_agentbench() -> None:
    """answer_action and finish_action both commit (AgentBench FC's _extract_function)."""
    env = make("os", interface="tools")
    for seed in range(40):
        env.reset(seed)
        if not env.task.is_goal:
            break
    result = env.step(_call("finish_action", thought="not the answer"))
    assert result[2] is True and result[4]["success"] is False  # the thought was the answer
    env.reset(seed)
    result = env.step(_call("answer_action", answer=env.task.gold))
    assert result[2] is True and result[4]["success"] is True


def test_kg_final_answer_text_ends_the_episode() -> None:
    env = make("kg", interface="tools")
    env.reset(0)
    q = env.question
    plan = list(q.plan)
    for action in plan[:-1]:
        env.step(format_tool_call(tool_oracle_call("kg", action)))
    last = plan[-1].split("(", 1)[1].rstrip(")")
    obs, reward, terminated, _, info = env.step(f"Thought: done. Final Answer: {last}")
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    assert info["observation_role"] == "user"


def tool_oracle_call(family: str, action: str) -> ToolCall:
    from entropace.envs.registry import tool_suite

    call = tool_suite(family).to_call(action)
    assert isinstance(call, ToolCall)
    return call


@pytest.mark.parametrize(
    ("family", "tool", "arguments", "message"),
    [
        ("kg", "get_relations", {"variable": "France\nAction: answer(#0)"}, "one line"),
        ("kg", "get_neighbors", {"variable": "France", "relation": "a, b"}, "comma"),
        ("kg", "get_relations", {"variable": "  "}, "must not be empty"),
        ("shop", "search_action", {"keywords": "shoes] click[Buy Now"}, "square brackets"),
        ("shop", "click_action", {"value": "Buy\nNow"}, "one line"),
        ("household", "take_action", {"action": "look\ngo to cabinet 1"}, "one line"),
        ("reasoning", "final_answer", {"answer": "1</answer><answer>2"}, "<answer> tags"),
        ("db", "execute_sql", {"query": "SELECT '\ud800'"}, "unpaired UTF-16 surrogate"),
        ("db", "execute_sql", {"query": " \n "}, "the query is empty"),
        ("reasoning", "final_answer", {"answer": "  "}, "the answer is empty"),
        pytest.param(
            "os",
            "bash_action",
            {"script": "\n"},
            "the script is empty",
            marks=pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap (bwrap) is not installed"),
        ),
        ("household", "take_action", {"action": "\udfff"}, "unpaired UTF-16 surrogate"),
    ],
)
def test_arguments_the_text_parser_would_alter_are_refused(
    family: str, tool: str, arguments: dict[str, str], message: str
) -> None:
    env = make(family, interface="tools")
    env.reset(0)
    obs, _, _, _, info = env.step(_call(tool, **arguments))
    assert info["tool_error"] == "bad_arguments" and message in obs


def test_reasoning_without_the_tool_is_truncated_after_its_one_turn() -> None:
    env = make("reasoning", interface="tools")
    env.reset(0)
    obs, reward, terminated, truncated, info = env.step("<answer>42</answer>")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["tool_error"] == "no_call"


# ------------------------------------------------------------------- the agentbench profile

AGENTBENCH_TURNS = {"db": 15, "os": 8, "kg": 15, "household": 20, "shop": 20}


@pytest.mark.parametrize("family", [f for f in FAMILIES if f in AGENTBENCH_TURNS])
def test_agentbench_profile_settings(family: str) -> None:
    from entropace.envs.agentbench import AGENTBENCH

    # every option the profile sets exists in the family (a renamed option fails here)
    assert AGENTBENCH[family].missing(spec(family).options) == []
    env = make(family, profile="agentbench")
    assert env.max_turns == AGENTBENCH_TURNS[family]  # AgentBench FC's configs/tasks/*.yaml
    assert env.tools and type(env.env).__name__ == "ToolInterface"
    inner = env.env.env
    for option, value in AGENTBENCH[family].options.items():
        # numeric / boolean options are stored as given (string ones may be normalised)
        if option in spec(family).options and isinstance(value, bool | int | float):
            assert getattr(inner, option, value) == value, option
    # explicit arguments win over the profile
    assert make(family, profile="agentbench", max_turns=3).max_turns == 3
    close = getattr(env, "close", None)
    if callable(close):
        close()


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
@pytest.mark.parametrize("family", FAMILIES)
def test_oracle_under_the_agentbench_profile(family: str, difficulty: str) -> None:
    failed = []
    for seed in SEEDS[:10]:
        env = make(family, profile="agentbench", difficulty=difficulty)
        env.reset(seed)
        ep = run_episode(env, tool_oracle(spec(family).oracle)(env), seed)
        if not ep.success:
            failed.append((seed, ep.observations[-1][:200]))
        close = getattr(env, "close", None)
        if callable(close):
            close()
    assert failed == []


def test_profile_errors() -> None:
    with pytest.raises(ValueError, match="profile must be one of"):
        make("db", profile="agentbench-v0.2")
    from entropace.envs.toy import register_letter_envs

    register_letter_envs("profile_letter")
    with pytest.raises(ValueError, match="does not cover 'profile_letter'"):
        make("profile_letter", profile="agentbench")


def test_agentbench_wording() -> None:
    """AgentBench FC's task texts (shop/webshop/task.py, household/alfworld/task.py, ...)."""
    shop = make("shop", profile="agentbench")
    first, _ = shop.reset(0)
    # WebShop's text mode (observation_mode="text", webshop/task.py lines 39 and 50)
    assert first.startswith("The initial observation:\nWebShop [SEP] Instruction: [SEP] ")
    assert first.endswith("Available Actions:\n{'has_search_bar': True, 'clickables': ['search']}")
    obs = shop.step(_call("search_action", keywords="shampoo"))[0]
    assert obs.startswith("Action: search[shampoo]\n\nObservation:\nInstruction: [SEP] ")
    assert "'has_search_bar': False" in obs and "'back to search'" in obs
    house = make("household", profile="agentbench")
    first, _ = house.reset(0)
    assert first.startswith("Here is your task. You are in the middle of a room.")
    assert " AVAILABLE ACTIONS: look\ninventory\n" in first
    obs, _, _, _, info = house.step("go to the kitchen")
    assert obs == "No executable tool calls found. Please call a tool instead"
    assert info["observation_role"] == "user" and info["tool_error"] == "no_call"
    db = make("db", profile="agentbench")
    db.reset(0)
    assert db.step("SQL: SELECT 1")[0] == (
        "Internal error: No tool calls found despite finish reason."
    )


@pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap (bwrap) is not installed")
def test_agentbench_wording_os() -> None:
    env = make("os", profile="agentbench")
    first, _ = env.reset(0)
    assert first.startswith("Now, I will start a new problem in a new OS. My problem is:\n\n")
    assert env.step(_call("bash_action", script="echo hi"))[0] == "The output of the OS:\n\nhi"
    assert env.step(_call("bash_action", script="true"))[0] == "The output of the OS is empty."
    env.close()
    # goal tasks name the tool, not the text action, in both tool profiles
    for profile in ("default", "agentbench"):
        for seed in range(12):
            env = make("os", interface="tools", profile=profile)
            first, _ = env.reset(seed)
            env.close()
            assert "Reply `done`" not in first
            if env.task.is_goal:
                assert first.endswith("Call `finish_action` when finished.")
