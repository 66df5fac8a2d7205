"""``shop``: WebShop-style shopping (Yao et al. 2022, arXiv 2207.01206).

An instruction asks for a product with attributes, options and a price limit. The agent acts
with ``search[query]`` and ``click[button]`` on text pages (search, results, item, item
sub-pages) and ends by clicking ``Buy Now``. The reward is WebShop's: the fraction of the
instruction's attributes, options and price constraint that the bought product satisfies,
times a type-match factor; 1.0 only for an exact match (success).

Option ``reward``: ``"exact"`` (default, :func:`shop_reward`: exact attribute and option
matches, type factor 1 / 0.5 / 0.1 by category and department) or ``"webshop"``
(:mod:`entropace.envs.shop.webshop`: WebShop's ``get_reward`` with its fuzzy matching and its
type factor, which can be 0; AgentBench's WebShop uses it). Success is reward 1.0 either way.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from entropace.envs.base import StepResult, action_too_long, check_difficulty
from entropace.envs.shop.catalogue import Product, build_catalogue, product_description
from entropace.envs.shop.goals import LEVELS, Goal, make_goal, shop_reward  # noqa: F401 (re-export)
from entropace.envs.shop.search import SearchIndex
from entropace.envs.shop.splits import goal_fingerprint, split_goal
from entropace.envs.shop.webshop import get_reward
from entropace.envs.splits import split_of

#: Values of the ``reward`` option.
REWARDS = ("exact", "webshop")
#: Values of the ``page_format`` option: one element a line (default) or WebShop's ``text``
#: observation mode (the page's visible texts joined with ``" [SEP] "``).
PAGE_FORMATS = ("lines", "webshop")
RESULTS_PER_PAGE = 10
MAX_RESULTS = 50
MAX_QUERY_CHARS = 200

SYSTEM_PROMPT = """You are shopping on a web store for the user. Each turn you see a text page and \
must reply with exactly one action on the last line:
  search[<query>]   type a query in the search box (only on the search page)
  click[<button>]   click a button shown in square brackets on the page: a product id such \
