"""``shop`` through tools (AgentBench FC's WebShop tools): ``search_action``, ``click_action``.

The schemas are AgentBench FC's (``configs/tasks/webshop.yaml``): ``search_action(keywords)``
and ``click_action(value)``; as in AgentBench FC's task code they become ``search[keywords]``
and ``click[value]``. The text parser reads what is inside the brackets, so keywords and
values must be one line without square brackets (a ``bad_arguments`` tool error otherwise).
"""

from __future__ import annotations

import re
from typing import Any

from entropace.envs.shop.env import parse_action
from entropace.envs.tools import (
    MessageStyle,
    ToolArgumentError,
    ToolCall,
    ToolSpec,
    ToolSuite,
    one_line,
    string_parameters,
)

SYSTEM_PROMPT = """\
You are shopping on a web store for a user. Each turn you see a text page and respond by \
calling one of the tools provided:
- `search_action` types keywords into the search box (only on a page with a [Search] box);
- `click_action` clicks a button shown in square brackets on the page (a product id such as \
B0ABC12345, an option value, Next >, < Prev, Back to Search, Description, Features or Buy \
Now); the value must be one shown on the page, without the brackets.
Open products, select every option the instruction asks for, check the price, then click \
Buy Now to finish. You are scored on how well the bought product matches the instruction. \
Think first, then call a tool; always call a tool. You have at most {max_turns} turns."""


def _system_prompt(env: Any, max_turns: int) -> str:
    return SYSTEM_PROMPT.format(max_turns=max_turns)


def _bracketed(value: str, what: str) -> str:
    one_line(value, what)
    if "[" in value or "]" in value:
        raise ToolArgumentError(f"{what} must not contain square brackets")
    return value


SEARCH_ACTION = ToolSpec(
    name="search_action",
    description="Use search functionality with specified keywords.",
    parameters=string_parameters(keywords="The keywords to use in the search function."),
    run=lambda env, a: env.step(f"search[{_bracketed(a['keywords'], 'keywords')}]"),
)

CLICK_ACTION = ToolSpec(
    name="click_action",
    description="Click a button or link with a specified value.",
    parameters=string_parameters(value="The value to click from the list of available actions."),
    run=lambda env, a: env.step(f"click[{_bracketed(a['value'], 'the value')}]"),
)


def to_call(action: str) -> ToolCall | str:
    """The call equivalent to a text action (``search[...]`` / ``click[...]``)."""
    parsed = parse_action(action)
    if parsed is None:
        return action
    verb, arg = parsed
    if verb == "search":
        return ToolCall("search_action", {"keywords": arg})
    return ToolCall("click_action", {"value": arg})


_BUTTON = re.compile(r"\[([^\[\]\n]+)\]")


def available_actions(env: Any) -> dict[str, Any]:
    """WebShop's ``get_available_actions()`` of the current page: ``{"has_search_bar": bool,
    "clickables": [lower-cased button texts]}`` (``["search"]`` on the search page)."""
    if env.page.kind == "search":
        return {"has_search_bar": True, "clickables": ["search"]}
    buttons = [b.strip().lower() for b in _BUTTON.findall(env.render_lines())]
    return {"has_search_bar": False, "clickables": buttons}


def _action_text(call: ToolCall) -> str:
    verb = "search" if call.name == "search_action" else "click"
    return f"{verb}[{next(iter(call.arguments.values()))}]"


#: AgentBench FC's messages (webshop/task.py): observation and available actions every turn.
AGENTBENCH_STYLE = MessageStyle(
    first=lambda env, obs: (
        f"The initial observation:\n{obs}\n\nAvailable Actions:\n{available_actions(env)}"
    ),
    result=lambda env, call, obs: (
        f"Action: {_action_text(call)}\n\nObservation:\n{obs}\n\n"
        f"Available Actions:\n{available_actions(env)}"
    ),
    no_call=lambda env: (
        "Observation:\nNo executable tool calls found! You should call a tool instead.\n\n"
        f"Available Actions:\n{available_actions(env)}"
    ),
)

SUITE = ToolSuite(
    tools=(SEARCH_ACTION, CLICK_ACTION),
    system_prompt=_system_prompt,
    to_call=to_call,
    agentbench=AGENTBENCH_STYLE,
)
