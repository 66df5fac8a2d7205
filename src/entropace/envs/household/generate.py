"""Seeded problem generator for ALFWorld's six task types, and their goal predicates.

Rooms are ALFWorld's 120 AI2-THOR floor plans (kitchens, living rooms, bedrooms, bathrooms:
their receptacle instances and object types, from ``alfred_tables.json``, see :mod:`.extract`).
An instance draws a task type, a floor plan where ALFWorld generates that task type
(``GOALS_VALID``, uniformly among those where the task is possible), a target object type and
receptacle type (uniformly among the possible pairs), then scatters objects over
receptacles that can contain them (``canContain``). The goals are ALFWorld's PDDL goals
(``alfworld/gen/goal_library.py``):

* ``pick_and_place_simple``:  exists o, r: type(o)=O, type(r)=R, inReceptacle(o, r)
* ``pick_clean_then_place_in_recep`` / ``heat`` / ``cool``: the same, and isClean / isHot /
  isCool(o)
* ``pick_two_obj_and_place``: exists r, o1 != o2 of type O, both inReceptacle(., r)
* ``look_at_obj_in_light``: exists a lamp l of type T with isToggled(l) in a receptacle at the
  agent's location, and the agent holds an object of type O.

No object of type O starts in a receptacle of type R, so no goal holds at the start.
Generation is pure Python and takes well under a millisecond, so no cache is needed.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entropace.envs.household.world import PROCESSES, Obj, Process, Receptacle, World

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)

#: ALFWorld's task templates (``goal_library.py``); ``{recep}`` is a lamp type for look_at.
TEMPLATES: dict[str, tuple[str, str]] = {
    "pick_and_place_simple": ("put a {obj} in {recep}", "put some {obj} on {recep}"),
    "look_at_obj_in_light": (
        "look at {obj} under the {recep}",
        "examine the {obj} with the {recep}",
    ),
    "pick_clean_then_place_in_recep": (
        "put a clean {obj} in {recep}",
        "clean some {obj} and put it in {recep}",
    ),
    "pick_heat_then_place_in_recep": (
        "put a hot {obj} in {recep}",
        "heat some {obj} and put it in {recep}",
    ),
    "pick_cool_then_place_in_recep": (
        "put a cool {obj} in {recep}",
        "cool some {obj} and put it in {recep}",
    ),
    "pick_two_obj_and_place": (
        "put two {obj} in {recep}",
        "find two {obj} and put them in {recep}",
    ),
}

#: task type -> the appliance process it needs (:data:`.world.PROCESSES`).
PROCESSING: dict[str, Process] = {
    "pick_clean_then_place_in_recep": PROCESSES["clean"],
    "pick_heat_then_place_in_recep": PROCESSES["heat"],
    "pick_cool_then_place_in_recep": PROCESSES["cool"],
}

#: Receptacle types a desk or floor lamp stands on (open furniture), in order of preference.
LAMP_HOLDERS: tuple[str, ...] = (
    "desk",
    "sidetable",
    "dresser",
    "shelf",
    "coffeetable",
    "diningtable",
    "tvstand",
)


@dataclass(frozen=True)
class Level:
    """What a difficulty level draws.

    Attributes:
        task_types: the task types drawn (uniformly).
        max_receptacles: only floor plans with at most this many receptacle instances.
        distractor_types: at most this many object types besides the target's.
        max_instances: each object type gets 1..max_instances instances (pick_two: >= 2).
        hidden: probability that a target object starts inside a closed receptacle (cabinet,
            drawer, fridge, ...) when one can hold it; 0 means it always lies in the open.
        max_turns: the turn limit.
    """

    task_types: tuple[str, ...]
    max_receptacles: int
    distractor_types: int
    max_instances: int
    hidden: float
    max_turns: int


LEVELS: dict[str, Level] = {
    "easy": Level(TASK_TYPES[:2], 15, 6, 1, 0.0, 20),
    "medium": Level(TASK_TYPES[:5], 25, 12, 2, 0.5, 30),
    "hard": Level(TASK_TYPES, 10_000, 40, 3, 0.8, 40),
}


@dataclass(frozen=True)
class Goal:
    """The task of one instance: type, object type, target receptacle (or lamp) type, text."""

    task_type: str
    obj: str
    target: str
    text: str


@dataclass(frozen=True)
class Instance:
    """A generated game: the scene, the initial world (copy it before playing) and the goal."""

    seed: int
    difficulty: str
    scene: int
    room: str
    world: World
    goal: Goal

    @property
    def gold(self) -> str:
        """The goal and where its objects start, for debugging (never shown to the agent)."""
        where = ", ".join(
            f"{o.name} in {o.parent}"
            for o in self.world.objects.values()
            if o.otype == self.goal.obj
        )
        return f"{self.goal.task_type}(obj={self.goal.obj}, target={self.goal.target}); {where}"


# --- tables --------------------------------------------------------------------------------------
@functools.cache
def tables() -> dict[str, Any]:
    """ALFWorld's tables (``alfred_tables.json``, extracted from alfworld 0.4.2, MIT)."""
    return json.loads(Path(__file__).with_name("alfred_tables.json").read_text())


