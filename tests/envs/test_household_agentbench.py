"""The ``household`` family's AgentBench-ALFWorld options: action list, nearest admissible
command (BLEU), repeated-action failure."""

from __future__ import annotations

import math
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropace.envs import DIFFICULTIES, make, spec
from entropace.envs.checks import HOSTILE_ACTIONS, check_env, oracle_success_rate, run_episode
from entropace.envs.household import available_actions, nearest_admissible, sentence_bleu
from entropace.envs.household import env as env_module

ALL_ON = {"action_list": True, "nearest_action": True, "repeat_limit": 3}
KITCHEN = [
    "look",
    "inventory",
    "go to cabinet 1",
    "go to cabinet 2",
    "go to countertop 1",
    "go to fridge 1",
    "examine countertop 1",
    "take mug 1 from countertop 1",
    "take apple 1 from countertop 1",
]


# --------------------------------------------------------------------------- BLEU


def test_bleu_hand_worked() -> None:
    # h = "go to cabinet" (c = 3) vs r = "go to cabinet 1" (4 tokens):
    # p1 = 3/3, p2 = 2/2, p3 = 1/1; p4 has no 4-gram: 0 / max(1, 0), smoothed (method 4, first
    # smoothed order, k = 5) to 1 / (2 * 5 / ln 3) / 1 = ln 3 / 10; BP = exp(1 - 4/3).
    expected = math.exp(1 - 4 / 3) * math.exp(0.25 * math.log(math.log(3) / 10))
    assert sentence_bleu("go to cabinet 1".split(), "go to cabinet".split()) == pytest.approx(
        expected, rel=1e-12
    )
    assert expected == pytest.approx(0.41253, abs=1e-5)
    # h = "take the mug" vs r = "take mug 1 from countertop 1" (6 tokens): p1 = 2/3; no bigram,
    # trigram or 4-gram matches: smoothed ln3/10/2, ln3/20/1, ln3/40/1; BP = exp(1 - 6/3).
    ln3 = math.log(3)
    p = [2 / 3, ln3 / 10 / 2, ln3 / 20 / 1, ln3 / 40 / 1]
    expected = math.exp(-1) * math.exp(sum(0.25 * math.log(x) for x in p))
    got = sentence_bleu("take mug 1 from countertop 1".split(), "take the mug".split())
    assert got == pytest.approx(expected, rel=1e-12)
    # One token (c = 1): orders 2-4 are not smoothed (c > 1 fails) and drop out:
    # BLEU = BP * p1^(1/4) = exp(1 - 4/1) * 1.
    assert sentence_bleu("go to cabinet 1".split(), ["cabinet"]) == pytest.approx(math.exp(-3))
    # Identical: every p_n = 1, BP = 1. No unigram in common, or an empty hypothesis: 0.
    assert sentence_bleu("go to fridge 1".split(), "go to fridge 1".split()) == 1.0
    assert sentence_bleu("go to fridge 1".split(), "xyzzy".split()) == 0.0
    assert sentence_bleu("go to fridge 1".split(), []) == 0.0


def test_bleu_matches_nltk() -> None:
    nltk_bleu = pytest.importorskip("nltk.translate.bleu_score")
    smoothing = nltk_bleu.SmoothingFunction().method4
    rng = random.Random(0)
    vocab = "go to cabinet 1 2 take mug from move countertop the a".split()
    for _ in range(1000):
        ref = [rng.choice(vocab) for _ in range(rng.randint(0, 7))]
        hyp = [rng.choice(vocab) for _ in range(rng.randint(0, 7))]
        want = nltk_bleu.sentence_bleu([ref], hyp, smoothing_function=smoothing)
        assert sentence_bleu(ref, hyp) == want, (ref, hyp)


# --------------------------------------------------------------------------- nearest


def test_nearest_admissible_cases() -> None:
    # Exact (after strip + lower case, as AgentBench): returned as is.
    assert nearest_admissible("  Go To Fridge 1 ", KITCHEN) == "go to fridge 1"
    # "go to the fridge" (c = 4): vs "go to fridge 1" p1 = 3/4, p2 = 1/3 ("go to"), beating
    # every other "go to x" (p1 = 2/4) -> the fridge.
    assert nearest_admissible("go to the fridge", KITCHEN) == "go to fridge 1"
    assert nearest_admissible("take the mug 1 from the countertop 1", KITCHEN) == (
        "take mug 1 from countertop 1"
    )
    # Equal BLEU: the first in the list (np.argmax): cabinet 1 before cabinet 2.
    assert nearest_admissible("go to cabinet", KITCHEN) == "go to cabinet 1"
    # One word that is not a command but occurs in one: BLEU = exp(1 - 4/1) * 1 > 0.01.
    assert nearest_admissible("fridge", KITCHEN) == "go to fridge 1"
    # Nothing in common, empty text, or no admissible commands: None (left unmapped).
    assert nearest_admissible("xyzzy plugh", KITCHEN) is None
    assert nearest_admissible("", KITCHEN) is None
    assert nearest_admissible("look", []) is None


