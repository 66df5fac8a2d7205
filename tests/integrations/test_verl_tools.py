"""entropace's tool interface as verl tools (``entropace.integrations.verl.tools``).

The tools are built from the generated YAML by verl's own ``initialize_tools_from_config``.
Each family's tools oracle is played twice: through entropace's ``make(f, interface="tools")``
and through the verl tools' ``create / execute / calc_reward / release``; observations and
rewards are identical, the return is 1, and ``release`` closes the environment (an os
persistent shell is torn down). verl's ``ToolAgentLoop`` itself (and our subclass) is driven
with a fake LLM server as verl's ``*_on_cpu`` agent-loop tests do: the rendered tools are the
family's schemas, verl's Hermes parser reads the oracle's calls, tool messages are the
environment's observations (mask 0), the reward is the episode's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'entropace[verl]')")

import datasets  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap  # noqa: E402
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop  # noqa: E402
from verl.tools.tool_registry import initialize_tools_from_config  # noqa: E402
from verl.trainer.ppo.reward import get_custom_reward_fn  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from entropace.envs import make, seeds, spec  # noqa: E402
from entropace.envs.tools import parse_tool_calls, tool_oracle  # noqa: E402
from entropace.integrations.verl import tools as vt  # noqa: E402
from entropace.models.tiny import build_tiny_tokenizer  # noqa: E402

HAS_BWRAP = shutil.which("bwrap") is not None
CALL_FAMILIES = ["db", "household", "shop", "reasoning"] + (["os"] if HAS_BWRAP else [])


def _tools(tmp_path: Path, families: list[str], **kwargs: Any) -> dict[str, Any]:
    path = vt.write_tool_config(families, tmp_path / "tools.yaml", **kwargs)
    return {t.name: t for t in initialize_tools_from_config(str(path))}


def _entropace_episode(family: str, seed: int, **options: Any) -> tuple[list[str], list, list]:
    """(replies, observations, rewards) of the tools oracle through make(interface="tools")."""
    env = make(family, interface="tools", **options)
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


def test_loading_the_yaml_registers_the_agent_loop_in_a_fresh_process(tmp_path: Path) -> None:
    # verl's AgentLoopWorker loads the tool config in __init__, before it runs any loop
    path = vt.write_tool_config(["kg"], tmp_path / "tools.yaml")
    code = (
        "import json, sys\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry as R\n"
        "from verl.tools.tool_registry import initialize_tools_from_config\n"
        "before = 'entropace_tool_agent' in R\n"
        f"tools = initialize_tools_from_config({str(path)!r})\n"
        "print(json.dumps({'before': before, 'after': R.get('entropace_tool_agent'),"
        " 'tools': [type(t).__name__ for t in tools]}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        env={**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"},
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["before"] is False
    assert result["after"] == {
        "_target_": "entropace.integrations.verl.tools.EntropaceToolAgentLoop"
    }
    assert result["tools"] == ["EntropaceTool"] * 8


def test_yaml_builds_the_family_tools_with_their_schemas(tmp_path: Path) -> None:
    families = ["db", "kg", "household", "shop", "reasoning", "os"]
    tools = _tools(tmp_path, families)
    for family in families:
        schemas = make(family, interface="tools").tools
        for schema in schemas:
            tool = tools[schema["function"]["name"]]
            assert isinstance(tool, vt.EntropaceTool) and tool.family == family
            # verl's loop renders model_dump(...): the family's schema, key order included
            dumped = tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
            assert json.dumps(dumped) == json.dumps(schema)
    assert sum(len(make(f, interface="tools").tools) for f in families) == len(tools)
    with pytest.raises(ValueError, match="also"):
        vt.tool_config(["db", "db"])
    with pytest.raises(ValueError, match="has no tool"):
        vt.EntropaceTool({"type": "native", "env": "db", "tool": "bash_action"}, None)


@pytest.mark.parametrize(
    ("family", "profile"),
    [(f, "default") for f in CALL_FAMILIES] + [("db", "agentbench"), ("shop", "agentbench")],
)
def test_oracle_episode_through_verl_tools_equals_entropace(
    tmp_path: Path, family: str, profile: str
) -> None:
    seed = 3
    replies, observations, rewards = _entropace_episode(
        family, seed, difficulty="medium", profile=profile
    )
    tools = _tools(tmp_path, [family], options={family: {"difficulty": "medium"}}, profile=profile)

    async def play() -> tuple[list[str], list[float], list[dict], float]:
        ids = {}
        for name, tool in tools.items():  # one instance id per tool, one episode per id
            ids[name], _ = await tool.create(create_kwargs={"seed": seed})
        # the direct lifecycle: every call on one instance id steps the episode it owns
        first = next(iter(tools))
        got, got_rewards, metrics = [], [], []
        for reply in replies:
            (call,) = parse_tool_calls(reply).calls
            response, reward, m = await tools[call.name].execute(ids[first], call.arguments)
            got.append(response.text)
            got_rewards.append(reward)
            metrics.append(m)
        total = await tools[first].calc_reward(ids[first])
        episode = vt._HANDLES[ids[first]][2]
        assert episode is not None and episode.done and episode.env is None  # closed at the end
        for name, tool in tools.items():
            await tool.release(ids[name])
        assert all(i not in vt._HANDLES for i in ids.values())
        return got, got_rewards, metrics, total

    got, got_rewards, metrics, total = asyncio.run(play())
    assert got == observations[1:]
    assert got_rewards == rewards and total == sum(rewards) == 1.0
    assert metrics[-1]["success"] is True and metrics[-1]["terminated"] is True
    assert all(m["parse_error"] is False and m["tool_error"] is None for m in metrics)
    assert [m["turn"] for m in metrics] == list(range(1, len(replies) + 1))


def test_bad_arguments_and_calls_after_the_end(tmp_path: Path) -> None:
    tools = _tools(tmp_path, ["db"])
    env = make("db", interface="tools")
    env.reset(0)
    expected = env.step('<tool_call>{"name": "execute_sql", "arguments": {"sql": "x"}}</tool_call>')

    async def play() -> list[Any]:
        iid, _ = await tools["execute_sql"].create(create_kwargs={"seed": 0})
        bad = await tools["execute_sql"].execute(iid, {"sql": "x"})
        done = await tools["commit_final_answer"].execute(iid, {"answers": ["no"]})
        after = await tools["execute_sql"].execute(iid, {"query": "SELECT 1"})
        reward = await tools["execute_sql"].calc_reward(iid)
        await tools["execute_sql"].release(iid)
        return [bad, done, after, reward]

    bad, done, after, reward = asyncio.run(play())
    assert bad[0].text == expected[0] and bad[1] == 0.0
    assert bad[2]["tool_error"] == "bad_arguments" and bad[2]["parse_error"] is True
    assert done[2]["terminated"] is True and done[1] == 0.0
    assert after[0].text == vt.EPISODE_OVER and after[2] == {"episode_over": True}
    assert reward == 0.0
    with pytest.raises(ValueError, match="seed"):
        asyncio.run(_execute_without_seed(tools["execute_sql"]))


async def _execute_without_seed(tool: Any) -> None:
    iid, _ = await tool.create(create_kwargs={})
    try:
        await tool.execute(iid, {"query": "SELECT 1"})
    finally:
        await tool.release(iid)


@pytest.mark.skipif(not HAS_BWRAP, reason="the os environment needs bwrap")
def test_release_tears_down_a_persistent_shell(tmp_path: Path) -> None:
    tools = _tools(tmp_path, ["os"], options={"os": {"shell": "persistent"}})

    async def play() -> Any:
        iid, _ = await tools["bash_action"].create(create_kwargs={"seed": 0})
        response, _, _ = await tools["bash_action"].execute(iid, {"script": "cd /tmp; X=7"})
        response, _, _ = await tools["bash_action"].execute(iid, {"script": "echo $X $PWD"})
        session = vt._HANDLES[iid][2].env.session
        assert session is not None and not session.closed
        await tools["bash_action"].release(iid)
        return response.text, session

    text, session = asyncio.run(play())
    assert "7 /tmp" in text  # state persisted between the two calls
    assert session.closed


# --------------------------------------------------------------------------------------------
# verl's ToolAgentLoop with a fake server
# --------------------------------------------------------------------------------------------

#: ChatML with the tools as JSON lines in the system turn (a Qwen2.5-style layout)
TOOLS_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] }}{% if loop.first and tools %}{{ '\\n<tools>' }}{% for t in tools %}"
    "{{ '\\n' + (t | tojson) }}{% endfor %}{{ '\\n</tools>' }}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class FakeServer:
    """Returns scripted replies (tokenised, closed by ``<|im_end|>``), one per generate call."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.prompts = tokenizer, list(replies), []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params, **kw):
        self.prompts.append(list(prompt_ids))
        ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False)
        return TokenOutput(
            token_ids=ids + [self.tokenizer.eos_token_id], log_probs=[-0.5] * (len(ids) + 1)
        )


