"""``entropace envs``: list environment families, play one in the terminal, sample instances.

Works for every registered family through :func:`entropace.envs.specs`, :func:`make` and
:attr:`EnvSpec.oracle`::

    entropace envs list
    entropace envs play db --seed 3 --difficulty medium --opt database=chinook
    entropace envs play db --interface tools          # AgentBench FC's tools, typed as calls
    entropace envs sample db --n 5 --difficulty hard --split test --solve
    entropace envs sample kg --profile agentbench --solve
    entropace envs stats household --n 2000         # pools, distinct instances, overlap

In the tools interface a typed line ``tool_name {"argument": "value"}`` is sent as that call
(in the generic ``<tool_call>`` format); any other text is sent as typed (a raw
``<tool_call>...</tool_call>``, or kg's ``Final Answer: #3``). A line naming a tool with
arguments that are not a JSON object, or an unknown tool followed by a JSON object, is refused
with the reason and an example (no turn is spent); after the environment's own "no tool call"
message, which shows the model's ``<tool_call>`` format, ``play`` repeats how to type a call.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from entropace._text import printable
from entropace.envs import DIFFICULTIES, SPLITS, make, seeds, spec, specs
from entropace.envs.base import TurnLimit
from entropace.envs.checks import run_episode
from entropace.envs.registry import INTERFACES, PROFILES, EnvSpec, tool_suite
from entropace.envs.tools import ToolCall, format_tool_call, tool_oracle


def parse_option(text: str) -> tuple[str, Any]:
    """``key=value`` -> ``(key, value)``; the value becomes an int, float or bool if it reads as one.

    ``true``/``false`` (any case) are booleans; anything else stays a string.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--opt expects key=value, got {text!r}")
    value: Any = raw.strip()
    for convert in (int, float):
        try:
            return key, convert(value)
        except ValueError:
            pass
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    return key, value


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options = dict(args.opt or [])
    if args.difficulty is not None:
        options["difficulty"] = args.difficulty
    return options


def _installed(package: str) -> bool:
    try:
        importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _tools_line(name: str) -> str:
    try:
        suite = tool_suite(name)
    except KeyError:
        return "tools: (text interface only)"
    calls = ", ".join(
        f"{t.name}({', '.join(t.parameters.get('properties', {}))})" for t in suite.tools
    )
    return f"tools (--interface tools): {calls}"


def _requires(s: EnvSpec) -> str:
    """Packages (missing ones marked) and executables (checked on PATH, with the install hint
    when missing), or ``nothing extra``."""
    parts = [f"{p}{'' if _installed(p) else ' (missing)'}" for p in s.requires]
    for binary, how in s.binaries.items():
        where = shutil.which(binary)
        parts.append(f"the {binary} binary ({f'found: {where}' if where else f'missing; {how}'})")
    return ", ".join(parts) if parts else "nothing extra"


def _details(s: EnvSpec) -> list[str]:
    """A family's lines below its name: options, data, licence, requirements, tools."""
    lines = [f"--opt {opt}=...  {help_text}" for opt, help_text in s.options.items()]
    lines += [f"data: {s.data_source}", f"licence: {s.license}", f"requires: {_requires(s)}"]
    return lines + [_tools_line(s.name)]


def cmd_list(args: argparse.Namespace) -> int:
    """The families, one line each with what they need; ``--details`` (or names) adds options,
    data, licence and tools. Families whose details are all the same (the lab's toy tasks)
    share one block, after the others, each with its own one-line description."""
    out: TextIO = sys.stdout
    families = specs()
    if args.names:
        families = {n: spec(n) for n in args.names}  # unknown name -> KeyError (a message)
    if not families:
        print("no environment families are registered", file=out)
        return 0
    details = args.details or bool(args.names)
    blocks: dict[tuple[str, ...], list[EnvSpec]] = {}
    for s in families.values():
        blocks.setdefault(tuple(_details(s)), []).append(s)
    ordered = sorted(blocks.values(), key=lambda group: len(group) > 1)  # single families first
    wrap = textwrap.TextWrapper(width=100, initial_indent="    ", subsequent_indent="        ")
    if not details:
        print(
            "Environment families (options, data, licences, tools: entropace envs list "
            "--details, or entropace envs list NAME):",
            file=out,
        )
    width = max(len(n) for n in families) + 2
    brief = textwrap.TextWrapper(width=100, subsequent_indent=" " * (width + 2))
    for group in ordered:
        if details:
            if len(group) > 1:
                names = ", ".join(g.name for g in group)
                print(f"{names} (the same options, data and requirements):", file=out)
            for g in group:
                print(f"{'  ' if len(group) > 1 else ''}{g.name}: {g.description}", file=out)
            for line in _details(group[0]):
                print("\n".join(wrap.wrap(line)), file=out)
            print(file=out)
            continue
        for g in group:
            print(brief.fill(f"  {g.name:<{width}}{g.description}"), file=out)
        print(brief.fill(f"  {'':<{width}}requires: {_requires(group[0])}"), file=out)
    return 0


