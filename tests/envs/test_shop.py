"""The ``shop`` family: reward, pages, parser, oracle, robustness, determinism."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropace.envs import DIFFICULTIES, make, spec
from entropace.envs.checks import HOSTILE_ACTIONS, check_env, oracle_success_rate, run_episode
from entropace.envs.shop import Goal, build_catalogue, make_goal, parse_action, shop_reward


def _product(category: str):
    return next(p for p in build_catalogue() if p.category == category)


def test_reward_hand_computed() -> None:
    p = _product("hiking boots")
    name, values = p.options[0]
    goal = Goal(
        category="hiking boots",
        attributes=(p.attributes[0], "no such attribute"),
        options=((name, values[0]),),
        price_limit=p.price - 0.01,  # too expensive
        target_asin=p.asin,
        instruction="",
    )
    # 1 of 2 attributes, option selected, price violated: (1 + 1 + 0) / (2 + 1 + 1)
    assert shop_reward(goal, p, {name: values[0]}) == pytest.approx(2 / 4)
    # option not selected: (1 + 0 + 0) / 4
    assert shop_reward(goal, p, {}) == pytest.approx(1 / 4)
    # same department, other category: factor 0.5
    other = _product("running shoes")
    assert other.department == p.department
    expected = (
        0.5
        * (
            sum(a in other.attributes for a in goal.attributes)
            + 0
            + (other.price <= goal.price_limit)
        )
        / 4
    )
    assert shop_reward(goal, other, {}) == pytest.approx(expected)
    # other department: factor 0.1
    coffee = _product("coffee")
    assert shop_reward(goal, coffee, {}) == pytest.approx(
        0.1 * (coffee.price <= goal.price_limit) / 4
    )


def test_goal_is_satisfied_by_its_target_exactly() -> None:
    products = build_catalogue()
    by_asin = {p.asin: p for p in products}
    for difficulty in DIFFICULTIES:
        for seed in range(30):
            goal = make_goal(products, seed, difficulty)
            target = by_asin[goal.target_asin]
            assert shop_reward(goal, target, dict(goal.options)) == 1.0
            assert f"{goal.price_limit:.2f}" in goal.instruction
            for attribute in goal.attributes:
                assert attribute in goal.instruction


def test_catalogue_is_deterministic_and_unique() -> None:
    a = build_catalogue()
    build_catalogue.cache_clear()
    b = build_catalogue()
    assert a == b
    assert len({p.asin for p in a}) == len(a) == 24 * 300


def test_parse_action() -> None:
    assert parse_action("search[red shoes]") == ("search", "red shoes")
    assert parse_action("Thought: I should open it.\nAction: click[ B01234ABCD ]") == (
        "click",
        "B01234ABCD",
    )
    assert parse_action("CLICK[Buy Now]") == ("click", "Buy Now")
    assert parse_action("search[a] then click[b]") == ("click", "b")
    assert parse_action("buy it now") is None
    assert parse_action("click[") is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parse_action_never_raises(text: str) -> None:
    result = parse_action(text)
    assert result is None or (result[0] in ("search", "click") and "\n" not in result[1])


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="[]\n"), max_size=80))
def test_parse_action_round_trips(arg: str) -> None:
    assert parse_action(f"search[{arg}]") == ("search", arg.strip())


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_env_survives_any_text(text: str) -> None:
    env = make("shop", difficulty="medium")
    env.reset(0)
    obs, reward, terminated, truncated, info = env.step(text)
    assert isinstance(obs, str) and obs
    assert reward == 0.0 or terminated


def test_navigation_and_errors() -> None:
    env = make("shop", difficulty="easy")
    obs, _ = env.reset(5)
    assert "[Search]" in obs
    obs, *_, info = env.step("click[Buy Now]")
    assert "no button [Buy Now]" in obs and not info["parse_error"]
    obs, *_ = env.step("search[water bottle]")
    assert "Page 1 of 5" in obs and "[Next >]" in obs and "[< Prev]" not in obs
    obs, *_ = env.step("search[again]")
    assert "no search box" in obs
    obs, *_ = env.step("click[Next >]")
    assert "Page 2 of 5" in obs and "[< Prev]" in obs
    asin = obs.split("\n")[5].split("]")[0][1:]
    obs, *_ = env.step(f"click[{asin.lower()}]")
    assert "Selected options: none" in obs and "[Buy Now]" in obs
    obs, *_ = env.step("click[Features]")
    assert obs.count("\n- ") >= 2
    obs, *_ = env.step("click[< Prev]")
    assert "[Buy Now]" in obs
    obs, *_, info = env.step("I will now think")
    assert info["parse_error"] and "Invalid action" in obs


def test_buying_ends_with_partial_reward() -> None:
    env = make("shop", difficulty="hard")
    env.reset(11)
    goal = env.goal
    target = env.products[env.asin_index[goal.target_asin]]
    env.step(f"search[{target.title}]")
    assert env.asin_index[goal.target_asin] in env.visible_results()
    env.step(f"click[{goal.target_asin}]")
    obs, reward, terminated, truncated, info = env.step("click[Buy Now]")  # no options selected
    n = len(goal.attributes) + len(goal.options) + 1
    assert terminated and not info["success"]
    assert reward == pytest.approx((len(goal.attributes) + 0 + 1) / n)


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_oracle_solves_all(difficulty: str) -> None:
    assert oracle_success_rate("shop", range(50), difficulty=difficulty) == 1.0


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_garbage_policy_scores_about_zero(difficulty: str) -> None:
    rng = random.Random(0)
    words = ["shoes", "black", "cheap", "coffee", "lamp", "Buy Now", "Next >", "B0AAAAAAAA"]

    def garbage(_obs: str) -> str:
        return rng.choice(["search[{}]", "click[{}]", "{}"]).format(rng.choice(words))

    wins = 0
    for seed in range(30):
        env = make("shop", difficulty=difficulty)
        wins += run_episode(env, garbage, seed).success
    assert wins <= 1


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_robust_to_hostile_actions(difficulty: str) -> None:
    extra = ("search[" + "x" * 10_000 + "]", "click[" * 50, "search[]", "click[Back to Search]" * 3)
    check_env(make("shop", difficulty=difficulty), seed=1, actions=HOSTILE_ACTIONS + extra)


def test_same_seed_same_instance_and_truncation() -> None:
    a, b = make("shop", difficulty="medium"), make("shop", difficulty="medium")
    assert a.reset(7) == b.reset(7)
    assert a.reset(7)[1]["gold"] != a.reset(8)[1]["gold"]
    env = make("shop", difficulty="easy")
    env.reset(0)
    results = [env.step("click[nothing]") for _ in range(env.max_turns)]
    assert env.max_turns == 10
    assert [r[3] for r in results] == [False] * 9 + [True]
    assert not any(r[2] for r in results)


def test_spec_registered() -> None:
    s = spec("shop")
    assert "WebShop" in s.description and "difficulty" in s.options
