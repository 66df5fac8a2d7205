"""entropace's tools as a TRL ``environment_factory``: schemas as TRL derives them, episodes
played through the methods, the reward function (kg's final answer in the last reply)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from entropace.envs import make, spec
from entropace.envs.registry import tool_suite

pytest.importorskip("trl")
from transformers.utils import get_json_schema  # noqa: E402

from entropace.integrations.trl.tool_env import (  # noqa: E402
    env_tool_reward,
    environment_factory,
    tool_dataset,
)


def _tools_as_trl_sees_them(instance: Any) -> list[Any]:
    """What GRPOTrainer collects: public functions of the class, bound to the instance."""
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


@pytest.mark.parametrize("family", ["db", "kg", "household", "shop", "reasoning"])
def test_schemas_match_the_tools_interface(family: str) -> None:
    instance = environment_factory(family)()
    derived = {
        s["function"]["name"]: s["function"]
        for s in (get_json_schema(m) for m in _tools_as_trl_sees_them(instance))
    }
    for tool in make(family, interface="tools").tools:
        f = tool["function"]
        got = derived.pop(f["name"])
        assert got["description"] == f["description"]
        assert got["parameters"]["properties"] == f["parameters"]["properties"]
        assert got["parameters"]["required"] == f["parameters"]["required"]
    assert derived == {}
    assert hasattr(type(instance), "reset") and not hasattr(type(instance), "get_reward")


def _play(family: str, seed: int, **options: Any) -> tuple[float, Any]:
    """The family's oracle through the TRL environment's methods (TRL calls them with the
    parsed arguments); its last text-only reply goes to the reward function."""
    instance = environment_factory(family, **options)()
    instance.reset(seed=seed, prompt=[])  # TRL passes the whole row
    policy = spec(family).oracle(instance._env)
    suite = tool_suite(family)
    final = ""
    while not instance._done:
        call = suite.to_call(policy(instance._env.raw_observation))
        if isinstance(call, str):  # kg's "Final Answer: #N": the rollout's last reply
            final = call
            break
        getattr(instance, call.name)(**call.arguments)
    rewards = env_tool_reward([[{"role": "assistant", "content": final}]], [instance])
    return rewards[0], instance


@pytest.mark.parametrize("family", ["db", "kg", "household", "shop"])
def test_oracle_episodes_through_the_methods(family: str) -> None:
    for seed in range(5):
        reward, instance = _play(family, seed, difficulty="medium")
        assert reward == 1.0 and instance._success, (family, seed)


def test_kg_final_answer_text_and_abnormal_end() -> None:
    reward, _ = _play("kg", 0, profile="agentbench")
    assert reward == 1.0
    cls = environment_factory("kg", abnormal_penalty=-0.5)
    instance = cls()
    instance.reset(seed=0)
    out = instance.get_relations(variable="France")
    assert "Relations of France" in out
    # no final answer: the episode did not terminate, so the penalty
    assert env_tool_reward([[{"role": "assistant", "content": "I give up."}]], [instance]) == [-0.5]
    assert instance.get_relations(variable="France") != "The episode is over."  # not done yet


def test_bad_calls_are_tool_errors_and_rows_need_a_seed() -> None:
    instance = environment_factory("db")()
    with pytest.raises(KeyError, match="'seed' column"):
        instance.reset(prompt=[])
    instance.reset(seed=0)
    assert "must be a JSON string" in instance.execute_sql(query=3)
    ds = tool_dataset("db", 3, first_seed=10)
    assert ds["seed"] == [10, 11, 12]
    assert ds[0]["prompt"][0]["content"] == make("db", interface="tools").system_prompt
    with pytest.raises(ValueError, match="environment_factory"):
        env_tool_reward([[]])


def test_grpo_trainer_runs_the_tools_in_its_own_loop(tmp_path: Any, single_thread: None) -> None:
    """One GRPO step with ``environment_factory``: TRL parses the scripted replies' calls (Qwen3's
    template and response schema, as TRL ships them), runs our methods, appends the results and
    regenerates; the kg oracle's final answer then scores 1 through :func:`env_tool_reward`."""
    import sys
    from pathlib import Path

    import torch
    from transformers import AutoTokenizer
    from trl import GRPOTrainer
    from trl import chat_template_utils as templates

    from entropace.envs.tools import format_tool_call

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integrations"))
    import trl_run

    model_dir = trl_run.tiny_model_dir(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = templates.qwen3_chat_template
    tok = templates.add_response_schema(tok)
    trainer = GRPOTrainer(
        model_dir,
        reward_funcs=[env_tool_reward],
        args=trl_run.grpo_args(
            str(tmp_path / "run"),
            max_steps=1,
            max_completion_length=2048,
            per_device_train_batch_size=2,
            num_generations=2,
        ),
        processing_class=tok,
        train_dataset=tool_dataset("kg", 4),
        environment_factory=environment_factory("kg"),
    )
    suite = tool_suite("kg")

    def scripted(input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        rows = []
        for row in input_ids.tolist():
            text = tok.decode(row)
            env = next(e for e in trainer.environments if e._env.question.text in text)
            step = text.count("<tool_response>")
            call = suite.to_call(env._env.question.plan[step])
            reply = call if isinstance(call, str) else format_tool_call(call)
            rows.append(
                row + tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            )
        width = max(len(r) for r in rows)
        return torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])

    trainer.model.generate = scripted
    trainer.train()
    logs = trainer.state.log_history[0]
    assert float(logs["tools/call_frequency"]) > 0 and float(logs["tools/failure_frequency"]) == 0
    assert float(logs["rewards/env_tool_reward/mean"]) == 1.0