def _run_loop(cls: type, tokenizer: Any, tools: dict, replies: list[str], row: dict) -> Any:
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": 8192,
                    "response_length": 8192,
                    "full_determinism": False,
                    "multi_turn": {
                        "max_user_turns": None,
                        "max_assistant_turns": None,
                        "max_parallel_calls": 1,
                        "max_tool_response_length": 100_000,
                        "tool_response_truncate_side": "right",
                        "format": "hermes",
                    },
                }
            },
            "data": {},
        }
    )
    server = FakeServer(tokenizer, replies)

    async def go() -> Any:
        loop = cls(
            trainer_config=DictConfigWrap(config),
            server_manager=server,
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap(list(tools.values())),
        )
        return await loop.run({"temperature": 1.0}, **row)

    return asyncio.run(go()), server


def _segments(out: Any, tokenizer: Any) -> list[tuple[int, str]]:
    runs: list[tuple[int, list[int]]] = []
    for tid, m in zip(out.response_ids, out.response_mask, strict=True):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(tid)
        else:
            runs.append((m, [tid]))
    return [(m, tokenizer.decode(ids)) for m, ids in runs]


@pytest.mark.parametrize(
    ("cls", "family"), [(vt.EntropaceToolAgentLoop, "kg"), (ToolAgentLoop, "db")]
)
def test_tool_agent_loop_plays_the_oracle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cls: type, family: str
) -> None:
    closed: list[str] = []
    close = vt.Episode.close

    def recording_close(self: Any) -> None:
        if self.env is not None:
            closed.append(self.family)
        close(self)

    monkeypatch.setattr(vt.Episode, "close", recording_close)
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = TOOLS_TEMPLATE
    seed = 1_000_002  # a test-split seed
    # the rows as a parquet-backed dataset holds them: one schema for both families (the
    # other family's tools_kwargs entries are None)
    rows = datasets.Dataset.from_list(vt.dataset_rows(["db", "kg"], 1, split="test", offset=2))
    (data,) = [r for r in rows if r["data_source"] == family]
    assert None in data["extra_info"]["tools_kwargs"].values()
    row = {
        "raw_prompt": data["prompt"],
        "tools_kwargs": data["extra_info"]["tools_kwargs"],
        "extra_info": data["extra_info"],
    }
    replies, observations, rewards = _entropace_episode(family, seed)
    if cls is ToolAgentLoop:
        replies = [*replies, "Done."]
    # one YAML for several families: the row's tool_selection shows only its family's tools
    tools = _tools(tmp_path, ["db", "kg", "household"])
    out, server = _run_loop(cls, tokenizer, tools, replies, row)
    env = make(family, interface="tools")
    env.reset(seed)
    # the prompt: entropace's system prompt and first observation, the family's tool schemas
    assert data["extra_info"]["tool_selection"] == [t["function"]["name"] for t in env.tools]
    prompt = tokenizer.apply_chat_template(
        data["prompt"], tools=env.tools, add_generation_prompt=True, tokenize=False
    )
    assert data["prompt"][1]["content"] == observations[0]
    assert out.prompt_ids == tokenizer.encode(prompt, add_special_tokens=False)
    assert server.prompts[0] == out.prompt_ids and server.replies == []
    segments = _segments(out, tokenizer)
    eos = tokenizer.eos_token
    policy = [text for m, text in segments if m == 1]
    context = [text for m, text in segments if m == 0]
    called = [o for r, o in zip(replies, observations[1:]) if parse_tool_calls(r).calls]
    tool_messages = [f"<|im_start|>tool\n{o}<|im_end|>\n<|im_start|>assistant\n" for o in called]
    if cls is vt.EntropaceToolAgentLoop:
        # the mask covers exactly the sampled tokens; the loop stops when the episode ends
        assert policy == [r + eos for r in replies]
        if family == "kg":  # the last reply is the text 'Final Answer: #N' (no tool call)
            assert not parse_tool_calls(replies[-1]).calls
            assert context == tool_messages
        else:  # the episode ended on a call: its observation is not appended
            assert context == tool_messages[:-1]
        assert out.reward_score == 1.0 and out.extra_fields["entropace_success"] == 1.0
        assert out.extra_fields["entropace_turns"] == len(replies)
    else:
        # stock ToolAgentLoop: it goes on until a reply without a call ('Done.' here); the
        # reward function reads what the tools recorded
        assert policy == [r + eos for r in replies]
        assert context == tool_messages
        assert out.reward_score is None
        reward_fn = get_custom_reward_fn(
            OmegaConf.create(
                {
                    "reward": {
                        "custom_reward_function": {
                            "path": "pkg://entropace.integrations.verl.tools",
                            "name": "compute_score",
                        }
                    }
                }
            )
        )
        extra = dict(out.extra_fields)
        score = reward_fn(data_source=family, solution_str="", ground_truth="", extra_info=extra)
        assert score == {"score": 1.0, "success": 1.0}
    assert out.extra_fields["tool_rewards"] == rewards[: len(called)]
    gc.collect()
    assert closed == [family]  # the episode's environment was closed once