as [B0ABC12345], an option value such as [black], [Next >], [< Prev], [Back to Search], \
[Description], [Features] or [Buy Now]
Open products, select every option the instruction asks for, check the price, then click \
[Buy Now] to finish. You are scored on how well the bought product matches the instruction.
Example: search[waterproof hiking boots]"""

_ACTION = re.compile(r"(search|click)\s*\[([^\[\]\n]*)\]", re.IGNORECASE)


def parse_action(text: str) -> tuple[str, str] | None:
    """The last ``search[...]`` or ``click[...]`` in ``text`` as ``(verb, argument)``, or None.

    The argument is stripped; the verb is lower-cased. Any text around the action (for example
    a thought before it) is ignored. The whole text is searched (linear time); the environment
    refuses replies over :data:`entropace.envs.base.MAX_ACTION_CHARS` before parsing.
    """
    matches = _ACTION.findall(text) if isinstance(text, str) else []
    if not matches:
        return None
    verb, arg = matches[-1]
    return verb.lower(), arg.strip()


@dataclass
class _Page:
    kind: str = "search"  # search | results | item | description | features
    query: str = ""
    results: list[int] = field(default_factory=list)
    page: int = 0
    item: int = -1
    selected: dict[str, str] = field(default_factory=dict)


class ShopEnv:
    """The ``shop`` family (see module docstring).

    Args:
        difficulty: ``easy`` | ``medium`` | ``hard``.
        reward: ``"exact"`` (:func:`shop_reward`) or ``"webshop"`` (WebShop's own reward).
        page_format: ``"lines"`` (one page element a line, buttons in brackets) or
            ``"webshop"`` (WebShop's ``observation_mode="text"``, which AgentBench's WebShop
            task uses: the visible texts of the page joined with ``" [SEP] "``).
    """

    name = "shop"
    system_prompt = SYSTEM_PROMPT

    def __init__(
        self, difficulty: str = "easy", reward: str = "exact", page_format: str = "lines"
    ) -> None:
        self.difficulty = check_difficulty(difficulty)
        if reward not in REWARDS:
            raise ValueError(f"shop: reward must be one of {list(REWARDS)}, got {reward!r}")
        if page_format not in PAGE_FORMATS:
            raise ValueError(
                f"shop: page_format must be one of {list(PAGE_FORMATS)}, got {page_format!r}"
            )
        self.reward = reward
        self.page_format = page_format
        self.max_turns = LEVELS[difficulty][3]
        self.products = build_catalogue()
        self.index = _shared_index(self.products)
        self.asin_index = {p.asin: i for i, p in enumerate(self.products)}
        self.goal: Goal | None = None
        self.page = _Page()

    # --- protocol ------------------------------------------------------------------------------
    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.goal = split_goal(self.products, seed, self.difficulty)
        self.page = _Page()
        info = {
            "task": self.name,
            "seed": seed,
            "difficulty": self.difficulty,
            "gold": f"{self.goal.instruction} (e.g. {self.goal.target_asin})",
            "instruction": self.goal.instruction,
            "category": self.goal.category,
            "split": split_of(seed),
            "fingerprint": goal_fingerprint(self.goal),
        }
        return self.render(), info

    def step(self, action: str) -> StepResult:
        if self.goal is None:
            raise RuntimeError("shop: step() before reset()")
        too_long = action_too_long(action)
        if too_long is not None:
            return self._stay(too_long, parse_error=True)
        parsed = parse_action(action)
        if parsed is None:
            return self._stay(
                "Invalid action: reply with search[<query>] or click[<button>].", parse_error=True
            )
        verb, arg = parsed
        if verb == "search":
            return self._search(arg)
        return self._click(arg)

    # --- transitions ---------------------------------------------------------------------------
    def _stay(self, message: str, *, parse_error: bool = False) -> StepResult:
        return (
            f"{message}\n\n{self.render()}",
            0.0,
            False,
            False,
            {"success": False, "parse_error": parse_error},
        )

    def _search(self, query: str) -> StepResult:
        if self.page.kind != "search":
            return self._stay("There is no search box on this page: click[Back to Search] first.")
        if not query:
            return self._stay("The search query is empty.")
        query = query[:MAX_QUERY_CHARS]
        self.page = _Page(
            kind="results", query=query, results=self.index.search(query, MAX_RESULTS)
        )
        return self.render(), 0.0, False, False, {"success": False, "parse_error": False}

    def _click(self, button: str) -> StepResult:
        key = button.strip().lower()
        page = self.page
        ok = {"success": False, "parse_error": False}
        if key == "back to search" and page.kind != "search":
            self.page = _Page()
            return self.render(), 0.0, False, False, ok
        if page.kind == "results":
            n_pages = max(1, math.ceil(len(page.results) / RESULTS_PER_PAGE))
            if key == "next >" and page.page + 1 < n_pages:
                page.page += 1
                return self.render(), 0.0, False, False, ok
            if key == "< prev" and page.page > 0:
                page.page -= 1
                return self.render(), 0.0, False, False, ok
            idx = self.asin_index.get(button.strip().upper())
            if idx is not None and idx in self.visible_results():
                page.kind, page.item, page.selected = "item", idx, {}
                return self.render(), 0.0, False, False, ok
        elif page.kind == "item":
            product = self.products[page.item]
            if key == "buy now":
                return self._buy(product)
            if key == "< prev":
                page.kind = "results"
                return self.render(), 0.0, False, False, ok
            if key in ("description", "features"):
                page.kind = key
                return self.render(), 0.0, False, False, ok
            for name, values in product.options:
                if key in values:
                    page.selected[name] = key
                    return self.render(), 0.0, False, False, ok
        elif page.kind in ("description", "features") and key == "< prev":
            page.kind = "item"
            return self.render(), 0.0, False, False, ok
        return self._stay(f"There is no button [{button[:60]}] on this page.")

    def _buy(self, product: Product) -> StepResult:
        goal, selected = self.goal, self.page.selected
        assert goal is not None
        info: dict[str, Any] = {"parse_error": False, "bought": product.asin}
        if self.reward == "webshop":
            target = self.products[self.asin_index[goal.target_asin]]
            values = [value for _name, value in goal.options]
            reward, info["reward_parts"] = get_reward(
                product, target, goal.attributes, values, goal.price_limit, selected
            )
        else:
            reward = shop_reward(goal, product, selected)
        info["success"] = reward >= 1.0 - 1e-9
        obs = (
            f"Thank you for shopping with us! You bought {product.asin} with options "
            f"{selected or 'none'}. Reward: {reward:.3f}"
        )
        return obs, reward, True, False, info

    # --- rendering -----------------------------------------------------------------------------
    def visible_results(self) -> list[int]:
        start = self.page.page * RESULTS_PER_PAGE
        return self.page.results[start : start + RESULTS_PER_PAGE]

    def render(self) -> str:
        """The current page in the env's ``page_format``."""
        return self.render_sep() if self.page_format == "webshop" else self.render_lines()

    def render_sep(self) -> str:
        """The current page in WebShop's ``text`` observation mode.

        WebShop's ``convert_html_to_text(html, simple=True)``
        (``web_agent_site/envs/web_agent_text_env.py``) joins the stripped visible texts of the
        page's HTML with ``" [SEP] "``; AgentBench's WebShop task builds its env with
        ``observation_mode="text"`` (``src/server/tasks/webshop/task.py``, lines 39 and 50 at
        578c5e9). The texts, in WebShop's template order: ``WebShop``, ``Instruction:`` and the
        instruction, then the page: ``Search`` (search page); ``Back to Search``, ``Page N
        (Total results: M)``, ``< Prev``/``Next >`` and per product its ASIN, title and price
        (results); ``Back to Search``, ``< Prev``, each option type and its values, the title,
        ``Price: $x``, ``Rating: r``, ``Description``, ``Features``, ``Buy Now`` (item); the
        sub-page's text (description, features). The search page alone starts with ``WebShop``.
        """
        assert self.goal is not None
        page = self.page
        texts = ["Instruction:", self.goal.instruction]
        if page.kind == "search":
            texts = ["WebShop", *texts, "Search"]
        elif page.kind == "results":
            n_pages = max(1, math.ceil(len(page.results) / RESULTS_PER_PAGE))
            texts += [
                "Back to Search",
                f"Page {page.page + 1} (Total results: {len(page.results)})",
            ]
            if page.page > 0:
                texts.append("< Prev")
            if page.page + 1 < n_pages:
                texts.append("Next >")
            for idx in self.visible_results():
                product = self.products[idx]
                texts += [product.asin, product.title, f"${product.price:.2f}"]
        else:
            product = self.products[page.item]
            texts += ["Back to Search", "< Prev"]
            if page.kind == "item":
                for name, values in product.options:
                    texts += [name, *values]
                texts += [
                    product.title,
                    f"Price: ${product.price:.2f}",
                    f"Rating: {product.rating:.1f}",
                    "Description",
                    "Features",
                    "Buy Now",
                ]
            elif page.kind == "features":
                texts += list(product.attributes)
            else:
                texts.append(product_description(product))
        return " [SEP] ".join(t.strip() for t in texts)

    def render_lines(self) -> str:
        """The current page as text (WebShop's simple observation mode, one element a line)."""
        assert self.goal is not None
        page = self.page
        lines = [f"Instruction: {self.goal.instruction}"]
        if page.kind == "search":
            lines.append("[Search]")
        elif page.kind == "results":
            n_pages = max(1, math.ceil(len(page.results) / RESULTS_PER_PAGE))
            lines.append("[Back to Search]")
            lines.append(
                f"Page {page.page + 1} of {n_pages} (total results: {len(page.results)}) for '{page.query}'"
            )
            if page.page > 0:
                lines.append("[< Prev]")
            if page.page + 1 < n_pages:
                lines.append("[Next >]")
            if not page.results:
                lines.append("No products match your query.")
            for idx in self.visible_results():
                product = self.products[idx]
                lines.append(f"[{product.asin}] {product.title} | ${product.price:.2f}")
        else:
            product = self.products[page.item]
            lines.append("[Back to Search]")
            lines.append("[< Prev]")
            if page.kind == "item":
                lines.append(product.title)
                lines.append(f"Price: ${product.price:.2f}")
                lines.append(f"Rating: {product.rating:.1f} out of 5")
                for name, values in product.options:
                    lines.append(f"{name}: " + " ".join(f"[{v}]" for v in values))
                chosen = ", ".join(f"{k}={v}" for k, v in sorted(page.selected.items())) or "none"
                lines.append(f"Selected options: {chosen}")
                lines.append("[Description] [Features] [Buy Now]")
            elif page.kind == "features":
                lines.append("Features:")
                lines += [f"- {a}" for a in product.attributes]
            else:
                lines.append(product_description(product))
        return "\n".join(lines)


_INDEX_CACHE: dict[int, SearchIndex] = {}


def _shared_index(products: tuple[Product, ...]) -> SearchIndex:
    """One search index per catalogue and process (building it takes ~0.1 s)."""
    key = id(products)
    if key not in _INDEX_CACHE:
        _INDEX_CACHE[key] = SearchIndex(products)
    return _INDEX_CACHE[key]


def oracle(env: Any) -> Any:
    """Scripted policy for the current instance: search the target's title, page to it, open
    it, select the asked options, buy. Acts only through actions."""
    inner: ShopEnv = getattr(env, "env", env)
    goal = inner.goal
    assert goal is not None, "call reset() before oracle()"
    target = inner.products[inner.asin_index[goal.target_asin]]
    pending = [value for _name, value in goal.options]

    def policy(observation: str) -> str:
        page = inner.page
        if page.kind == "search":
            return f"search[{target.title} {' '.join(goal.attributes)}]"
        if page.kind == "results":
            if inner.asin_index[goal.target_asin] in inner.visible_results():
                return f"click[{goal.target_asin}]"
            n_pages = math.ceil(len(page.results) / RESULTS_PER_PAGE)
            return "click[Next >]" if page.page + 1 < n_pages else "click[Back to Search]"
        if page.kind in ("description", "features"):
            return "click[< Prev]"
        for value in pending:
            if page.selected.get(_option_name(target, value)) != value:
                return f"click[{value}]"
        return "click[Buy Now]"

    return policy


def _option_name(product: Product, value: str) -> str:
    for name, values in product.options:
        if value in values:
            return name
    return ""
