"""The pace-mismatch lab (``lab-*``): determinism, scoring by hand, oracle, hostile actions,
protocol conformance, and the ``lab`` preset."""

from __future__ import annotations

import pytest

from entropace.envs import EnvError, make, seeds, spec, specs
from entropace.envs.base import MAX_ACTION_CHARS, TextEnv
from entropace.envs.checks import HOSTILE_ACTIONS, check_env, oracle_success_rate, run_episode
from entropace.envs.lab import LAB_TASKS, LabTask, matched_positions, matched_prefix, score_reply
from entropace.train.config import load_config

NAMES = sorted(LAB_TASKS)
DIFFS = ("easy", "medium", "hard")


def test_every_lab_task_is_registered() -> None:
    assert {"lab-easy", "lab-mid", "lab-hard"} <= set(specs())
    for name in NAMES:
        s = spec(name)
        assert s.name == name and "pace-mismatch lab" in s.description
        assert set(s.options) == {"difficulty", "credit"}
        assert isinstance(make(name).env, TextEnv)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("difficulty", DIFFS)
def test_oracle_scores_one_on_50_seeds(name: str, difficulty: str) -> None:
    assert oracle_success_rate(name, range(50), difficulty=difficulty) == 1.0
    assert oracle_success_rate(name, seeds("test", 50), difficulty=difficulty) == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_instances_are_deterministic_per_seed(name: str) -> None:
    a, b = make(name), make(name)
    for seed in range(30):
        assert a.reset(seed) == b.reset(seed)
    obs = {make(name).reset(s)[0] for s in range(30)}
    if LAB_TASKS[name].distractors:
        assert len(obs) == 30  # the seed is in the prompt; distractors vary
    first, info = a.reset(7)
    assert info == {
        "task": name,
        "seed": 7,
        "difficulty": "easy",
        "level": LAB_TASKS[name].level,
        "gold": LAB_TASKS[name].code,
    }
    assert make(name, difficulty="hard").reset(7)[1]["difficulty"] == "hard"
    assert f"The code is {LAB_TASKS[name].code}." in first


def test_gold_per_difficulty() -> None:
    t = LAB_TASKS["lab-mid"]
    assert [t.gold(d) for d in DIFFS] == [t.code, t.code + t.extension[0], t.code + t.extension]
    assert make("lab-mid", difficulty="hard").reset(0)[1]["gold"] == t.code + t.extension
    with pytest.raises(ValueError, match="difficulty must be one of"):
        make("lab-mid", difficulty="brutal")


def test_distractors_never_show_the_gold_or_the_decoy() -> None:
    for name in NAMES:
        task = LAB_TASKS[name]
        for seed in range(40):
            obs, info = make(name).reset(seed)
            if not task.distractors:
                continue
            shown = obs.split("Not these: ")[1].rstrip(".").split()
            assert len(shown) == len(set(shown)) == task.distractors
            assert info["gold"] not in shown
            assert all(len(c) == len(info["gold"]) and set(c) <= set(task.alphabet) for c in shown)
            if task.decoy:
                assert not any(c.startswith(task.decoy) for c in shown)


def test_matched_prefix_by_hand() -> None:
    assert matched_prefix("70", "70") == 2
    assert matched_prefix("7", "70") == 1
    assert matched_prefix("71", "70") == 1
    assert matched_prefix("07", "70") == 0  # positions after the first mismatch do not count
    assert matched_prefix("", "70") == 0 and matched_prefix("703", "70") == 2


def test_score_reply_by_hand() -> None:
    easy, mid, hard = (LAB_TASKS[n] for n in ("lab-easy", "lab-mid", "lab-hard"))
    assert (easy.code, mid.code, hard.code, hard.decoy) == ("4", "70", "03", "4")
    assert score_reply(easy, "4", "4") == (1.0, True)
    assert score_reply(easy, "4", "4 and more") == (1.0, True)  # judged by its beginning
    assert score_reply(easy, "4", "5") == (0.0, False)  # no partial credit on lab-easy
    assert score_reply(mid, "70", "70x") == (1.0, True)
    assert score_reply(mid, "70", "71") == (0.5 * 1 / 2, False)
    assert score_reply(mid, "70", "07") == (0.0, False)
    # the decoy (lab-easy's answer) earns a little and never succeeds
    assert score_reply(hard, "03", "4") == (0.15, False)
    assert score_reply(hard, "03", "43") == (0.15, False)
    assert score_reply(hard, "03", "0") == (0.5 * 1 / 2, False)  # above the decoy
    assert score_reply(hard, "03", "03") == (1.0, True)
    # at difficulty hard the code is longer and the credit is per digit of it
    assert score_reply(hard, "0381", "038") == (0.5 * 3 / 4, False)