@pytest.mark.skipif(not HAS_BWRAP, reason="the os environment needs bwrap")
def test_loop_closes_the_episode_when_the_model_stops_calling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions: list[Any] = []
    close = vt.Episode.close

    def recording_close(self: Any) -> None:
        if self.env is not None:
            sessions.append(self.env.session)
        close(self)

    monkeypatch.setattr(vt.Episode, "close", recording_close)
    tokenizer = build_tiny_tokenizer()
    opts = {"os": {"shell": "persistent"}}
    tools = _tools(tmp_path, ["os"], options=opts)
    (data,) = vt.dataset_rows(["os"], 1, options=opts)
    row = {
        "raw_prompt": data["prompt"],
        "tools_kwargs": data["extra_info"]["tools_kwargs"],
        "extra_info": data["extra_info"],
    }
    replies = [
        '<tool_call>{"name": "bash_action", "arguments": {"script": "sleep 60 &"}}</tool_call>',
        "I give up.",
    ]
    out, _ = _run_loop(vt.EntropaceToolAgentLoop, tokenizer, tools, replies, row)
    assert out.reward_score == 0.0 and out.extra_fields["entropace_success"] == 0.0
    assert out.extra_fields["entropace_parse_errors"] == 1  # the reply without a call
    assert out.extra_fields["entropace_done"] is False
    assert len(sessions) == 1 and sessions[0] is not None and sessions[0].closed
    gc.collect()
    assert not vt._HANDLES


def test_a_first_reply_without_a_call_still_reaches_the_environment(tmp_path: Path) -> None:
    tokenizer = build_tiny_tokenizer()
    rows = datasets.Dataset.from_list(vt.dataset_rows(["db", "kg"], 1, split="test"))
    (data,) = [r for r in rows if r["data_source"] == "kg"]
    row = {
        "raw_prompt": data["prompt"],
        "tools_kwargs": data["extra_info"]["tools_kwargs"],
        "extra_info": data["extra_info"],
    }
    reply = "Final Answer: #0"
    env = make("kg", interface="tools")
    env.reset(seeds("test", 1)[0])
    _obs, reward, terminated, _trunc, info = env.step(reply)
    out, _ = _run_loop(
        vt.EntropaceToolAgentLoop, tokenizer, _tools(tmp_path, ["db", "kg"]), [reply], row
    )
    assert out.reward_score == reward and out.extra_fields["entropace_turns"] == 1
    assert out.extra_fields["entropace_done"] is terminated
    assert out.extra_fields["entropace_parse_errors"] == int(info["parse_error"])
