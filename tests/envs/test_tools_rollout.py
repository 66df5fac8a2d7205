"""The rollout with tool-calling environments: rendering, tool messages, the loss mask.

A scripted "model" (``generate_turn`` replaced) replies with each family's oracle tool calls, so
the trajectories are known exactly; the statistics pass still runs the tiny model. Two
templates: the tiny tokenizer's ChatML (no tool support: the generic Hermes format) and a
Qwen-style template that renders ``tools=`` and ``tool`` messages (built locally).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from entropace.envs import make, spec
from entropace.envs.tools import tool_oracle
from entropace.rollout import RolloutConfig, collect_rollouts
from entropace.rollout import engine as engine_module
from entropace.rollout.chat import ChatLayout, generic_tools_section
from entropace.rollout.types import RolloutRequest

pytest.importorskip("transformers")

#: A Qwen2.5-style template (tools in the system turn, results as <tool_response> user turns).
QWEN_STYLE_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'\\n\\n# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}"
    "{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages[1:] %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 2].role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: A template that accepts only system/user/assistant turns (and ignores tools=).
STRICT_TEMPLATE = (
    "{%- for m in messages %}{%- if m.role not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('bad role') }}{%- endif %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class ScriptedReplies:
    """Replaces ``generate_turn``: episode ``i`` replies with its tools oracle's next call."""

    def __init__(self, envs: list[Any], tokenizer: Any) -> None:
        self.envs = envs
        self.tokenizer = tokenizer
        self.policies = [tool_oracle(spec(env.name).oracle)(env) for env in envs]
        self.replies: list[list[str]] = [[] for _ in envs]
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def __call__(self, model: Any, prompts: list[list[int]], **kwargs: Any) -> list[list[int]]:
        live = [i for i, env in enumerate(self.envs) if not env.done]
        assert len(live) == len(prompts)
        out = []
        for i in live:
            reply = self.policies[i]("")
            self.replies[i].append(reply)
            out.append(self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.eos])
        return out


def _run(model: Any, tok: Any, monkeypatch: pytest.MonkeyPatch, names: list[str]) -> Any:
    envs = [make(name, interface="tools", difficulty="medium") for name in names]
    for env, seed in zip(envs, range(len(envs))):
        env.reset(seed)  # the scripted policies read the instance; the engine resets again
    script = ScriptedReplies(envs, tok)
    monkeypatch.setattr(engine_module, "generate_turn", script)
    requests = [RolloutRequest(e.name, e, seed, seed) for seed, e in enumerate(envs)]
    cfg = RolloutConfig(
        max_new_tokens_per_turn=2000,
        max_episode_tokens=60_000,
        share_prefix=False,
        reuse_kv=False,
    )
    return collect_rollouts(model, tok, requests, cfg, seed=0), script, envs