def _make(args: argparse.Namespace) -> TurnLimit:
    spec(args.name)  # unknown name -> KeyError listing the known families
    return make(
        args.name,
        max_turns=args.max_turns,
        interface=args.interface,
        profile=args.profile,
        **_options(args),
    )


def _tools_of(env: TurnLimit) -> list[dict[str, Any]] | None:
    tools = getattr(env, "tools", None)
    return tools if isinstance(tools, list) and tools else None


def _print_tools(tools: list[dict[str, Any]], out: TextIO) -> None:
    print("--- tools ---", file=out)
    for t in tools:
        print(json.dumps(t, ensure_ascii=False), file=out)


def typed_call(text: str, tool_names: list[str]) -> str:
    """A typed ``tool_name {json arguments}`` line as a generic tool call; other text as is."""
    name, _, rest = text.strip().partition(" ")
    if name not in tool_names:
        return text
    try:
        arguments = json.loads(rest) if rest.strip() else {}
    except ValueError:
        return text
    if not isinstance(arguments, dict):
        return text
    return format_tool_call(ToolCall(name, arguments))


#: A typed line that looks like a call: ``name {...}``.
_CALL_LIKE = re.compile(r"\s*([A-Za-z_][\w.-]*)\s+(\{.*)", re.DOTALL)


def call_example(tool: dict[str, Any]) -> str:
    """``execute_sql {"query": "..."}``: how to type a call of ``tool`` (its required
    arguments, each with a placeholder of its JSON type)."""
    function = tool["function"]
    params = function.get("parameters", {})
    props = params.get("properties", {})
    placeholder = {"array": ["..."], "object": {}, "integer": 0, "number": 0, "boolean": True}
    arguments = {
        name: placeholder.get(props[name].get("type"), "...")
        for name in params.get("required", list(props))
        if name in props
    }
    return f"{function['name']} {json.dumps(arguments, ensure_ascii=False)}"


def typed_call_error(text: str, tools: list[dict[str, Any]]) -> str | None:
    """Why a typed line meant as a tool call cannot be one (None if it can, or is no call):
    a tool's name followed by arguments that are not one JSON object, or an unknown name
    followed by a JSON object. ``play`` says so without spending a turn."""
    by_name = {t["function"]["name"]: t for t in tools}
    name, _, rest = text.strip().partition(" ")
    if name in by_name and rest.strip():
        try:
            arguments = json.loads(rest)
        except ValueError as exc:
            return (
                f"{name}: the arguments are not valid JSON ({exc}); type e.g. "
                f"{call_example(by_name[name])}"
            )
        if not isinstance(arguments, dict):
            return (
                f"{name}: the arguments must be one JSON object {{...}}, got "
                f"{type(arguments).__name__}; type e.g. {call_example(by_name[name])}"
            )
        return None
    match = _CALL_LIKE.fullmatch(text)
    if match and match.group(1) not in by_name:
        try:
            looks_like_call = isinstance(json.loads(match.group(2)), dict)
        except ValueError:
            looks_like_call = False
        if looks_like_call:
            return f"there is no tool {match.group(1)!r}; tools: {', '.join(by_name)}"
    return None


def read_actions(stream: TextIO, multiline: bool = False) -> Iterator[str]:
    """Actions typed by a person. By default one line is one action, and a line ending in a
    backslash continues on the next (the lines joined by newlines, the backslash dropped, as in
    a shell); blank lines are skipped. ``multiline``: lines up to an empty line are one action
    (for pasting a multi-line script or a model's whole reply)."""
    lines: list[str] = []
    for raw in stream:
        line = raw.rstrip("\n").rstrip("\r")
        if multiline:
            if line.strip():
                lines.append(line)
            elif lines:
                yield "\n".join(lines)
                lines = []
        elif line.endswith("\\"):
            lines.append(line[:-1])
        elif lines or line.strip():
            yield "\n".join([*lines, line])
            lines = []
    if lines:  # input closed in the middle of an action: still send what was typed
        yield "\n".join(lines)


