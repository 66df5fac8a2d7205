"""``household``: ALFWorld-style embodied household tasks in text (Shridhar et al. 2021).

The agent is in a room of one of ALFWorld's 120 floor plans and must carry out a task such as
``put a hot mug in coffeemachine.`` with ALFWorld's text commands (``go to cabinet 1``,
``open cabinet 1``, ``take mug 1 from cabinet 1``, ``heat mug 1 with microwave 1``, ...). The
world follows ALFWorld's PDDL domain (:mod:`.world`); tasks are generated from a seed
(:mod:`.generate`). Reward 1.0 when the task's goal holds (ALFWorld's ``won``), which ends the
episode; 0 otherwise.

Options for AgentBench-ALFWorld's behaviour (github:THUDM/AgentBench,
``src/server/tasks/alfworld/task.py`` and ``utils.py``; all off by default, so existing runs
are unchanged):

* ``action_list``: every observation, the first one included, ends with AgentBench's
  ``" AVAILABLE ACTIONS: " + "\n".join(admissible_commands) + "\n"`` (``get_available_actions``);
* ``nearest_action``: a command line that is not an admissible command is replaced by the
  admissible command with the highest BLEU (:mod:`.nearest`, ``process_action``);
  ``info["mapped_action"]`` then names the command that ran;
* ``repeat_limit = k`` (AgentBench: 3): after the action is applied, when more than ``k``
  actions were taken and the last ``k`` replies are identical strings, the episode fails
  (terminated, reward 0, ``info["repeated_action"] = True``), before the goal is checked
  (AgentBench's ``len(log) > 3`` test on the raw outputs, done before its ``won`` test).
"""

from __future__ import annotations

from typing import Any

from entropace.envs.base import StepResult, action_too_long, check_difficulty
from entropace.envs.household.generate import LEVELS, TASK_TYPES, Instance, goal_satisfied
from entropace.envs.household.nearest import nearest_admissible
from entropace.envs.household.parser import (
    MAX_COMMAND_CHARS,
    Command,
    command_line,
    format_command,
    parse_command,
)
from entropace.envs.household.splits import first_observation, instance_fingerprint, split_instance
from entropace.envs.household.world import World, apply
from entropace.envs.splits import split_of

#: Observations longer than this are cut (the largest kitchens list ~40 receptacles).
MAX_OBSERVATION_CHARS = 4000

HELP = """Available commands:
  look:                             look around your current location
  inventory:                        check your current inventory
  go to (receptacle):               move to a receptacle
  open (receptacle):                open a receptacle
  close (receptacle):               close a receptacle
  take (object) from (receptacle):  take an object from a receptacle
  move (object) to (receptacle):    place an object in or on a receptacle
  examine (something):              examine a receptacle or an object
  use (object):                     use an object
  heat (object) with (receptacle):  heat an object using a receptacle
  clean (object) with (receptacle): clean an object using a receptacle
  cool (object) with (receptacle):  cool an object using a receptacle
  think: (thought):                 think, without acting"""

SYSTEM_PROMPT = f"""You are an agent in a household. Each turn you read what you observe and \
reply with exactly one command on the last line of your reply. You can hold one object at a \
time, and must open a closed receptacle (cabinet, drawer, fridge, ...) before taking from or \
putting into it. Use the exact names you see, with their number (e.g. "cabinet 3").
{HELP}
To heat, cool or clean an object, hold it and use the microwave, fridge or sinkbasin. To look \
at something under a lamp, hold it and use the lamp where the lamp is.
Example for "Your task is to: put a clean mug in coffeemachine.":
go to countertop 1
take mug 1 from countertop 1
go to sinkbasin 1
clean mug 1 with sinkbasin 1
go to coffeemachine 1
move mug 1 to coffeemachine 1"""

PARSE_ERROR = (
    "Nothing happens. That is not a command; reply with one command such as "
    '"go to cabinet 1", "take mug 1 from cabinet 1", "move mug 1 to countertop 1" '
    '(type "help" for all commands).'
)


REPEATED_ACTION = "You repeated the same action {k} times in a row; the episode is over (failed)."


def _cap(text: str) -> str:
    if len(text) <= MAX_OBSERVATION_CHARS:
        return text
    return text[: MAX_OBSERVATION_CHARS - 15] + " ... (truncated)"


def available_actions(commands: list[str]) -> str:
    """AgentBench's action list suffix (``ALFWorld.get_available_actions``), verbatim."""
    return " AVAILABLE ACTIONS: " + "\n".join(commands) + "\n"


def _admissible(command: Command, admissible: list[str]) -> bool:
    """``command`` is one of ``admissible`` (``put o in/on r`` counts as ``move o to r``)."""
    if command.verb == "put":
        command = Command("move", command.args)
    return format_command(command) in admissible


