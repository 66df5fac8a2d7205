"""World state and action semantics of ALFWorld text games (Shridhar et al. 2021, arXiv:2010.03768).

Each action below is a transcription of the action of the same name in ALFWorld's PDDL domain
``alfworld/data/alfred.pddl`` (alfworld 0.4.2, MIT), and its feedback text is the one in
ALFWorld's grammar ``alfworld/data/alfred.twl2``. Preconditions that fail give ALFWorld's
``"Nothing happens."``. Summary (``a`` agent, ``r`` receptacle, ``o`` object):

==================  ==============================================  ===============================
command             precondition                                    effect
==================  ==============================================  ===============================
go to r             r exists                                        atLocation(a, loc(r))
open r / close r    openable(r), at loc(r), r closed / open         opened(r) toggled
take o from r       at loc(r), inReceptacle(o, r), hands empty,     holds(a, o), o leaves r
                    r open if openable
move o to r         holds(a, o), at loc(r), r open if openable,     inReceptacle(o, r), hands empty
                    canContain(type(r), type(o))
clean o with r      holds(a, o), cleanable(o), at r, r sinkbasin    isClean(o)
heat o with r       holds(a, o), heatable(o), at r, r microwave     isHot(o), not isCool(o)
cool o with r       holds(a, o), coolable(o), at r, r fridge        isCool(o), not isHot(o)
use o               toggleable(o), o in a receptacle at agent's     isOn(o) flipped, isToggled(o)
                    location
examine r / o       r at agent's location / o held or visible       (describes it)
look, inventory     -                                               (describes surroundings/hands)
==================  ==============================================  ===============================

Every receptacle has its own location (as in ALFWorld's generated problems); the agent starts
at none of them ("in the middle of a room"). As in ALFWorld's domain (``full`` commented out),
receptacles have no capacity limit, and the microwave/fridge need not be open to heat/cool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

NOTHING = "Nothing happens."


@dataclass
class Receptacle:
    """A receptacle instance, e.g. ``cabinet 3`` (``rtype`` ``cabinet``)."""

    name: str
    rtype: str
    openable: bool
    opened: bool = False


@dataclass
class Obj:
    """An object instance, e.g. ``mug 2``. ``parent`` is its receptacle, None while held."""

    name: str
    otype: str
    parent: str | None
    cleanable: bool = False
    heatable: bool = False
    coolable: bool = False
    toggleable: bool = False
    pickupable: bool = True
    is_clean: bool = False
    is_hot: bool = False
    is_cool: bool = False
    is_on: bool = False
    is_toggled: bool = False


@dataclass
class World:
    """The mutable state of one game.

    ``receptacles`` and ``objects`` are keyed by instance name and kept in display order;
    ``can_contain`` maps a receptacle type to the object types it accepts.
    """

    receptacles: dict[str, Receptacle]
    objects: dict[str, Obj]
    can_contain: dict[str, frozenset[str]]
    agent_at: str | None = None
    holding: str | None = None

    # --- queries -------------------------------------------------------------------------------
    def contents(self, receptacle: str) -> list[Obj]:
        """Objects in ``receptacle`` (in instance order)."""
        return [o for o in self.objects.values() if o.parent == receptacle]

    def reachable(self, receptacle: Receptacle) -> bool:
        """The agent stands at ``receptacle`` and can reach inside it (open if openable)."""
        return self.agent_at == receptacle.name and (not receptacle.openable or receptacle.opened)

    def copy(self) -> World:
        return World(
            receptacles={k: Receptacle(**vars(v)) for k, v in self.receptacles.items()},
            objects={k: Obj(**vars(v)) for k, v in self.objects.items()},
            can_contain=self.can_contain,
            agent_at=self.agent_at,
            holding=self.holding,
        )

    # --- descriptions (ALFWorld's grammar) -----------------------------------------------------
    def describe_receptacle(self, r: Receptacle) -> str:
        """``examineReceptacle.feedback``: what the agent sees at or in ``r``."""
        if r.openable and not r.opened:
            return f"The {r.name} is closed."
        seen = _listing([f"a {o.name}" for o in self.contents(r.name)])
        if r.openable:
            return f"The {r.name} is open. In it, you see {seen}."
        return f"On the {r.name}, you see {seen}."

    def describe_object(self, o: Obj) -> str:
        """``examineObject.feedback`` (no sliced states: slicing is not part of the six tasks)."""
        if o.is_clean and o.is_hot:
            return f"This is a hot and clean {o.name}."
        if o.is_clean and o.is_cool:
            return f"This is a cool and clean {o.name}."
        if o.is_hot:
            return f"This is a hot {o.name}."
        if o.is_clean:
            return f"This is a clean {o.name}."
        if o.is_cool:
            return f"This is a cold {o.name}."
        if o.toggleable:
            return f"This {o.name} is {'on' if o.is_on else 'off'}."
        return f"There's nothing special about {o.name}."

    def look(self) -> str:
        """``look.feedback``: the receptacle the agent faces, or the whole room."""
        if self.agent_at is None:
            seen = _listing([f"a {name}" for name in self.receptacles])
            return f"You are in the middle of a room. Looking quickly around you, you see {seen}."
        return f"You are facing the {self.agent_at}. Next to it, you see nothing."

    def inventory(self) -> str:
        if self.holding is None:
            return "You are not carrying anything."
        return f"You are carrying: a {self.holding}."

    # --- admissible commands -------------------------------------------------------------------
    def admissible_commands(self) -> list[str]:
        """Commands whose precondition holds now (ALFWorld's ``admissible_commands``)."""
        cmds = ["look", "inventory"]
        cmds += [f"go to {name}" for name in self.receptacles if name != self.agent_at]
        here = self.receptacles.get(self.agent_at or "")
        held = self.objects.get(self.holding or "")
        if here is not None:
            cmds.append(f"examine {here.name}")
            if here.openable:
                cmds.append(f"{'close' if here.opened else 'open'} {here.name}")
            if self.reachable(here):
                for o in self.contents(here.name):
                    cmds.append(f"examine {o.name}")
                    if held is None and o.pickupable:
                        cmds.append(f"take {o.name} from {here.name}")
                    if o.toggleable:
                        cmds.append(f"use {o.name}")
                if held is not None and held.otype in self.can_contain.get(here.rtype, ()):
                    cmds.append(f"move {held.name} to {here.name}")
            if held is not None:
                for p in PROCESSES.values():
                    if here.rtype == p.appliance and getattr(held, p.capability):
                        cmds.append(f"{p.verb} {held.name} with {here.name}")
        if held is not None:
            cmds.append(f"examine {held.name}")
        return cmds


def _listing(items: list[str]) -> str:
    """TextWorld's list rendering: ``nothing``, ``a x``, ``a x, and a y``, ``a x, a y, and a z``."""
    if not items:
        return "nothing"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + ", and " + items[-1]


@dataclass(frozen=True)
class Process:
    """``CleanObject`` / ``HeatObject`` / ``CoolObject``: hold an object with ``capability`` at
    an ``appliance``; the effect sets the state flag ``sets`` and clears ``clears``."""

    verb: str
    appliance: str
    capability: str
    sets: str
    clears: str | None


PROCESSES: dict[str, Process] = {
    "clean": Process("clean", "sinkbasin", "cleanable", "is_clean", None),
    "heat": Process("heat", "microwave", "heatable", "is_hot", "is_cool"),
    "cool": Process("cool", "fridge", "coolable", "is_cool", "is_hot"),
}


# --- actions: world, arguments -> feedback ----------------------------------------------------
Action = Callable[[World, tuple[str, ...]], str]


def _go_to(w: World, args: tuple[str, ...]) -> str:
    r = w.receptacles.get(args[0])
    if r is None:
        return NOTHING
    w.agent_at = r.name
    return f"You arrive at {r.name}. {w.describe_receptacle(r)}"


def _open(w: World, args: tuple[str, ...]) -> str:
    r = w.receptacles.get(args[0])
    if r is None or not r.openable or r.opened or w.agent_at != r.name:
        return NOTHING
    r.opened = True
    return f"You open the {r.name}. {w.describe_receptacle(r)}"


def _close(w: World, args: tuple[str, ...]) -> str:
    r = w.receptacles.get(args[0])
    if r is None or not r.openable or not r.opened or w.agent_at != r.name:
        return NOTHING
    r.opened = False
    return f"You close the {r.name}."


def _take(w: World, args: tuple[str, ...]) -> str:
    o, r = w.objects.get(args[0]), w.receptacles.get(args[1])
    if o is None or r is None or not o.pickupable or w.holding is not None:
        return NOTHING
    if o.parent != r.name or not w.reachable(r):
        return NOTHING
    o.parent = None
    w.holding = o.name
    return f"You pick up the {o.name} from the {r.name}."


def _put(w: World, args: tuple[str, ...], feedback: str) -> str:
    o, r = w.objects.get(args[0]), w.receptacles.get(args[1])
    if o is None or r is None or w.holding != o.name or not w.reachable(r):
        return NOTHING
    if o.otype not in w.can_contain.get(r.rtype, ()):
        return NOTHING
    o.parent = r.name
    w.holding = None
    return feedback.format(o=o.name, r=r.name)


def _move(w: World, args: tuple[str, ...]) -> str:
    return _put(w, args, "You move the {o} to the {r}.")  # ALFWorld >= 0.4


def _put_in_on(w: World, args: tuple[str, ...]) -> str:
    return _put(w, args, "You put the {o} in/on the {r}.")  # ALFWorld <= 0.3


def _process(p: Process) -> Action:
    def action(w: World, args: tuple[str, ...]) -> str:
        o, r = w.objects.get(args[0]), w.receptacles.get(args[1])
        if o is None or r is None or w.holding != o.name or w.agent_at != r.name:
            return NOTHING
        if r.rtype != p.appliance or not getattr(o, p.capability):
            return NOTHING
        setattr(o, p.sets, True)
        if p.clears is not None:
            setattr(o, p.clears, False)
        return f"You {p.verb} the {o.name} using the {r.name}."

    return action


def _use(w: World, args: tuple[str, ...]) -> str:
    o = w.objects.get(args[0])
    if o is None or o.parent is None or o.parent != w.agent_at:
        return NOTHING
    if not o.toggleable:
        return f"You don't see any switch on the {o.name}."
    o.is_on = not o.is_on
    o.is_toggled = True
    return f"You turn {'on' if o.is_on else 'off'} the {o.name}."


def _examine(w: World, args: tuple[str, ...]) -> str:
    name = args[0]
    r = w.receptacles.get(name)
    if r is not None:
        return w.describe_receptacle(r) if w.agent_at == r.name else NOTHING
    o = w.objects.get(name)
    if o is None:
        return NOTHING
    visible = o.parent is not None and w.reachable(w.receptacles[o.parent])
    return w.describe_object(o) if visible or w.holding == o.name else NOTHING


def _look(w: World, args: tuple[str, ...]) -> str:
    return w.look()


def _inventory(w: World, args: tuple[str, ...]) -> str:
    return w.inventory()


#: verb -> (number of arguments, transition). The parser produces these verbs.
ACTIONS: dict[str, tuple[int, Action]] = {
    "go to": (1, _go_to),
    "open": (1, _open),
    "close": (1, _close),
    "take": (2, _take),
    "move": (2, _move),
    "put": (2, _put_in_on),
    **{verb: (2, _process(p)) for verb, p in PROCESSES.items()},
    "use": (1, _use),
    "examine": (1, _examine),
    "look": (0, _look),
    "inventory": (0, _inventory),
}


def apply(world: World, verb: str, args: tuple[str, ...]) -> str:
    """Apply one parsed command to ``world`` in place; return ALFWorld's feedback text."""
    arity, action = ACTIONS[verb]
    if len(args) != arity:
        raise ValueError(f"{verb!r} takes {arity} argument(s), got {len(args)}")
    return action(world, args)
