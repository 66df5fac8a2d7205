"""Rollout engine: token layout, masks, statistics, determinism, abnormal ends, robustness.

Every test uses the tiny offline Llama (``tests/conftest.py``) and small scripted environments
defined here, whose observations and rewards are known in advance.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

import entropace.rollout.decode as decode_mod  # noqa: E402
from entropace.envs.base import TurnLimit  # noqa: E402
from entropace.rollout import (  # noqa: E402
    RolloutConfig,
    RolloutRequest,
    collect_rollouts,
    sequence_token_stats,
)

IM_END = "<|im_end|>"


# ----------------------------------------------------------------------------------------------
# Scripted environments
# ----------------------------------------------------------------------------------------------


class CounterEnv:
    """Observation ``"count <seed>"``, then ``"turn <t>: <len(action)> chars"``.

    Terminates successfully at turn ``stop_at`` (default: ``seed % 3 + 1``), reward 0.25 per
    step plus 1.0 on the terminating step. ``parse_error`` on every step when ``bad_syntax``.
    """

    name = "counter"
    system_prompt = "Count the turns. Answer with a number."

    def __init__(
        self, max_turns: int = 5, stop_at: int | None = None, bad_syntax: bool = False
    ) -> None:
        self.max_turns = max_turns
        self.stop_at_fixed = stop_at
        self.bad_syntax = bad_syntax

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.seed = seed
        self.turn = 0
        self.stop_at = self.stop_at_fixed if self.stop_at_fixed is not None else seed % 3 + 1
        self.actions: list[str] = []
        return f"count {seed}", {"task": self.name, "seed": seed}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.turn += 1
        self.actions.append(action)
        done = self.turn >= self.stop_at
        reward = 0.25 + (1.0 if done else 0.0)
        obs = f"turn {self.turn}: {len(action)} chars"
        info = {"success": done, "parse_error": self.bad_syntax}
        return obs, reward, done, False, info


class RaisingEnv(CounterEnv):
    """Raises inside ``step`` at turn ``fail_at``."""

    name = "raising"

    def __init__(self, fail_at: int = 2, **kw: Any) -> None:
        super().__init__(**kw)
        self.fail_at = fail_at

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.turn + 1 >= self.fail_at:
            raise KeyError("boom: the environment crashed")
        return super().step(action)


class NanRewardEnv(CounterEnv):
    name = "nan"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, _, done, trunc, info = super().step(action)
        return obs, float("nan"), done, trunc, info


def add_eot_bias(model: Any, tokenizer: Any, bias: float) -> None:
    """Raise the end-of-turn logit by ``bias`` everywhere (a forward hook on ``lm_head``), so
    that some turns end with a generated ``<|im_end|>`` and others hit the token budget."""
    eot = tokenizer.convert_tokens_to_ids(IM_END)

    def hook(_module: Any, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[..., eot] += bias
        return output

    model.lm_head.register_forward_hook(hook)


def chatml(messages: list[dict[str, str]]) -> str:
    """The ChatML rendering, written out by hand."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def requests(n: int, env: Any = CounterEnv, task: str = "counter") -> list[RolloutRequest]:
    return [RolloutRequest(task, env, seed, seed // 2) for seed in range(n)]


@pytest.fixture(autouse=True)
def _restore_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spies below replace the decoding loop; put it back after each test."""
    monkeypatch.setattr(decode_mod, "decode", decode_mod.decode)


class GenerateSpy:
    """Wraps the rollout's decoding loop (``entropace.rollout.decode.decode``, one call per
    ``generate_turn``) for ``model`` and records every call's input ids, mask and output ids
    (the input followed by the generated tokens, as ``generate`` returns them)."""

    def __init__(self, model: Any) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.original = original = decode_mod.decode

        def decode(m: Any, input_ids: Any, attention_mask: Any, *args: Any, **kwargs: Any) -> Any:
            new = original(m, input_ids, attention_mask, *args, **kwargs)
            if m is model:
                out = torch.cat([input_ids.cpu(), new], dim=1)
                self.calls.append((input_ids, attention_mask, out))
            return new

        decode_mod.decode = decode

    @property
    def batch_sizes(self) -> list[int]:
        return [ids.shape[0] for ids, _, _ in self.calls]


CFG = RolloutConfig(max_new_tokens_per_turn=12, max_episode_tokens=400, temperature=1.0)


# ----------------------------------------------------------------------------------------------
# Token layout
# ----------------------------------------------------------------------------------------------


def test_trajectory_is_the_chat_rendering_and_loss_mask_covers_exactly_generated_tokens(
    tiny_model_and_tokenizer: tuple[Any, Any],
) -> None:
    model, tok = tiny_model_and_tokenizer
    add_eot_bias(model, tok, 4.0)
    spy = GenerateSpy(model)
    result = collect_rollouts(model, tok, requests(6), CFG, seed=0)
    batch = result.batch
    eot = tok.convert_tokens_to_ids(IM_END)

    # Per episode, the continuations generate() produced (cut at the first <|im_end|>).
    sampled: list[list[list[int]]] = [[] for _ in range(batch.size)]
    live = list(range(batch.size))
    for (inp, _mask, out), expected_size in zip(spy.calls, result.generate_batch_sizes):
        assert inp.shape[0] == expected_size == len(live)
        for row, ep in enumerate(live):
            new = out[row, inp.shape[1] :].tolist()
            cut = new.index(eot) + 1 if eot in new else len(new)
            sampled[ep].append(new[:cut])
        live = [ep for ep in live if len(sampled[ep]) < batch.num_turns[ep]]
    assert live == []

    n_stopped = n_cut = 0
    for i, record in enumerate(batch.episodes):
        length = int(batch.attention_mask[i].sum())
        ids = batch.input_ids[i, :length].tolist()
        assert batch.attention_mask[i, length:].sum() == 0  # right padding
        # 1. The trajectory decodes to the ChatML rendering of its conversation.
        assert tok.decode(ids) == chatml(record.messages)
        assert record.messages[0] == {"role": "system", "content": CounterEnv.system_prompt}
        assert record.messages[1] == {"role": "user", "content": f"count {record.seed}"}
        # 2. Rebuild the token list by hand: prompt, sampled ids verbatim, template tokens.
        expected = tok(
            chatml(record.messages[:2]) + "<|im_start|>assistant\n", add_special_tokens=False
        )["input_ids"]
        expected_mask = [0] * len(expected)
        turns = sampled[i]
        for t, gen in enumerate(turns):
            stopped = bool(gen) and gen[-1] == eot
            n_stopped += stopped
            n_cut += not stopped
            assert len(gen) <= CFG.max_new_tokens_per_turn
            expected += gen
            expected_mask += [1] * len(gen)
            closing = "\n" if stopped else IM_END + "\n"
            if t + 1 < len(turns):
                obs = record.messages[2 + 2 * t + 1]["content"]
                assert obs == f"turn {t + 1}: {len(record.messages[2 + 2 * t]['content'])} chars"
                closing += f"<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n"
            template = tok(closing, add_special_tokens=False)["input_ids"]
            expected += template
            expected_mask += [0] * len(template)
        assert ids == expected
        assert batch.loss_mask[i, :length].tolist() == expected_mask
        assert batch.loss_mask[i, length:].sum() == 0
    # The bias makes both kinds of turn end appear, so both layouts were checked.
    assert n_stopped > 0 and n_cut > 0


def test_any_chat_template_layout(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    """A non-ChatML template (no newline after the end-of-turn token, its own role markers):
    the trajectory still decodes to the template's rendering of the conversation."""
    model, tok = tiny_model_and_tokenizer
    tok.chat_template = (
        "{% for m in messages %}{{ '### ' + m['role'] + ':\\n' + m['content'] + '<|im_end|>' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '### assistant:\\n' }}{% endif %}"
    )
    add_eot_bias(model, tok, 4.0)
    batch = collect_rollouts(model, tok, requests(4), CFG, seed=2).batch
    for i, record in enumerate(batch.episodes):
        length = int(batch.attention_mask[i].sum())
        rendered = tok.apply_chat_template(record.messages, tokenize=False)
        assert rendered.startswith("### system:\n")
        assert tok.decode(batch.input_ids[i, :length]) == rendered
        # every generated token lies inside an assistant turn: after "### assistant:\n"
        text_before = tok.decode(batch.input_ids[i, : int(batch.loss_mask[i].nonzero()[0])])
        assert text_before.endswith("### assistant:\n")


def test_terminated_rewards_turns_and_success(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    model, tok = tiny_model_and_tokenizer
    batch = collect_rollouts(model, tok, requests(6), CFG, seed=1).batch
    for i, record in enumerate(batch.episodes):
        stop_at = record.seed % 3 + 1
        assert record.end_reason == "terminated"
        assert int(batch.num_turns[i]) == stop_at
        assert batch.rewards[i].item() == pytest.approx(0.25 * stop_at + 1.0)
        assert bool(batch.success[i]) and not bool(batch.abnormal[i])
    assert batch.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert batch.task_ids.tolist() == [0] * 6 and batch.task_names == ["counter"]


def test_finished_episodes_drop_out_of_generation(
    tiny_model_and_tokenizer: tuple[Any, Any],
) -> None:
    model, tok = tiny_model_and_tokenizer
    spy = GenerateSpy(model)
    # seeds 0..5 stop after 1, 2, 3, 1, 2, 3 turns -> 6, then 4, then 2 live episodes.
    result = collect_rollouts(model, tok, requests(6), CFG, seed=0)
    assert spy.batch_sizes == [6, 4, 2] == result.generate_batch_sizes
    assert result.counts["generate_calls"] == 3
    assert result.counts["turns"] == 12
    for _inp, mask, _ in spy.calls:  # left padding: every row's real tokens are right-aligned
        assert mask[:, -1].all()
        assert (mask.cummax(dim=1).values == mask).all()
    # generation_batch_size splits each turn into several calls of at most that many.
    spy2 = GenerateSpy(model)
    cfg = RolloutConfig(max_new_tokens_per_turn=12, max_episode_tokens=400, generation_batch_size=4)
    collect_rollouts(model, tok, requests(6), cfg, seed=0)
    assert spy2.batch_sizes == [4, 2, 4, 2]


def test_multi_task_ids_follow_task_names(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    model, tok = tiny_model_and_tokenizer
    reqs = [
        RolloutRequest("b", CounterEnv, 0, 0),
        RolloutRequest("a", CounterEnv, 1, 1),
        ("b", CounterEnv(), 2, 2),  # tuple form, env instance
    ]
    result = collect_rollouts(model, tok, reqs, CFG, task_names=["b", "c", "a"], seed=0)
    assert result.batch.task_ids.tolist() == [0, 2, 0]
    assert result.batch.task_names == ["b", "c", "a"]
    assert result.task_counts["b"]["episodes"] == 2 and result.task_counts["a"]["turns"] == 2
    assert "c" not in result.task_counts
    with pytest.raises(ValueError, match=r"not in task_names"):
        collect_rollouts(model, tok, reqs, CFG, task_names=["a"])
    with pytest.raises(TypeError, match=r"RolloutRequest or a \(task"):
        collect_rollouts(model, tok, [("a", CounterEnv)], CFG)
    with pytest.raises(ValueError, match="at least one request"):
        collect_rollouts(model, tok, [], CFG)


# ----------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------


def reference_stats(model64: Any, ids: list[int], temperature: float) -> dict[str, torch.Tensor]:
    """Brute force in float64 on one unpadded trajectory: column t from the prefix ids[:t]."""
    with torch.no_grad():
        logits = model64(torch.tensor([ids])).logits[0].double() / temperature
    logp = torch.log_softmax(logits, dim=-1)[:-1]
    p = logp.exp()
    y = torch.tensor(ids[1:])
    logp_y = logp[torch.arange(len(y)), y]
    entropy = -(p * logp).sum(-1)
    t1 = logp_y.exp() * (entropy + logp_y)
    t2 = (p * p * (entropy[:, None] + logp)).sum(-1)
    zero = torch.zeros(1, dtype=torch.float64)
    return {
        "logprob": torch.cat([zero, logp_y]),
        "entropy": torch.cat([zero, entropy]),
        "sensitivity": torch.cat([zero, t2 - t1]),
    }


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_old_logprobs_entropy_sensitivity_match_float64_forward(
    tiny_model_and_tokenizer: tuple[Any, Any], temperature: float
) -> None:
    model, tok = tiny_model_and_tokenizer
    cfg = RolloutConfig(
        max_new_tokens_per_turn=10,
        max_episode_tokens=400,
        temperature=temperature,
        micro_batch_size=2,
        stats_chunk_size=7,
    )
    batch = collect_rollouts(model, tok, requests(5), cfg, seed=3).batch
    model64 = copy.deepcopy(model).double()
    for i in range(batch.size):
        length = int(batch.attention_mask[i].sum())
        ref = reference_stats(model64, batch.input_ids[i, :length].tolist(), temperature)
        mask = batch.loss_mask[i, :length].double()
        for name, got in [
            ("logprob", batch.old_logprobs),
            ("entropy", batch.entropy),
            ("sensitivity", batch.sensitivity),
        ]:
            torch.testing.assert_close(
                got[i, :length].double(), ref[name] * mask, atol=2e-5, rtol=1e-4
            )
            assert (got[i, length:] == 0).all()
    # Sanity: generated tokens carry real (negative) log-probs, template tokens carry zeros.
    assert (batch.old_logprobs[batch.loss_mask > 0] < 0).all()
    assert (batch.old_logprobs[batch.loss_mask == 0] == 0).all()


def test_sequence_token_stats_padding_and_micro_batch_invariance(
    tiny_model_and_tokenizer: tuple[Any, Any],
) -> None:
    model, tok = tiny_model_and_tokenizer
    g = torch.Generator().manual_seed(0)
    lengths = [5, 17, 9, 30]
    rows = [torch.randint(4, len(tok), (n,), generator=g).tolist() for n in lengths]
    L = 34
    ids = torch.full((4, L), tok.pad_token_id)
    mask = torch.zeros((4, L), dtype=torch.long)
    left_ids, left_mask = ids.clone(), mask.clone()
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
        left_ids[i, L - len(r) :] = torch.tensor(r)
        left_mask[i, L - len(r) :] = 1
    full = sequence_token_stats(model, ids, mask, temperature=0.9)
    micro = sequence_token_stats(
        model, ids, mask, temperature=0.9, micro_batch_size=1, chunk_size=3
    )
    left = sequence_token_stats(model, left_ids, left_mask, temperature=0.9, micro_batch_size=3)
    for i, r in enumerate(rows):
        alone = sequence_token_stats(
            model, torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long), temperature=0.9
        )
        n = len(r)
        for name in ("logprob", "entropy", "t1", "t2", "sensitivity"):
            ref = getattr(alone, name)[0]
            assert ref[0] == 0
            torch.testing.assert_close(getattr(full, name)[i, :n], ref, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(getattr(micro, name)[i, :n], ref, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(getattr(left, name)[i, L - n :], ref, atol=1e-5, rtol=1e-5)
            assert (getattr(full, name)[i, n:] == 0).all()
            assert (getattr(left, name)[i, : L - n + 1] == 0).all()


def test_sequence_token_stats_gradient_matches_direct_log_softmax(
    tiny_model_and_tokenizer: tuple[Any, Any],
) -> None:
    """grad=True (the update's call): d/dtheta of sum(mask * logprob) equals autograd of the
    plain log_softmax formula, in float64."""
    model, tok = tiny_model_and_tokenizer
    model = model.double()
    ids = torch.tensor([[5, 9, 300, 41, 7, 3, 3], [8, 200, 6, 90, 11, 12, 13]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    weights = torch.linspace(-1.0, 1.0, 7, dtype=torch.float64).expand(2, 7) * mask
    stats = sequence_token_stats(model, ids, mask, temperature=0.8, micro_batch_size=1, grad=True)
    ((stats.logprob * weights).sum() + 0.3 * (stats.entropy * mask).sum()).backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1] / 0.8
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    valid = mask[:, 1:] * mask[:, :-1]
    ((lp * weights[:, 1:] * valid).sum() + 0.3 * (ent * valid).sum()).backward()
    for g_got, p in zip(got, model.parameters()):
        torch.testing.assert_close(g_got, p.grad, atol=1e-10, rtol=1e-8)


def test_sequence_token_stats_rejects_bad_shapes(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    model, _ = tiny_model_and_tokenizer
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        sequence_token_stats(model, torch.ones(2, 3, dtype=torch.long), torch.ones(2, 4))
    with pytest.raises(ValueError, match="temperature"):
        sequence_token_stats(
            model, torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3), temperature=0
        )


# ----------------------------------------------------------------------------------------------
# Determinism and sampling options
# ----------------------------------------------------------------------------------------------


def test_seeded_sampling_is_deterministic_and_leaves_global_rng_alone(
    tiny_model_and_tokenizer: tuple[Any, Any],
) -> None:
    model, tok = tiny_model_and_tokenizer
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = collect_rollouts(model, tok, requests(4), CFG, seed=7).batch
    assert torch.equal(torch.get_rng_state(), state)
    b = collect_rollouts(model, tok, requests(4), CFG, seed=7).batch
    c = collect_rollouts(model, tok, requests(4), CFG, seed=8).batch
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.old_logprobs, b.old_logprobs)
    assert not torch.equal(
        a.input_ids[:, : c.input_ids.shape[1]], c.input_ids[:, : a.input_ids.shape[1]]
    )


def test_greedy_decoding_picks_the_argmax(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    model, tok = tiny_model_and_tokenizer
    cfg = RolloutConfig(max_new_tokens_per_turn=6, max_episode_tokens=400, do_sample=False)
    batch = collect_rollouts(model, tok, requests(2), cfg).batch
    with torch.no_grad():
        logits = model(batch.input_ids[:1]).logits[0]
    gen = batch.loss_mask[0].nonzero().flatten()
    assert torch.equal(logits[gen - 1].argmax(-1), batch.input_ids[0, gen])
    # At temperature 1 every greedy token is the mode: its log-prob is the largest one.
    assert torch.allclose(
        batch.old_logprobs[0, gen], torch.log_softmax(logits[gen - 1], -1).max(-1).values, atol=1e-5
    )


def test_top_p_restricts_sampling_to_the_nucleus(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    model, tok = tiny_model_and_tokenizer
    cfg = RolloutConfig(max_new_tokens_per_turn=12, max_episode_tokens=400, top_p=0.3)
    batch = collect_rollouts(model, tok, requests(4), cfg, seed=0).batch
    with torch.no_grad():
        logits = model(batch.input_ids, attention_mask=batch.attention_mask).logits
    probs = torch.softmax(logits[:, :-1], -1)
    sorted_p, _ = probs.sort(-1, descending=True)
    # A token is in the top-p nucleus iff the mass strictly above it is below top_p.
    p_tok = probs.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    mass_above = (sorted_p * (sorted_p > p_tok[..., None])).sum(-1)
    gen = batch.loss_mask[:, 1:] > 0
    assert gen.sum() > 20
    assert (mass_above[gen] < 0.3 + 1e-5).all()


# ----------------------------------------------------------------------------------------------
# Abnormal ends and robustness
# ----------------------------------------------------------------------------------------------


def test_turn_limit_is_abnormal_with_penalty(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    model, tok = tiny_model_and_tokenizer
    env = lambda: CounterEnv(max_turns=2, stop_at=99)  # noqa: E731
    cfg = RolloutConfig(max_new_tokens_per_turn=8, max_episode_tokens=400, abnormal_penalty=-0.7)
    result = collect_rollouts(model, tok, requests(3, env), cfg, seed=0)
    batch = result.batch
    assert batch.num_turns.tolist() == [2, 2, 2]
    assert batch.abnormal.all() and not batch.success.any()
    assert batch.rewards.tolist() == pytest.approx([-0.7] * 3)
    assert {r.end_reason for r in batch.episodes} == {"truncated_turns"}
    assert result.counts["end_truncated_turns"] == 3 and result.counts["abnormal"] == 3

    # rollout.max_turns overrides the environment's limit, also through a TurnLimit wrapper.
    cfg1 = RolloutConfig(max_turns=1, max_new_tokens_per_turn=8, max_episode_tokens=400)
    wrapped = lambda: TurnLimit(CounterEnv(max_turns=5, stop_at=99))  # noqa: E731
    batch = collect_rollouts(model, tok, requests(2, wrapped), cfg1, seed=0).batch
    assert batch.num_turns.tolist() == [1, 1] and batch.abnormal.all()
    assert [r.end_reason for r in batch.episodes] == ["truncated_turns"] * 2


def test_parse_errors_end_the_episode_only_when_asked(
    tiny_model_and_tokenizer: tuple[Any, Any],
) -> None:
    model, tok = tiny_model_and_tokenizer
    env = lambda: CounterEnv(max_turns=3, stop_at=3, bad_syntax=True)  # noqa: E731
    strict = RolloutConfig(
        max_new_tokens_per_turn=8, max_episode_tokens=400, end_on_parse_error=True
    )
    batch = collect_rollouts(model, tok, requests(2, env), strict, seed=0).batch
    assert batch.num_turns.tolist() == [1, 1]
    assert [r.end_reason for r in batch.episodes] == ["parse_error"] * 2
    assert batch.rewards.tolist() == pytest.approx([-0.2, -0.2]) and batch.abnormal.all()
    lenient = RolloutConfig(max_new_tokens_per_turn=8, max_episode_tokens=400)
    batch = collect_rollouts(model, tok, requests(2, env), lenient, seed=0).batch
    assert batch.num_turns.tolist() == [3, 3] and not batch.abnormal.any()
    assert batch.rewards.tolist() == pytest.approx([1.75, 1.75])


def test_episode_token_limit(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    model, tok = tiny_model_and_tokenizer
    env = lambda: CounterEnv(max_turns=10, stop_at=99)  # noqa: E731
    limit = 70
    cfg = RolloutConfig(max_new_tokens_per_turn=15, max_episode_tokens=limit)
    batch = collect_rollouts(model, tok, requests(3, env), cfg, seed=0).batch
    closing = len(tok(IM_END + "\n", add_special_tokens=False)["input_ids"])
    for i, record in enumerate(batch.episodes):
        assert record.end_reason == "length"
        length = int(batch.attention_mask[i].sum())
        assert length <= limit + closing
        assert batch.rewards[i].item() == pytest.approx(-0.2) and batch.abnormal[i]
        assert tok.decode(batch.input_ids[i, :length]) == chatml(record.messages)
    # A first prompt already over the budget: no turn at all, all-zero loss mask, a warning.
    tight = RolloutConfig(max_new_tokens_per_turn=4, max_episode_tokens=5)
    with pytest.warns(UserWarning, match="first prompt"):
        batch = collect_rollouts(model, tok, requests(1, env), tight).batch
    assert batch.num_turns.tolist() == [0] and batch.loss_mask.sum() == 0
    assert batch.episodes[0].end_reason == "length"


def test_env_that_raises_ends_only_its_episode(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    model, tok = tiny_model_and_tokenizer
    reqs = [
        RolloutRequest("counter", lambda: CounterEnv(stop_at=3), 0, 0),
        RolloutRequest("raising", lambda: RaisingEnv(fail_at=2, stop_at=3), 1, 1),
        RolloutRequest("nan", lambda: NanRewardEnv(stop_at=3), 2, 2),
    ]
    with pytest.warns(RuntimeWarning) as record:
        result = collect_rollouts(model, tok, reqs, CFG, seed=0)
    messages = [str(w.message) for w in record]
    assert any("'raising'" in m and "boom" in m and "env_error" in m for m in messages)
    assert any("'nan'" in m and "finite" in m for m in messages)
    batch = result.batch
    assert [r.end_reason for r in batch.episodes] == ["terminated", "env_error", "env_error"]
    assert batch.num_turns.tolist() == [3, 2, 1]
    assert batch.rewards.tolist() == pytest.approx([1.75, -0.2, -0.2])
    assert batch.abnormal.tolist() == [False, True, True]
    assert result.counts["end_env_error"] == 2


def test_out_of_memory_names_the_knobs(
    tiny_model_and_tokenizer: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tok = tiny_model_and_tokenizer

    def oom(*_args: Any, **_kwargs: Any) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(model, "forward", oom)
    with pytest.raises(RuntimeError, match=r"rollout\.max_new_tokens_per_turn.*group size"):
        collect_rollouts(model, tok, requests(2), CFG)

    def oom_runtime(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("[enforce fail] DefaultCPUAllocator: out of memory")

    monkeypatch.setattr(model, "forward", oom_runtime)
    with pytest.raises(RuntimeError, match=r"rollout\.micro_batch_size"):
        collect_rollouts(model, tok, requests(2), CFG)


def test_reset_failure_and_bad_env_are_clear_errors(
    tiny_model_and_tokenizer: tuple[Any, Any],
) -> None:
    model, tok = tiny_model_and_tokenizer

    class BadReset(CounterEnv):
        def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
            raise FileNotFoundError("missing data file")

    with pytest.raises(RuntimeError, match=r"'counter' failed to reset with seed 0.*missing data"):
        collect_rollouts(model, tok, requests(1, BadReset), CFG)

    class NoLimit:
        name = "nolimit"
        system_prompt = ""

        def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
            return "hi", {}

        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            return "again", 0.0, False, False, {}

    with pytest.raises(ValueError, match=r"no max_turns attribute; set rollout\.max_turns"):
        collect_rollouts(model, tok, [RolloutRequest("nolimit", NoLimit, 0, 0)], CFG)
    one_turn = RolloutConfig(max_turns=1, max_new_tokens_per_turn=4, max_episode_tokens=100)
    batch = collect_rollouts(model, tok, [RolloutRequest("nolimit", NoLimit, 0, 0)], one_turn).batch
    assert batch.num_turns.tolist() == [1] and batch.episodes[0].end_reason == "truncated_turns"
    with pytest.raises(TypeError, match="must be a TextEnv"):
        collect_rollouts(model, tok, [RolloutRequest("counter", lambda: 42, 0, 0)], CFG)


def test_model_mode_is_restored(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    model, tok = tiny_model_and_tokenizer
    model.train()
    collect_rollouts(model, tok, requests(1), CFG, seed=0)
    assert model.training


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_new_tokens_per_turn": 0}, "max_new_tokens_per_turn"),
        ({"max_episode_tokens": -5}, "max_episode_tokens"),
        ({"max_turns": 0}, "max_turns"),
        ({"temperature": 0.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"abnormal_penalty": math.nan}, "abnormal_penalty"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"stats_chunk_size": 2.5}, "stats_chunk_size"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=rf"rollout\.{match}"):
        RolloutConfig(**kwargs)


def test_lora_wrapped_model_rolls_out_like_its_base(
    tiny_model_and_tokenizer: tuple[Any, Any],
) -> None:
    """A peft model goes through generate and the statistics pass; with LoRA B = 0 at init it
    samples and scores exactly like the base model."""
    pytest.importorskip("peft")
    from entropace.models import apply_lora

    model, tok = tiny_model_and_tokenizer
    base = collect_rollouts(model, tok, requests(3), CFG, seed=5).batch
    wrapped = apply_lora(copy.deepcopy(model), {"r": 2, "target_modules": ["q_proj", "v_proj"]})
    lora = collect_rollouts(wrapped, tok, requests(3), CFG, seed=5).batch
    assert torch.equal(base.input_ids, lora.input_ids)
    torch.testing.assert_close(base.old_logprobs, lora.old_logprobs, atol=1e-6, rtol=0)


def test_loss_mask_limits_the_vocabulary_work_without_changing_the_loss_columns(
    tiny_model_and_tokenizer,
) -> None:
    """With ``loss_mask``, the LM head runs only from the first loss column of the micro-batch
    (``logits_to_keep``): columns from there on equal the full computation, earlier ones are 0;
    a model without ``logits_to_keep`` gives the same numbers."""
    from entropace.models.compat import takes_logits_to_keep
    from entropace.rollout.stats import sequence_token_stats

    model, _ = tiny_model_and_tokenizer
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(4, model.config.vocab_size, (3, 24), generator=g)
    attn = torch.ones(3, 24, dtype=torch.long)
    attn[2, 20:] = 0  # right padding in one row
    loss = torch.zeros(3, 24)
    loss[0, 10:15] = 1
    loss[1, 12:24] = 1
    loss[2, 9:18] = 1  # first loss column of the batch: 9
    seen: list[int] = []

    class NoKeep(torch.nn.Module):  # a causal LM whose forward has no logits_to_keep
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, position_ids, use_cache):
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids, use_cache=use_cache)  # fmt: skip
            seen.append(out.logits.shape[1])
            return out

    assert takes_logits_to_keep(model) and not takes_logits_to_keep(NoKeep(model))
    full = sequence_token_stats(model, ids, attn, temperature=0.7)
    part = sequence_token_stats(model, ids, attn, temperature=0.7, loss_mask=loss)
    plain = sequence_token_stats(NoKeep(model), ids, attn, temperature=0.7, loss_mask=loss)
    assert seen == [24]  # the fallback computed every position
    for name in ("logprob", "entropy", "t1", "t2"):
        a, b, c = getattr(full, name), getattr(part, name), getattr(plain, name)
        assert torch.equal(b[:, :9], torch.zeros(3, 9))
        torch.testing.assert_close(b[:, 9:], a[:, 9:], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6)
    # the head really ran on fewer positions: 24 - 9 + 1 = 16
    calls: list[int] = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: calls.append(out.shape[1]))
    try:
        sequence_token_stats(model, ids, attn, loss_mask=loss)
    finally:
        hook.remove()
    assert calls == [16]
