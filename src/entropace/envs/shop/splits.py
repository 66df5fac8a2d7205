"""Content splits of ``shop``: held-out categories and fingerprint-disjoint goals.

* ``test_unseen``: the target product belongs to one of :data:`UNSEEN_CATEGORIES` (one per
  department that has two or more categories); ``train`` and ``test`` never ask for a product of
  those categories (the products stay in the store, where they can show up in search results
  as distractors, as any product can).
* ``train`` and ``test`` share the other categories; a goal belongs to ``test`` (or
  ``test_unseen``) only when its fingerprint (the first page, i.e. the instruction, plus the
  gold: the instruction's constraints and the target ASIN) hashes into the test bucket
  (:func:`entropace.envs.splits.draw_in_split`): no test goal equals a train goal.
"""

from __future__ import annotations

from entropace.envs.shop.catalogue import CATEGORIES, Product, build_catalogue
from entropace.envs.shop.goals import Goal, make_goal
from entropace.envs.splits import draw_in_split, fingerprint, split_of

__all__ = ["UNSEEN_CATEGORIES", "goal_fingerprint", "pools", "split_goal", "target_pool"]

#: Categories whose products are targets only in ``test_unseen``.
UNSEEN_CATEGORIES: frozenset[str] = frozenset({"dog food", "desk lamps", "tea", "smart watches"})


def goal_fingerprint(goal: Goal) -> str:
    """The fingerprint of a goal: the first page (in the default page format) and the gold."""
    first = f"Instruction: {goal.instruction}\n[Search]"
    gold = {
        "category": goal.category,
        "attributes": goal.attributes,
        "options": goal.options,
        "price_limit": goal.price_limit,
        "target": goal.target_asin,
    }
    return fingerprint(first, gold)


#: id(catalogue) -> (catalogue, seen pool, unseen pool); keyed by identity, since hashing a
#: catalogue of thousands of products on every reset would cost more than the reset.
_POOLS: dict[int, tuple[tuple[Product, ...], tuple[int, ...], tuple[int, ...]]] = {}


def target_pool(products: tuple[Product, ...], unseen: bool) -> tuple[int, ...]:
    """Indices of the products that may be targets in the (un)seen splits."""
    entry = _POOLS.get(id(products))
    if entry is None or entry[0] is not products:
        seen = tuple(i for i, p in enumerate(products) if p.category not in UNSEEN_CATEGORIES)
        held = tuple(i for i, p in enumerate(products) if p.category in UNSEEN_CATEGORIES)
        entry = _POOLS[id(products)] = (products, seen, held)
    return entry[2] if unseen else entry[1]


def split_goal(products: tuple[Product, ...], seed: int, difficulty: str) -> Goal:
    """The goal of ``seed`` in its split (:func:`~entropace.envs.splits.split_of`)."""
    pool = target_pool(products, split_of(seed) == "test_unseen")
    goal, _ = draw_in_split(
        seed,
        lambda attempt: make_goal(products, seed, difficulty, attempt=attempt, targets=pool),
        goal_fingerprint,
        salt=f"shop/{difficulty}",
    )
    return goal


def pools(difficulty: str) -> dict[str, int]:
    """Catalogue size and the target products / categories of each side."""
    del difficulty  # the catalogue and the held-out categories do not depend on it
    products = build_catalogue()
    return {
        "products": len(products),
        "categories (train, test)": len(CATEGORIES) - len(UNSEEN_CATEGORIES),
        "categories (test_unseen)": len(UNSEEN_CATEGORIES),
        "target products (train, test)": len(target_pool(products, False)),
        "target products (test_unseen)": len(target_pool(products, True)),
    }