@functools.cache
def can_contain() -> dict[str, frozenset[str]]:
    return {r: frozenset(objs) for r, objs in tables()["can_contain"].items()}


@functools.cache
def pickupable() -> frozenset[str]:
    """Object types some receptacle can hold (lamps, chairs, windows, ... are not movable)."""
    return frozenset().union(*can_contain().values())


# --- goal predicates -----------------------------------------------------------------------------
def _placed(w: World, goal: Goal, flag: str | None) -> bool:
    return any(
        o.otype == goal.obj
        and o.parent is not None
        and w.receptacles[o.parent].rtype == goal.target
        and (flag is None or getattr(o, flag))
        for o in w.objects.values()
    )


def _two_placed(w: World, goal: Goal) -> bool:
    counts: dict[str, int] = {}
    for o in w.objects.values():
        if o.otype == goal.obj and o.parent is not None:
            if w.receptacles[o.parent].rtype == goal.target:
                counts[o.parent] = counts.get(o.parent, 0) + 1
    return any(n >= 2 for n in counts.values())


def _looked_at(w: World, goal: Goal) -> bool:
    held = w.objects.get(w.holding or "")
    if held is None or held.otype != goal.obj:
        return False
    return any(
        o.otype == goal.target and o.is_toggled and o.parent is not None and o.parent == w.agent_at
        for o in w.objects.values()
    )


GOAL_CHECKS: dict[str, Callable[[World, Goal], bool]] = {
    "pick_and_place_simple": lambda w, g: _placed(w, g, None),
    **{tt: (lambda w, g, flag=p.sets: _placed(w, g, flag)) for tt, p in PROCESSING.items()},
    "pick_two_obj_and_place": _two_placed,
    "look_at_obj_in_light": _looked_at,
}


def goal_satisfied(world: World, goal: Goal) -> bool:
    """ALFWorld's ``won``: the PDDL goal of ``goal.task_type`` holds in ``world``."""
    return GOAL_CHECKS[goal.task_type](world, goal)


# --- task sampling -------------------------------------------------------------------------------
def _sources(scene: dict[str, Any], obj: str, exclude: str, open_only: bool) -> list[str]:
    """Receptacle types of ``scene`` where ``obj`` may start (not the goal's type)."""
    openable = set(tables()["openable"])
    return [
        r
        for r in scene["receptacles"]
        if obj in can_contain()[r] and r != exclude and not (open_only and r in openable)
    ]


@functools.cache
def candidates(difficulty: str, task_type: str) -> dict[int, tuple[tuple[str, str], ...]]:
    """Floor plan -> the (object type, target type) pairs ``difficulty`` may draw for
    ``task_type`` there (floor plans with no pair are left out)."""
    level = LEVELS[difficulty]
    t = tables()
    out: dict[int, tuple[tuple[str, str], ...]] = {}
    for sid, scene in t["scenes"].items():
        recs = scene["receptacles"]
        if scene["room"] not in t["goals_valid"][task_type]:
            continue
        if sum(recs.values()) > level.max_receptacles:
            continue
        objs = [o for o in scene["objects"] if o in pickupable()]
        open_only = level.hidden == 0.0
        pairs: list[tuple[str, str]] = []
        if task_type == "look_at_obj_in_light":
            lamps = [o for o in scene["objects"] if o in t["toggleable"]]
            if any(r in recs for r in LAMP_HOLDERS):
                for obj in objs:
                    if _sources(scene, obj, "", open_only):
                        pairs += [(obj, lamp) for lamp in lamps]
        else:
            process = PROCESSING.get(task_type)
            appliance = process.appliance if process is not None else ""
            for obj in objs:
                if process is not None and (
                    appliance not in recs or obj not in t[process.capability]
                ):
                    continue
                for target in recs:
                    if target == appliance or obj not in can_contain()[target]:
                        continue
                    if _sources(scene, obj, target, open_only):
                        pairs.append((obj, target))
        if pairs:
            out[int(sid)] = tuple(pairs)
    return out


