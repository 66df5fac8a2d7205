"""``db`` through tools (AgentBench FC's DBBench tools): ``execute_sql``, ``commit_final_answer``.

The schemas are AgentBench FC's (``configs/tasks/dbbench.yaml``): ``execute_sql(query: string)``
and ``commit_final_answer(answers: array of strings)``. A call maps onto the family's text
actions exactly: ``execute_sql`` -> ``SQL: <query>`` (the text parser keeps everything after
the colon, so a query over several lines arrives whole; only surrounding whitespace and a
dangling closing code fence are dropped, neither of which changes a statement), and
``commit_final_answer`` -> ``Answer: <the answers as a JSON list>`` (read as that list).
"""

from __future__ import annotations

import json
from typing import Any

from entropace.envs.db.actions import parse_action
from entropace.envs.tools import (
    MessageStyle,
    ToolArgumentError,
    ToolCall,
    ToolSpec,
    ToolSuite,
    string_parameters,
    text_step,
)

SYSTEM_PROMPT = """\
I will ask you a question about a SQLite database; help me answer it by operating the \
database with SQL, using the two tools provided. Explain your thinking before each call.
- To run one SQL statement, call `execute_sql`; you see its result (at most {max_rows} rows; \
statements are stopped after {timeout:g} s). One statement per call.
- When you know the answer, call `commit_final_answer` with the list of answer values (one \
string per value, numbers without thousands separators; in order only when the question asks \
for an ordered list). It ends the episode; do not call it before you are sure.
- If the question asks you to modify the database, make the changes with `execute_sql`, then \
call `commit_final_answer`; after such operations its answers can be anything (the final state \
of the tables is checked).
Always use the tools; an answer written in the message text is not read.
You have at most {max_turns} turns."""


def _system_prompt(env: Any, max_turns: int) -> str:
    return SYSTEM_PROMPT.format(
        max_rows=getattr(env, "max_rows", 20),
        timeout=getattr(env, "timeout_s", 1.0),
        max_turns=max_turns,
    )


def _answers_text(arguments: dict[str, Any]) -> str:
    return "Answer: " + json.dumps(arguments["answers"], ensure_ascii=False)


def _sql_text(arguments: dict[str, Any]) -> str:
    if not arguments["query"].strip():
        raise ToolArgumentError("the query is empty")
    return "SQL: " + arguments["query"]


EXECUTE_SQL = ToolSpec(
    name="execute_sql",
    description="Executes a given SQL statement on the database and returns the result.",
    parameters=string_parameters(query="The SQL query to be executed."),
    run=text_step(_sql_text),
)

COMMIT_FINAL_ANSWER = ToolSpec(
    name="commit_final_answer",
    description="Commits the final answer after all operations are completed.",
    parameters={
        "type": "object",
        "properties": {
            "answers": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The list of final answers to commit.",
            }
        },
        "required": ["answers"],
        "additionalProperties": False,
    },
    run=text_step(_answers_text),
)


def to_call(action: str) -> ToolCall | str:
    """The call equivalent to a text action (``SQL: ...`` / ``Answer: <JSON list>``)."""
    parsed = parse_action(action)
    if parsed is None:
        return action
    if parsed.kind == "sql":
        return ToolCall("execute_sql", {"query": parsed.arg})
    try:
        values = json.loads(parsed.arg)
    except ValueError:
        values = [parsed.arg]
    if not isinstance(values, list):
        values = [values]
    return ToolCall("commit_final_answer", {"answers": [_text(v) for v in values]})


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


#: AgentBench FC's message after a reply without a tool call (dbbench/task.py).
AGENTBENCH_STYLE = MessageStyle(
    no_call=lambda env: "Internal error: No tool calls found despite finish reason."
)

SUITE = ToolSuite(
    tools=(EXECUTE_SQL, COMMIT_FINAL_ANSWER),
    system_prompt=_system_prompt,
    to_call=to_call,
    agentbench=AGENTBENCH_STYLE,
)
