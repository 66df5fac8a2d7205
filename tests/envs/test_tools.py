"""The tool-call parser, argument validation and the :class:`ToolInterface` wrapper.

Parser properties (hypothesis): it never raises, it reads back every call the generic format
writes, and it is linear on huge hostile replies. The wrapper: every kind of tool error gives
its own observation, counts as a parse error and leaves the family untouched.
"""

from __future__ import annotations

import json
import shutil
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropace.envs import make
from entropace.envs.base import MAX_ACTION_CHARS
from entropace.envs.tools import (
    MAX_JSON_DEPTH,
    ToolCall,
    format_tool_call,
    parse_tool_calls,
    string_parameters,
    validate_arguments,
)

#: Wall-clock bound of one parse of a ~MAX_ACTION_CHARS reply (milliseconds when linear).
PARSE_BOUND_S = 1.0

# ----------------------------------------------------------------------------------- parser


def test_hermes_blocks_with_thinking_around_them() -> None:
    reply = (
        'I will look.\n<tool_call>\n{"name": "execute_sql", "arguments": {"query": "SELECT 1"}}'
        "\n</tool_call>\nthen more text"
    )
    parsed = parse_tool_calls(reply)
    assert parsed.calls == (ToolCall("execute_sql", {"query": "SELECT 1"}),)
    assert parsed.errors == ()
    assert parsed.content == "I will look.\n\nthen more text"


def test_other_formats_and_openai_string_arguments() -> None:
    want = ToolCall("take_action", {"action": "look"})
    for reply in (
        '[TOOL_CALLS] [{"name": "take_action", "arguments": {"action": "look"}}]',
        '{"name": "take_action", "parameters": {"action": "look"}}',
        '<|python_tag|>{"name": "take_action", "arguments": {"action": "look"}}',
        '<tool_call>{"name": "take_action", "arguments": "{\\"action\\": \\"look\\"}"}</tool_call>',
        '<tool_call>{"type": "function", "function": {"name": "take_action", '
        '"arguments": {"action": "look"}}}</tool_call>',
        '<tool_call>\n```json\n{"name": "take_action", "arguments": {"action": "look"}}\n```\n'
        "</tool_call>",
        '<tool_call>{"name": "take_action", "arguments": {"action": "look"}}',  # cut at the end
    ):
        parsed = parse_tool_calls(reply)
        assert parsed.calls == (want,), reply
        assert parsed.errors == (), reply


