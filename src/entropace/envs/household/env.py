"""``household``: ALFWorld-style embodied household tasks in text (Shridhar et al. 2021).

The agent is in a room of one of ALFWorld's 120 floor plans and must carry out a task such as
``put a hot mug in coffeemachine.`` with ALFWorld's text commands (``go to cabinet 1``,
``open cabinet 1``, ``take mug 1 from cabinet 1``, ``heat mug 1 with microwave 1``, ...). The
world follows ALFWorld's PDDL domain (:mod:`.world`); tasks are generated from a seed
(:mod:`.generate`). Reward 1.0 when the task's goal holds (ALFWorld's ``won``), which ends the
episode; 0 otherwise.
"""

from __future__ import annotations

from typing import Any

from entropace.envs.base import StepResult, action_too_long, check_difficulty
from entropace.envs.household.generate import LEVELS, Instance, generate, goal_satisfied
from entropace.envs.household.parser import parse_command
from entropace.envs.household.world import World, apply

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


def _cap(text: str) -> str:
    if len(text) <= MAX_OBSERVATION_CHARS:
        return text
    return text[: MAX_OBSERVATION_CHARS - 15] + " ... (truncated)"


class HouseholdEnv:
    """The ``household`` family (see module docstring). Options: ``difficulty``."""

    name = "household"
    system_prompt = SYSTEM_PROMPT

    def __init__(self, difficulty: str = "easy") -> None:
        self.difficulty = check_difficulty(difficulty)
        self.max_turns = LEVELS[difficulty].max_turns
        self.instance: Instance | None = None
        self.world: World | None = None

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.instance = generate(seed, self.difficulty)
        self.world = self.instance.world.copy()
        obs = (
            f"-= Welcome to TextWorld, ALFRED! =-\n\n{self.world.look()}\n\n"
            f"Your task is to: {self.instance.goal.text}"
        )
        info = {
            "task": self.name,
            "seed": seed,
            "difficulty": self.difficulty,
            "gold": self.instance.gold,
            "task_type": self.instance.goal.task_type,
            "scene": self.instance.scene,
            "admissible_commands": self.world.admissible_commands(),
        }
        return _cap(obs), info

    def step(self, action: str) -> StepResult:
        if self.world is None or self.instance is None:
            raise RuntimeError("household: step() before reset()")
        too_long = action_too_long(action)
        command = parse_command(action) if too_long is None else None
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
        info = {
            "success": success,
            "parse_error": parse_error,
            "admissible_commands": self.world.admissible_commands(),
        }
        return _cap(obs), float(success), success, False, info
