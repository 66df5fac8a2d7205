"""Registry of environment families and their seed-range task sets.

``make(name, **options)`` builds a fresh, turn-limited environment. A *task set* is a seed
range (:data:`entropace.envs.splits.SPLITS`); each family draws a seed's instance from that
split's content pool (:mod:`entropace.envs.splits`), and the same seed always gives the same
instance and gold answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from entropace.envs.base import DIFFICULTIES, Policy, TextEnv, TurnLimit
from entropace.envs.splits import SPLITS, Split


@dataclass(frozen=True)
class EnvSpec:
    """Everything the library and the CLI know about one family.

    Attributes:
        name: family name, e.g. ``"db"``.
        factory: ``factory(**options) -> TextEnv`` (unwrapped).
        oracle: ``oracle(env) -> Policy``; called after ``env.reset(seed)`` it returns a scripted
            policy that solves that instance (used by tests and ``envs sample``).
        description: one line for ``entropace envs list``.
        options: option name -> help text (with allowed values and default).
        data_source: where the family's data comes from.
        license: the licence(s) of that data.
        requires: pip packages the family needs (named in the error when missing).
        binaries: executables the family runs -> how to install them (``entropace envs list``
            checks that each is on PATH).
        splits: the splits whose seeds draw content-disjoint instances
            (:mod:`entropace.envs.splits`): ``("train", "test")`` by default; a family with
            held-out units adds ``"test_unseen"``. ``entropace eval`` reports the others as
            n/a.
        pools: ``pools(difficulty) -> {name: size}``: the sizes of the family's content pools
            and held-out units (``entropace envs stats``); None: not reported.
        prior: ``prior(env, rng, **options) -> Policy``: a *demonstration prior*, a noisy
            demonstrator of the family whose replies follow a distribution the options set
            (called after ``env.reset(seed)``, drawing from the ``random.Random`` ``rng``);
            the warm start's ``source: prior`` (:mod:`entropace.train.warm_start`) fine-tunes
            a model on its episodes. None: the family has none (warm starts use its oracle).
            Unknown or bad options raise ``TypeError`` / ``ValueError``.
    """

    name: str
    factory: Callable[..., TextEnv]
    oracle: Callable[[Any], Policy]
    description: str
    options: dict[str, str] = field(default_factory=dict)
    data_source: str = "generated"
    license: str = "n/a"
    requires: tuple[str, ...] = ()
    binaries: dict[str, str] = field(default_factory=dict)
    splits: tuple[str, ...] = ("train", "test")
    pools: Callable[[str], dict[str, int]] | None = None
    prior: Callable[..., Policy] | None = None


def has_split(name: str, split: str) -> bool:
    """Whether family ``name`` offers ``split`` (:attr:`EnvSpec.splits`)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    return split in spec(name).splits


_REGISTRY: dict[str, EnvSpec] = {}
_BUILTIN_MODULES: tuple[str, ...] = (
    "entropace.envs.db",
    "entropace.envs.kg",
    "entropace.envs.reasoning",
    "entropace.envs.os",
    "entropace.envs.household",
    "entropace.envs.shop",
    "entropace.envs.lab",
)
_loaded = False
#: builtin family module -> why it could not be imported (a missing optional dependency)
UNAVAILABLE: dict[str, str] = {}


def register(spec: EnvSpec) -> EnvSpec:
    """Register a family; re-registering the same name replaces it."""
    _REGISTRY[spec.name] = spec
    return spec


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    import importlib
    import importlib.util

    for mod in _BUILTIN_MODULES:
        if importlib.util.find_spec(mod) is None:
            continue
        try:
            importlib.import_module(mod)
        except ImportError as exc:  # one family's missing dependency must not hide the others
            UNAVAILABLE[mod.rsplit(".", 1)[-1]] = (
                f"{exc}; install the environment extras: pip install 'entropace[envs]'"
            )
    _loaded = True


def specs() -> dict[str, EnvSpec]:
    """All registered families by name."""
    _load_builtins()
    return dict(sorted(_REGISTRY.items()))


def spec(name: str) -> EnvSpec:
    """The spec of family ``name``; an unknown name lists the known ones."""
    known = specs()
    if name not in known:
        if name in UNAVAILABLE:
            raise ImportError(f"environment {name!r} is unavailable: {UNAVAILABLE[name]}")
        raise KeyError(f"unknown environment {name!r}; known: {sorted(known)}")
    return known[name]