def cmd_play(args: argparse.Namespace) -> int:
    env = _make(args)
    obs, info = env.reset(args.seed)
    out: TextIO = sys.stdout
    print(f"=== {env.name} seed={args.seed} difficulty={info.get('difficulty')}", file=out)
    print("--- system prompt ---", file=out)
    print(env.system_prompt, file=out)
    tools = _tools_of(env)
    if tools is not None:
        _print_tools(tools, out)
    print("--- observation ---", file=out)
    print(obs, file=out)
    how = (
        "end each action with an empty line"
        if args.multiline
        else "one line per action; end a line with \\ to continue the action on the next"
    )
    hint = ""
    if tools is not None:
        hint = "a tool call as: " + " or ".join(call_example(t) for t in tools)
        how += "; " + hint
    print(f"(type your action; {how}; Ctrl-D quits)", file=out)
    total, success, turn = 0.0, False, 0
    ended = False
    names = [t["function"]["name"] for t in tools or []]
    for action in read_actions(sys.stdin, args.multiline):
        if tools is not None:
            problem = typed_call_error(action, tools)
            if problem is not None:  # said here; the environment is not stepped
                print(f"(not sent: {problem})", file=out)
                continue
            action = typed_call(action, names)
        obs, reward, terminated, truncated, step_info = env.step(action)
        turn += 1
        total += reward
        success = success or bool(step_info.get("success"))
        role = step_info.get("observation_role")
        kind = f", {role} message" if tools is not None and role else ""
        if step_info.get("tool_error"):
            kind += f", tool error: {step_info['tool_error']}"
        print(f"--- observation (turn {turn}, reward {reward:g}{kind}) ---", file=out)
        print(obs, file=out)
        if step_info.get("tool_error") in ("no_call", "bad_json"):
            # the observation is the model's (its <tool_call> format); a person types calls so
            print(f"(in play, type {hint})", file=out)
        if terminated or truncated:
            ended = True
            print("episode " + ("terminated" if terminated else "truncated (turn limit)"), file=out)
            break
    if not ended:
        print("input closed: quitting", file=out)
    print(f"reward={total:g} success={success} turns={turn}", file=out)
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    out: TextIO = sys.stdout
    s = spec(args.name)
    for seed in seeds(args.split, args.n, offset=args.offset):
        env = _make(args)
        obs, info = env.reset(seed)
        print(
            f"=== {env.name} seed={seed} split={args.split} difficulty={info.get('difficulty')}",
            file=out,
        )
        if seed == seeds(args.split, 1, offset=args.offset)[0] and _tools_of(env) is not None:
            _print_tools(_tools_of(env) or [], out)
        print(obs, file=out)
        print(f"gold: {info.get('gold')}", file=out)
        if args.solve:
            policy = tool_oracle(s.oracle)(env) if _tools_of(env) is not None else s.oracle(env)
            ep = run_episode(env, policy, seed)
            print("--- oracle episode ---", file=out)
            for action, observation in zip(ep.actions, ep.observations[1:]):
                print(f"> {action}", file=out)
                print(observation, file=out)
            print(
                f"oracle: reward={ep.total_reward:g} success={ep.success} turns={len(ep.actions)}",
                file=out,
            )
        print(file=out)
    return 0


Command = Callable[[argparse.Namespace], int]


def _guarded(func: Command) -> Command:
    """Turn the errors a user can cause (unknown family, bad option) into a message and exit 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (KeyError, TypeError, ValueError, ImportError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            print(f"entropace envs: error: {printable(msg)}", file=sys.stderr)
            return 2

    return run


def _env_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="environment family (see 'entropace envs list')")
    p.add_argument("--difficulty", choices=DIFFICULTIES, default=None, help="difficulty level")
    p.add_argument(
        "--opt",
        type=parse_option,
        action="append",
        metavar="KEY=VALUE",
        help="family option (repeatable), e.g. --opt database=chinook",
    )
    p.add_argument("--max-turns", type=int, default=None, help="override the turn limit")
    p.add_argument(
        "--interface",
        choices=INTERFACES,
        default="text",
        help="text: the family's own action syntax (default); tools: JSON-schema tool calls",
    )
    p.add_argument(
        "--profile",
        choices=PROFILES,
        default="default",
        help="agentbench: AgentBench FC's interface, observations, turn limits and caps",
    )


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("envs", help="list, play and sample environment families")
    sub = parser.add_subparsers(dest="envs_command", metavar="ACTION")
    sub.required = True

    p_list = sub.add_parser(
        "list", help="the families and what they need (--details: options, data, licence)"
    )
    p_list.add_argument("names", nargs="*", metavar="NAME", help="only these families (details)")
    p_list.add_argument(
        "--details", action="store_true", help="options, data source, licence and tools"
    )
    p_list.set_defaults(func=_guarded(cmd_list))

    p_play = sub.add_parser("play", help="play one instance in the terminal (actions on stdin)")
    _env_args(p_play)
    p_play.add_argument("--seed", type=int, default=0, help="instance seed (default 0)")
    p_play.add_argument(
        "--multiline",
        action="store_true",
        help="an action is the lines up to an empty line (to paste a script or a whole reply); "
        "default: one line per action, a line ending in \\ continues on the next",
    )
    p_play.add_argument("--oneline", action="store_true", help=argparse.SUPPRESS)  # the default
    p_play.set_defaults(func=_guarded(cmd_play))

    p_sample = sub.add_parser("sample", help="print instances with gold answers")
    _env_args(p_sample)
    p_sample.add_argument("--n", type=int, default=5, help="number of instances (default 5)")
    p_sample.add_argument("--split", choices=sorted(SPLITS), default="train", help="seed split")
    p_sample.add_argument("--offset", type=int, default=0, help="first seed within the split")
    p_sample.add_argument("--solve", action="store_true", help="also print the oracle's episode")
    p_sample.set_defaults(func=_guarded(cmd_sample))

    from entropace.cli import envs_stats

    envs_stats.add_parser(sub, _env_args, _guarded)
