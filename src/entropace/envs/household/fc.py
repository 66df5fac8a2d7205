"""``household`` through tools (AgentBench FC's ALFWorld tool): ``take_action(action)``.

The schema is AgentBench FC's (``configs/tasks/alfworld.yaml``). A call maps onto the family's
text command exactly: the command is sent as the whole reply (the text parser reads the last
line, so the command must be on one line).
"""

from __future__ import annotations

from typing import Any

from entropace.envs.tools import (
    MessageStyle,
    ToolCall,
    ToolSpec,
    ToolSuite,
    one_line,
    string_parameters,
)

SYSTEM_PROMPT = """\
Interact with a household to solve a task. You are an agent in a household environment; at \
the beginning you get a description of the room and your goal. Each turn, call the tool \
`take_action` with the action you want to take, written exactly like the commands below \
(use the exact names you see, with their number, e.g. "cabinet 3"); this tool is the only way \
to act. After each action the environment tells you what happened; "Nothing happens" means the \
action was not possible.
You can hold one object at a time, and must open a closed receptacle before taking from or \
putting into it.
Commands: look | inventory | go to (receptacle) | open (receptacle) | close (receptacle) | \
take (object) from (receptacle) | move (object) to (receptacle) | examine (something) | \
use (object) | heat (object) with (receptacle) | clean (object) with (receptacle) | \
cool (object) with (receptacle)
To heat, cool or clean an object, hold it and use the microwave, fridge or sinkbasin. To look \
at something under a lamp, hold it and use the lamp where the lamp is. You have at most \
{max_turns} turns."""


def _system_prompt(env: Any, max_turns: int) -> str:
    return SYSTEM_PROMPT.format(max_turns=max_turns)


TAKE_ACTION = ToolSpec(
    name="take_action",
    description="Take an action.",
    parameters=string_parameters(action="The action you would like to take"),
    run=lambda env, a: env.step(one_line(a["action"], "the action")),
)


def to_call(action: str) -> ToolCall | str:
    """The call equivalent to a text command."""
    return ToolCall("take_action", {"action": action})


#: AgentBench FC's first message (the welcome line dropped) and no-call message (alfworld/task.py).
AGENTBENCH_STYLE = MessageStyle(
    first=lambda env, obs: "Here is your task. " + "\n".join(obs.split("\n\n")[1:]),
    no_call=lambda env: "No executable tool calls found. Please call a tool instead",
)

SUITE = ToolSuite(
    tools=(TAKE_ACTION,),
    system_prompt=_system_prompt,
    to_call=to_call,
    agentbench=AGENTBENCH_STYLE,
)
