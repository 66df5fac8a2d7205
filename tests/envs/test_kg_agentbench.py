"""The ``kg`` family's AgentBench-KG options: hidden members, ``Final Answer: #N``, F1."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropace.envs import make, spec
from entropace.envs.checks import HOSTILE_ACTIONS, check_env, oracle_success_rate, run_episode
from entropace.envs.kg import KGEnv, answer_f1
from entropace.envs.kg.graph import load_graph
from entropace.envs.kg.tools import ToolSession

DIFFS = ("easy", "medium", "hard")
NB = "location.country.neighbours"
ALL_ON = {"hide_members": True, "final_answer": True, "reward": "f1"}


def _env_at(template: str, difficulty: str = "easy", **options: object) -> tuple[object, int]:
    env = make("kg", difficulty=difficulty, **options)
    for seed in range(500):
        if env.reset(seed)[1]["template"] == template:
            return env, seed
    raise AssertionError(template)


# --------------------------------------------------------------------------- F1


@pytest.mark.parametrize(
    ("predicted", "gold", "expected"),
    [
        # TP=2, precision 2/2, recall 2/3: F1 = 2 * 1 * 2/3 / (1 + 2/3) = (4/3) / (5/3) = 0.8
        ({"a", "b"}, {"a", "b", "c"}, 0.8),
        # TP=1, precision 1/2, recall 1/2: F1 = 0.5
        ({"a", "d"}, {"a", "b"}, 0.5),
        # TP=1, precision 1/4, recall 1: F1 = 2 * 1/4 / (5/4) = 0.4
        ({"a", "b", "c", "d"}, {"a"}, 0.4),
        ({"a", "b"}, {"b", "a"}, 1.0),
        ({"x"}, {"a"}, 0.0),  # TP = 0 -> 0 (AgentBench returns 0.0 before dividing)
        (set(), {"a"}, 0.0),
    ],
)
def test_answer_f1_hand_worked(predicted: set[str], gold: set[str], expected: float) -> None:
    assert answer_f1(frozenset(predicted), frozenset(gold)) == pytest.approx(expected, abs=1e-15)


def test_f1_and_exact_match_in_info_and_f1_reward() -> None:
    graph = load_graph()
    for reward in ("exact_match", "f1"):
        # Answering a capital question with all the country's cities: P = cities (n), G = the
        # capital, TP = 1: precision 1/n, recall 1, F1 = 2 (1/n) / (1/n + 1) = 2 / (n + 1).
        env = make("kg", reward=reward)
        seed = next(
            s
            for s in range(500)
            if env.reset(s)[1]["template"] == "capital"
            and len(graph.neighbors(env.question.entities[0], "location.country.cities")) > 1
        )
        country = env.question.entities[0]
        n = len(graph.neighbors(country, "location.country.cities"))
        _, r0, _, _, info0 = env.step(f"Action: get_neighbors({country}, location.country.cities)")
        assert (r0, info0["f1"], info0["exact_match"]) == (0.0, 0.0, 0.0)  # not answered yet
        _, r, term, _, info = env.step("Action: answer(#0)")
        assert term and not info["success"] and info["exact_match"] == 0.0
        assert info["f1"] == pytest.approx(2 / (n + 1))
        assert r == (pytest.approx(2 / (n + 1)) if reward == "f1" else 0.0)
    # A number question: the exact number scores F1 1, another number 0, entities 0.
    env, seed = _env_at("count_countries", reward="f1")
    gold = env.question.gold_number
    for answer, f1 in ((str(gold), 1.0), (str(gold + 1), 0.0), ("France", 0.0)):
        env.reset(seed)
        _, r, _, _, info = env.step(f"Action: answer({answer})")
        assert (r, info["f1"], info["exact_match"], info["success"]) == (f1, f1, f1, f1 == 1.0)
    # An entity question answered with a number: F1 0.
    env, _ = _env_at("borders")
    _, _, _, _, info = env.step("Action: answer(7)")
    assert (info["f1"], info["exact_match"]) == (0.0, 0.0)


# --------------------------------------------------------------------------- hidden members


def test_hidden_observations_are_agentbench_s() -> None:
    graph = load_graph()
    s = ToolSession(graph, hide_members=True)
    out = s.run(f"Action: get_neighbors(Spain, {NB})")
    assert out.observation == "variable #0, which are instances of country"
    assert s.variables[0].entities == tuple(sorted(graph.neighbors("Spain", NB)))  # still stored
    assert s.run("Action: count(#0)").observation == "variable #1, which is a number"
    # AgentBench api.py line 173: rtn_str = f"Observation: [{', '.join(out_relations)}]"
    obs = s.run("Action: get_attributes(Spain)").observation
    assert obs == "[area_km2, code, population]" and s.last_ok  # names, no values
    # api.py line 86 (get_relations): the same bare list
    obs = s.run("Action: get_relations(Spain)").observation
    assert obs == "[" + ", ".join(graph.relations("Spain")) + "]"
    assert s.run("Action: argmax(#0, population)").observation == (
        "variable #2, which are instances of country"
    )
    obs = s.run("Action: get_neighbors(Euro (EUR), location.country.capital)").observation
    assert "has no relation" in obs and not s.last_ok  # errors are unchanged, flagged
    # Off (default): the member list and the value are shown, as before.
    s = ToolSession(graph)
    assert "[Andorra, France" in s.run(f"Action: get_neighbors(Spain, {NB})").observation
    assert s.run("Action: count(#0)").observation.endswith(
        f"number: {len(s.variables[0].entities)}"
    )


@pytest.mark.parametrize("difficulty", DIFFS)
def test_hidden_members_never_show_the_answer(difficulty: str) -> None:
    env = make("kg", difficulty=difficulty, hide_members=True)
    policy_of = spec("kg").oracle
    for seed in range(50):
        obs0, _ = env.reset(seed)
        q = env.question
        ep = run_episode(env, policy_of(env), seed)
        assert ep.success
        shown = "\n".join(ep.observations[1:-1])  # every tool result before the verdict
        if q.gold_number is not None:
            assert str(q.gold_number) not in re.sub(r"#\d+", "", shown)
        else:
            for name in q.gold_entities - set(q.entities):
                assert name not in shown, (seed, name, shown)


# --------------------------------------------------------------------------- Final Answer


def test_final_answer_syntax() -> None:
    env, seed = _env_at("borders", final_answer=True)
    country = env.question.entities[0]

    def fresh() -> None:
        env.reset(seed)
        env.step(f"Action: get_neighbors({country}, {NB})")  # -> #0 = the gold set

    fresh()
    _, r, term, _, info = env.step("Thought: #0 holds them.\nFinal Answer: #0")
    assert (r, term, info["success"], info["f1"]) == (1.0, True, True, 1.0)
    fresh()  # AgentBench's regex also takes its "Find Answer" spelling
    assert env.step("Find Answer: #0")[4]["success"]
    fresh()  # the Final Answer wins over an Action line (AgentBench v0.2's order)
    _, _, term, _, info = env.step("Action: count(#0)\nFinal Answer: #0")
    assert term and info["success"]
    fresh()  # only the text before "Observation:" counts
    obs, _, term, _, info = env.step("Observation: made up\nFinal Answer: #0")
    assert not term and info["parse_error"] and "No action found" in obs
    fresh()
    _, _, term, _, info = env.step("Final Answer: #0\nObservation: Final Answer: #7")
    assert term and info["success"]
    fresh()  # a variable that does not exist ends the episode, reward 0: AgentBench FC's
    # knowledgegraph/task.py lines 109-110 and 124-126 (commit 578c5e9): variables_list[var_idx]
    # raises IndexError and the sample ends as AGENT_VALIDATION_FAILED
    obs, r, term, _, info = env.step("Final Answer: #5")
    assert (r, term, info["parse_error"], info["invalid_answer"]) == (0.0, True, False, True)
    assert obs == "Variable #5 does not exist (1 variable). The episode is over."
    fresh()
    obs, r, term, _, info = env.step("Final Answer: #" + "9" * 5000)  # past int()'s digit limit
    assert (r, term, info["invalid_answer"]) == (0.0, True, True)
    fresh()  # leading zeros: AgentBench reads the id with int()
    assert env.step("Final Answer: #000")[4]["success"]
    fresh()  # case-sensitive, as AgentBench's regex
    obs, _, term, _, info = env.step("final answer: #0")
    assert not term and info["parse_error"]
    # Off (default): "Final Answer" is not an action.
    env = make("kg")
    env.reset(seed)
    env.step(f"Action: get_neighbors({country}, {NB})")
    _, _, term, _, info = env.step("Final Answer: #0")
    assert not term and info["parse_error"]


def test_system_prompts_follow_the_options() -> None:
    plain = make("kg").system_prompt
    hidden = make("kg", hide_members=True, final_answer=True).system_prompt
    assert "[Andorra, France" in plain and "Final Answer" not in plain
    assert "[Andorra" not in hidden and "variable #2, which are instances of country" in hidden
    assert "Final Answer: #id" in hidden and "up to 3 entities" not in hidden


def test_bad_options() -> None:
    with pytest.raises(TypeError, match="hide_members must be a bool"):
        make("kg", hide_members="yes")
    with pytest.raises(TypeError, match="final_answer must be a bool"):
        make("kg", final_answer=1)
    with pytest.raises(ValueError, match="reward must be one of"):
        make("kg", reward="bleu")


# --------------------------------------------------------------------------- oracle, robustness


@pytest.mark.parametrize("difficulty", DIFFS)
@pytest.mark.parametrize(
    "options",
    [{"hide_members": True}, {"final_answer": True}, {"reward": "f1"}, ALL_ON],
    ids=["hide_members", "final_answer", "f1", "all"],
)
def test_oracle_solves_every_instance_with_options(difficulty: str, options: dict) -> None:
    assert oracle_success_rate("kg", range(50), difficulty=difficulty, **options) == 1.0


def test_oracle_uses_final_answer_when_on() -> None:
    env = make("kg", final_answer=True)
    env.reset(0)
    ep = run_episode(env, spec("kg").oracle(env), 0)
    assert ep.success and ep.actions[-1].splitlines()[-1].startswith("Final Answer: #")


@pytest.mark.parametrize("difficulty", DIFFS)
def test_deterministic_with_options(difficulty: str) -> None:
    a, b = make("kg", difficulty=difficulty, **ALL_ON), make("kg", difficulty=difficulty, **ALL_ON)
    for seed in (0, 7, 1_000_003):
        a.reset(seed)
        ea = run_episode(a, spec("kg").oracle(a), seed)
        b.reset(seed)
        eb = run_episode(b, spec("kg").oracle(b), seed)
        assert ea.observations == eb.observations and ea.rewards == eb.rewards


NASTY = (
    "Final Answer: #",
    "Final Answer: #-1",
    "Final Answer: #0",
    "Final Answer: #00000000000000000000000001",
    "Final Answer: #" + "9" * 20_000,
    "Final Answer: #1\\_2",
    "Observation:" * 5000 + "Final Answer: #0",
    "Find Answer: #0 Final Answer: #1",
    "Final Answer: #0\x00",
    "Action: answer(#0)",
    "Action: count(#0)",
)


@pytest.mark.parametrize("difficulty", DIFFS)
def test_check_env_hostile_actions_with_options(difficulty: str) -> None:
    for seed in (0, 1):
        check_env(make("kg", difficulty=difficulty, **ALL_ON), seed, HOSTILE_ACTIONS + NASTY)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=200),
            st.builds(
                lambda t, k: f"{t}Final Answer: #{k}", st.text(max_size=30), st.integers(0, 40)
            ),
            st.sampled_from(NASTY),
        ),
        max_size=6,
    )
)
def test_env_never_raises_with_options(actions: list[str]) -> None:
    env = make("kg", **ALL_ON)
    env.reset(3)
    for action in actions:
        obs, reward, term, trunc, info = env.step(action)
        assert isinstance(obs, str) and 0.0 <= reward <= 1.0
        assert 0.0 <= info["f1"] <= 1.0 and info["exact_match"] in (0.0, 1.0)
        if term or trunc:
            break


def test_agentbench_tools_wording_and_every_call_of_a_reply() -> None:
    """AgentBench FC's kg loop (knowledgegraph/task.py, commit 578c5e9): the first message is
    ``f'{question}\\nEntities: [...]'`` (line 93); every call of a reply runs in order (line
    140), results read ``Observation: variable #N, which are instances of T`` / ``..., which is
    a number`` (api.py lines 106 and 144), a failed call ``Error processing tool call: ...``
    (task.py line 193)."""
    from entropace.envs.base import TurnLimit
    from entropace.envs.kg.fc import AGENTBENCH_STYLE, SUITE
    from entropace.envs.tools import ToolCall, ToolInterface, format_tool_call

    raw = KGEnv("easy", hide_members=True, final_answer=True)
    env = TurnLimit(ToolInterface(raw, SUITE, AGENTBENCH_STYLE, calls_per_reply="all"), 15)
    obs, _ = env.reset(0)
    assert obs == f"{raw.question.text}\nEntities: [{', '.join(raw.question.entities)}]"
    reply = format_tool_call(
        ToolCall("get_neighbors", {"variable": "Spain", "relation": NB})
    ) + format_tool_call(ToolCall("count", {"variable": "#0"}))
    obs, reward, term, _, info = env.step(reply)
    assert [m["content"] for m in info["tool_messages"]] == [
        "Observation: variable #0, which are instances of country",
        "Observation: variable #1, which is a number",
    ]
    assert (reward, term, info["calls_run"]) == (0.0, False, 2)
    obs, *_ = env.step(format_tool_call(ToolCall("count", {"variable": "#7"})))
    assert obs == "Error processing tool call: Variable #7 does not exist (variables: #0..#1)."
    obs, *_ = env.step(format_tool_call(ToolCall("get_relations", {"variable": "Spain"})))
    assert obs == "Observation: [" + ", ".join(raw.graph.relations("Spain")) + "]"
    # strict (the default tools interface): two calls are refused, none runs
    strict = make("kg", interface="tools")
    strict.reset(0)
    _, _, _, _, info = strict.step(reply)
    assert info["tool_error"] == "several_calls" and not strict.env.env.session.variables
