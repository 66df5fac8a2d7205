"""The parser's Llama 3.2 pythonic, OpenAI-message and JSON-after-prose formats.

Each format is read where unambiguous and left alone otherwise; every one stays linear in the
reply's length: the parse time of adversarial replies grows by at most ~2x per doubling of
the size (a quadratic parser would take ~4x) and stays far below a second at
:data:`~entropace.envs.base.MAX_ACTION_CHARS`.
"""

from __future__ import annotations

import json
import time

import pytest

from entropace.envs.base import MAX_ACTION_CHARS
from entropace.envs.tools import MAX_JSON_DEPTH, ToolCall, parse_tool_calls


def test_llama_pythonic_list() -> None:
    parsed = parse_tool_calls('[get_weather(city="Paris", days=3), finish()]')
    assert parsed.calls == (
        ToolCall("get_weather", {"city": "Paris", "days": 3}),
        ToolCall("finish", {}),
    )
    assert parsed.errors == () and parsed.content == ""
    # <|python_tag|>, literals of every JSON type, dotted names
    parsed = parse_tool_calls(
        "<|python_tag|>[db.run(q='SELECT 1', rows=[1, 2.5], opts={'a': None, 'b': True})]"
    )
    assert parsed.calls == (
        ToolCall("db.run", {"q": "SELECT 1", "rows": [1, 2.5], "opts": {"a": None, "b": True}}),
    )


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ("[f(1)]", "positional arguments"),
        ("[f(x=open('/etc/passwd'))]", "not a literal"),
        ("[f(x=(1, 2))]", "not JSON"),
        ("[f(x=1]", "not valid Python"),
        ("[f(**kw)]", "positional arguments"),
        ("[f(x=" + "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1) + ")]", "deeper"),
    ],
)
def test_pythonic_errors(reply: str, error: str) -> None:
    parsed = parse_tool_calls(reply)
    assert parsed.calls == () and len(parsed.errors) == 1 and error in parsed.errors[0]


@pytest.mark.parametrize("reply", ["[Search]", "[1, 2, 3]", "click[Buy Now]", "[B0ABC] is it"])
def test_bracket_text_is_not_a_pythonic_call(reply: str) -> None:
    assert parse_tool_calls(reply).calls == () and parse_tool_calls(reply).errors == ()


def test_openai_assistant_message() -> None:
    message = {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": "call_7",
                "type": "function",
                "function": {"name": "execute_sql", "arguments": '{"query": "SELECT 1"}'},
            },
            {"type": "function", "function": {"name": "commit_final_answer", "arguments": {}}},
        ],
    }
    parsed = parse_tool_calls(json.dumps(message))
    assert parsed.calls == (
        ToolCall("execute_sql", {"query": "SELECT 1"}, "call_7"),
        ToolCall("commit_final_answer", {}),
    )
    assert parsed.content == "Let me check." and parsed.errors == ()
    bad = parse_tool_calls(json.dumps({"tool_calls": {"name": "x"}}))
    assert bad.calls == () and "not a list" in bad.errors[0]
    extra = parse_tool_calls(json.dumps({"tool_calls": [], "weather": 1}))
    assert "unknown field" in extra.errors[0]


def test_json_call_after_prose() -> None:
    call = {"name": "take_action", "arguments": {"action": "go to {cabinet 1}"}}
    for reply in (
        f"I should open it first. {json.dumps(call)}",
        f"Thinking {{not json}} done.\n```json\n{json.dumps(call)}\n```",
        f'He said "hi {json.dumps(call)}',  # a stray quote in the prose does not matter
    ):
        parsed = parse_tool_calls(reply)
        assert parsed.calls == (ToolCall("take_action", {"action": "go to {cabinet 1}"}),), reply
        assert "take_action" not in parsed.content
    assert parse_tool_calls(f"I should. {json.dumps(call)}").content == "I should."


@pytest.mark.parametrize(
    "reply",
    [
        # two call-shaped objects: ambiguous, not guessed between
        'first {"name": "a", "arguments": {}} then {"name": "b", "arguments": {}}',
        # the object does not end the reply
        'call {"name": "a", "arguments": {}} and then I wait',
        # not call-shaped (no arguments): prose with JSON in it
        'the record {"name": "alice"} is here: {"name": "bob"}',
        # an unmatched brace in the prose swallows the object: ambiguous
        'use { and {"name": "a", "arguments": {}}',
        "bash: awk '{ print $1 }' logs/app.log",
    ],
)
def test_ambiguous_prose_is_not_a_call(reply: str) -> None:
    parsed = parse_tool_calls(reply)
    assert parsed.calls == () and parsed.errors == ()


ADVERSARIAL = {
    "open braces": lambda n: "{" * n,
    "call prefixes": lambda n: '{"name": "a", "arguments": ' * (n // 27),
    "pythonic prefixes": lambda n: "[f(" + "x=[" * (n // 3) + "]",
    "many objects then a call": lambda n: (
        '{"a": 1} ' * (n // 9 - 8) + '{"name": "a", "arguments": {}}'
    ),
    "quotes and braces": lambda n: '{"' * (n // 2) + "}",
    "python strings": lambda n: "[f(x='" + "\\'" * (n // 2) + "')]",
}


def _best_time(reply: str, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        parse_tool_calls(reply)
        best = min(best, time.perf_counter() - t0)
    return best


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_new_formats_stay_linear(name: str) -> None:
    make = ADVERSARIAL[name]
    small, big = make(MAX_ACTION_CHARS // 4), make(MAX_ACTION_CHARS)
    assert len(big) <= MAX_ACTION_CHARS + 64
    t_small, t_big = _best_time(small), _best_time(big)
    assert t_big < 0.5, f"{name}: {t_big:.3f} s for {len(big)} characters"
    # 4x the size: linear ~4x, quadratic ~16x; the margin absorbs timer noise on small times
    assert t_big < 8 * t_small + 0.01, f"{name}: {t_small:.4f} s -> {t_big:.4f} s"
