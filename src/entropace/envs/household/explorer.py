"""A non-privileged scripted baseline: solves household tasks from the observations alone.

Unlike the oracle (:mod:`.oracle`), :class:`Explorer` never looks at the world state. It reads
the receptacles from the first observation and the task from its last line, remembers what it
sees ("On the countertop 1, you see a mug 1, ..."), searches the receptacles that may contain
the object (ALFWorld's ``canContain`` table: domain knowledge, not instance knowledge), opening
closed ones, then processes and places the object as the task says. This is the hand-coded
expert of ALFWorld (``handcoded_expert.py``) in spirit; it measures how many turns a
systematic search needs at each difficulty level.
"""

from __future__ import annotations

import re

from entropace.envs.household.generate import LAMP_HOLDERS, PROCESSING, TEMPLATES, can_contain

_LIST = re.compile(r"(?:you see|In it, you see) (.+?)\.(?:\s|$)")
_ITEM = re.compile(r"an? ([a-z]+ \d+)")
_GOALS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(re.escape(t).replace(r"\{obj\}", "([a-z]+)").replace(r"\{recep\}", "([a-z]+)")), tt)
    for tt, pair in TEMPLATES.items()
    for t in pair
)


def _game_text(observation: str) -> str:
    """``observation`` without the ``action_list`` option's AgentBench suffix."""
    return observation.split(" AVAILABLE ACTIONS: ", 1)[0]


def parse_task(observation: str) -> tuple[str, str, str]:
    """(task type, object type, target type) from ``Your task is to: ...`` in ``observation``."""
    observation = _game_text(observation)
    line = observation.rsplit("Your task is to:", 1)[-1].strip().rstrip(".")
    for pattern, task_type in _GOALS:
        match = pattern.fullmatch(line)
        if match:
            return task_type, match.group(1), match.group(2)
    raise ValueError(f"not a household task: {line!r}")


def _type(name: str) -> str:
    return name.rsplit(" ", 1)[0]


class Explorer:
    """Policy: ``Explorer(first_observation)(observation) -> command``."""

    def __init__(self, first_observation: str) -> None:
        self.task_type, self.obj, self.target = parse_task(first_observation)
        room = _LIST.search(_game_text(first_observation))
        self.receptacles = _ITEM.findall(room.group(1)) if room else []
        self.seen: dict[str, list[str]] = {}  # receptacle -> objects last seen in/on it
        self.closed: set[str] = set()
        self.at: str | None = None
        self.holding: str | None = None
        self.processed = False
        self.placed: list[str] = []  # objects this policy put at the destination
        self.last = ""
        if self.task_type == "look_at_obj_in_light":
            self.dest = ""
        else:
            self.dest = next((r for r in self.receptacles if _type(r) == self.target), "")

    # --- reading observations -------------------------------------------------------------------
    def _observe(self, obs: str) -> None:
        arrive = re.match(r"You arrive at ([a-z]+ \d+)\.", obs)
        if arrive:
            self.at = arrive.group(1)
        if self.at is not None:
            if f"The {self.at} is closed." in obs:
                self.closed.add(self.at)
            listing = _LIST.search(obs)
            if listing:
                self.closed.discard(self.at)
                self.seen[self.at] = _ITEM.findall(listing.group(1))
        pick = re.match(r"You pick up the ([a-z]+ \d+) from the ([a-z]+ \d+)\.", obs)
        if pick:
            self.holding = pick.group(1)
            if self.holding in self.seen.get(pick.group(2), []):
                self.seen[pick.group(2)].remove(self.holding)
            self.processed = False
        put = re.match(r"You (?:move|put) the ([a-z]+ \d+) (?:to|in/on) the ([a-z]+ \d+)\.", obs)
        if put:
            self.seen.setdefault(put.group(2), []).append(put.group(1))
            self.placed.append(put.group(1))
            self.holding = None
        if re.match(r"You (clean|heat|cool) the ", obs):
            self.processed = True

    # --- acting --------------------------------------------------------------------------------
    def _go_or(self, where: str, command: str) -> str:
        if self.at != where:
            return f"go to {where}"
        if where in self.closed:
            return f"open {where}"
        return command

    def _search(self, wanted: str) -> str:
        """Open the closed receptacle here if it may hold ``wanted``, else go to the next unvisited
        receptacle that may hold it (lamps: open furniture), or any unvisited one."""
        fits = can_contain()
        if self.at in self.closed and wanted in fits.get(_type(self.at), ()):
            return f"open {self.at}"
        unvisited = [r for r in self.receptacles if r not in self.seen and r != self.at]
        if wanted in ("desklamp", "floorlamp"):
            likely = [r for r in unvisited if _type(r) in LAMP_HOLDERS]
        else:
            likely = [r for r in unvisited if wanted in fits.get(_type(r), ())]
        options = likely or unvisited or self.receptacles
        return f"go to {options[0]}"

    def _act(self) -> str:
        look = self.task_type == "look_at_obj_in_light"
        if self.holding is None:
            for r, objs in self.seen.items():
                for o in objs:
                    if _type(o) == self.obj and o not in self.placed and (look or r != self.dest):
                        return self._go_or(r, f"take {o} from {r}")
            return self._search(self.obj)
        if look:
            for r, objs in self.seen.items():
                for o in objs:
                    if _type(o) == self.target:
                        return f"go to {r}" if self.at != r else f"use {o}"
            return self._search(self.target)
        process = PROCESSING.get(self.task_type)
        if process is not None and not self.processed:
            where = next(r for r in self.receptacles if _type(r) == process.appliance)
            if self.at != where:
                return f"go to {where}"
            return f"{process.verb} {self.holding} with {where}"
        return self._go_or(self.dest, f"move {self.holding} to {self.dest}")

    def __call__(self, observation: str) -> str:
        self._observe(_game_text(observation))
        self.last = self._act()
        return self.last
