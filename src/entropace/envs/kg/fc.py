"""``kg`` through tools (AgentBench FC's knowledge-graph tools).

The seven tools and their argument names are AgentBench FC's
(``src/server/tasks/knowledgegraph/const.py``: ``get_relations(variable)``,
``get_neighbors(variable, relation)``, ``intersection(variable1, variable2)``,
``get_attributes(variable)``, ``argmax(variable, attribute)``, ``argmin(variable, attribute)``,
``count(variable)``), plus entropace's ``filter(variable, attribute, operator, value)``, which
some hard templates need. As in AgentBench FC the final answer is not a tool: a reply without
a tool call whose text says ``Final Answer: #N`` (the first such mention, before any
``Observation:``) answers with variable ``#N`` and ends the episode.

Each call maps onto the text action ``Action: tool(arg, ...)`` exactly: arguments must be on
one line, and the arguments the text parser splits on commas (relation, attribute, operator,
value) must not contain one (no relation or attribute name does).
"""

from __future__ import annotations

import re
from typing import Any

from entropace.envs.base import StepResult
from entropace.envs.kg.env import variable_index
from entropace.envs.kg.tools import parse_action
from entropace.envs.tools import (
    MessageStyle,
    ToolArgumentError,
    ToolCall,
    ToolSpec,
    ToolSuite,
    one_line,
    string_parameters,
)

#: tool -> its argument names in call order (AgentBench FC's TOOLS_PARAM_ORDER, plus filter)
PARAM_ORDER: dict[str, tuple[str, ...]] = {
    "get_relations": ("variable",),
    "get_neighbors": ("variable", "relation"),
    "intersection": ("variable1", "variable2"),
    "get_attributes": ("variable",),
    "argmax": ("variable", "attribute"),
    "argmin": ("variable", "attribute"),
    "count": ("variable",),
    "filter": ("variable", "attribute", "operator", "value"),
}

SYSTEM_PROMPT = """\
You answer questions about world geography with the knowledge in a knowledge graph, probing \
it with the tools provided.
- A variable is an entity or a set of entities produced by an earlier call; variables are \
numbered from 0 (#0 is the first variable, #1 the second, ...). Entity names must be exact.
- Use the tools in a sensible order (find relations with get_relations before following one \
with get_neighbors; attributes with get_attributes before argmax / argmin / filter).
- After each new variable, judge whether it is the final answer. Once you know it, reply \
WITHOUT a tool call, with the text 'Final Answer: #id', e.g. 'Final Answer: #3'. Do not call \
a tool to commit the answer.
- One tool call per turn; at most {max_turns} turns."""


def _system_prompt(env: Any, max_turns: int) -> str:
    return SYSTEM_PROMPT.format(max_turns=max_turns)


def _runner(tool: str) -> Any:
    names = PARAM_ORDER[tool]

    def run(env: Any, arguments: dict[str, Any]) -> StepResult:
        values = [one_line(str(arguments[n]).strip(), f"argument {n!r}") for n in names]
        if any(not v for v in values):
            raise ToolArgumentError("arguments must not be empty")
        # what the text parser splits on: filter from the left, the others from the right
        split = values[:3] if tool == "filter" else values[1:]
        for name, value in zip(names if tool == "filter" else names[1:], split):
            if "," in value:
                raise ToolArgumentError(f"argument {name!r} must not contain a comma")
        return env.step(f"Action: {tool}({', '.join(values)})")

    return run


