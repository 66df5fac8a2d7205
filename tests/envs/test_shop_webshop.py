"""The ``shop`` option ``reward="webshop"``: WebShop's ``get_reward`` on hand-worked cases.

Every fuzzy score below is worked by hand from thefuzz 0.19.0's definition (difflib's
``SequenceMatcher.ratio() = 2 M / T``, ``M`` matched characters, ``T`` total length); the same
values were checked against thefuzz 0.19.0 itself (all 64,100 pairs of catalogue words and
random strings agree: ``benchmarks/results/envs_shop.md``).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropace.envs import DIFFICULTIES, make, spec
from entropace.envs.checks import HOSTILE_ACTIONS, check_env, oracle_success_rate, run_episode
from entropace.envs.shop import build_catalogue, make_goal, shop_reward
from entropace.envs.shop.catalogue import Product
from entropace.envs.shop.webshop import (
    full_process,
    get_attribute_reward,
    get_option_reward,
    get_reward,
    get_type_reward,
    normalize_color,
    token_set_ratio,
    type_factor,
    type_words,
)


def _boots(title: str, attributes: tuple[str, ...], price: float = 80.0) -> Product:
    return Product("B0TEST0001", "hiking boots", title, price, attributes, (), 4.0)


# --------------------------------------------------------------------------- the fuzzy matcher


@pytest.mark.parametrize(
    ("a", "b", "score"),
    [
        # "x large" / "xx large": sect "large", c12 "large x", c21 "large xx":
        # ratio(large, large x) = 2*5/12 -> 83, ratio(large, large xx) = 10/13 -> 77,
        # ratio(large x, large xx) = 2*7/15 -> 93 (the block "large x"); max 93.
        ("x-large", "xx-large", 93),
        # "iphone 14" / "iphone 15": the block "iphone 1" (8): 16/18 -> 89 (a match, > 85).
        ("iphone 14", "iphone 15", 89),
        # "ounce 8" / "ounce 12": block "ounce " (6): 12/15 -> 80; ratio(ounce, ounce 8) = 10/12
        # -> 83 is the max: no match.
        ("8 ounce", "12 ounce", 83),
        # "liter 20" / "liter 30": "liter " and "0" (7): 14/16 = 87.5 -> 88 (round half even).
        ("20 liter", "30 liter", 88),
        # "pound 2" / "pound 5": 12/14 = 85.7 -> 86: a match.
        ("2 pound", "5 pound", 86),
        # one token set inside the other: sect == c12 -> ratio 100.
        ("slip resistant sole", "slip resistant", 100),
        ("fit", "wide fit", 100),
        ("Slip-Resistant!!", "slip resistant", 100),  # punctuation -> spaces, lower case
        # "10" / "11": no common token, ratio("10", "11") = 2*1/4 -> 50.
        ("10", "11", 50),
        ("brown", "10", 0),  # no common character
        ("", "a", 0),  # an empty processed string scores 0
        ("é", "e", 0),  # characters 128-255 are dropped (force_ascii): "é" -> ""
    ],
)
def test_token_set_ratio_hand_worked(a: str, b: str, score: int) -> None:
    assert token_set_ratio(a, b) == score


def test_full_process_and_normalize_color() -> None:
    assert full_process("  Heather-Grey, XL! ") == "heather grey  xl"
    assert full_process("snake_case") == "snake_case"  # "_" is a word character for \W
    # The first colour of COLOR_SET's order contained in the text: "grey" is listed before
    # "heather", "blue" before "royal", "gold" before "rose".
    assert normalize_color("heather grey") == "grey"
    assert normalize_color("royal blue") == "blue"
    assert normalize_color("rose gold") == "gold"
    assert normalize_color("size 10") == "size 10"  # no colour: unchanged
    assert normalize_color("tired") == "red"  # substring, as WebShop's


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60), st.text(max_size=60))
def test_token_set_ratio_never_raises(a: str, b: str) -> None:
    score = token_set_ratio(a, b)
    assert isinstance(score, int) and 0 <= score <= 100
    if full_process(a) and full_process(a) == full_process(b):
        assert score == 100


# --------------------------------------------------------------------------- the four rewards


@pytest.mark.parametrize(
    ("query", "category", "title", "r_type"),
    [
        (True, True, 1.0, 1.0),
        (False, False, 0.25, 1.0),  # title_score > 0.2 alone is a match
        (False, False, 0.2, 0.5),  # not > 0.2: no match -> 0.5
        (False, False, 0.1, 0.5),  # 0.1 is not < 0.1
        (False, False, 0.09, 0.1),
        (True, True, 0.09, 0.1),  # the title tests override a query/category match
        (True, True, 0.0, 0.0),
        (False, True, 0.5, 1.0),
    ],
)
def test_type_factor_branches(query: bool, category: bool, title: float, r_type: float) -> None:
    assert type_factor(query, category, title) == r_type


def _product(category: str, title: str) -> Product:
    return Product("B0TEST0002", category, title, 50.0, ("x",), (), 4.0)


def test_type_reward_cases() -> None:
    target = _product("running shoes", "Glenrock Memory Foam Wide Fit Trail Runners")
    assert type_words(target) == ["glenrock", "memory", "foam", "wide", "fit", "trail", "runners"]
    assert type_words(_product("shampoo", "Arbor For Dry Hair 2-In-1 Shampoo")) == [
        "arbor",
        "dry",
        "hair",
        "shampoo",
    ]  # "for", "in" and numbers are not nouns
    assert get_type_reward(target, target) == {
        "r_type": 1.0,
        "query_match": True,
        "category_match": True,
        "title_score": 1.0,
    }
    # Same category, no common word: title_score 0 -> r_type 0 despite the query match.
    shoes = _product("running shoes", "Ironleaf Lightweight Running Shoes")
    assert get_type_reward(shoes, target) == {
        "r_type": 0.0,
        "query_match": True,
        "category_match": True,
        "title_score": 0.0,
    }
    # Other category (same department: breadcrumbs share 1 < 2): "fit" is 1 of 7 words ->
    # 0.143, not > 0.2 and not < 0.1 -> 0.5.
    shirt = _product("t-shirts", "Halden Relaxed Fit T-Shirt")
    info = get_type_reward(shirt, target)
    assert (info["query_match"], info["category_match"], info["r_type"]) == (False, False, 0.5)
    assert info["title_score"] == pytest.approx(1 / 7)
    # Other category, brand and "fit" shared: 2/7 > 0.2 -> 1.0 ("tee" is not a noun to spaCy).
    tee = _product("t-shirts", "Glenrock Quick Dry Relaxed Fit Graphic Tee")
    info = get_type_reward(tee, target)
    assert (info["title_score"], info["r_type"]) == (pytest.approx(2 / 7), 1.0)


def test_attribute_reward_cases() -> None:
    product = _boots("Kestrel Steel Toe Trekking Boots", ("leather", "slip resistant sole"))
    # "waterproof": best fuzzy score 47 (vs "leather"), not in title/bullets/description -> 0;
    # "slip resistant": token subset of "slip resistant sole" -> 100 -> 1;
    # "steel toe": fuzzy 25 / 21, but a substring of the title -> 1;
    # "non slip": fuzzy 67 vs "slip resistant sole"... no substring -> 0.
    wanted = ("waterproof", "slip resistant", "steel toe", "non slip")
    assert get_attribute_reward(product, wanted) == (2 / 4, 2)
    # The description fallback: "hiking boot" appears in "A leather, ... hiking boot from our".
    assert get_attribute_reward(product, ("hiking boot",)) == (1.0, 1)


def test_option_reward_cases() -> None:
    # heather grey -> grey (normalize_color) == grey: 100; x-large vs xx-large: 93 -> 2 of 2.
    assert get_option_reward(["grey", "xx-large"], ["heather grey", "x-large"]) == (1.0, 2)
    # 8 ounce vs 12 ounce: 83, not > 85; 2 pound vs 5 pound: 86 -> 1 of 2.
    assert get_option_reward(["12 ounce", "5 pound"], ["8 ounce", "2 pound"]) == (0.5, 1)
    # No option asked: r_option None, 0 matches; nothing chosen: 0.
    assert get_option_reward(["black"], []) == (None, 0)
    assert get_option_reward([], ["black"]) == (0.0, 0)


def test_get_reward_hand_worked() -> None:
    target = _boots("Arbor Waterproof Hiking Boots", ("waterproof", "slip resistant"), 80.0)
    bought = _boots("Kestrel Steel Toe Trekking Boots", ("leather", "slip resistant sole"), 120.0)
    attributes = ("waterproof", "slip resistant", "steel toe")
    # n_attr = 2 (slip resistant, steel toe; see above); options brown / 10 against the chosen
    # brown / 11: brown 100, "10" vs "11" 50 -> n_opt = 1; price 120 > 100 -> 0;
    # r_type: words [kestrel steel toe trekking boots] vs [arbor waterproof hiking boots] ->
    # 1/4 (boots) > 0.2 -> 1.
    # r = (2 + 1 + 0) / (3 + 2 + 1) * 1 = 0.5
    total, parts = get_reward(
        bought, target, attributes, ["brown", "10"], 100.0, {"color": "brown", "size": "11"}
    )
    assert total == 0.5
    assert parts == {
        "r_type": 1.0,
        "query_match": True,
        "category_match": True,
        "title_score": 0.25,
        "r_att": pytest.approx(2 / 3),
        "w_att": 0.5,
        "r_price": False,
        "w_price": pytest.approx(1 / 6),
        "r_option": 0.5,
        "w_option": pytest.approx(2 / 6),
    }
    # Within the price limit: (2 + 1 + 1) / 6.
    total, _ = get_reward(bought, target, attributes, ["brown", "10"], 150.0, {"color": "brown"})
    assert total == pytest.approx(4 / 6)
    # No option asked: no r_option part, denominator |A| + 1.
    total, parts = get_reward(bought, target, attributes, [], 150.0, {})
    assert total == pytest.approx(3 / 4) and "r_option" not in parts


def test_webshop_vs_exact_reward_in_the_env() -> None:
    products = build_catalogue()
    by_asin = {p.asin: p for p in products}
    differ = 0
    for seed in range(40):
        goal = make_goal(products, seed, "hard")
        target = by_asin[goal.target_asin]
        values = [v for _n, v in goal.options]
        # The target with the asked options scores 1 under both rewards.
        assert (
            get_reward(
                target, target, goal.attributes, values, goal.price_limit, dict(goal.options)
            )[0]
            == 1.0
        )
        for other in products[seed * 90 : seed * 90 + 5]:
            exact = shop_reward(goal, other, {})
            fuzzy, parts = get_reward(other, target, goal.attributes, values, goal.price_limit, {})
            assert 0.0 <= fuzzy <= 1.0 and parts["r_type"] in (0.0, 0.1, 0.5, 1.0)
            differ += fuzzy != exact
    assert differ > 0  # the two rewards are not the same function


def test_env_reward_option() -> None:
    env = make("shop", difficulty="medium", reward="webshop")
    env.reset(3)
    goal = env.goal
    words = " ".join(goal.attributes)
    env.step(f"search[{goal.category} {words}]")
    first = env.visible_results()[0]
    env.step(f"click[{env.products[first].asin}]")
    obs, reward, term, _, info = env.step("click[Buy Now]")
    product = env.products[first]
    target = env.products[env.asin_index[goal.target_asin]]
    want, parts = get_reward(
        product, target, goal.attributes, [v for _n, v in goal.options], goal.price_limit, {}
    )
    assert term and reward == want and info["reward_parts"] == parts
    assert info["success"] == (want >= 1.0 - 1e-9) and f"Reward: {want:.3f}" in obs
    # Default: the exact reward, no reward_parts.
    env = make("shop", difficulty="medium")
    env.reset(3)
    env.step(f"search[{goal.category} {words}]")
    env.step(f"click[{env.products[first].asin}]")
    _, reward, _, _, info = env.step("click[Buy Now]")
    assert reward == shop_reward(goal, product, {}) and "reward_parts" not in info


def test_bad_option() -> None:
    with pytest.raises(ValueError, match="reward must be one of"):
        make("shop", reward="fuzzy")


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_oracle_solves_all_with_webshop_reward(difficulty: str) -> None:
    assert oracle_success_rate("shop", range(50), difficulty=difficulty, reward="webshop") == 1.0


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_deterministic_and_robust_with_webshop_reward(difficulty: str) -> None:
    a = make("shop", difficulty=difficulty, reward="webshop")
    b = make("shop", difficulty=difficulty, reward="webshop")
    for seed in (0, 11):
        a.reset(seed)
        b.reset(seed)
        ea = run_episode(a, spec("shop").oracle(a), seed)
        eb = run_episode(b, spec("shop").oracle(b), seed)
        assert ea.observations == eb.observations and ea.rewards == eb.rewards == [0.0] * (
            len(ea.rewards) - 1
        ) + [1.0]
        check_env(a, seed, HOSTILE_ACTIONS + ("click[Buy Now]", "click[é" + "x" * 100 + "]"))
