"""envhub: a hub of stateful agentic environments for LLM agents.

`import envhub` registers the bundled envs (and those of installed plugins) under gymnasium's
`envhub/` namespace, so `gym.make("envhub/Sokoban-v0")` works.
"""

from envhub.core import AgentEnv, UnicodeText, run_sync
from envhub.errors import (
    ConfigError,
    EnvhubError,
    EnvNotFound,
    EnvUnavailable,
    RegistrationError,
    ResetNeeded,
    SandboxError,
)
from envhub.registry import EnvSpec, as_async, list_envs, load_plugins, make, make_multiagent, register, spec
from envhub.remote import RemoteEnv, RemoteError
from envhub.selfplay import SelfPlay
from envhub.toolcalls import ParsedAction, ToolCall, parse_tool_calls
from envhub.toolenv import SandboxSpec, SandboxToolEnv, ToolEnv
from envhub.tools import Tool, ToolContext, tool
from envhub.wrappers import Wrapper

__version__ = "0.1.0"

__all__ = [
    "AgentEnv",
    "ConfigError",
    "EnvNotFound",
    "EnvSpec",
    "EnvUnavailable",
    "EnvhubError",
    "OpenEnvEnv",
    "ParsedAction",
    "RegistrationError",
    "RemoteEnv",
    "RemoteError",
    "ResetNeeded",
    "SandboxError",
    "SandboxSpec",
    "SandboxToolEnv",
    "SelfPlay",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolEnv",
    "UnicodeText",
    "Wrapper",
    "as_async",
    "list_envs",
    "make",
    "make_multiagent",
    "parse_tool_calls",
    "register",
    "run_sync",
    "spec",
    "tool",
]


def __getattr__(name: str) -> object:
    """`envhub.OpenEnvEnv` (the client of OpenEnv servers) lives with the OpenEnv adapter and loads on first use."""
    if name == "OpenEnvEnv":
        from envhub.envs.adapters.openenv import OpenEnvEnv

        return OpenEnvEnv
    raise AttributeError(f"module 'envhub' has no attribute {name!r}")


def _register_builtins() -> None:
    from envhub.envs import register_builtin_envs

    register_builtin_envs()


_register_builtins()
load_plugins()
