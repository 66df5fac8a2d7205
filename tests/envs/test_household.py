"""The ``household`` family: PDDL action semantics, goals, generator, parser, oracle, robustness."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropace.envs import DIFFICULTIES, EnvError, make, spec
from entropace.envs.checks import HOSTILE_ACTIONS, check_env, oracle_success_rate, run_episode
from entropace.envs.household import (
    ACTIONS,
    LEVELS,
    NOTHING,
    TASK_TYPES,
    Command,
    Goal,
    Obj,
    Receptacle,
    World,
    apply,
    format_command,
    generate,
    goal_satisfied,
    next_command,
    parse_command,
)
from entropace.envs.household.explorer import Explorer, parse_task
from entropace.envs.household.generate import can_contain, candidates, pickupable, tables

NASTY = (
    "go to",
    "go to cabinet 999",
    "go to " + "cabinet 1 " * 5000,
    "take mug 1 from",
    "take from countertop 1",
    "move mug 1 to",
    "put put put in/on on",
    "heat heat 1 with with 1",
    "use",
    "examine " + "x" * 10_000,
    "open the fridge please",
    "think:",
    "think: " + "y" * 50_000,
    "help",
    "Action:",
    "> > >",
    "inventory\x00",
    "go to cabinet 1\n" * 1000,
)


def _room() -> World:
    """A small hand-built room: two open surfaces, a closed cabinet, three appliances, a desk."""
    recs = [
        Receptacle("cabinet 1", "cabinet", openable=True),
        Receptacle("countertop 1", "countertop", openable=False),
        Receptacle("countertop 2", "countertop", openable=False),
        Receptacle("coffeemachine 1", "coffeemachine", openable=False),
        Receptacle("desk 1", "desk", openable=False),
        Receptacle("fridge 1", "fridge", openable=True),
        Receptacle("microwave 1", "microwave", openable=True),
        Receptacle("sinkbasin 1", "sinkbasin", openable=False),
    ]
    objs = [
        Obj("apple 1", "apple", "countertop 1", cleanable=True, heatable=True, coolable=True),
        Obj("book 1", "book", "desk 1"),
        Obj("desklamp 1", "desklamp", "desk 1", toggleable=True, pickupable=False),
        Obj("mug 1", "mug", "cabinet 1", cleanable=True, heatable=True, coolable=True),
        Obj("mug 2", "mug", "countertop 2", cleanable=True, heatable=True, coolable=True),
    ]
    return World({r.name: r for r in recs}, {o.name: o for o in objs}, can_contain())


def test_actions_follow_alfred_pddl_and_grammar() -> None:
    w = _room()
    # Taking needs the agent at the receptacle, and an openable receptacle open.
    assert apply(w, "take", ("mug 1", "cabinet 1")) == NOTHING
    assert apply(w, "go to", ("cabinet 1",)) == "You arrive at cabinet 1. The cabinet 1 is closed."
    assert apply(w, "take", ("mug 1", "cabinet 1")) == NOTHING
    assert apply(w, "close", ("cabinet 1",)) == NOTHING
    assert apply(w, "open", ("cabinet 1",)) == (
        "You open the cabinet 1. The cabinet 1 is open. In it, you see a mug 1."
    )
    assert apply(w, "open", ("cabinet 1",)) == NOTHING
    assert apply(w, "take", ("mug 1", "cabinet 1")) == "You pick up the mug 1 from the cabinet 1."
    assert (w.holding, w.objects["mug 1"].parent) == ("mug 1", None)
    assert apply(w, "inventory", ()) == "You are carrying: a mug 1."
    assert apply(w, "examine", ("cabinet 1",)) == "The cabinet 1 is open. In it, you see nothing."
    # Hands hold one object.
    apply(w, "go to", ("countertop 1",))
    assert apply(w, "take", ("apple 1", "countertop 1")) == NOTHING
    assert apply(w, "examine", ("apple 1",)) == "There's nothing special about apple 1."
    # Heating needs the held object at the microwave (closed is fine: no opened precondition).
    assert apply(w, "heat", ("mug 1", "microwave 1")) == NOTHING
    assert (
        apply(w, "go to", ("microwave 1",))
        == "You arrive at microwave 1. The microwave 1 is closed."
    )
    assert apply(w, "heat", ("apple 1", "microwave 1")) == NOTHING  # not held
    assert apply(w, "clean", ("mug 1", "microwave 1")) == NOTHING  # wrong appliance
    assert apply(w, "heat", ("mug 1", "microwave 1")) == "You heat the mug 1 using the microwave 1."
    assert apply(w, "examine", ("mug 1",)) == "This is a hot mug 1."
    apply(w, "go to", ("sinkbasin 1",))
    assert (
        apply(w, "clean", ("mug 1", "sinkbasin 1")) == "You clean the mug 1 using the sinkbasin 1."
    )
    assert apply(w, "examine", ("mug 1",)) == "This is a hot and clean mug 1."
    apply(w, "go to", ("fridge 1",))
    assert apply(w, "cool", ("mug 1", "fridge 1")) == "You cool the mug 1 using the fridge 1."
    mug = w.objects["mug 1"]
    assert (mug.is_cool, mug.is_hot, mug.is_clean) == (True, False, True)  # CoolObject: not isHot
    assert apply(w, "examine", ("mug 1",)) == "This is a cool and clean mug 1."
    # Putting: canContain and open receptacles; both ALFWorld verbs.
    assert apply(w, "move", ("mug 1", "fridge 1")) == NOTHING  # closed
    apply(w, "go to", ("desk 1",))
    apply(w, "go to", ("coffeemachine 1",))
    assert (
        apply(w, "move", ("mug 1", "coffeemachine 1"))
        == "You move the mug 1 to the coffeemachine 1."
    )
    assert w.holding is None and mug.parent == "coffeemachine 1"
    apply(w, "go to", ("countertop 1",))
    apply(w, "take", ("apple 1", "countertop 1"))
    apply(w, "go to", ("coffeemachine 1",))
    assert apply(w, "move", ("apple 1", "coffeemachine 1")) == NOTHING  # coffeemachine: mugs only
    assert apply(w, "put", ("apple 1", "countertop 2")) == NOTHING  # not there
    apply(w, "go to", ("countertop 2",))
    assert (
        apply(w, "put", ("apple 1", "countertop 2"))
        == "You put the apple 1 in/on the countertop 2."
    )
    assert (
        apply(w, "examine", ("countertop 2",))
        == "On the countertop 2, you see a apple 1, and a mug 2."
    )
    assert apply(w, "inventory", ()) == "You are not carrying anything."


def test_lamp_and_look() -> None:
    w = _room()
    assert apply(w, "look", ()).startswith(
        "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, "
        "a countertop 1, a countertop 2,"
    )
    assert apply(w, "look", ()).endswith(", and a sinkbasin 1.")
    assert apply(w, "use", ("desklamp 1",)) == NOTHING  # not at the desk
    assert apply(w, "go to", ("desk 1",)) == (
        "You arrive at desk 1. On the desk 1, you see a book 1, and a desklamp 1."
    )
    assert apply(w, "look", ()) == "You are facing the desk 1. Next to it, you see nothing."
    assert apply(w, "take", ("desklamp 1", "desk 1")) == NOTHING  # not pickupable
    assert apply(w, "use", ("book 1",)) == "You don't see any switch on the book 1."
    assert apply(w, "examine", ("desklamp 1",)) == "This desklamp 1 is off."
    assert apply(w, "use", ("desklamp 1",)) == "You turn on the desklamp 1."
    assert apply(w, "use", ("desklamp 1",)) == "You turn off the desklamp 1."
    lamp = w.objects["desklamp 1"]
    assert (lamp.is_on, lamp.is_toggled) == (False, True)  # ToggleObject always sets isToggled


def test_goal_predicates() -> None:
    w = _room()
    place = Goal("pick_and_place_simple", "mug", "countertop", "")
    assert goal_satisfied(w, place)  # mug 2 already lies on countertop 2
    assert not goal_satisfied(w, Goal("pick_and_place_simple", "mug", "desk", ""))
    hot = Goal("pick_heat_then_place_in_recep", "mug", "countertop", "")
    assert not goal_satisfied(w, hot)
    w.objects["mug 2"].is_hot = True
    assert goal_satisfied(w, hot)
    assert not goal_satisfied(w, Goal("pick_cool_then_place_in_recep", "mug", "countertop", ""))
    assert not goal_satisfied(w, Goal("pick_clean_then_place_in_recep", "mug", "countertop", ""))
    # Two objects must share one receptacle instance.
    two = Goal("pick_two_obj_and_place", "mug", "countertop", "")
    w.objects["mug 1"].parent = "countertop 1"
    assert not goal_satisfied(w, two)
    w.objects["mug 1"].parent = "countertop 2"
    assert goal_satisfied(w, two)
    # Look at: hold the object, at the lamp's receptacle, the lamp toggled.
    look = Goal("look_at_obj_in_light", "apple", "desklamp", "")
    w.objects["apple 1"].parent, w.holding, w.agent_at = None, "apple 1", "desk 1"
    assert not goal_satisfied(w, look)
    w.objects["desklamp 1"].is_toggled = True
    assert goal_satisfied(w, look)
    w.agent_at = "countertop 1"
    assert not goal_satisfied(w, look)
    assert not goal_satisfied(w, Goal("look_at_obj_in_light", "book", "desklamp", ""))


def test_admissible_commands_match_preconditions() -> None:
    """Along random walks, a command succeeds (not "Nothing happens.") iff it is admissible:
    every admissible command and a random sample of all other (verb, names) commands."""
    rng = random.Random(0)
    for seed in range(8):
        w = generate(seed, "hard").world.copy()
        for _ in range(20):
            listed = set(w.admissible_commands())
            everything = []
            for verb, (arity, _) in ACTIONS.items():
                if verb in ("look", "inventory", "put"):
                    continue
                if arity == 1:
                    everything += [(verb, (a,)) for a in [*w.receptacles, *w.objects]]
                else:
                    everything += [(verb, (o, r)) for o in w.objects for r in w.receptacles]
            others = [c for c in everything if format_command(Command(*c)) not in listed]
            for verb, args in [*map(parse_command, sorted(listed)), *rng.sample(others, 150)]:
                if verb == "go to" and args[0] == w.agent_at:
                    continue  # going where you are is allowed but not listed
                if verb == "use" and args[0] in w.objects and not w.objects[args[0]].toggleable:
                    continue  # "You don't see any switch on the ..."
                feedback = apply(w.copy(), verb, args)
                text = format_command(Command(verb, args))
                assert (feedback != NOTHING) == (text in listed), (seed, text, feedback)
            apply(w, *parse_command(rng.choice(sorted(listed))))


def test_tables_are_alfworlds() -> None:
    t = tables()
    rooms = [s["room"] for s in t["scenes"].values()]
    assert len(rooms) == 120 and all(rooms.count(r) == 30 for r in set(rooms))
    assert t["scenes"]["1"]["receptacles"]["cabinet"] == 8  # FloorPlan1: 8 cabinets
    assert can_contain()["coffeemachine"] == frozenset({"mug"})
    assert set(t["openable"]) == {"cabinet", "drawer", "fridge", "microwave", "safe"}
    assert "desklamp" not in pickupable() and "mug" in pickupable()
    assert t["goals_valid"]["pick_heat_then_place_in_recep"] == ["Kitchen"]


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_generator_invariants(difficulty: str) -> None:
    level, t = LEVELS[difficulty], tables()
    seen: set[str] = set()
    for seed in range(150):
        inst = generate(seed, difficulty)
        w, goal = inst.world, inst.goal
        seen.add(goal.task_type)
        assert goal.task_type in level.task_types
        assert inst.room in t["goals_valid"][goal.task_type]
        assert len(w.receptacles) <= level.max_receptacles
        assert not goal_satisfied(w, goal), (seed, inst.gold)
        assert w.agent_at is None and w.holding is None
        assert not any(r.opened for r in w.receptacles.values())
        targets = [o for o in w.objects.values() if o.otype == goal.obj]
        assert len(targets) >= (2 if goal.task_type == "pick_two_obj_and_place" else 1)
        for o in w.objects.values():
            r = w.receptacles[o.parent]
            assert o.otype in can_contain()[r.rtype] or o.toggleable, (o, r)
        for o in targets:
            if goal.task_type != "look_at_obj_in_light":
                assert w.receptacles[o.parent].rtype != goal.target
            if level.hidden == 0.0:
                assert not w.receptacles[o.parent].openable
        if goal.task_type == "look_at_obj_in_light":
            assert any(o.otype == goal.target and o.toggleable for o in w.objects.values())
        text = goal.text
        assert text.endswith(".") and goal.obj in text and goal.target in text
    assert seen == set(level.task_types)


def test_generator_is_deterministic_and_seeds_differ() -> None:
    a, b = generate(17, "hard"), generate(17, "hard")
    assert a.gold == b.gold and a.goal == b.goal and a.world == b.world
    assert len({generate(s, "medium").gold for s in range(50)}) == 50
    assert all(candidates("hard", tt) for tt in TASK_TYPES)


def test_parse_command() -> None:
    assert parse_command("go to cabinet 1") == Command("go to", ("cabinet 1",))
    assert parse_command("Think: the mug is hot\nAction: Take Mug 1 From CounterTop 2.") == Command(
        "take", ("mug 1", "countertop 2")
    )
    assert parse_command("> put mug 1 in/on coffeemachine 1") == Command(
        "put", ("mug 1", "coffeemachine 1")
    )
    assert parse_command("put mug 1 on desk 2") == Command("put", ("mug 1", "desk 2"))
    assert parse_command("move apple1 to fridge1") == Command("move", ("apple 1", "fridge 1"))
    assert parse_command("heat egg 2 with microwave 1") == Command("heat", ("egg 2", "microwave 1"))
    assert parse_command("think: where is the mug?") == Command("think", ("where is the mug?",))
    assert parse_command("  inventory  \n\n") == Command("inventory")
    assert parse_command("go to the kitchen") == Command("go to", ("the kitchen",))  # no such place
    assert parse_command("go to cabinet 1 and open it") is None
    assert parse_command("take mug 1") is None
    assert parse_command("dance") is None
    assert parse_command("") is None
    assert parse_command("go to " + "a" * 400) is None


_name = st.builds(
    lambda t, n: f"{t} {n}",
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=14),
    st.integers(1, 999),
)
_command = st.one_of(
    st.sampled_from([Command("look"), Command("inventory"), Command("help")]),
    st.builds(
        lambda v, a: Command(v, (a,)),
        st.sampled_from(["go to", "open", "close", "use", "examine"]),
        _name,
    ),
    st.builds(
        lambda v, a, b: Command(v, (a, b)),
        st.sampled_from(["take", "move", "put", "clean", "heat", "cool"]),
        _name,
        _name,
    ),
)


@settings(max_examples=300, deadline=None)
@given(_command)
def test_parse_round_trips(command: Command) -> None:
    assert parse_command(format_command(command)) == command
    assert parse_command("Thought.\nAction: " + format_command(command).upper()) == command


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_parse_never_raises(text: str) -> None:
    result = parse_command(text)
    assert result is None or result.verb in (*ACTIONS, "help", "think")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200), st.sampled_from(DIFFICULTIES))
def test_env_survives_any_text(text: str, difficulty: str) -> None:
    env = make("household", difficulty=difficulty)
    env.reset(3)
    obs, reward, terminated, truncated, info = env.step(text)
    assert isinstance(obs, str) and obs and len(obs) <= 4000
    assert reward == 0.0 and not terminated and not info["success"]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.integers(0, 10_000), min_size=1, max_size=40))
def test_random_command_sequences_keep_the_world_consistent(seed: int, picks: list[int]) -> None:
    """Arbitrary sequences of well-formed commands (admissible or not): every object is
    in exactly one place (a receptacle, or the agent's hand), nothing is created or lost."""
    env = make("household", difficulty="hard", max_turns=1000)
    env.reset(seed)
    w = env.world
    names = [*w.receptacles, *w.objects, "nowhere 1"]
    verbs = sorted(ACTIONS)
    before = sorted(w.objects)
    for k in picks:
        if k % 2:  # an admissible command (moves the world along) ...
            admissible = w.admissible_commands()
            action = admissible[(k // 2) % len(admissible)]
        else:  # ... or any verb over any names (mostly "Nothing happens.")
            verb = verbs[(k // 2) % len(verbs)]
            args = tuple(names[(k // (7 + i)) % len(names)] for i in range(ACTIONS[verb][0]))
            action = format_command(Command(verb, args))
        obs, reward, terminated, _truncated, info = env.step(action)
        assert obs and not info["parse_error"]
        assert sorted(w.objects) == before
        held = [o.name for o in w.objects.values() if o.parent is None]
        assert held == ([w.holding] if w.holding else [])
        assert all(o.parent in w.receptacles for o in w.objects.values() if o.parent is not None)
        assert terminated == info["success"] == goal_satisfied(w, env.instance.goal)
        if terminated:
            assert reward == 1.0
            break


def test_episode_text_and_parse_errors() -> None:
    env = make("household", difficulty="easy")
    obs, info = env.reset(0)
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.")
    assert f"Your task is to: {env.instance.goal.text}" in obs
    assert set(info) >= {"task", "seed", "difficulty", "gold", "admissible_commands"}
    obs, _r, _t, _tr, info = env.step("please fetch the mug")
    assert info["parse_error"] and obs.startswith(NOTHING) and "help" in obs
    obs, *_, info = env.step("go to nowhere 1")
    assert obs == NOTHING and not info["parse_error"]
    obs, *_, info = env.step("think: plan first")
    assert obs == "OK." and not info["parse_error"]
    assert "go to (receptacle)" in env.step("help")[0]


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_oracle_solves_all(difficulty: str) -> None:
    assert oracle_success_rate("household", range(50), difficulty=difficulty) == 1.0


def test_oracle_with_alfworld_03_put_grammar() -> None:
    """The older ``put X in/on Y`` command works as well as ``move X to Y``."""
    for seed in range(30):
        env = make("household", difficulty="hard")
        env.reset(seed)

        def policy(_obs: str, env=env) -> str:
            cmd = next_command(env.world, env.instance.goal)
            if cmd.startswith("move "):
                obj, dest = cmd[5:].split(" to ")
                return f"put {obj} in/on {dest}"
            return cmd

        assert run_episode(env, policy, seed).success


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_explorer_solves_from_observations_alone(difficulty: str) -> None:
    """The non-privileged explorer (reads only observation strings) solves every instance
    given enough turns, and nearly all within the difficulty's turn limit."""
    within = 0
    for seed in range(40):
        env = make("household", difficulty=difficulty)
        obs, _ = env.reset(seed)
        assert parse_task(obs) == (
            env.instance.goal.task_type,
            env.instance.goal.obj,
            env.instance.goal.target,
        )
        within += run_episode(env, Explorer(obs), seed).success
        env = make("household", difficulty=difficulty, max_turns=300)
        obs, _ = env.reset(seed)
        assert run_episode(env, Explorer(obs), seed).success, seed
    assert within >= 36


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_garbage_policies_score_about_zero(difficulty: str) -> None:
    rng = random.Random(0)
    words = ["mug 1", "cabinet 1", "countertop 1", "apple 2", "fridge 1", "desklamp 1", "xyz"]
    templates = ["go to {}", "take {} from {}", "move {} to {}", "heat {} with {}", "use {}", "{}"]

    def garbage(_obs: str) -> str:
        return rng.choice(templates).format(rng.choice(words), rng.choice(words))

    wins = 0
    for seed in range(30):
        env = make("household", difficulty=difficulty)
        wins += run_episode(env, garbage, seed).success
        # A random walk over admissible commands (valid, but aimless).
        env = make("household", difficulty=difficulty)
        ep = run_episode(env, lambda _o, env=env: rng.choice(env.world.admissible_commands()), seed)
        wins += ep.success
    assert wins <= 3


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_robust_to_hostile_actions(difficulty: str) -> None:
    check_env(make("household", difficulty=difficulty), seed=2, actions=HOSTILE_ACTIONS + NASTY)


def test_same_seed_same_instance_and_truncation() -> None:
    a, b = make("household", difficulty="medium"), make("household", difficulty="medium")
    assert a.reset(7) == b.reset(7)
    assert a.reset(7)[1]["gold"] != a.reset(8)[1]["gold"]
    env = make("household", difficulty="easy")
    env.reset(0)
    results = [env.step("look") for _ in range(env.max_turns)]
    assert [LEVELS[d].max_turns for d in DIFFICULTIES] == [20, 30, 40]
    assert [r[3] for r in results] == [False] * 19 + [True]
    assert not any(r[2] for r in results)
    with pytest.raises(EnvError):
        env.step("look")


def test_reset_restores_the_initial_world() -> None:
    env = make("household", difficulty="hard")
    obs0, info0 = env.reset(4)
    policy = spec("household").oracle(env)
    for _ in range(3):
        env.step(policy(""))
    assert env.reset(4) == (obs0, info0)
    assert env.world == env.instance.world and env.world is not env.instance.world


def test_spec_and_options() -> None:
    s = spec("household")
    assert "ALFWorld" in s.description and "difficulty" in s.options and "MIT" in s.license
    with pytest.raises(ValueError, match="difficulty"):
        make("household", difficulty="impossible")
    with pytest.raises(TypeError, match="options"):
        make("household", level=3)