def test_the_real_qwen25_template(
    tiny_model_and_tokenizer: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2.5-Instruct's own template (as shipped in TRL): tools rendered natively, results in
    <tool_response> user turns, the masked tokens exactly the replies."""
    chat_templates = pytest.importorskip("trl.chat_template_utils")
    model, tok = tiny_model_and_tokenizer
    tok.chat_template = chat_templates.qwen2_5_chat_template
    how = ChatLayout(tok).tool_rendering()
    assert (how.native, how.result_role) == (True, "tool")
    result, script, envs = _run(model, tok, monkeypatch, ["db", "household"])
    assert result.batch.success.tolist() == [True, True]
    for i in range(2):
        length = int(result.batch.attention_mask[i].sum())
        ids = result.batch.input_ids[i, :length].tolist()
        mask = result.batch.loss_mask[i, :length].tolist()
        policy = tok.decode([t for t, m in zip(ids, mask) if m])
        assert policy == "".join(r + "<|im_end|>" for r in script.replies[i])
        text = tok.decode(ids)
        name = envs[i].tools[0]["function"]["name"]
        assert (
            "# Tools\n\nYou may call one or more functions" in text and f'"name": "{name}"' in text
        )
        assert text.count("<|im_start|>user\n<tool_response>\n") == len(script.replies[i]) - 1


@pytest.mark.parametrize("template", ["chatml", "qwen"])
def test_tool_episodes_render_tool_turns_and_mask_exactly_the_replies(
    tiny_model_and_tokenizer: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, template: str
) -> None:
    model, tok = tiny_model_and_tokenizer
    if template == "qwen":
        tok.chat_template = QWEN_STYLE_TEMPLATE
    result, script, envs = _run(model, tok, monkeypatch, ["kg", "db", "shop"])
    batch = result.batch
    assert batch.success.tolist() == [True, True, True]
    assert batch.abnormal.tolist() == [False, False, False]
    for i, record in enumerate(batch.episodes):
        length = int(batch.attention_mask[i].sum())
        ids = batch.input_ids[i, :length].tolist()
        mask = batch.loss_mask[i, :length].tolist()
        # The masked tokens are exactly the scripted replies, each closed by <|im_end|>.
        policy = [t for t, m in zip(ids, mask) if m]
        assert tok.decode(policy) == "".join(r + "<|im_end|>" for r in script.replies[i])
        # The whole trajectory is the hand-written rendering of the conversation.
        tools = envs[i].tools
        roles = [m["role"] for m in record.messages]
        assert roles[:2] == ["system", "user"]
        # tool results (kg's final answer is plain text, then the episode ends)
        assert set(roles[2:]) <= {"assistant", "tool"} and "tool" in roles
        text = tok.decode(ids)
        if template == "chatml":
            system = f"{record.messages[0]['content']}\n\n{generic_tools_section(tools)}"
            expected = f"<|im_start|>system\n{system}<|im_end|>\n"
        else:
            lines = "".join("\n" + json.dumps(t) for t in tools)
            expected = (
                f"<|im_start|>system\n{record.messages[0]['content']}\n\n# Tools\n<tools>"
                f"{lines}\n</tools><|im_end|>\n"
            )
        for m in record.messages[1:]:
            if m["role"] == "assistant":  # the header came with the previous turn
                expected += f"{m['content']}<|im_end|>\n"
                continue
            if m["role"] == "tool":
                role = "tool" if template == "chatml" else "user"
                body = f"<tool_response>\n{m['content']}\n</tool_response>"
                expected += f"<|im_start|>{role}\n{body}<|im_end|>\n"
            else:
                expected += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
            expected += "<|im_start|>assistant\n"
        assert text == expected


def test_tool_messages_carry_the_call_id_and_name(
    tiny_model_and_tokenizer: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tok = tiny_model_and_tokenizer
    result, _script, _envs = _run(model, tok, monkeypatch, ["db"])
    tool_turns = [m for m in result.batch.episodes[0].messages if m["role"] == "tool"]
    assert tool_turns and tool_turns[0]["name"] == "execute_sql"
    assert tool_turns[0]["tool_call_id"] == "call_1"


def test_template_probe(tiny_tokenizer: Any) -> None:
    layout = ChatLayout(tiny_tokenizer)
    how = layout.tool_rendering()
    assert (how.native, how.result_role) == (False, "tool")
    tiny_tokenizer.chat_template = QWEN_STYLE_TEMPLATE
    how = ChatLayout(tiny_tokenizer).tool_rendering()
    assert (how.native, how.result_role) == (True, "tool")
    tiny_tokenizer.chat_template = STRICT_TEMPLATE
    strict = ChatLayout(tiny_tokenizer)
    assert (strict.tool_rendering().native, strict.tool_rendering().result_role) == (False, "user")
    # results go into user turns, wrapped, and the schemas into the system prompt
    tools = make("household", interface="tools").tools
    text = strict.render(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"},
            {"role": "tool", "content": "R", "tool_call_id": "call_1", "name": "take_action"},
        ],
        add_generation_prompt=True,
        tools=tools,
    )
    assert text == (
        f"<|im_start|>system\nS\n\n{generic_tools_section(tools)}<|im_end|>\n"
        "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nR\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_text_interface_rendering_is_unchanged(tiny_tokenizer: Any) -> None:
    layout = ChatLayout(tiny_tokenizer)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert layout.render(msgs, add_generation_prompt=True) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    assert layout._tool_rendering is None  # text episodes never probe the template


def test_sampled_tool_episodes_with_kv_reuse(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    """The real (random) tiny model through tools envs on the fast path: replies without calls
    get user turns, and the trajectory is still the rendering of its conversation."""
    model, tok = tiny_model_and_tokenizer
    requests = [
        RolloutRequest(n, lambda n=n: make(n, interface="tools"), s, s)
        for s, n in enumerate(["kg", "household", "kg", "household"])
    ]
    cfg = RolloutConfig(max_turns=3, max_new_tokens_per_turn=8, max_episode_tokens=6000)
    result = collect_rollouts(model, tok, requests, cfg, seed=0)
    layout = ChatLayout(tok)
    for i, record in enumerate(result.batch.episodes):
        length = int(result.batch.attention_mask[i].sum())
        ids = result.batch.input_ids[i, :length].tolist()
        tools = make(record.task, interface="tools").tools
        assert record.messages[-1]["role"] == "assistant"
        text = layout.render(record.messages, add_generation_prompt=False, tools=tools)
        decoded = tok.decode(ids)
        # cut turns (no <|im_end|> generated) are closed by the template: same text
        assert decoded == text
        user_turns = [m for m in record.messages[2:] if m["role"] == "user"]
        assert all("No tool call found" in m["content"] for m in user_turns)
    # every step of a random model is a malformed or missing call: counted per task
    for task, c in result.task_counts.items():
        assert c["tool_errors"] == c["parse_errors"] == c["turns"] > 0, task


def test_trl_rollout_func_with_the_tools_interface(
    tiny_model_and_tokenizer: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL plug-in: ``env_options={family: {"interface": "tools"}}`` (or ``profile``) reaches
    ``make``; the schemas are rendered and the completion mask is the policy's tokens."""
    pytest.importorskip("trl")
    from types import SimpleNamespace

    from entropace.integrations.trl import EnvRolloutConfig, env_rollout_func

    model, tok = tiny_model_and_tokenizer
    rows = [{"task": "kg", "seed": 0}, {"task": "kg", "seed": 0}, {"task": "shop", "seed": 1}]

    def scripted(model_: Any, prompts: list[list[int]], **kwargs: Any) -> list[list[int]]:
        reply = '<tool_call>{"name": "get_relations", "arguments": {"variable": "France"}}'
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        return [tok(reply + "</tool_call>", add_special_tokens=False)["input_ids"] + [eos]] * len(
            prompts
        )

    monkeypatch.setattr(engine_module, "generate_turn", scripted)
    trainer = SimpleNamespace(
        model=model,
        processing_class=tok,
        _entropace_inputs=rows,
        num_generations=2,
        temperature=1.0,
        args=SimpleNamespace(top_p=1.0),
        task_names=["kg", "shop"],
    )
    config = EnvRolloutConfig(
        max_turns=2,
        max_new_tokens_per_turn=64,
        env_options={"kg": {"interface": "tools"}, "shop": {"profile": "agentbench"}},
    )
    out = env_rollout_func(config)([r["task"] for r in rows], trainer)
    kg_prompt = tok.decode(out["prompt_ids"][0])
    assert "<tools>" in kg_prompt and '"name": "get_relations"' in kg_prompt
    shop_prompt = tok.decode(out["prompt_ids"][2])
    assert '"name": "search_action"' in shop_prompt and "The initial observation:" in shop_prompt
    for completion, mask in zip(out["completion_ids"], out["env_mask"]):
        policy = tok.decode([t for t, m in zip(completion, mask) if m])
        assert policy.count("<tool_call>") == 2  # two turns, each exactly the scripted reply
    kg_completion = tok.decode(out["completion_ids"][0])
    assert "<|im_start|>tool\n<tool_response>\nRelations of France" in kg_completion


def test_one_training_step_through_tools(tmp_path: Any, single_thread: None) -> None:
    """``tasks.profile=agentbench`` (tools interface) through the trainer, end to end."""
    import json as json_module

    from entropace.cli import main

    run = tmp_path / "run"
    preset = tmp_path / "preset.yaml"  # the dataclass defaults, whatever the shipped presets say
    preset.write_text("seed: 0\n")
    code = main(
        [
            "train",
            "--preset",
            str(preset),
            "model=tiny",
            "tasks=kg,household",
            "tasks.profile=agentbench",
            "rollout.abnormal_penalty=0.0",
            "steps=1",
            "P=1",
            "G=2",
            "rollout.max_turns=2",
            "rollout.max_new_tokens_per_turn=6",
            "rollout.max_episode_tokens=4096",
            "log.progress=false",
            "log.report=false",
            "log.tensorboard=false",
            "--run-dir",
            str(run),
        ]
    )
    assert code == 0
    rows = [json_module.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # a random tiny model never calls a tool: every episode hits the turn limit, scored 0.0
    assert rows[-1]["task/kg/abnormal"] == 1.0 and rows[-1]["task/kg/reward"] == 0.0
    assert "profile: agentbench" in (run / "config.yaml").read_text()
