"""AgentBench FC parity under ``profile="agentbench"``, each against a case from its code.

Sources (github:THUDM/AgentBench at commit 578c5e9):

* os check scripts, ``data/os_interaction/scripts/1/check/{integer-match,string-match,
  size-match,containing,in}.py``; their use, ``src/server/tasks/os_interaction/task.py``
  lines 671-738; the counting question of ``data/os_interaction/data/dev.json`` lines 83-95
  ("How many hidden files are in /home?") is judged by ``integer-match``;
* calls per reply: ``tool_call = tool_calls[0]`` in ``os_interaction/task.py`` line 569,
  ``webshop/task.py`` line 99, ``alfworld/task.py`` line 166; ``for tool_call in tool_calls:``
  in ``dbbench/task.py`` line 133 and ``knowledgegraph/task.py`` line 140;
* WebShop pages: ``WebAgentTextEnv(observation_mode="text")``, ``webshop/task.py`` lines 39
  and 50 (WebShop's ``convert_html_to_text``: the visible texts joined with ``" [SEP] "``);
* ALFWorld's six task types: ``alfworld/task.py`` lines 65-72 (``self.prefixes``).
"""

from __future__ import annotations

import json

import pytest

from entropace.envs import make
from entropace.envs.agentbench import AGENTBENCH
from entropace.envs.os.agentbench_check import CHECK_TYPES, CHECKS, agentbench_check
from entropace.envs.registry import seeds
from entropace.envs.tools import ToolCall, format_tool_call

# ------------------------------------------------------------------------- os check scripts

# (check type, answer, gold, passes): each the result of running AgentBench's script
# `python3 check/<type>.py <answer> <gold>` (the scripts are transcribed in
# entropace.envs.os.agentbench_check; the expectations follow their code line by line)
SCRIPT_CASES = [
    ("integer-match", "6", "6\n", True),  # int() ignores the newline of the example output
    ("integer-match", " 6 ", "6", True),
    ("integer-match", "6.0", "6", False),  # int("6.0") raises: exit 1
    ("integer-match", "6 files", "6", False),
    ("integer-match", "+6", "6", True),
    ("string-match", "alpha\r\n", "alpha\n", True),  # norm_newline, then strip
    ("string-match", "Alpha", "alpha", False),  # case-sensitive
    ("string-match", "alpha beta", "alpha", False),
    ("size-match", "1K", "1024", True),
    ("size-match", "2M", "2097152", True),
    # size-match.py tries the suffixes in its dict's order, "B" first: "2MB" ends with "B",
    # int("2M") raises, the script exits 1; AgentBench fails "2MB", and so do we
    ("size-match", "2MB", "2097152", False),
    ("size-match", "1.5K", "1536", False),  # int("1.5") raises
    ("containing", "the answer is 42", "42", True),  # gold in answer
    ("containing", "4", "42", False),
    ("in", "42", "the answer is 42", True),  # answer in gold
    ("match", " 1\n", "1", True),  # match with strip (dev.json's first task: "match": "1")
    ("match", "1 second", "1", False),
]


@pytest.mark.parametrize(("check", "answer", "gold", "passes"), SCRIPT_CASES)
def test_os_check_scripts(check: str, answer: str, gold: str, passes: bool) -> None:
    assert CHECKS[check](answer, gold) is passes


def test_os_counting_kinds_use_integer_match() -> None:
    from entropace.envs.os.splits import ALL_TASKS
    from entropace.envs.os.tasks_shell import SHELL_TASKS

    # every question kind judged by an answer string has a check type; counts are integers
    for kind in ALL_TASKS:
        if kind in SHELL_TASKS or kind in (
            "create_file", "fix_permissions", "rename_docs", "collect_errors",
            "append_line", "delete_rotated", "merge_tables",
        ):  # fmt: skip
            continue
        assert kind in CHECK_TYPES, kind
    assert CHECK_TYPES["count_files"] == "integer-match"  # dev.json 83-95: "How many hidden files"
    assert agentbench_check("count_files", "6.0", "6") is False  # lenient scoring accepts it


def test_os_profile_scores_by_check_scripts() -> None:
    from entropace.envs.os.actions import answers_match

    # a counting question answered "N.0": correct for our lenient match, wrong for AgentBench
    for seed in seeds("train", 40):
        env = make("os", profile="agentbench", difficulty="easy")
        env.reset(int(seed))
        if env.task.kind != "count_files":
            env.close()
            continue
        gold = env.task.gold
        assert answers_match(f"{gold}.0", gold)
        call = format_tool_call(ToolCall("answer_action", {"answer": f"{gold}.0"}))
        _obs, reward, terminated, _truncated, info = env.step(call)
        assert (reward, terminated, info["success"]) == (0.0, True, False)
        break
    else:
        pytest.fail("no count_files instance in 40 seeds")