def test_step_rewards_and_endings() -> None:
    env = make("lab-mid")
    env.reset(0)
    obs, reward, term, trunc, info = env.step("  70")
    assert (obs, reward, term, trunc, info["success"]) == ("Correct.", 1.0, True, False, True)
    env.reset(0)
    obs, reward, term, trunc, info = env.step("71")
    assert term and not info["success"] and not info["parse_error"]
    assert reward == 0.25 and obs == "Wrong code (reward 0.25)."
    with pytest.raises(EnvError):
        env.step("70")  # the episode ended


def test_empty_and_oversized_replies_are_parse_errors() -> None:
    env = make("lab-easy")
    env.reset(1)
    obs, reward, term, trunc, info = env.step(" \n\t")
    assert info["parse_error"] and not term and not trunc and reward == 0.0
    assert "Empty reply" in obs
    # the next turn may answer (max_turns 2)
    obs, reward, term, trunc, info = env.step("4")
    assert info["success"] and term and reward == 1.0
    env.reset(1)
    obs, reward, term, trunc, info = env.step("4" * (MAX_ACTION_CHARS + 1))
    assert info["parse_error"] and str(MAX_ACTION_CHARS) in obs and not info["success"]
    env.reset(1)
    _, _, _, trunc, info = env.step("4" * MAX_ACTION_CHARS)  # at the limit: parsed whole
    assert info["success"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("difficulty", ("easy", "hard"))
def test_check_env_hostile_actions(name: str, difficulty: str) -> None:
    nasty = ("9" * 100, "\u0664", "\uff14", "-4", "+70", " 0 3", "\u0660\u0663", "o3")
    check_env(make(name, difficulty=difficulty), seed=3, actions=HOSTILE_ACTIONS + nasty)


def test_non_ascii_digits_score_nothing() -> None:
    # Arabic-Indic and full-width digits are not the code's digits
    for reply in ("\u0664", "\uff14"):
        assert score_reply(LAB_TASKS["lab-easy"], "4", reply) == (0.0, False)
    assert score_reply(LAB_TASKS["lab-hard"], "03", "\u0660\u0663") == (0.0, False)


def test_a_truncated_episode_never_succeeds() -> None:
    env = make("lab-hard")
    ep = run_episode(env, lambda obs: "", 5)
    assert ep.truncated and not ep.success and ep.rewards == [0.0, 0.0]


def test_bad_task_definitions_are_refused() -> None:
    with pytest.raises(ValueError, match="digits"):
        LabTask("x", "easy", "4a", "12")
    with pytest.raises(ValueError, match="must not prefix"):
        LabTask("x", "easy", "42", "12", decoy="4", decoy_reward=0.1)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        LabTask("x", "easy", "42", "12", partial=1.0)
    with pytest.raises(ValueError, match="too many distractors"):
        LabTask("x", "easy", "4", "12", distractors=6)


def test_lab_preset_loads_and_validates() -> None:
    cfg = load_config("lab", [])
    assert cfg.model.name == "tiny" and cfg.model.device == "cpu"
    assert cfg.tasks.names == ["lab-easy", "lab-mid", "lab-hard"]
    assert cfg.steps >= 200 and cfg.algorithm.name == "grpo"
    assert cfg.ppo.epochs * cfg.ppo.num_minibatches > 1  # the clip rules act
    longest = max(len(LAB_TASKS[n].gold(cfg.tasks.difficulty)) for n in cfg.tasks.names)
    assert cfg.rollout.max_new_tokens_per_turn >= longest  # digits are single tokens
    for algo in ("eppo", "eppo-success", "papo", "eppo+papo", "bapo", "clip_cov"):
        assert load_config("lab", [f"algo={algo}"]).algorithm.name == algo


# ------------------------------------------------------------------------------ lab v2 (issue 23)
V2 = ("lab2-easy", "lab2-mid", "lab2-hard")


def test_v2_tasks_share_no_answer_characters() -> None:
    alphabets = [set(LAB_TASKS[n].alphabet) for n in V2]
    for i in range(3):
        for j in range(i + 1, 3):
            assert not alphabets[i] & alphabets[j]
    for n in V2:  # nothing a v2 task can reply scores on another v2 task
        for difficulty in ("easy", "medium", "hard"):
            gold = LAB_TASKS[n].gold(difficulty)
            for other in V2:
                if other != n:
                    t = LAB_TASKS[other]
                    assert score_reply(t, t.gold(difficulty), gold) == (0.0, False)


def test_v2_graded_credit_by_hand() -> None:
    hard = LAB_TASKS["lab2-hard"]
    assert [score_reply(hard, "lRfD", r)[0] for r in ("x", "l", "lR", "lRf")] == pytest.approx(
        [0.0, 0.2, 0.4, 0.6]
    )
    assert score_reply(hard, "lRfD", "lRfD and more") == (1.0, True)
    assert score_reply(LAB_TASKS["lab2-easy"], "SF", "S")[0] == pytest.approx(0.4)


def test_v2_codes_are_one_token_per_character_of_the_tiny_tokenizer() -> None:
    pytest.importorskip("transformers")
    from entropace.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    for n in V2:
        for ch in LAB_TASKS[n].alphabet:
            assert len(tok.encode(ch, add_special_tokens=False)) == 1, (n, ch)


def test_v2_oracle_and_prompts_say_characters() -> None:
    for n in V2:
        env = make(n)
        obs, info = env.reset(3)
        assert "characters" in env.system_prompt
        ep = run_episode(env, spec(n).oracle(env), 3)
        assert ep.success and ep.rewards == [1.0]


def test_v2_held_out_prompts_never_occur_in_train() -> None:
    from entropace.envs import seeds

    for n in V2:
        env = make(n)
        train = {env.reset(int(s))[0].split(". ", 1)[1] for s in seeds("train", 2000)}
        test = [env.reset(int(s))[0].split(". ", 1)[1] for s in seeds("test", 300)]
        # the prompt without its "#seed" header: the distractor lists themselves are new
        assert not any(t in train for t in test), n


def test_lab2_preset_is_a_regime_where_the_clip_can_bind() -> None:
    cfg = load_config("lab2", [])
    assert cfg.tasks.names == list(V2)
    assert cfg.ppo.num_minibatches >= 8 and cfg.ppo.epochs == 2  # 16 optimiser steps per rollout
    assert cfg.rollout.temperature == 1.5 and all(LAB_TASKS[n].credit == "position" for n in V2)
    longest = max(len(LAB_TASKS[n].gold(cfg.tasks.difficulty)) for n in cfg.tasks.names)
    assert cfg.rollout.max_new_tokens_per_turn >= longest


def test_position_credit_by_hand() -> None:
    """``credit="position"`` counts the positions that match, whatever precedes them."""
    hard = LAB_TASKS["lab2-hard"]  # code lRfD, partial 0.8
    by_hand = {"x": 0, "l": 1, "xR": 1, "xxfD": 2, "lxfx": 2, "xRfD": 3, "Dfrl": 0}
    for reply, m in by_hand.items():
        assert score_reply(hard, "lRfD", reply, "position") == pytest.approx((0.8 * m / 4, False))
        assert matched_positions(reply, "lRfD") == m
    assert score_reply(hard, "lRfD", "xRfD") == pytest.approx((0.6, False))  # the task's own
    assert score_reply(hard, "lRfD", "xRfD", "prefix") == (0.0, False)
    assert score_reply(hard, "lRfD", "lRfD!", "position") == (1.0, True)
    # brute force: every reply over the alphabet and one outside letter, up to length 4
    import itertools

    letters = hard.alphabet + "a"
    for n in range(1, 5):
        for chars in itertools.product(letters, repeat=n):
            reply = "".join(chars)
            hits = sum(1 for i in range(min(n, 4)) if reply[i] == "lRfD"[i])
            want = (1.0, True) if reply.startswith("lRfD") else (0.8 * hits / 4, False)
            assert score_reply(hard, "lRfD", reply, "position") == pytest.approx(want)


def test_credit_option_reaches_the_env_and_bad_values_are_refused() -> None:
    env = make("lab2-mid", credit="position")  # code JHj
    env.reset(5)
    _, reward, done, _, info = env.step("xHj")
    assert reward == pytest.approx(0.8 * 2 / 3) and done and not info["success"]
    env = make("lab2-mid", credit="prefix")
    env.reset(5)
    assert env.step("xHj")[1] == 0.0
    env = make("lab2-mid")  # the v2 tasks' own credit: by position
    env.reset(5)
    assert env.step("xHj")[1] == pytest.approx(0.8 * 2 / 3)
    env = make("lab-mid")  # v1 keeps prefix credit (code 70)
    env.reset(5)
    assert env.step("x0")[1] == 0.0
    with pytest.raises(ValueError, match="credit must be one of"):
        make("lab2-mid", credit="hamming")
    with pytest.raises(ValueError, match="credit must be one of"):
        LabTask("x", "easy", "42", "12", credit="suffix")
    cfg = load_config("lab2", ["tasks.options={lab2-easy: {credit: prefix}}"])
    assert cfg.tasks.options == {"lab2-easy": {"credit": "prefix"}}