def test_nearest_threshold_is_strict() -> None:
    # h = "look" + 29 other words (c = 30) vs r = "look": p1 = 1/30, p2..p4 smoothed to
    # ln30 / (2*5) / 29, ln30 / (4*5) / 28, ln30 / (8*5) / 27; BP = 1 (c > 1):
    ln30 = math.log(30)
    p = [1 / 30, ln30 / 10 / 29, ln30 / 20 / 28, ln30 / 40 / 27]
    bleu = math.exp(sum(0.25 * math.log(x) for x in p))
    words = "look " + " ".join(f"w{i}" for i in range(29))
    assert sentence_bleu(["look"], words.split()) == pytest.approx(bleu, rel=1e-12)
    assert bleu < 0.01 and nearest_admissible(words, ["look"]) is None
    # 10 other words (c = 11): above the threshold, mapped.
    words = "look " + " ".join(f"w{i}" for i in range(10))
    assert 0.01 < sentence_bleu(["look"], words.split()) and nearest_admissible(words, ["look"])


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.lists(st.text(max_size=40), max_size=8))
def test_nearest_never_raises(text: str, admissible: list[str]) -> None:
    out = nearest_admissible(text, admissible)
    assert out is None or out in admissible or out == text.strip().lower()


# --------------------------------------------------------------------------- the env options


def _kitchen_env(**options: object) -> tuple[object, int]:
    env = make("household", difficulty="medium", **options)
    for seed in range(200):
        env.reset(seed)
        names = env.world.receptacles
        if "fridge 1" in names and "cabinet 2" in names:
            return env, seed
    raise AssertionError("no kitchen")


def test_action_list_is_appended_to_every_observation() -> None:
    env = make("household", action_list=True)
    obs, info = env.reset(4)
    suffix = " AVAILABLE ACTIONS: " + "\n".join(info["admissible_commands"]) + "\n"
    assert obs.endswith(suffix) and suffix == available_actions(info["admissible_commands"])
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert " AVAILABLE ACTIONS: look\ninventory\ngo to " in obs
    for action in ["look", "go to nowhere 1", "gibberish", "think: x", "a" * 40_000]:
        obs, _, _, _, info = env.step(action)
        assert obs.endswith(available_actions(info["admissible_commands"]))
        assert obs.count("AVAILABLE ACTIONS") == 1
    plain = make("household")
    assert "AVAILABLE ACTIONS" not in plain.reset(4)[0] + plain.step("look")[0]


def test_nearest_action_maps_and_runs_the_command() -> None:
    env, seed = _kitchen_env(nearest_action=True)
    obs, _, _, _, info = env.step("go to the fridge")
    assert info["mapped_action"] == "go to fridge 1" and not info["parse_error"]
    assert env.world.agent_at == "fridge 1" and obs.startswith("You arrive at fridge 1.")
    # An admissible command is run as is (no mapped_action); think/help are never mapped.
    _, _, _, _, info = env.step("open fridge 1")
    assert "mapped_action" not in info and env.world.receptacles["fridge 1"].opened
    assert env.step("think: where is the mug?")[0] == "OK."
    assert "go to (receptacle)" in env.step("help")[0]
    # Nothing close: unchanged behaviour (parse error).
    obs, _, _, _, info = env.step("xyzzy plugh")
    assert info["parse_error"] and "mapped_action" not in info and obs.startswith("Nothing")
    # Off (default): the same text is read literally and does nothing.
    plain = make("household", difficulty="medium")
    plain.reset(seed)
    obs, _, _, _, info = plain.step("go to the fridge")
    assert obs == "Nothing happens." and plain.world.agent_at is None


def test_put_is_not_remapped_when_move_is_admissible() -> None:
    env = make("household", nearest_action=True)
    next(s for s in range(50) if env.reset(s)[1]["task_type"] == "pick_and_place_simple")
    policy = spec("household").oracle(env)
    obs = ""
    while True:
        command = policy(obs)
        if command.startswith("move "):
            obj, dest = re.fullmatch(r"move (.+) to (.+)", command).groups()
            obs, reward, term, _, info = env.step(f"put {obj} in/on {dest}")
            assert "mapped_action" not in info and obs == f"You put the {obj} in/on the {dest}."
            break
        obs, *_ = env.step(command)


def _sloppy(policy):
    """The oracle's commands with a "the" before every name ("go to the fridge 1")."""
    return lambda obs: re.sub(r"\b([a-z]+ \d+)", r"the \1", policy(obs))


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_nearest_action_recovers_a_sloppy_oracle(difficulty: str) -> None:
    solved = {False: 0, True: 0}
    for nearest in (False, True):
        for seed in range(50):
            env = make("household", difficulty=difficulty, nearest_action=nearest)
            env.reset(seed)
            solved[nearest] += run_episode(
                env, _sloppy(spec("household").oracle(env)), seed
            ).success
    assert solved == {False: 0, True: 50}


