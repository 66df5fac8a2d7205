"""The ``entropace`` verl agent loop with a fake LLM server (as verl's own CPU agent-loop tests).

A ``db`` and an ``os`` episode of three turns (the oracle's query twice, then its answer): the
prompt is the chat-rendered first observation, the response interleaves the generated turns
(mask 1) with the observations (mask 0) exactly as verl expects, and the reward is the one a
fresh environment gives for the same actions. Also: a wrong answer, an episode cut by the
response budget, the dataset rows, and registration with verl's agent-loop registry.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'entropace[verl]')")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop import agent_loop as verl_agent_loop  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from entropace.envs import make, spec  # noqa: E402
from entropace.integrations.verl import agent_loop as al  # noqa: E402
from entropace.models.tiny import build_tiny_tokenizer  # noqa: E402


class FakeServerManager:
    """Returns scripted actions (tokenised, closed by ``<|im_end|>``), one per generate call."""

    def __init__(self, tokenizer: Any, actions: list[str]) -> None:
        self.tokenizer = tokenizer
        self.actions = list(actions)
        self.prompts: list[list[int]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params, **kw):
        self.prompts.append(list(prompt_ids))
        text = self.actions.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [
            self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        ]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


def _loop(tokenizer: Any, server: FakeServerManager, response_length: int = 4096):
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"prompt_length": 4096, "response_length": response_length}
            },
            "data": {},
        }
    )
    return al.EntropaceAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
    )


def _play(tok: Any, server: FakeServerManager, row: dict, response_length: int = 4096):
    async def go():  # verl's loop binds the running event loop when it is built
        return await _loop(tok, server, response_length).run({"temperature": 1.0}, **row)

    return asyncio.run(go())


def _oracle_actions(family: str, seed: int) -> list[str]:
    env = make(family)
    obs, _ = env.reset(seed)
    policy = spec(family).oracle(env)
    actions = []
    while True:
        actions.append(policy(obs))
        obs, _r, term, trunc, _i = env.step(actions[-1])
        if term or trunc:
            return actions


def _replay(family: str, seed: int, actions: list[str]) -> tuple[list[str], float, bool]:
    env = make(family)
    obs, _ = env.reset(seed)
    observations, reward, success = [obs], 0.0, False
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        reward += r
        success = success or info["success"]
        observations.append(obs)
        if term or trunc:
            break
    return observations, reward, success


def _row(family: str, seed: int) -> dict[str, Any]:
    return {
        "raw_prompt": [],
        "extra_info": {"entropace": {"env": family, "seed": seed, "options": {}}},
    }


@pytest.mark.parametrize("family", ["db", "os"])
def test_multi_turn_episode_layout_and_reward(family: str) -> None:
    if family == "os" and shutil.which("bwrap") is None:
        pytest.skip("the os environment needs bwrap (apt-get install bubblewrap)")
    tok = build_tiny_tokenizer()
    oracle = _oracle_actions(family, 0)
    assert len(oracle) == 2
    actions = [oracle[0], oracle[0], oracle[1]]  # query, query again, answer: three turns
    server = FakeServerManager(tok, actions)
    out = _play(tok, server, _row(family, 0))
    observations, reward, success = _replay(family, 0, actions)
    assert reward == 1.0 and success
    assert out.reward_score == reward and out.extra_fields["entropace_success"] == 1.0
    assert out.extra_fields["entropace_turns"] == 3 and out.num_turns == 6
    env = make(family)
    env.reset(0)
    first = [
        {"role": "system", "content": env.system_prompt},
        {"role": "user", "content": observations[0]},
    ]
    text = tok.apply_chat_template(first, add_generation_prompt=True, tokenize=False)
    assert out.prompt_ids == tok.encode(text, add_special_tokens=False)
    assert server.prompts[0] == out.prompt_ids
    # response: [turn][obs][turn][obs][turn], masks 1 / 0 / 1 / 0 / 1
    assert len(out.response_ids) == len(out.response_mask)
    runs: list[tuple[int, list[int]]] = []
    for tid, m in zip(out.response_ids, out.response_mask, strict=True):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(tid)
        else:
            runs.append((m, [tid]))
    assert [m for m, _ in runs] == [1, 0, 1, 0, 1]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    for k, (_m, ids) in enumerate(runs[::2]):
        assert ids == tok.encode(actions[k], add_special_tokens=False) + [im_end]
    for k, (_m, ids) in enumerate(runs[1::2]):
        text = tok.decode(ids)
        assert observations[k + 1] in text and "<|im_start|>user" in text
        assert text.rstrip().endswith("<|im_start|>assistant")
    # each generate call saw the whole conversation so far
    assert server.prompts[1] == out.prompt_ids + runs[0][1] + runs[1][1]
    assert out.response_logprobs is not None
    assert [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m] == [
        -0.5
    ] * sum(out.response_mask)


def test_wrong_answer_gets_the_environment_reward() -> None:
    tok = build_tiny_tokenizer()
    oracle = _oracle_actions("db", 1)
    actions = [oracle[0], "Answer: [-12345]"]
    out = _play(tok, FakeServerManager(tok, actions), _row("db", 1))
    _, reward, success = _replay("db", 1, actions)
    assert out.reward_score == reward and not success
    assert out.extra_fields["entropace_success"] == 0.0


def test_response_budget_ends_the_episode() -> None:
    tok = build_tiny_tokenizer()
    oracle = _oracle_actions("db", 0)
    server = FakeServerManager(tok, [oracle[0]] * 10)
    out = _play(tok, server, _row("db", 0), response_length=40)
    assert len(out.response_ids) <= 40 and len(out.response_mask) == len(out.response_ids)
    assert out.extra_fields["entropace_end"] == "length"
    assert out.reward_score == 0.0


def test_rows_and_registration() -> None:
    assert "entropace" in verl_agent_loop._agent_loop_registry
    target = verl_agent_loop._agent_loop_registry["entropace"]["_target_"]
    assert target == "entropace.integrations.verl.agent_loop.EntropaceAgentLoop"
    rows = al.dataset_rows(["db", "kg"], 2, split="test")
    assert [r["data_source"] for r in rows] == ["db", "db", "kg", "kg"]
    assert rows[0]["extra_info"]["entropace"]["seed"] == 1_000_000
    assert al.episode_spec(rows[3])["env"] == "kg"
    env = make("kg")
    obs, _ = env.reset(1_000_001)
    assert rows[3]["prompt"][1]["content"] == obs
    with pytest.raises(ValueError, match="extra_info"):
        al.episode_spec({"extra_info": {}})