_DESCRIPTIONS: dict[str, tuple[str, dict[str, str]]] = {
    "get_relations": (
        "Fetches all relations associated with a given entity or variable, which helps in "
        "navigating the Knowledge Base (KB) to find useful connections.",
        {"variable": "The entity or variable whose relations are to be fetched."},
    ),
    "get_neighbors": (
        "Returns all entities connected to a given variable through a specified relation, can "
        "only be used after identifying valid relations with get_relations().",
        {
            "variable": "The subject entity or variable to find neighbors for.",
            "relation": "The relationship through which neighbors are connected to the subject.",
        },
    ),
    "intersection": (
        "Computes the intersection of two sets of entities or variables of the same type.",
        {
            "variable1": "The first set of entities or a variable.",
            "variable2": "The second set of entities or a variable.",
        },
    ),
    "get_attributes": (
        "Retrieves all numerical attributes of a given variable, especially valuable when "
        "seeking for entities with extreme attributes (max or min).",
        {"variable": "The variable whose numerical attributes are to be fetched."},
    ),
    "argmax": (
        "Finds the entity with the maximum value of the specified attribute, can be used after "
        "identifying valid attributes with get_attributes().",
        {
            "variable": "The variable or set of entities among which to find the maximum.",
            "attribute": "The attribute to maximize over the entities.",
        },
    ),
    "argmin": (
        "Finds the entity with the minimum value of the specified attribute, can be used after "
        "identifying valid attributes with get_attributes().",
        {
            "variable": "The variable or set of entities among which to find the minimum.",
            "attribute": "The attribute to minimize over the entities.",
        },
    ),
    "count": (
        "Counts the number of entities within a given variable.",
        {"variable": "The variable or set of entities to count."},
    ),
    "filter": (
        "Keeps the members of a variable whose numerical attribute compares to a value "
        "(operator one of > >= < <= = !=); the result is a new variable.",
        {
            "variable": "The variable to filter.",
            "attribute": "The numerical attribute to compare.",
            "operator": "One of >, >=, <, <=, =, !=.",
            "value": "The number to compare with.",
        },
    ),
}

TOOLS: tuple[ToolSpec, ...] = tuple(
    ToolSpec(name, desc, string_parameters(**params), _runner(name))
    for name, (desc, params) in _DESCRIPTIONS.items()
)

_FINAL = re.compile(r"(?:Find|Final) Answer: #(\d+)")


def _no_call(env: Any, reply: str) -> StepResult | None:
    """AgentBench FC's final answer: ``Final Answer: #N`` in a reply without tool calls."""
    text = reply.split("Observation:")[0].replace("\\_", "_")
    match = _FINAL.search(text)
    if match is None:
        return None
    # a variable that does not exist ends the episode (KGEnv.final; AgentBench FC's IndexError)
    return env.final(variable_index(match.group(1)))


def to_call(action: str) -> ToolCall | str:
    """The call equivalent to a text action; ``answer(#N)`` becomes ``Final Answer: #N``."""
    call = parse_action(action)
    if isinstance(call, str):
        return action
    if call.tool == "answer":
        return f"Final Answer: {call.args[0]}"
    return ToolCall(call.tool, dict(zip(PARAM_ORDER[call.tool], call.args)))


def _agentbench_result(env: Any, call: ToolCall, obs: str) -> str:
    """AgentBench FC's tool message: ``Observation: ...`` for a result (``knowledgegraph/api.py``
    returns ``"Observation: ..."`` from every tool, e.g. line 106), ``Error processing tool call:
    ...`` for a call that failed (``knowledgegraph/task.py`` line 193, commit 578c5e9)."""
    session = getattr(env, "session", None)
    if session is not None and not session.last_ok:
        return f"Error processing tool call: {obs}"
    return obs if obs.startswith("Observation:") else f"Observation: {obs}"


#: AgentBench FC's wording: results and errors as above; the first message is
#: ``f'{question}\nEntities: [...]'`` without our ``Question:`` prefix (task.py line 93); the
#: message after a reply with neither a call nor a final answer (task.py line 135).
AGENTBENCH_STYLE = MessageStyle(
    first=lambda env, obs: obs.removeprefix("Question: "),
    result=_agentbench_result,
    no_call=lambda env: "No valid function calls found! Need to recheck the function calls.",
)

#: The default tools interface keeps one call per turn (``"strict"``); the ``agentbench``
#: profile runs every call of a reply in order (``calls_per_reply="all"``, task.py line 140).
SUITE = ToolSuite(
    tools=TOOLS,
    system_prompt=_system_prompt,
    to_call=to_call,
    no_call=_no_call,
    agentbench=AGENTBENCH_STYLE,
)
