"""verl's tool config YAML and dataset rows for entropace's families (no verl import needed).

:func:`write_tool_config` writes the file verl's ``multi_turn.tool_config_path`` names: one
entry per tool of each family, ``class_name``
``entropace.integrations.verl.tools.EntropaceTool``, ``config: {type: native, env, options
(JSON text), profile, max_turns}`` and the tool's JSON schema (verl's
``initialize_tools_from_config`` builds the tools from it). :func:`dataset_rows` builds the
rows the tool loops read. Command line::

    python -m entropace.integrations.verl.tool_config --families db,os,kg --out tools.yaml \
        --options '{"os": {"shell": "persistent"}}' [--profile agentbench] [--max-turns N]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from entropace.envs import make, seeds
from entropace.envs.registry import tool_suite

__all__ = ["AGENT_NAME", "CLASS_NAME", "dataset_rows", "main", "tool_config", "write_tool_config"]

#: the agent loop of :mod:`entropace.integrations.verl.tools` (verl's ``ToolAgentLoop`` + the
#: episode's end)
AGENT_NAME = "entropace_tool_agent"
#: the ``class_name`` of every entry in the generated YAML
CLASS_NAME = "entropace.integrations.verl.tools.EntropaceTool"


def tool_config(
    families: Iterable[str],
    *,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    profile: str = "default",
    max_turns: int | None = None,
) -> dict[str, Any]:
    """verl's tool config (``{"tools": [{"class_name", "config", "tool_schema"}, ...]}``): one
    entry per tool of each family. Raises ``ValueError`` when two entries share a name
    (verl keys tools by name)."""
    entries: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for family in families:
        suite = tool_suite(family)
        for spec in suite.tools:
            if spec.name in seen:
                raise ValueError(f"tool {spec.name!r} of {family!r} is also {seen[spec.name]!r}'s")
            seen[spec.name] = family
            config: dict[str, Any] = {
                "type": "native",
                "env": family,
                "options": json.dumps(dict((options or {}).get(family, {})), sort_keys=True),
                "profile": profile,
                "max_turns": max_turns,
            }
            entries.append(
                {"class_name": CLASS_NAME, "config": config, "tool_schema": spec.schema()}
            )
    return {"tools": entries}


def write_tool_config(families: Iterable[str], path: str | Path, **kwargs: Any) -> Path:
    """Write :func:`tool_config` as YAML to ``path`` (for ``multi_turn.tool_config_path``)."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(tool_config(families, **kwargs), sort_keys=False, allow_unicode=True)
    path.write_text(text, encoding="utf-8")
    return path


def instance_rows(
    family: str,
    env: Any,
    instance_seeds: Iterable[int],
    *,
    agent_name: str,
    split: str,
    extra_info: Callable[[int], dict[str, Any]],
) -> list[dict[str, Any]]:
    """One verl dataset row per seed: ``data_source`` (the family), ``agent_name``, ``prompt``
    (``env``'s system prompt and first observation), ``reward_model`` (the gold answer) and
    ``extra_info`` (``extra_info(seed)`` plus ``split``). Shared by the tool loops' and the
    ``entropace`` agent loop's datasets."""
    rows = []
    for seed in instance_seeds:
        observation, info = env.reset(seed)
        rows.append(
            {
                "data_source": family,
                "agent_name": agent_name,
                "prompt": [
                    {"role": "system", "content": env.system_prompt},
                    {"role": "user", "content": observation},
                ],
                "reward_model": {"style": "env", "ground_truth": str(info.get("gold", ""))},
                "extra_info": {**extra_info(int(seed)), "split": split},
            }
        )
    return rows


def dataset_rows(
    families: Iterable[str],
    n: int,
    *,
    split: str = "train",
    offset: int = 0,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    profile: str = "default",
    max_turns: int | None = None,
    agent_name: str = AGENT_NAME,
) -> list[dict[str, Any]]:
    """verl dataset rows (one per instance) for the tool loops.

    Each row: ``data_source`` (the family: the entropace trainer's task key), ``agent_name``
    (``entropace_tool_agent`` or verl's ``tool_agent``), ``prompt`` (the tools interface's
    system prompt and first observation), ``reward_model``, ``extra_info.tools_kwargs``
    (``{tool: {"create_kwargs": {"seed": ...}}}`` for every tool of the family) and
    ``extra_info.tool_selection`` (the family's tool names: verl 0.9.1 then renders and runs
    only those, so one YAML can hold several families).
    """
    rows = []
    for family in families:
        opts = dict((options or {}).get(family, {}))
        env = make(family, interface="tools", profile=profile, max_turns=max_turns, **opts)
        names = [t.name for t in tool_suite(family).tools]
        rows += instance_rows(
            family, env, seeds(split, n, offset=offset), agent_name=agent_name, split=split,
            extra_info=lambda seed, fam=family, names=names: {
                "tools_kwargs": {name: {"create_kwargs": {"seed": seed}} for name in names},
                "tool_selection": list(names),  # only this family's tools in the prompt
                "entropace": {"env": fam, "seed": seed, "profile": profile},
            },
        )  # fmt: skip
        getattr(env, "close", lambda: None)()
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m entropace.integrations.verl.tool_config --families db,os --out tools.yaml``."""
    parser = argparse.ArgumentParser(description="write verl's tool config for entropace families")
    parser.add_argument("--families", required=True, help="comma-separated, e.g. db,os,kg")
    parser.add_argument("--out", required=True, help="YAML path (multi_turn.tool_config_path)")
    parser.add_argument("--profile", default="default", choices=["default", "agentbench"])
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--options", default="{}", help='JSON: {"db": {"difficulty": "easy"}, ...}')
    args = parser.parse_args(argv)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    path = write_tool_config(
        families,
        args.out,
        options=json.loads(args.options),
        profile=args.profile,
        max_turns=args.max_turns,
    )
    print(f"wrote {len(tool_config(families)['tools'])} tools to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
