"""``reasoning`` through tools: one final-answer tool, ``final_answer(answer)``.

AgentBench has no such task; the tool makes the single-turn family usable in a tools-only run.
A call maps onto the text reply ``<answer>answer</answer>`` exactly (the answer must not itself
contain ``<answer>`` tags, which would move the block the text parser reads). A reply without
the call is a ``no_call`` tool error, and the episode (one turn) ends truncated.
"""

from __future__ import annotations

from typing import Any

from entropace.envs.reasoning.env import extract_answer
from entropace.envs.tools import (
    ToolArgumentError,
    ToolCall,
    ToolSpec,
    ToolSuite,
    string_parameters,
)

SYSTEM_PROMPT = """\
You solve one reasoning problem per episode (arithmetic, number puzzles, word sorting, logic \
puzzles). You may think step by step first; then call the tool `final_answer` with your final \
answer, and nothing else, in the format the question asks for. You have one reply: it is \
graded at once and the episode ends. An answer written in the text instead of the tool call \
is not graded."""


def _answer(env: Any, arguments: dict[str, Any]) -> Any:
    answer = arguments["answer"]
    low = answer.lower()
    if "<answer>" in low or "</answer>" in low:
        raise ToolArgumentError("the answer must not contain <answer> tags")
    if not answer.strip():
        raise ToolArgumentError("the answer is empty")
    return env.step(f"<answer>{answer}</answer>")


FINAL_ANSWER = ToolSpec(
    name="final_answer",
    description="Submit the final answer to the problem (ends the episode).",
    parameters=string_parameters(answer="The final answer, in the format the question asks for."),
    run=_answer,
)


def to_call(action: str) -> ToolCall | str:
    """The call equivalent to a text reply with an ``<answer>`` block."""
    answer = extract_answer(action)
    return action if answer is None else ToolCall("final_answer", {"answer": answer})


SUITE = ToolSuite(
    tools=(FINAL_ANSWER,), system_prompt=lambda env, max_turns: SYSTEM_PROMPT, to_call=to_call
)
