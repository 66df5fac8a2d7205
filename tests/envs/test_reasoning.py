"""The ``reasoning`` family: answer extraction, scoring through reasoning-gym, oracle, robustness."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("reasoning_gym")

import reasoning_gym
from hypothesis import given, settings
from hypothesis import strategies as st

from entropace.envs import EnvError, make, seeds, spec
from entropace.envs.checks import HOSTILE_ACTIONS, check_env, oracle_success_rate, run_episode
from entropace.envs.reasoning import DATASETS, build_dataset, extract_answer, parse_datasets

DIFFS = ("easy", "medium", "hard")

NASTY = (
    "<answer></answer>",
    "<answer>" * 5000,
    "</answer>" * 5000,
    "<answer>9**9**9**9**9</answer>",
    "<answer>__import__('os').system('echo pwned')</answer>",
    "Answer: " + "1" * 10_000,
    "<ANSWER>  </ANSWER> Answer:",
    "<answer>" + "x" * 50_000 + "</answer>",
)


# --------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>42</answer>", "42"),
        ("think... <answer> 1 </answer> then <answer>2</answer>", "2"),  # last block wins
        ("<ANSWER>Paris</Answer>", "Paris"),  # tags are case-insensitive, content is not
        ("so the result is\nAnswer: 17\nbye", "17"),
        ("answer: a\nAnswer:  b, c  ", "b, c"),
        ("<answer>5</answer> Answer: 6", "5"),  # a tag block beats the Answer: fallback
        ("<answer>multi\nline</answer>", "multi\nline"),
        ("no answer here", None),
        ("<answer>   </answer>", None),
        ("Answer:", None),
        ("<answer>7", None),  # unclosed, no fallback
        ("</answer><answer>", None),
    ],
)
def test_extract_answer_cases(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_extract_answer_never_raises(text: str) -> None:
    out = extract_answer(text)
    assert out is None or (isinstance(out, str) and out == out.strip() and out)


_inner = st.text(alphabet=st.characters(blacklist_characters="<>"), min_size=0, max_size=60)


@settings(max_examples=300, deadline=None)
@given(prefix=st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=60), ans=_inner)
def test_extract_answer_round_trips(prefix: str, ans: str) -> None:
    text = f"{prefix}\n<answer>{ans}</answer>"
    assert extract_answer(text) == (ans.strip() or None)


# --------------------------------------------------------------------------- options


def test_parse_datasets() -> None:
    assert parse_datasets(None) == tuple(DATASETS)
    assert parse_datasets("all") == tuple(DATASETS)
    assert parse_datasets(" countdown , chain_sum") == ("countdown", "chain_sum")
    with pytest.raises(ValueError, match="available: basic_arithmetic"):
        parse_datasets("countdown,sudokuu")
    with pytest.raises(ValueError, match="empty"):
        parse_datasets(" , ")
    with pytest.raises(ValueError, match="twice"):
        parse_datasets("countdown,countdown")
    with pytest.raises(ValueError, match="comma-separated string"):
        parse_datasets(3)  # type: ignore[arg-type]


def test_bad_options_are_clear() -> None:
    with pytest.raises(ValueError, match="difficulty must be one of"):
        make("reasoning", difficulty="extreme")
    with pytest.raises(TypeError, match="unknown option"):
        make("reasoning", level=3)
    with pytest.raises(ValueError, match="unknown reasoning dataset"):
        make("reasoning", datasets="gsm8k")
    env = make("reasoning")
    with pytest.raises(EnvError):
        env.step("<answer>1</answer>")


def test_spec_metadata() -> None:
    s = spec("reasoning")
    assert "Apache-2.0" in s.license and "reasoning-gym" in s.data_source
    assert s.requires == ("reasoning-gym",)
    assert set(s.options) == {"difficulty", "datasets"}


# --------------------------------------------------------------------------- instances


@pytest.mark.parametrize("difficulty", DIFFS)
def test_instances_match_reasoning_gym_and_are_deterministic(difficulty: str) -> None:
    env, again = make("reasoning", difficulty=difficulty), make("reasoning", difficulty=difficulty)
    for seed in [0, 1, 7, 123_456, 1_000_003]:
        obs, info = env.reset(seed)
        assert again.reset(seed) == (obs, info)
        # attempt 0: the historical draw; later attempts (the seed's first draw lay on the
        # other side of the content split) draw dataset and index from the seed's own stream
        if info["attempt"] == 0:
            name, index = random.Random(seed).choice(tuple(DATASETS)), seed
        else:
            rng = random.Random(f"reasoning/{seed}/{info['attempt']}")
            name, index = rng.choice(tuple(DATASETS)), rng.randrange(1_100_000)
        assert info["dataset"] == name and info["seed"] == seed and info["task"] == "reasoning"
        # Reference: reasoning-gym built independently with the documented knobs and seed.
        ref = reasoning_gym.create_dataset(
            name, seed=0, size=2_000_000, **DATASETS[name].configs[difficulty]
        )[index]
        assert obs.startswith(ref["question"].rstrip())
        assert obs.endswith("<answer></answer> tags.")
        assert info["gold"] == str(ref["answer"])


def test_dataset_selection_and_coverage() -> None:
    env = make("reasoning", datasets="chain_sum")
    assert {env.reset(s)[1]["dataset"] for s in range(20)} == {"chain_sum"}
    env = make("reasoning")
    assert {env.reset(s)[1]["dataset"] for s in range(60)} == set(DATASETS)


def test_difficulty_maps_to_knobs() -> None:
    # knights_knaves: 2 / 3 / 4 inhabitants; chain_sum: terms within the configured range.
    for difficulty, people in zip(DIFFS, (2, 3, 4)):
        env = make("reasoning", difficulty=difficulty, datasets="knights_knaves")
        env.reset(11)
        assert len(env.entry["metadata"]["names"]) == people
        cfg = DATASETS["chain_sum"].configs[difficulty]
        env = make("reasoning", difficulty=difficulty, datasets="chain_sum")
        for s in range(10):
            env.reset(s)
            assert cfg["min_terms"] <= env.entry["metadata"]["num_terms"] <= cfg["max_terms"]


def test_train_and_test_seeds_disjoint() -> None:
    assert not set(seeds("train", 1000, offset=999_000)) & set(seeds("test", 1000))


# --------------------------------------------------------------------------- scoring


def test_reward_is_the_scorers_score_with_partial_credit() -> None:
    env = make("reasoning", difficulty="medium", datasets="word_sorting")
    _, info = env.reset(4)
    gold = info["gold"].split(", ")
    wrong = list(reversed(gold))
    # reasoning-gym's word_sorting rule, by hand: share of words in the right position, at
    # least 0.2 when the words are the right multiset.
    expected = max(sum(a == b for a, b in zip(wrong, gold)) / len(gold), 0.2)
    obs, reward, term, trunc, info = env.step("Sorted: <answer>" + ", ".join(wrong) + "</answer>")
    assert reward == pytest.approx(expected) and 0 < reward < 1
    assert term and not trunc and not info["success"] and not info["parse_error"]
    assert "partially correct" in obs


def test_exact_answer_formats() -> None:
    env = make("reasoning", datasets="chain_sum")
    _, info = env.reset(2)
    # chain_sum's scorer tolerates "+0042"-style formatting of the same number.
    obs, reward, term, _, info2 = env.step(f"Answer: {int(info['gold']):+05d}")
    assert reward == 1.0 and info2["success"] and term
    env.reset(2)
    _, reward, _, _, info3 = env.step(f"<answer>{int(info['gold']) + 1}</answer>")
    assert reward == 0.0 and not info3["success"] and not info3["parse_error"]


def test_no_answer_is_a_parse_error() -> None:
    env = make("reasoning")
    env.reset(0)
    obs, reward, term, trunc, info = env.step("I think it is 42.")
    assert (reward, term, trunc, info["parse_error"], info["success"]) == (
        0.0,
        True,
        False,
        True,
        False,
    )
    assert "<answer></answer>" in obs


def test_scorer_exceptions_and_nan_give_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    env = make("reasoning", datasets="basic_arithmetic")
    env.reset(0)
    ds = build_dataset("basic_arithmetic", "easy")

    def boom(answer: str, entry: dict) -> float:
        raise ZeroDivisionError("scorer bug")

    monkeypatch.setattr(ds, "score_answer", boom)
    _, reward, term, _, info = env.step(f"<answer>{env.gold}</answer>")
    assert (reward, term, info["parse_error"], info["success"]) == (0.0, True, True, False)
    assert "ZeroDivisionError" in info["error"]
    monkeypatch.setattr(ds, "score_answer", lambda answer, entry: float("nan"))
    env.reset(0)
    _, reward, _, _, info = env.step(f"<answer>{env.gold}</answer>")
    assert reward == 0.0 and info["parse_error"] and "non-finite" in info["error"]


def test_countdown_guard_never_evaluates_code(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = make("reasoning", datasets="countdown")
    env.reset(0)
    _, reward, _, _, info = env.step("<answer>__import__('os').mkdir('pwned')</answer>")
    assert reward == 0.0 and info["parse_error"] and not (tmp_path / "pwned").exists()
    env.reset(0)
    _, reward, _, _, info = env.step("<answer>9**9**9**9**9</answer>")
    assert reward == 0.0 and "'**'" in info["error"]
    env.reset(0)  # the guard lets real expressions through to the scorer
    _, reward, _, _, info = env.step(f"<answer>{env.gold}</answer>")
    assert reward == 1.0 and info["success"]


# --------------------------------------------------------------------------- policies


@pytest.mark.parametrize("difficulty", DIFFS)
def test_oracle_solves_every_instance(difficulty: str) -> None:
    assert oracle_success_rate("reasoning", range(50), difficulty=difficulty) == 1.0


@pytest.mark.parametrize("difficulty", DIFFS)
def test_garbage_policies_score_about_zero(difficulty: str) -> None:
    rng = random.Random(0)
    env = make("reasoning", difficulty=difficulty)
    policies = [
        lambda obs: "".join(rng.choice("abc 123+*/<>\n") for _ in range(rng.randrange(80))),
        lambda obs: f"<answer>{rng.randrange(-1000, 1000)}</answer>",
        lambda obs: "<answer>Alice is a knight, and Bob is a knave</answer>",
    ]
    for i, policy in enumerate(policies):
        eps = [run_episode(env, policy, seed) for seed in range(100 * i, 100 * i + 30)]
        assert all(ep.terminated and len(ep.actions) == 1 for ep in eps)
        assert sum(ep.success for ep in eps) <= 1
        assert sum(ep.total_reward for ep in eps) / len(eps) < 0.1


@pytest.mark.parametrize("difficulty", DIFFS)
def test_check_env_hostile_actions(difficulty: str) -> None:
    env = make("reasoning", difficulty=difficulty)
    covered = set()
    for seed in range(12):
        check_env(env, seed, HOSTILE_ACTIONS + NASTY)
    for seed in range(40):  # the first 40 train seeds draw every dataset
        covered.add(env.reset(seed)[1]["dataset"])
    assert covered == set(DATASETS)


@pytest.mark.parametrize(
    "difficulty",
    [
        "easy",
        # slow: medium / hard instances take ~10-30 ms to generate and a test seed draws ~5
        # candidates (~50 s each on a loaded 2-core machine); easy is where overlap was found
        pytest.param("medium", marks=pytest.mark.slow),
        pytest.param("hard", marks=pytest.mark.slow),
    ],
)
def test_test_split_never_repeats_a_train_instance(difficulty: str) -> None:
    """Before the content split, 40 of the first 500 easy test seeds (chain_sum,
    basic_arithmetic) repeated a question and answer of the first 3,000 train seeds."""
    from entropace.envs.splits import SplitUnavailable, fingerprint

    env = make("reasoning", difficulty=difficulty, datasets="chain_sum,basic_arithmetic")
    train = set()
    for s in seeds("train", 1500):
        obs, info = env.reset(int(s))
        assert info["fingerprint"] == fingerprint(obs, info["gold"])
        train.add(info["fingerprint"])
    test = [env.reset(int(s))[1]["fingerprint"] for s in seeds("test", 300)]
    assert sum(f in train for f in test) == 0
    with pytest.raises(SplitUnavailable, match="test_unseen"):
        env.reset(int(seeds("test_unseen", 1)[0]))