class HouseholdEnv:
    """The ``household`` family (see module docstring).

    Args:
        difficulty: ``easy`` | ``medium`` | ``hard``.
        action_list: append AgentBench's list of admissible commands to every observation.
        nearest_action: map a non-admissible command line to the nearest admissible command.
        repeat_limit: fail the episode after this many identical replies (0: never).
        task_types: ``"level"`` (default: the difficulty's task types) or ``"all"`` (ALFWorld's
            six at any difficulty, as AgentBench's ALFWorld test mixes them).
    """

    name = "household"
    system_prompt = SYSTEM_PROMPT

    def __init__(
        self,
        difficulty: str = "easy",
        action_list: bool = False,
        nearest_action: bool = False,
        repeat_limit: int = 0,
        task_types: str = "level",
    ) -> None:
        self.difficulty = check_difficulty(difficulty)
        if task_types not in ("level", "all"):
            raise ValueError(f"household: task_types must be 'level' or 'all', got {task_types!r}")
        self.task_types = task_types
        for name, flag in (("action_list", action_list), ("nearest_action", nearest_action)):
            if not isinstance(flag, bool):
                raise TypeError(f"household: {name} must be a bool (true/false), got {flag!r}")
        if isinstance(repeat_limit, bool) or not isinstance(repeat_limit, int) or repeat_limit < 0:
            raise ValueError(
                f"household: repeat_limit must be an int >= 0 (0 = off), got {repeat_limit!r}"
            )
        self.action_list = action_list
        self.nearest_action = nearest_action
        self.repeat_limit = repeat_limit
        self.max_turns = LEVELS[difficulty].max_turns
        self.instance: Instance | None = None
        self.world: World | None = None
        self.replies = 0  # raw replies so far this episode (for repeat_limit)
        self.recent: list[str] = []  # the last repeat_limit raw replies

    def _observe(self, text: str, commands: list[str]) -> str:
        """The capped observation, with the action list appended (uncapped) if asked."""
        return _cap(text) + (available_actions(commands) if self.action_list else "")

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        types = TASK_TYPES if self.task_types == "all" else None
        self.instance = split_instance(seed, self.difficulty, types)
        self.world = self.instance.world.copy()
        self.replies, self.recent = 0, []
        obs = first_observation(self.instance)
        info = {
            "task": self.name,
            "seed": seed,
            "difficulty": self.difficulty,
            "gold": self.instance.gold,
            "split": split_of(seed),
            "fingerprint": instance_fingerprint(self.instance),
            "task_type": self.instance.goal.task_type,
            "scene": self.instance.scene,
            "admissible_commands": self.world.admissible_commands(),
        }
        return self._observe(obs, info["admissible_commands"]), info

    def _read(self, action: str) -> tuple[Command | None, str | None]:
        """The command ``action`` runs, and the admissible command it was mapped to (if any)."""
        command = parse_command(action)
        if not self.nearest_action or (command is not None and command.verb in ("think", "help")):
            return command, None
        assert self.world is not None
        admissible = self.world.admissible_commands()
        if command is not None and _admissible(command, admissible):
            return command, None
        line = command_line(action)
        if len(line) > MAX_COMMAND_CHARS:
            return command, None
        choice = nearest_admissible(line, admissible)
        if choice is None:
            return command, None
        return parse_command(choice), choice

    def step(self, action: str) -> StepResult:
        if self.world is None or self.instance is None:
            raise RuntimeError("household: step() before reset()")
        too_long = action_too_long(action)
        command, mapped = self._read(action) if too_long is None else (None, None)
        parse_error = command is None
        if too_long is not None:
            obs = too_long
        elif command is None:
            obs = PARSE_ERROR
        elif command.verb == "think":
            obs = "OK."
        elif command.verb == "help":
            obs = HELP
        else:
            obs = apply(self.world, command.verb, command.args)
        success = not parse_error and goal_satisfied(self.world, self.instance.goal)
        info: dict[str, Any] = {"success": success, "parse_error": parse_error}
        if mapped is not None:
            info["mapped_action"] = mapped
        k = self.repeat_limit
        if k and too_long is None:  # AgentBench logs every reply it could read
            self.replies += 1
            self.recent = [*self.recent[1 - k :], action] if k > 1 else [action]
        if k and self.replies > k and len(set(self.recent)) == 1:
            obs, success = f"{obs}\n{REPEATED_ACTION.format(k=k)}", False
            info.update(success=False, repeated_action=True)
            terminated = True
        else:
            terminated = success
        info["admissible_commands"] = self.world.admissible_commands()
        return (
            self._observe(obs, info["admissible_commands"]),
            float(success),
            terminated,
            False,
            info,
        )