def generate(
    seed: int,
    difficulty: str,
    *,
    attempt: int = 0,
    scenes: Callable[[int], bool] | None = None,
    task_types: tuple[str, ...] | None = None,
) -> Instance:
    """Instance ``seed`` of ``difficulty``: same arguments, same instance (``random.Random``).

    ``attempt`` selects another random stream of the same seed (0: the historical one; the
    content splits, :mod:`.splits`, draw again until the instance lies in the seed's split);
    ``scenes`` restricts the floor plans drawn (a predicate on the floor-plan number; task
    types no allowed plan offers at ``difficulty`` are dropped: ALFRED's four unseen plans
    offer heat / cool tasks only from medium on); ``task_types`` overrides the level's task
    types (the ``agentbench`` profile's six).
    """
    level = LEVELS[difficulty]
    stream = f"household/{difficulty}/{seed}" + (f"/{attempt}" if attempt else "")
    rng = random.Random(stream)
    types = task_types or level.task_types
    if scenes is not None:  # only the task types that some allowed floor plan offers
        types = tuple(tt for tt in types if any(map(scenes, candidates(difficulty, tt))))
    if not types:
        raise ValueError(f"household: no allowed floor plan offers a task at {difficulty}")
    task_type = rng.choice(types)
    options = candidates(difficulty, task_type)  # uniform over floor plans, then over pairs
    if scenes is not None:
        options = {sid: pairs for sid, pairs in options.items() if scenes(sid)}
    scene_id = rng.choice(sorted(options))
    obj_type, target = rng.choice(options[scene_id])
    t = tables()
    scene = t["scenes"][str(scene_id)]
    openable = set(t["openable"])

    receptacles: dict[str, Receptacle] = {}
    by_type: dict[str, list[str]] = {}
    for rtype, count in sorted(scene["receptacles"].items()):
        for k in range(1, count + 1):
            name = f"{rtype} {k}"
            receptacles[name] = Receptacle(name, rtype, openable=rtype in openable)
            by_type.setdefault(rtype, []).append(name)

    def instances(otype: str, n: int) -> list[Obj]:
        return [
            Obj(
                name=f"{otype} {k}",
                otype=otype,
                parent=None,
                cleanable=otype in t["cleanable"],
                heatable=otype in t["heatable"],
                coolable=otype in t["coolable"],
                toggleable=otype in t["toggleable"],
                pickupable=otype in pickupable(),
            )
            for k in range(1, n + 1)
        ]

    placed: list[Obj] = []
    # Target objects: never in the goal's receptacle type; hidden in closed ones with p=hidden.
    low = 2 if task_type == "pick_two_obj_and_place" else 1
    exclude = "" if task_type == "look_at_obj_in_light" else target
    for o in instances(obj_type, rng.randint(low, max(low, level.max_instances))):
        open_src = _sources(scene, obj_type, exclude, True)
        closed_src = [r for r in _sources(scene, obj_type, exclude, False) if r in openable]
        hide = closed_src and (not open_src or rng.random() < level.hidden)
        o.parent = rng.choice(by_type[rng.choice(closed_src if hide else open_src)])
        placed.append(o)
    # Lamps stand on open furniture.
    holders = [r for r in LAMP_HOLDERS if r in by_type]
    for lamp in (o for o in scene["objects"] if o in t["toggleable"]):
        for o in instances(lamp, 1):
            o.parent = rng.choice(by_type[rng.choice(holders)]) if holders else None
            if o.parent is not None:
                placed.append(o)
    # Distractors: other movable object types of the floor plan, anywhere they fit.
    others = [
        o
        for o in scene["objects"]
        if o in pickupable() and o != obj_type and any(o in can_contain()[r] for r in by_type)
    ]
    for otype in rng.sample(others, min(level.distractor_types, len(others))):
        fits = [name for r, names in by_type.items() if otype in can_contain()[r] for name in names]
        for o in instances(otype, rng.randint(1, level.max_instances)):
            o.parent = rng.choice(fits)
            placed.append(o)

    # Listing order (type, number) must not reveal which objects matter.
    placed.sort(key=lambda o: (o.otype, int(o.name.rsplit(" ", 1)[1])))
    world = World(receptacles, {o.name: o for o in placed}, can_contain())
    text = rng.choice(TEMPLATES[task_type]).format(obj=obj_type, recep=target) + "."
    goal = Goal(task_type, obj_type, target, text)
    return Instance(seed, difficulty, scene_id, scene["room"], world, goal)