def test_malformed_calls_are_errors_not_exceptions() -> None:
    cases = {
        "<tool_call>not json</tool_call>": "not valid JSON",
        "<tool_call>[1, 2]</tool_call>": "not a JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': "no 'name'",
        '<tool_call>{"name": "x", "arguments": [1]}</tool_call>': "not a JSON object",
        '<tool_call>{"name": "x", "arguments": "{oops"}</tool_call>': "not valid JSON",
        '<tool_call>{"name": "x", "arguments": {}, "extra": 1}</tool_call>': "unknown field",
        "<tool_call>" + "[" * (MAX_JSON_DEPTH + 1) + "</tool_call>": "nested deeper",
        "[TOOL_CALLS] {{{": "not valid JSON",
    }
    for reply, message in cases.items():
        parsed = parse_tool_calls(reply)
        assert parsed.calls == () and len(parsed.errors) == 1, reply
        assert message in parsed.errors[0], (reply, parsed.errors)
    # plain text, or JSON that is not a call, is no call at all (and no error)
    for reply in ("hello", '{"a": 1}', "{not json}", "", "Final Answer: #3"):
        assert parse_tool_calls(reply).calls == () and parse_tool_calls(reply).errors == ()


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    name=st.text(min_size=1, max_size=30).filter(lambda s: "</tool_call>" not in s),
    arguments=st.dictionaries(st.text(max_size=10), _json_values, max_size=4),
    before=st.text(max_size=40).filter(lambda s: "<tool_call>" not in s),
)
def test_generic_format_round_trips(name: str, arguments: dict[str, Any], before: str) -> None:
    call = ToolCall(name, arguments)
    text = format_tool_call(call)
    if "</tool_call>" in json.dumps(arguments, ensure_ascii=False):
        return  # a closing tag inside an argument ends the block (documented)
    parsed = parse_tool_calls(before + text)
    assert parsed.calls == (call,)
    assert parsed.errors == ()


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('<>/{}[]"\\:,tool_cal{} \nname')), max_size=200))
def test_parser_never_raises_on_tag_soup(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert all(isinstance(c, ToolCall) and isinstance(c.arguments, dict) for c in parsed.calls)
    assert all(isinstance(e, str) for e in parsed.errors)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parser_never_raises_on_any_text(text: str) -> None:
    parse_tool_calls(text)


@pytest.mark.parametrize(
    "reply",
    [
        "<tool_call>" * (MAX_ACTION_CHARS // 11),
        "<tool_call>" + "[" * (MAX_ACTION_CHARS - 30) + "</tool_call>",
        '<tool_call>{"name": "x", "arguments": {"a": "' + "\\" * (MAX_ACTION_CHARS - 60) + '"}}',
        "[TOOL_CALLS]" + "{" * (MAX_ACTION_CHARS - 20),
        "{" * (MAX_ACTION_CHARS // 2) + "}" * (MAX_ACTION_CHARS // 2),
        '"' * MAX_ACTION_CHARS,
    ],
)
def test_parser_is_linear_on_huge_hostile_replies(reply: str) -> None:
    start = time.perf_counter()
    parse_tool_calls(reply)
    assert time.perf_counter() - start < PARSE_BOUND_S


# ------------------------------------------------------------------------------- validation


def test_validation_names_what_is_wrong() -> None:
    schema = {
        "type": "object",
        "properties": {
            "answers": {"type": "array", "items": {"type": "string"}},
            "n": {"type": "integer"},
            "op": {"type": "string", "enum": ["<", ">"]},
        },
        "required": ["answers"],
        "additionalProperties": False,
    }
    assert validate_arguments({"answers": ["a"], "n": 3, "op": "<"}, schema) is None
    assert "missing required argument(s) ['answers']" in str(validate_arguments({}, schema))
    assert "unknown argument(s)" in str(validate_arguments({"answers": [], "x": 1}, schema))
    assert "must be a JSON array" in str(validate_arguments({"answers": "a"}, schema))
    assert "argument 'answers'[1] must be a JSON string" in str(
        validate_arguments({"answers": ["a", 2]}, schema)
    )
    assert "JSON integer" in str(validate_arguments({"answers": [], "n": True}, schema))
    assert "JSON integer" in str(validate_arguments({"answers": [], "n": 1.5}, schema))
    assert "must be one of" in str(validate_arguments({"answers": [], "op": "="}, schema))
    strings = string_parameters(query="q")
    assert strings["required"] == ["query"] and strings["additionalProperties"] is False


# ------------------------------------------------------------------------------ the wrapper


def _call(tool: str, **arguments: Any) -> str:
    return format_tool_call(ToolCall(tool, arguments))


def test_tool_errors_are_parse_errors_with_their_own_observation() -> None:
    env = make("db", interface="tools")
    env.reset(0)
    cases = [
        ("x" * (MAX_ACTION_CHARS + 1), "too_long", "user", "limited to"),
        ("I think the answer is 3.", "no_call", "user", "No tool call found"),
        ("<tool_call>{oops</tool_call>", "bad_json", "tool", "could not be read"),
        (_call("drop_table", table="x"), "unknown_tool", "tool", "no tool 'drop_table'"),
        (_call("execute_sql"), "bad_arguments", "tool", "missing required argument"),
        (_call("execute_sql", query=1), "bad_arguments", "tool", "must be a JSON string"),
        (_call("execute_sql", query="SELECT 1", x=2), "bad_arguments", "tool", "unknown argument"),
        (_call("commit_final_answer", answers="3"), "bad_arguments", "tool", "JSON array"),
        (
            _call("execute_sql", query="SELECT 1") + _call("execute_sql", query="SELECT 2"),
            "several_calls",
            "tool",
            "2 tool calls",
        ),
    ]
    for reply, kind, role, message in cases:
        env.reset(0)
        obs, reward, terminated, truncated, info = env.step(reply)
        assert (reward, terminated, truncated) == (0.0, False, False), kind
        assert info["parse_error"] is True and info["tool_error"] == kind
        assert info["observation_role"] == role and message in obs, (kind, obs)
        assert info["success"] is False
    # a good call is not a parse error and is a tool message with the call's id and name
    env.reset(0)
    obs, _, _, _, info = env.step(_call("execute_sql", query="SELECT 1 AS one"))
    assert info["parse_error"] is False and info["tool_error"] is None
    assert info["observation_role"] == "tool" and info["tool_name"] == "execute_sql"
    assert info["tool_call_id"] == "call_1" and "one" in obs and "1" in obs


def test_tools_are_json_schemas_in_the_chat_template_format() -> None:
    expected = {
        "db": ["execute_sql", "commit_final_answer"],
        "os": ["bash_action", "finish_action", "answer_action"],
        "kg": [
            "get_relations",
            "get_neighbors",
            "intersection",
            "get_attributes",
            "argmax",
            "argmin",
            "count",
            "filter",
        ],
        "household": ["take_action"],
        "shop": ["search_action", "click_action"],
        "reasoning": ["final_answer"],
    }
    for family, names in expected.items():
        if family == "os" and shutil.which("bwrap") is None:
            continue  # the os family needs bubblewrap
        env = make(family, interface="tools")
        tools = env.tools
        assert [t["function"]["name"] for t in tools] == names
        for t in tools:
            assert t["type"] == "function"
            params = t["function"]["parameters"]
            assert params["type"] == "object" and params["additionalProperties"] is False
            assert set(params["required"]) == set(params["properties"])
            json.dumps(t)  # serialisable
        tools[0]["function"]["name"] = "changed"  # a copy: the env's schemas do not change
        assert env.tools[0]["function"]["name"] == names[0]
        assert "SQL:" not in env.system_prompt and "bash:" not in env.system_prompt


def test_agentbench_argument_names() -> None:
    """The argument names of AgentBench FC's configs/tasks/*.yaml and kg's const.py."""
    args = {}
    for family in ("db", "kg", "household", "shop", "reasoning"):
        for t in make(family, interface="tools").tools:
            args[t["function"]["name"]] = list(t["function"]["parameters"]["properties"])
    assert args["execute_sql"] == ["query"] and args["commit_final_answer"] == ["answers"]
    assert args["get_neighbors"] == ["variable", "relation"]
    assert args["intersection"] == ["variable1", "variable2"]
    assert args["argmax"] == args["argmin"] == ["variable", "attribute"]
    assert args["take_action"] == ["action"]
    assert args["search_action"] == ["keywords"] and args["click_action"] == ["value"]


def test_unknown_interface_and_family_without_tools() -> None:
    with pytest.raises(ValueError, match="interface must be one of"):
        make("db", interface="json")
    from entropace.envs.toy import register_letter_envs

    register_letter_envs("toolless_letter")
    with pytest.raises(ValueError, match="has no tool interface"):
        make("toolless_letter", interface="tools")
    assert make("toolless_letter").env.letter == "a"  # the text interface still works


# ------------------------------------------------------------------------------------ CLI


def _cli(argv: list[str], capsys: Any, monkeypatch: Any, stdin: str = "") -> tuple[int, str]:
    import io

    from entropace.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    rc = main(argv)
    return rc, capsys.readouterr().out


def test_cli_play_tools_scripted(capsys: Any, monkeypatch: Any) -> None:
    env = make("db", interface="tools", database="chinook")
    env.reset(0)
    gold = env.instance.gold
    answers = json.dumps({"answers": [str(v) for v in gold]})
    stdin = f'execute_sql {{"query": "{env.instance.sql}"}}\nnot a call\ncommit_final_answer {answers}\n'
    rc, out = _cli(
        ["envs", "play", "db", "--interface", "tools", "--oneline", "--opt", "database=chinook"],
        capsys,
        monkeypatch,
        stdin,
    )
    assert rc == 0
    assert "--- tools ---" in out and '"name": "execute_sql"' in out
    assert "(turn 1, reward 0, tool message)" in out
    assert "(turn 2, reward 0, user message, tool error: no_call)" in out
    assert "reward=1 success=True turns=3" in out


def test_cli_sample_solve_with_the_agentbench_profile(capsys: Any, monkeypatch: Any) -> None:
    rc, out = _cli(
        ["envs", "sample", "kg", "--profile", "agentbench", "--n", "2", "--solve"],
        capsys,
        monkeypatch,
    )
    assert rc == 0 and out.count("oracle: reward=1 success=True") == 2
    assert "<tool_call>" in out and "Final Answer: #" in out
    rc, out = _cli(["envs", "list", "db"], capsys, monkeypatch)
    assert "tools (--interface tools): execute_sql(query), commit_final_answer(answers)" in out


def test_cli_typed_call_shorthand() -> None:
    from entropace.cli.envs import typed_call

    names = ["take_action"]
    assert parse_tool_calls(typed_call('take_action {"action": "look"}', names)).calls == (
        ToolCall("take_action", {"action": "look"}),
    )
    for text in ("take_action oops", "look", 'other {"a": 1}', "take_action [1]"):
        assert typed_call(text, names) == text


def test_system_prompt_states_the_effective_turn_limit() -> None:
    env = make("db", profile="agentbench")
    assert env.system_prompt.endswith("You have at most 15 turns.")  # AgentBench FC's limit
    env.max_turns = 4  # what the rollout does with rollout.max_turns
    assert env.system_prompt.endswith("You have at most 4 turns.")
    assert make("kg", interface="tools", max_turns=6).system_prompt.endswith("at most 6 turns.")
