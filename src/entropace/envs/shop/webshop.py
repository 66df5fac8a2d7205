"""WebShop's reward, formula for formula (the ``shop`` option ``reward="webshop"``).

Mirrors ``web_agent_site/engine/goal.py`` of github:princeton-nlp/WebShop (commit 64fa2a5, the
one AgentBench's WebShop worker builds): :func:`get_reward`, :func:`get_type_reward`,
:func:`get_attribute_reward` and :func:`get_option_reward`, with ``normalize_color`` from
``web_agent_site/engine/normalize.py`` and the fuzzy matcher ``thefuzz.fuzz.token_set_ratio``
of thefuzz 0.19.0 (WebShop pins ``thefuzz==0.19.0``, AgentBench ``thefuzz~=0.19.0``; without
python-Levenshtein, which neither installs, it scores with :class:`difflib.SequenceMatcher`),
re-implemented in :func:`token_set_ratio`. For a bought product ``P``, goal ``G`` with
attributes ``A``, options ``O`` and price limit ``u``::

    r = r_type * (n_attr + n_opt + [price(P) <= u]) / (|A| + |O| + 1)

* ``n_attr``: goal attributes ``a`` with some product attribute ``p``,
  ``token_set_ratio(p, a) > 85``, or else ``a`` a substring of the lower-cased title, bullet
  points (our Features page) or description;
* ``n_opt``: goal option values ``o`` with some chosen value ``v``,
  ``token_set_ratio(normalize_color(v), normalize_color(o)) > 85``;
* ``r_type`` (type factor): 1.0; 0.5 unless the query matches, the category breadcrumbs share
  >= 2 entries or ``title_score > 0.2``; then 0.1 if ``title_score < 0.1``; 0.0 if
  ``title_score == 0``, where ``title_score = |nouns(P) & nouns(target)| / len(nouns(target))``
  (0.2 when the target's noun list is empty).

What our catalogue lacks, and what stands in for it:

* WebShop's ``query`` (the search query a product was scraped with) -> our category (each
  category is one query); ``product_category`` breadcrumbs -> ``[department, category]``
  (so ``category_match`` equals ``query_match`` here);
* the words spaCy (``en_core_web_sm``; AgentBench's patch loads ``en_core_web_lg``) tags
  ``NOUN``/``PROPN`` in a title -> :func:`type_words`, a rule calibrated once against spaCy
  3.8 ``en_core_web_sm`` 3.8.0 on our 3,600 titles (no spaCy at run time): spaCy tags almost
  every word of a title-cased title ``PROPN``, so the rule keeps every word except numbers
  and :data:`NON_NOUN_WORDS`; it gives spaCy's exact noun list for 89.4% of the titles, and
  over 20,000 random (bought, target) pairs the same ``r_type`` distribution within 0.3
  points (same category: ``r_type`` 0 for 25.2% vs spaCy's 25.5%, as short titles often share
  no word; ``benchmarks/check_agentbench_references.py``, ``benchmarks/results/envs_shop.md``);
* ``BulletPoints`` -> the product's attributes (its Features page); ``Description`` -> its
  Description page text.
Human goals (AgentBench's ``human_goals=True``) give goal options as a list of values; our
goals' ``(name, value)`` pairs enter as their values, as there.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any

from entropace.envs.shop.catalogue import Product, product_description

#: ``normalize.py``'s ``COLOR_SET``, in its order (the first contained colour wins).
COLOR_SET: tuple[str, ...] = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure",
    "banana", "beige", "black", "blue", "blush", "bordeaux", "bronze",
    "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark",
    "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite",
    "grape", "graphite", "grass", "gray", "green", "grey", "heather", "indigo",
    "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac",
    "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha",
    "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive",
    "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red",
    "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)  # fmt: skip
#: Title words spaCy ``en_core_web_sm`` 3.8.0 tags as neither ``NOUN`` nor ``PROPN`` in most of
#: their occurrences in our titles (ADP, DET, VERB, ADV, ADJ; numbers are NUM, dropped too).
NON_NOUN_WORDS = frozenset(
    {"built", "for", "in", "individually", "keeps", "no", "over", "senior", "tee", "wrapped"}
)
#: ``token_set_ratio`` must exceed this for a fuzzy match (``score > 85`` in goal.py).
MATCH_THRESHOLD = 85

_NON_WORD = re.compile(r"\W", re.UNICODE | re.IGNORECASE)  # thefuzz StringProcessor.regex
_LATIN1 = {i: None for i in range(128, 256)}  # thefuzz utils.asciidammit's table
_WORD = re.compile(r"[a-z0-9]+")


def full_process(text: str) -> str:
    """thefuzz 0.19.0 ``utils.full_process(s, force_ascii=True)``: drop characters 128-255,
    replace each non-word character by a space, lower-case, strip."""
    return _NON_WORD.sub(" ", text.translate(_LATIN1)).lower().strip()


def ratio(a: str, b: str) -> int:
    """thefuzz 0.19.0 ``fuzz.ratio`` without python-Levenshtein: equal strings 100, an empty
    one 0, else ``round(100 * SequenceMatcher(None, a, b).ratio())`` (Python's rounding)."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))


def token_set_ratio(s1: str, s2: str) -> int:
    """thefuzz 0.19.0 ``fuzz.token_set_ratio`` (``_token_set(partial=False)``), in ``[0, 100]``.

    With ``t1``, ``t2`` the token sets of the processed strings, ``s`` their sorted
    intersection, ``d12``/``d21`` the sorted differences (each joined by spaces)::

        max(ratio(s, s + " " + d12), ratio(s, s + " " + d21),
            ratio(s + " " + d12, s + " " + d21))           (each stripped)

    and 0 if either processed string is empty.
    """
    p1, p2 = full_process(s1), full_process(s2)
    if not p1 or not p2:
        return 0
    t1, t2 = set(p1.split()), set(p2.split())
    sect = " ".join(sorted(t1 & t2))
    combined_12 = (sect + " " + " ".join(sorted(t1 - t2))).strip()
    combined_21 = (sect + " " + " ".join(sorted(t2 - t1))).strip()
    sect = sect.strip()
    return max(ratio(sect, combined_12), ratio(sect, combined_21), ratio(combined_12, combined_21))


def normalize_color(text: str) -> str:
    """``normalize.py``'s ``normalize_color``: the first colour of :data:`COLOR_SET` contained
    in ``text`` (as a substring), else ``text`` unchanged."""
    return next((color for color in COLOR_SET if color in text), text)


def type_words(product: Product) -> list[str]:
    """Stand-in for the spaCy ``NOUN``/``PROPN`` tokens of a title (lower case, in order):
    its alphanumeric words except numbers and :data:`NON_NOUN_WORDS`
    (``"Juniper & Co Keto Friendly Protein Bars"`` -> ``juniper co keto friendly protein bars``,
    ``"Arbor For Dry Hair 2-In-1 Shampoo"`` -> ``arbor dry hair shampoo``)."""
    return [
        w
        for w in _WORD.findall(product.title.lower())
        if w not in NON_NOUN_WORDS and not w.isdigit()
    ]


def type_factor(query_match: bool, category_match: bool, title_score: float) -> float:
    """``get_type_reward``'s ``r_type``: 1.0; 0.5 unless ``query_match or category_match or
    title_score > 0.2``; then 0.1 if ``title_score < 0.1`` and 0.0 if ``title_score == 0``
    (the title tests override the query and category ones, in this order)."""
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type


def get_type_reward(purchased: Product, target: Product) -> dict[str, Any]:
    """``goal.py`` ``get_type_reward``: ``r_type`` and its inputs (see the module docstring).

    ``target`` is the product the goal was drawn from (WebShop's ``goal['name']`` is its name).
    """
    query_match = purchased.category == target.category
    bought_crumbs = {purchased.department, purchased.category}
    goal_crumbs = {target.department, target.category}
    category_match = len(bought_crumbs & goal_crumbs) >= 2
    bought, desired = type_words(purchased), type_words(target)
    title_score = 0.2 if not desired else len(set(bought) & set(desired)) / len(desired)
    return {
        "r_type": type_factor(query_match, category_match, title_score),
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def get_attribute_reward(purchased: Product, goal_attributes: Sequence[str]) -> tuple[float, int]:
    """``goal.py`` ``get_attribute_reward``: ``(r_attr, n_attr)``; ``r_attr = n_attr / |A|``."""
    title = purchased.title.lower()
    bullets = " ".join(purchased.attributes).lower()
    description = product_description(purchased).lower()
    matches = 0
    for wanted in goal_attributes:
        if any(token_set_ratio(have, wanted) > MATCH_THRESHOLD for have in purchased.attributes):
            matches += 1
        elif wanted in title or wanted in bullets or wanted in description:
            matches += 1
    return (matches / len(goal_attributes) if goal_attributes else 0.0), matches


def get_option_reward(
    purchased_options: Iterable[str], goal_options: Iterable[str]
) -> tuple[float | None, int]:
    """``goal.py`` ``get_option_reward``: ``(r_option, n_opt)``, ``r_option`` None if no
    option is asked."""
    chosen = [normalize_color(o) for o in purchased_options]
    wanted = [normalize_color(o) for o in goal_options]
    matches = sum(
        any(token_set_ratio(have, want) > MATCH_THRESHOLD for have in chosen) for want in wanted
    )
    return (matches / len(wanted) if wanted else None), matches


def get_reward(
    purchased: Product,
    target: Product,
    goal_attributes: Sequence[str],
    goal_options: Sequence[str],
    price_upper: float,
    selected: dict[str, str],
) -> tuple[float, dict[str, Any]]:
    """``goal.py`` ``get_reward(..., verbose=True)``: the total reward and its parts.

    Args:
        purchased: the bought product.
        target: the product the goal was drawn from (its name is WebShop's ``goal['name']``).
        goal_attributes / goal_options: what the instruction asks for (option values).
        price_upper: the price limit (> 0, so ``r_price`` is always defined).
        selected: the chosen options, name -> value (``options`` in WebShop).
    """
    type_info = get_type_reward(purchased, target)
    r_price = purchased.price <= price_upper
    r_att, n_attr = get_attribute_reward(purchased, goal_attributes)
    r_option, n_opt = get_option_reward(list(selected.values()), goal_options)
    denominator = len(goal_attributes) + len(goal_options) + 1
    total = (n_attr + n_opt + r_price) / denominator * type_info["r_type"]
    parts: dict[str, Any] = {
        **type_info,
        "r_att": r_att,
        "w_att": len(goal_attributes) / denominator,
        "r_price": r_price,
        "w_price": 1 / denominator,
    }
    if r_option is not None:
        parts["r_option"] = r_option
        parts["w_option"] = len(goal_options) / denominator
    return total, parts
