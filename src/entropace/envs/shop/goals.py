"""Shopping goals: what an instruction asks for, WebShop's reward, and drawing one per seed.

(Split out of :mod:`entropace.envs.shop.env` so that the content splits,
:mod:`entropace.envs.shop.splits`, build on :func:`make_goal` without an import cycle.)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from entropace.envs.shop.catalogue import CATEGORIES, Product

__all__ = ["LEVELS", "Goal", "make_goal", "shop_reward"]

#: difficulty -> (attributes asked, option types asked (max), price factor range, max turns)
LEVELS: dict[str, tuple[int, int, tuple[float, float], int]] = {
    "easy": (1, 0, (1.5, 2.0), 10),
    "medium": (2, 1, (1.2, 1.5), 15),
    "hard": (3, 2, (1.02, 1.15), 20),
}


@dataclass(frozen=True)
class Goal:
    """What the instruction asks for."""

    category: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, str], ...]
    price_limit: float
    target_asin: str
    instruction: str


def shop_reward(goal: Goal, product: Product, selected: dict[str, str]) -> float:
    """WebShop's reward for buying ``product`` with ``selected`` options.

    ``r = r_type * (|attrs matched| + |options matched| + 1[price <= limit]) / (|attrs| + |options| + 1)``
    with ``r_type`` = 1 for the asked category, 0.5 for the same department, 0.1 otherwise.
    """
    if product.category == goal.category:
        r_type = 1.0
    elif product.department == CATEGORIES[goal.category][0]:
        r_type = 0.5
    else:
        r_type = 0.1
    attrs = sum(a in product.attributes for a in goal.attributes)
    opts = sum(selected.get(name) == value for name, value in goal.options)
    price = float(product.price <= goal.price_limit)
    return r_type * (attrs + opts + price) / (len(goal.attributes) + len(goal.options) + 1)


def make_goal(
    products: tuple[Product, ...],
    seed: int,
    difficulty: str,
    *,
    attempt: int = 0,
    targets: tuple[int, ...] | None = None,
) -> Goal:
    """The instruction of instance ``seed``: drawn from a target product so it is satisfiable.

    ``attempt`` selects another random stream of the seed (0: the historical one; the content
    splits draw again until the goal lies in the seed's split, :mod:`.splits`); ``targets``
    restricts the target products (indices into ``products``; default: all).
    """
    rng = random.Random(f"shop/{difficulty}/{seed}" + (f"/{attempt}" if attempt else ""))
    n_attr, n_opt, (flo, fhi), _ = LEVELS[difficulty]
    pool = targets if targets is not None else range(len(products))
    target = products[pool[rng.randrange(len(pool))]]
    attributes = tuple(rng.sample(target.attributes, min(n_attr, len(target.attributes))))
    option_items = list(target.options)
    rng.shuffle(option_items)
    options = tuple((name, rng.choice(values)) for name, values in option_items[:n_opt])
    limit = math.ceil(target.price * rng.uniform(flo, fhi) * 100) / 100
    limit = max(limit, target.price)
    noun = target.category
    wanted = (
        attributes[0]
        if len(attributes) == 1
        else ", ".join(attributes[:-1]) + " and " + attributes[-1]
    )
    parts = [f"i am looking for {wanted} {noun}"]
    parts += [f"with {name}: {value}" for name, value in options]
    instruction = ", ".join(parts) + f", and price lower than {limit:.2f} dollars"
    return Goal(target.category, attributes, options, limit, target.asin, instruction)