#: Interfaces :func:`make` builds: the family's own text actions, or JSON-schema tool calls.
INTERFACES: tuple[str, ...] = ("text", "tools")
#: Profiles :func:`make` knows (``entropace.envs.agentbench``).
PROFILES: tuple[str, ...] = ("default", "agentbench")
#: family -> its :class:`~entropace.envs.tools.ToolSuite` (user families: :func:`register_tools`)
_TOOL_SUITES: dict[str, Any] = {}


def register_tools(name: str, suite: Any) -> None:
    """Give family ``name`` a tool interface (builtin families have theirs in ``<family>/fc.py``)."""
    _TOOL_SUITES[name] = suite


def tool_suite(name: str) -> Any:
    """The :class:`~entropace.envs.tools.ToolSuite` of family ``name``; ``KeyError`` if none."""
    module = f"entropace.envs.{name}.fc"
    if name not in _TOOL_SUITES and f"entropace.envs.{name}" in _BUILTIN_MODULES:
        import importlib
        import importlib.util

        if importlib.util.find_spec(module) is not None:
            _TOOL_SUITES[name] = importlib.import_module(module).SUITE
    if name not in _TOOL_SUITES:
        raise KeyError(f"environment {name!r} has no tool interface (interface='tools')")
    return _TOOL_SUITES[name]


def make(
    name: str,
    *,
    max_turns: int | None = None,
    interface: str = "text",
    profile: str = "default",
    calls_per_reply: str | None = None,
    **options: Any,
) -> TurnLimit:
    """Build a fresh environment of family ``name`` wrapped in :class:`TurnLimit`.

    Args:
        max_turns: overrides the family's turn limit.
        interface: ``"text"`` (the family's own action syntax) or ``"tools"`` (JSON-schema
            tools and parsed tool calls, :mod:`entropace.envs.tools`).
        profile: ``"default"``, or ``"agentbench"``: AgentBench FC's interface, observation
            formats, turn limits, output caps, calls per reply and task mix for the family
            (:mod:`entropace.envs.agentbench`); explicit arguments override the profile's.
        calls_per_reply: tools interface: ``"all"``, ``"first"`` or ``"strict"`` (what a
            reply with several calls does); default: the profile's, else the suite's.
        options: the family's options (``entropace envs list``). ``difficulty="mixed"``
            draws each seed's difficulty (uniformly, or by the profile's mix); under the
            ``agentbench`` profile a family with a mix gets it when no difficulty is given.

    Unknown options raise ``TypeError`` naming the family's options.
    """
    s = spec(name)
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {list(PROFILES)}, got {profile!r}")
    mix: dict[str, float] | None = None
    if profile == "agentbench":
        from entropace.envs.agentbench import profile_settings

        preset = profile_settings(name, options.get("difficulty"))
        options = {**{k: v for k, v in preset.options.items() if k in s.options}, **options}
        interface = "tools" if interface == "text" else interface
        max_turns = preset.max_turns if max_turns is None else max_turns
        if calls_per_reply is None:
            calls_per_reply = preset.calls_per_reply
        if "difficulty" not in options and preset.difficulty_mix and "difficulty" in s.options:
            mix = dict(preset.difficulty_mix)
    if options.get("difficulty") == "mixed":
        if "difficulty" not in s.options:
            raise TypeError(f"{name}: has no difficulty option to mix")
        mix = mix or {d: 1.0 for d in DIFFICULTIES}
        options.pop("difficulty")
    if interface not in INTERFACES:
        raise ValueError(f"interface must be one of {list(INTERFACES)}, got {interface!r}")
    unknown = sorted(set(options) - set(s.options))
    if unknown:
        raise TypeError(f"{name}: unknown option(s) {unknown}; options: {sorted(s.options)}")
    if mix is not None:
        from entropace.envs.agentbench import MixedDifficulty

        env: Any = MixedDifficulty(lambda d: s.factory(**options, difficulty=d), mix, salt=name)
    else:
        env = s.factory(**options)
    if interface == "tools":
        from entropace.envs.tools import ToolInterface

        try:
            suite = tool_suite(name)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        style = suite.agentbench if profile == "agentbench" else suite.style
        rule = {} if calls_per_reply is None else {"calls_per_reply": calls_per_reply}
        env = ToolInterface(env, suite, style, **rule)
    elif calls_per_reply is not None and profile != "agentbench":
        raise ValueError("calls_per_reply applies to interface='tools' only")
    return TurnLimit(env, max_turns=max_turns)


def seeds(split: Split, n: int, *, offset: int = 0) -> range:
    """The first ``n`` seeds of ``split`` starting at ``offset`` within it."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    r = SPLITS[split]
    if offset < 0 or n < 0 or offset + n > len(r):
        raise ValueError(f"{split} split has {len(r)} seeds; asked for [{offset}, {offset + n})")
    return r[offset : offset + n]