def test_repeat_limit_follows_agentbench_s_count() -> None:
    env = make("household", repeat_limit=3)
    env.reset(0)
    # Three identical replies from the start do not fail: AgentBench tests len(log) > 3.
    for _ in range(3):
        _, _, term, _, info = env.step("look")
        assert not term and "repeated_action" not in info
    obs, reward, term, trunc, info = env.step("look")  # the 4th: the last 3 are identical
    assert (reward, term, trunc, info["success"], info["repeated_action"]) == (
        0.0,
        True,
        False,
        False,
        True,
    )
    assert "repeated the same action 3 times" in obs
    # x, y, y, y fails at the 4th reply; x, y, y, x, y does not fail.
    env.reset(0)
    results = [env.step(a)[2] for a in ("inventory", "look", "look", "look")]
    assert results == [False, False, False, True]
    env.reset(0)
    results = [env.step(a)[2] for a in ("look", "inventory", "inventory", "look", "inventory")]
    assert not any(results)
    # The raw reply is compared: a different thought makes a different reply.
    env.reset(0)
    assert not any(env.step(f"I think ({i})\nlook")[2] for i in range(6))
    # repeat_limit=1: every reply after the first repeats the last one.
    env = make("household", repeat_limit=1)
    env.reset(0)
    assert [env.step("look")[2] for _ in range(2)] == [False, True]
    # Off (default): never.
    env = make("household")
    env.reset(0)
    assert not any(env.step("look")[2] for _ in range(15))


def test_repeat_rule_is_checked_before_the_goal(monkeypatch: pytest.MonkeyPatch) -> None:
    env = make("household", repeat_limit=3)
    env.reset(0)
    for action in ("inventory", "look", "look"):
        env.step(action)
    monkeypatch.setattr(env_module, "goal_satisfied", lambda world, goal: True)
    _, reward, term, _, info = env.step("look")  # would win, but repeats: AgentBench fails it
    assert (reward, term, info["success"], info["repeated_action"]) == (0.0, True, False, True)
    env.reset(0)
    _, reward, term, _, info = env.step("look")  # the same win without a repeat counts
    assert (reward, term, info["success"]) == (1.0, True, True)


def test_bad_options() -> None:
    with pytest.raises(TypeError, match="action_list must be a bool"):
        make("household", action_list="yes")
    with pytest.raises(TypeError, match="nearest_action must be a bool"):
        make("household", nearest_action=1)
    for bad in (-1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="repeat_limit must be an int >= 0"):
            make("household", repeat_limit=bad)


# --------------------------------------------------------------------------- oracle, robustness


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
@pytest.mark.parametrize(
    "options",
    [{"action_list": True}, {"nearest_action": True}, {"repeat_limit": 3}, ALL_ON],
    ids=["action_list", "nearest_action", "repeat_limit", "all"],
)
def test_oracle_solves_all_with_options(difficulty: str, options: dict) -> None:
    assert oracle_success_rate("household", range(50), difficulty=difficulty, **options) == 1.0


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_deterministic_with_options(difficulty: str) -> None:
    a = make("household", difficulty=difficulty, **ALL_ON)
    b = make("household", difficulty=difficulty, **ALL_ON)
    rng = random.Random(5)
    texts = ["go to the fridge", "take the mug", "look", "open cabinet", "xyzzy"] * 3
    rng.shuffle(texts)
    for seed in (0, 9):
        oa, ob = a.reset(seed)[0], b.reset(seed)[0]
        assert oa == ob
        for text in texts:
            ra, rb = a.step(text), b.step(text)
            assert ra == rb
            if ra[2] or ra[3]:
                break


NASTY = (
    "go to the " + "cabinet " * 2000,
    "the " * 70 + "fridge 1",
    "take " + "mug 1 " * 60,
    "\n\n\n" + "go to the fridge",
    "GO TO THE FRIDGE\n",
    "go  to\tthe fridge 1",
)


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_robust_to_hostile_actions_with_options(difficulty: str) -> None:
    for seed in (0, 1):
        check_env(make("household", difficulty=difficulty, **ALL_ON), seed, HOSTILE_ACTIONS + NASTY)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=120), max_size=8), st.sampled_from(DIFFICULTIES))
def test_env_survives_any_text_with_options(texts: list[str], difficulty: str) -> None:
    env = make("household", difficulty=difficulty, **ALL_ON)
    env.reset(2)
    for text in texts:
        obs, reward, term, trunc, info = env.step(text)
        assert obs.endswith(available_actions(info["admissible_commands"]))
        mapped = info.get("mapped_action")
        assert mapped is None or isinstance(mapped, str)
        if term or trunc:
            break


def test_explorer_reads_observations_with_the_action_list() -> None:
    from entropace.envs.household.explorer import Explorer

    solved = {}
    for key, options in (("off", {}), ("on", ALL_ON)):
        solved[key] = []
        for seed in range(30):
            env = make("household", difficulty="medium", **options)
            obs, _ = env.reset(seed)
            policy = Explorer(obs)
            while True:
                obs, _, term, trunc, info = env.step(policy(obs))
                if term or trunc:
                    solved[key].append(info["success"])
                    break
    assert solved["on"] == solved["off"] and sum(solved["on"]) >= 27
