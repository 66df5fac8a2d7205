"""``os``: real bash over a generated file tree, sandboxed by bubblewrap (AgentBench-OS style).

See ``docs/envs/os.md``. The sandbox needs the ``bwrap`` binary (``apt-get install
bubblewrap``); building an environment without it raises
:class:`~entropace.envs.os.sandbox.SandboxUnavailableError` with the install hint.

Note on the package name: inside this package every module uses absolute imports, so
``import os`` is always the standard library.
"""

from __future__ import annotations

from entropace.envs.os.actions import Answer, Bash, Done, answers_match, parse_action
from entropace.envs.os.env import MAX_TURNS, SHELLS, OsEnv, oracle
from entropace.envs.os.sandbox import (
    RunResult,
    Sandbox,
    SandboxLimits,
    SandboxUnavailableError,
    require_bwrap,
)
from entropace.envs.os.session import ShellResult, ShellSession
from entropace.envs.os.splits import TRAIN_KINDS, UNSEEN_KINDS, pools
from entropace.envs.os.supervisor import SessionError
from entropace.envs.registry import EnvSpec, register

__all__ = [
    "MAX_TURNS",
    "SHELLS",
    "Answer",
    "Bash",
    "Done",
    "OsEnv",
    "RunResult",
    "Sandbox",
    "SandboxLimits",
    "SandboxUnavailableError",
    "SessionError",
    "ShellResult",
    "ShellSession",
    "TRAIN_KINDS",
    "UNSEEN_KINDS",
    "answers_match",
    "oracle",
    "parse_action",
    "require_bwrap",
]

register(
    EnvSpec(
        name="os",
        factory=OsEnv,
        oracle=oracle,
        description="bash in a bubblewrap sandbox over a generated file tree (AgentBench-OS)",
        options={
            "difficulty": "easy | medium | hard (default easy)",
            "command_timeout": "seconds per command before it is killed (default 5.0)",
            "output_chars": "characters of command output shown (default 4000)",
            "shell": "fresh (default: a new sandbox per command) | persistent (one bash per "
            "episode; adds the process/user/PATH/edit kinds)",
            "kinds": "task kinds to draw (default: the difficulty's kinds for the shell; the "
            "test_unseen kinds are held out)",
            "scoring": "lenient (default) | agentbench: AgentBench OS's check scripts "
            "(integer-match, string-match, ...; AgentBench: agentbench)",
        },
        data_source="generated from the seed (logs, CSV tables, configs, scripts); no external "
        "data; test_unseen: held-out task kinds (entropace.envs.os.splits)",
        license="n/a (generated data)",
        requires=(),
        binaries={"bwrap": "bubblewrap: apt-get install bubblewrap (Debian/Ubuntu)"},
        splits=("train", "test", "test_unseen"),
        pools=pools,
    )
)
