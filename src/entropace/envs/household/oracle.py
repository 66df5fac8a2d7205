"""Scripted oracle for ``household``: plans from the true world state, acts only by commands.

Each turn it recomputes the next command from the current state (so it recovers from any
state): fetch a target object (go to its receptacle, open it if closed, take it), process it
if the task asks (go to the sinkbasin / microwave / fridge, clean / heat / cool it), then go to
the destination (open it if closed) and move it there; for ``look_at_obj_in_light``, carry it
to the lamp and use the lamp. ``pick_two_obj_and_place`` repeats the fetch for a second object.
"""

from __future__ import annotations

from typing import Any

from entropace.envs.base import Policy
from entropace.envs.household.generate import PROCESSING, Goal
from entropace.envs.household.world import World


def _go_or(world: World, where: str, command: str) -> str:
    """``command`` if the agent is at ``where`` (opening it first if closed), else go there."""
    if world.agent_at != where:
        return f"go to {where}"
    r = world.receptacles[where]
    if r.openable and not r.opened:
        return f"open {where}"
    return command


def next_command(world: World, goal: Goal) -> str:
    """The oracle's next command in ``world`` for ``goal``."""
    if goal.task_type == "look_at_obj_in_light":
        lamp = next(o for o in world.objects.values() if o.otype == goal.target)
        dest = lamp.parent or ""
    else:
        lamp = None
        dest = next(name for name, r in world.receptacles.items() if r.rtype == goal.target)
    held = world.objects.get(world.holding or "")
    if held is None:
        # Any object of the type (look_at) or one not yet in the destination (placing tasks).
        obj = next(
            o
            for o in world.objects.values()
            if o.otype == goal.obj
            and o.parent is not None
            and (lamp is not None or o.parent != dest)
        )
        assert obj.parent is not None
        return _go_or(world, obj.parent, f"take {obj.name} from {obj.parent}")
    if held.otype != goal.obj:  # not reached by the oracle itself; put it back somewhere
        fits = [n for n, r in world.receptacles.items() if held.otype in world.can_contain[r.rtype]]
        spot = world.agent_at if world.agent_at in fits else fits[0]
        return _go_or(world, spot, f"move {held.name} to {spot}")
    if lamp is not None:
        if world.agent_at != dest:
            return f"go to {dest}"
        return f"use {lamp.name}"
    process = PROCESSING.get(goal.task_type)
    if process is not None and not getattr(held, process.sets):
        where = next(n for n, r in world.receptacles.items() if r.rtype == process.appliance)
        if world.agent_at != where:
            return f"go to {where}"
        return f"{process.verb} {held.name} with {where}"
    return _go_or(world, dest, f"move {held.name} to {dest}")


def oracle(env: Any) -> Policy:
    """Policy solving the instance ``env`` was last reset to (``env`` may be wrapped)."""
    inner = getattr(env, "env", env)
    if inner.instance is None:
        raise RuntimeError("household oracle: call env.reset(seed) first")

    def policy(observation: str) -> str:
        return next_command(inner.world, inner.instance.goal)

    return policy
