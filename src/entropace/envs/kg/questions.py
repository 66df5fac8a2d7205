"""Multi-hop question templates over the GeoNames graph, with gold answers and oracle plans.

Each template enumerates all its valid instances over the graph (sorted, so instance choice is
deterministic): the question text, the gold answer computed *directly* from the graph's tables
(not through the tools, so the oracle test checks the tools against an independent path), and
the oracle's plan of tool calls. Difficulty = number of tool calls before ``answer``:
easy 1-2, medium 2-3, hard 3-4. Templates whose gold would be ambiguous (ties in an
argmax/argmin, empty results) are not instantiated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache

from entropace.envs.kg.graph import KnowledgeGraph, load_graph

CAP = "location.country.capital"
NB = "location.country.neighbours"
CITIES = "location.country.cities"
CONT = "location.continent.countries"
CUR = "finance.currency.countries"
CITY_COUNTRY = "location.city.country"
COUNTRY_CONT = "location.country.continent"
COUNTRY_CUR = "location.country.currency"
CITY_TZ = "location.city.time_zone"
TZ_CITIES = "location.time_zone.cities"
COUNTRY_TZ = "location.country.time_zones"
STATE_CITIES = "location.state.cities"
POP = "population"
THRESHOLDS = (500_000, 1_000_000, 2_000_000, 5_000_000)


@dataclass(frozen=True)
class Question:
    """One question instance.

    Attributes:
        template: template name.
        text: the question shown to the agent.
        entities: the entity names the question mentions (shown to the agent too).
        gold_entities: the gold answer set (order-insensitive), or None for a number answer.
        gold_number: the gold number, or None.
        plan: the oracle's actions (tool calls, then ``answer``), for a fresh variable list.
    """

    template: str
    text: str
    entities: tuple[str, ...]
    gold_entities: frozenset[str] | None
    gold_number: int | None
    plan: tuple[str, ...]

    @property
    def gold_text(self) -> str:
        if self.gold_number is not None:
            return str(self.gold_number)
        assert self.gold_entities is not None
        return "; ".join(sorted(self.gold_entities))

    @property
    def hops(self) -> int:
        """Number of tool calls before the answer."""
        return len(self.plan) - 1


def _act(tool: str, *args: object) -> str:
    return f"Action: {tool}({', '.join(str(a) for a in args)})"


def _unique_extreme(g: KnowledgeGraph, ents: list[str], largest: bool) -> str | None:
    """The member with the largest (smallest) population if it is unique, else None."""
    vals = {e: g.attrs[e][POP] for e in ents if POP in g.attrs[e]}
    if len(vals) < 2:
        return None
    best = (max if largest else min)(vals.values())
    winners = [e for e, v in vals.items() if v == best]
    return winners[0] if len(winners) == 1 else None


def _of(g: KnowledgeGraph, kind: str) -> list[str]:
    return sorted(e for e, t in g.types.items() if t == kind)


def _ents(*names: str) -> frozenset[str]:
    return frozenset(names)


# ---------------------------------------------------------------------------- easy


def capital(g: KnowledgeGraph) -> Iterator[Question]:
    for c in _of(g, "country"):
        caps = g.neighbors(c, CAP)
        if caps:
            plan = (_act("get_neighbors", c, CAP), _act("answer", "#0"))
            yield Question(
                "capital", f"What is the capital of {c}?", (c,), _ents(*caps), None, plan
            )


def borders(g: KnowledgeGraph) -> Iterator[Question]:
    for c in _of(g, "country"):
        nb = g.neighbors(c, NB)
        if nb:
            plan = (_act("get_neighbors", c, NB), _act("answer", "#0"))
            yield Question("borders", f"Which countries border {c}?", (c,), _ents(*nb), None, plan)


def currency_users(g: KnowledgeGraph) -> Iterator[Question]:
    for cur in _of(g, "currency"):
        users = g.neighbors(cur, CUR)
        plan = (_act("get_neighbors", cur, CUR), _act("answer", "#0"))
        text = f"Which countries use the currency {cur}?"
        yield Question("currency_users", text, (cur,), _ents(*users), None, plan)


def count_countries(g: KnowledgeGraph) -> Iterator[Question]:
    for cont in _of(g, "continent"):
        n = len(g.neighbors(cont, CONT))
        plan = (_act("get_neighbors", cont, CONT), _act("count", "#0"), _act("answer", "#1"))
        text = f"How many countries and territories are in {cont}?"
        yield Question("count_countries", text, (cont,), None, n, plan)


def city_country(g: KnowledgeGraph) -> Iterator[Question]:
    for x in _of(g, "city"):
        for c in g.neighbors(x, CITY_COUNTRY):
            plan = (_act("get_neighbors", x, CITY_COUNTRY), _act("answer", "#0"))
            text = f"In which country is the city {x}?"
            yield Question("city_country", text, (x,), _ents(c), None, plan)


def city_time_zone(g: KnowledgeGraph) -> Iterator[Question]:
    for x in _of(g, "city"):
        zones = g.neighbors(x, CITY_TZ)
        if zones:
            plan = (_act("get_neighbors", x, CITY_TZ), _act("answer", "#0"))
            text = f"Which time zone is the city {x} in?"
            yield Question("city_time_zone", text, (x,), _ents(*zones), None, plan)


def country_time_zones(g: KnowledgeGraph) -> Iterator[Question]:
    for c in _of(g, "country"):
        zones = g.neighbors(c, COUNTRY_TZ)
        if 0 < len(zones) <= 10:
            plan = (_act("get_neighbors", c, COUNTRY_TZ), _act("answer", "#0"))
            text = f"Which time zones do the cities of {c} use?"
            yield Question("country_time_zones", text, (c,), _ents(*zones), None, plan)


# ---------------------------------------------------------------------------- medium


def _city_country_then(
    g: KnowledgeGraph, name: str, relation: str, text: str
) -> Iterator[Question]:
    """city -> its country -> ``relation``: two calls (``text`` has a ``{city}`` field)."""
    for x in _of(g, "city"):
        for c in g.neighbors(x, CITY_COUNTRY):
            gold = g.neighbors(c, relation)
            if gold:
                plan = (
                    _act("get_neighbors", x, CITY_COUNTRY),
                    _act("get_neighbors", "#0", relation),
                    _act("answer", "#1"),
                )
                yield Question(name, text.format(city=x), (x,), _ents(*gold), None, plan)


def city_continent(g: KnowledgeGraph) -> Iterator[Question]:
    yield from _city_country_then(
        g, "city_continent", COUNTRY_CONT, "On which continent is the city {city}?"
    )


def city_capital(g: KnowledgeGraph) -> Iterator[Question]:
    yield from _city_country_then(
        g, "city_capital", CAP, "What is the capital of the country where the city {city} is?"
    )


def city_currency(g: KnowledgeGraph) -> Iterator[Question]:
    yield from _city_country_then(
        g, "city_currency", COUNTRY_CUR, "Which currency is used in the country of the city {city}?"
    )


def largest_city_of_state(g: KnowledgeGraph) -> Iterator[Question]:
    for st in _of(g, "state"):
        top = _unique_extreme(g, g.neighbors(st, STATE_CITIES), largest=True)
        if top is not None:
            plan = (
                _act("get_neighbors", st, STATE_CITIES),
                _act("argmax", "#0", POP),
                _act("answer", "#1"),
            )
            text = f"Which is the most populous city of the US state {st}?"
            yield Question("largest_city_of_state", text, (st,), _ents(top), None, plan)


def largest_city_of_time_zone(g: KnowledgeGraph) -> Iterator[Question]:
    for tz in _of(g, "time_zone"):
        top = _unique_extreme(g, g.neighbors(tz, TZ_CITIES), largest=True)
        if top is not None:
            plan = (
                _act("get_neighbors", tz, TZ_CITIES),
                _act("argmax", "#0", POP),
                _act("answer", "#1"),
            )
            text = f"Which is the most populous city in the time zone {tz}?"
            yield Question("largest_city_of_time_zone", text, (tz,), _ents(top), None, plan)


def _border_currency_pairs(g: KnowledgeGraph) -> Iterator[tuple[str, str, list[str]]]:
    for c in _of(g, "country"):
        nb = g.neighbors(c, NB)
        for cur in sorted({x for n in nb for x in g.neighbors(n, "location.country.currency")}):
            yield c, cur, sorted(set(nb) & set(g.neighbors(cur, CUR)))


def border_currency(g: KnowledgeGraph) -> Iterator[Question]:
    for c, cur, both in _border_currency_pairs(g):
        plan = (
            _act("get_neighbors", c, NB),
            _act("get_neighbors", cur, CUR),
            _act("intersection", "#0", "#1"),
            _act("answer", "#2"),
        )
        text = f"Which countries bordering {c} use the currency {cur}?"
        yield Question("border_currency", text, (c, cur), _ents(*both), None, plan)


def most_populous_neighbour(g: KnowledgeGraph) -> Iterator[Question]:
    for c in _of(g, "country"):
        top = _unique_extreme(g, g.neighbors(c, NB), largest=True)
        if top is not None:
            plan = (_act("get_neighbors", c, NB), _act("argmax", "#0", POP), _act("answer", "#1"))
            text = f"Which country bordering {c} has the largest population?"
            yield Question("most_populous_neighbour", text, (c,), _ents(top), None, plan)


def largest_city(g: KnowledgeGraph) -> Iterator[Question]:
    for c in _of(g, "country"):
        top = _unique_extreme(g, g.neighbors(c, CITIES), largest=True)
        if top is not None:
            plan = (
                _act("get_neighbors", c, CITIES),
                _act("argmax", "#0", POP),
                _act("answer", "#1"),
            )
            text = f"Which is the most populous city of {c}?"
            yield Question("largest_city", text, (c,), _ents(top), None, plan)


def count_borders(g: KnowledgeGraph) -> Iterator[Question]:
    for c in _of(g, "country"):
        nb = g.neighbors(c, NB)
        if nb:
            plan = (_act("get_neighbors", c, NB), _act("count", "#0"), _act("answer", "#1"))
            text = f"How many countries border {c}?"
            yield Question("count_borders", text, (c,), None, len(nb), plan)


# ---------------------------------------------------------------------------- hard


def city_neighbour_count(g: KnowledgeGraph) -> Iterator[Question]:
    for x in _of(g, "city"):
        for c in g.neighbors(x, CITY_COUNTRY):
            nb = g.neighbors(c, NB)
            if nb:
                plan = (
                    _act("get_neighbors", x, CITY_COUNTRY),
                    _act("get_neighbors", "#0", NB),
                    _act("count", "#1"),
                    _act("answer", "#2"),
                )
                text = f"How many countries border the country where the city {x} is?"
                yield Question("city_neighbour_count", text, (x,), None, len(nb), plan)


def city_most_populous_neighbour(g: KnowledgeGraph) -> Iterator[Question]:
    for x in _of(g, "city"):
        for c in g.neighbors(x, CITY_COUNTRY):
            top = _unique_extreme(g, g.neighbors(c, NB), largest=True)
            if top is not None:
                plan = (
                    _act("get_neighbors", x, CITY_COUNTRY),
                    _act("get_neighbors", "#0", NB),
                    _act("argmax", "#1", POP),
                    _act("answer", "#2"),
                )
                text = (
                    f"Which country bordering the country of the city {x} has the largest "
                    "population?"
                )
                yield Question("city_most_populous_neighbour", text, (x,), _ents(top), None, plan)


def count_big_cities_of_time_zone(g: KnowledgeGraph) -> Iterator[Question]:
    for tz in _of(g, "time_zone"):
        cities = g.neighbors(tz, TZ_CITIES)
        for n in (50_000, 100_000, 250_000, 1_000_000):
            big = [x for x in cities if g.attrs[x].get(POP, -1) > n]
            if big:
                plan = (
                    _act("get_neighbors", tz, TZ_CITIES),
                    _act("filter", "#0", POP, ">", n),
                    _act("count", "#1"),
                    _act("answer", "#2"),
                )
                text = f"How many cities with a population over {n:,} are in the time zone {tz}?"
                yield Question("count_big_cities_of_time_zone", text, (tz,), None, len(big), plan)


def count_big_cities_of_state(g: KnowledgeGraph) -> Iterator[Question]:
    for st in _of(g, "state"):
        cities = g.neighbors(st, STATE_CITIES)
        for n in (20_000, 50_000, 100_000, 250_000, 500_000):
            big = [x for x in cities if g.attrs[x].get(POP, -1) > n]
            if big:
                plan = (
                    _act("get_neighbors", st, STATE_CITIES),
                    _act("filter", "#0", POP, ">", n),
                    _act("count", "#1"),
                    _act("answer", "#2"),
                )
                text = f"How many cities with a population over {n:,} are in the US state {st}?"
                yield Question("count_big_cities_of_state", text, (st,), None, len(big), plan)


def capital_of_most_populous_neighbour(g: KnowledgeGraph) -> Iterator[Question]:
    for c in _of(g, "country"):
        top = _unique_extreme(g, g.neighbors(c, NB), largest=True)
        if top is not None and g.neighbors(top, CAP):
            plan = (
                _act("get_neighbors", c, NB),
                _act("argmax", "#0", POP),
                _act("get_neighbors", "#1", CAP),
                _act("answer", "#2"),
            )
            text = f"What is the capital of the most populous country bordering {c}?"
            gold = _ents(*g.neighbors(top, CAP))
            yield Question("capital_of_most_populous_neighbour", text, (c,), gold, None, plan)


def count_big_cities(g: KnowledgeGraph) -> Iterator[Question]:
    for cont in _of(g, "continent"):
        cities = {x for c in g.neighbors(cont, CONT) for x in g.neighbors(c, CITIES)}
        for n in THRESHOLDS:
            big = [x for x in cities if g.attrs[x].get(POP, -1) > n]
            if big:
                plan = (
                    _act("get_neighbors", cont, CONT),
                    _act("get_neighbors", "#0", CITIES),
                    _act("filter", "#1", POP, ">", n),
                    _act("count", "#2"),
                    _act("answer", "#3"),
                )
                text = (
                    f"How many cities with a population over {n:,} are in the countries of {cont}?"
                )
                yield Question("count_big_cities", text, (cont,), None, len(big), plan)


def count_big_cities_of_neighbours(g: KnowledgeGraph) -> Iterator[Question]:
    for c in _of(g, "country"):
        cities = {x for n in g.neighbors(c, NB) for x in g.neighbors(n, CITIES)}
        for n in THRESHOLDS[:2]:
            big = [x for x in cities if g.attrs[x].get(POP, -1) > n]
            if big:
                plan = (
                    _act("get_neighbors", c, NB),
                    _act("get_neighbors", "#0", CITIES),
                    _act("filter", "#1", POP, ">", n),
                    _act("count", "#2"),
                    _act("answer", "#3"),
                )
                text = f"How many cities with a population over {n:,} are in the countries bordering {c}?"
                yield Question("count_big_cities_of_neighbours", text, (c,), None, len(big), plan)


def capitals_border_currency(g: KnowledgeGraph) -> Iterator[Question]:
    for c, cur, both in _border_currency_pairs(g):
        caps = [x for b in both for x in g.neighbors(b, CAP)]
        if caps:
            plan = (
                _act("get_neighbors", c, NB),
                _act("get_neighbors", cur, CUR),
                _act("intersection", "#0", "#1"),
                _act("get_neighbors", "#2", CAP),
                _act("answer", "#3"),
            )
            text = (
                f"What are the capitals of the countries bordering {c} that use the currency {cur}?"
            )
            yield Question("capitals_border_currency", text, (c, cur), _ents(*caps), None, plan)


def least_populous_continent_currency(g: KnowledgeGraph) -> Iterator[Question]:
    for cont in _of(g, "continent"):
        members = set(g.neighbors(cont, CONT))
        for cur in _of(g, "currency"):
            both = sorted(members & set(g.neighbors(cur, CUR)))
            low = _unique_extreme(g, both, largest=False)
            if low is not None:
                plan = (
                    _act("get_neighbors", cont, CONT),
                    _act("get_neighbors", cur, CUR),
                    _act("intersection", "#0", "#1"),
                    _act("argmin", "#2", POP),
                    _act("answer", "#3"),
                )
                text = (
                    f"Which is the least populous country of {cont} that uses the currency {cur}?"
                )
                yield Question(
                    "least_populous_continent_currency", text, (cont, cur), _ents(low), None, plan
                )


def largest_city_of_neighbours(g: KnowledgeGraph) -> Iterator[Question]:
    for c in _of(g, "country"):
        cities = sorted({x for n in g.neighbors(c, NB) for x in g.neighbors(n, CITIES)})
        top = _unique_extreme(g, cities, largest=True)
        if top is not None:
            plan = (
                _act("get_neighbors", c, NB),
                _act("get_neighbors", "#0", CITIES),
                _act("argmax", "#1", POP),
                _act("answer", "#2"),
            )
            text = f"Which is the most populous city in the countries bordering {c}?"
            yield Question("largest_city_of_neighbours", text, (c,), _ents(top), None, plan)


Template = Callable[[KnowledgeGraph], Iterator[Question]]

#: difficulty -> templates. A seed picks a template uniformly among those with instances in its
#: split (:mod:`entropace.envs.kg.splits`), then one of that split's instances.
TEMPLATES: dict[str, tuple[Template, ...]] = {
    "easy": (
        capital,
        borders,
        currency_users,
        count_countries,
        city_country,
        city_time_zone,
        country_time_zones,
    ),
    "medium": (
        border_currency,
        most_populous_neighbour,
        largest_city,
        count_borders,
        city_continent,
        city_capital,
        city_currency,
        largest_city_of_state,
        largest_city_of_time_zone,
    ),
    "hard": (
        city_neighbour_count,
        city_most_populous_neighbour,
        count_big_cities_of_time_zone,
        count_big_cities_of_state,
        capital_of_most_populous_neighbour,
        count_big_cities,
        count_big_cities_of_neighbours,
        capitals_border_currency,
        least_populous_continent_currency,
        largest_city_of_neighbours,
    ),
}


@cache
def instances(template: Template) -> tuple[Question, ...]:
    """All instances of ``template`` over the cached graph (computed once per process)."""
    return tuple(template(load_graph()))