# ------------------------------------------------------------------------- the profile table


def test_profile_calls_per_reply_and_mix() -> None:
    assert {f: s.calls_per_reply for f, s in AGENTBENCH.items() if f != "reasoning"} == {
        "db": "all",
        "kg": "all",
        "os": "first",
        "household": "first",
        "shop": "first",
    }
    assert AGENTBENCH["db"].options["kinds"] == "select,insert,update"  # no DELETE
    assert AGENTBENCH["household"].options["task_types"] == "all"
    assert AGENTBENCH["shop"].options["page_format"] == "webshop"
    assert AGENTBENCH["os"].options["scoring"] == "agentbench"
    env = make("os", profile="agentbench")  # no difficulty: the mix
    assert type(env.env.env).__name__ == "MixedDifficulty"
    got = set()
    for seed in seeds("test", 12):
        got.add(env.reset(int(seed))[1]["difficulty"])
    env.close()
    assert got == {"easy", "medium", "hard"}
    assert type(make("os", profile="agentbench", difficulty="hard").env.env).__name__ == "OsEnv"


def _calls(*calls: ToolCall) -> str:
    return "\n".join(format_tool_call(c) for c in calls)


@pytest.mark.parametrize("family", ["household", "shop"])
def test_first_call_runs_and_the_rest_are_ignored(family: str) -> None:
    env = make(family, profile="agentbench", difficulty="easy")
    env.reset(0)
    if family == "household":
        first, second = (
            ToolCall("take_action", {"action": "look"}),
            ToolCall("take_action", {"action": "inventory"}),
        )
    else:
        first = ToolCall("search_action", {"keywords": "shampoo"})
        second = ToolCall("click_action", {"value": "Back to Search"})
    ref = make(family, profile="agentbench", difficulty="easy")
    ref.reset(0)
    want = ref.step(_calls(first))[0]
    obs, _, _, _, info = env.step(_calls(first, second))
    assert obs == want and info["tool_error"] is None and info.get("calls_ignored") == 1


def test_os_first_call_runs() -> None:
    env = make("os", profile="agentbench", difficulty="easy")
    env.reset(0)
    obs, _, terminated, _, info = env.step(
        _calls(
            ToolCall("bash_action", {"script": "echo first"}),
            ToolCall("bash_action", {"script": "echo second"}),
        )
    )
    env.close()
    assert "first" in obs and "second" not in obs and not terminated


def test_strict_rule_stays_an_option() -> None:
    env = make("household", profile="agentbench", difficulty="easy", calls_per_reply="strict")
    env.reset(0)
    call = ToolCall("take_action", {"action": "look"})
    _obs, _, _, _, info = env.step(_calls(call, call))
    assert info["tool_error"] == "several_calls"


# ------------------------------------------------------------------------- shop text mode


def test_shop_pages_in_webshop_text_mode() -> None:
    env = make("shop", profile="agentbench", difficulty="easy")
    first, info = env.reset(0)
    instruction = info["instruction"]
    page = f"WebShop [SEP] Instruction: [SEP] {instruction} [SEP] Search"
    assert first.startswith(f"The initial observation:\n{page}\n\nAvailable Actions:\n")
    search = format_tool_call(ToolCall("search_action", {"keywords": "shampoo"}))
    obs = env.step(search)[0]
    body = obs.split("Observation:\n", 1)[1].split("\n\nAvailable Actions:", 1)[0]
    texts = body.split(" [SEP] ")
    assert texts[:4] == ["Instruction:", instruction, "Back to Search", texts[3]]
    assert texts[3].startswith("Page 1 (Total results: ")
    assert "\n" not in body
    inner = env.env.env
    shown = [inner.products[i] for i in inner.visible_results()]
    # each result: ASIN, title, price, in order (the results list of WebShop's template)
    start = texts.index(shown[0].asin)
    assert texts[start : start + 3] == [shown[0].asin, shown[0].title, f"${shown[0].price:.2f}"]
    # clicking a shown ASIN opens the item page: options, title, price, the buttons
    obs = env.step(format_tool_call(ToolCall("click_action", {"value": shown[0].asin})))[0]
    body = obs.split("Observation:\n", 1)[1].split("\n\nAvailable Actions:", 1)[0]
    assert body.endswith(" [SEP] Description [SEP] Features [SEP] Buy Now")
    assert f" [SEP] {shown[0].title} [SEP] Price: ${shown[0].price:.2f} [SEP] " in body
    assert "'buy now'" in obs  # the available actions are unchanged by the page format


def test_shop_default_pages_unchanged() -> None:
    env = make("shop", difficulty="easy")
    first, info = env.reset(0)
    assert first == f"Instruction: {info['instruction']}\n[Search]"
    assert json.dumps(first)  # plain text
