"""Built-in harnesses: real agent programs from PyPI, run unmodified, each with the packages it needs.

A harness's packages live in their own folder (`.venv/harness-overlay`, made by `make install` with
`pip install --target`), mounted read-only into the sandbox and put on PYTHONPATH for the sandbox's own python3
(both CPython 3.11 here, so the compiled wheels fit); its program file is copied into the sandbox. `Launch` says
how any harness starts, built-in or command line; it imports nothing of the trainer, so the config can check names.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from envhub.errors import HarnessError

SITE_INSIDE = "/tmp/.envhub-site"  #: where the overlay is seen inside the sandbox


@dataclass(frozen=True)
class Launch:
    """How one harness starts: a shell command line, its extra environment, files copied in before it starts
    (path inside -> bytes) and host folders mounted read-only (host path -> path inside; sandboxed runners only)."""

    command: str
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    mounts: dict[str, str] = field(default_factory=dict)


def overlay_dir() -> Path:
    """The folder holding the built-in harnesses' packages (beside the virtualenv's own)."""
    return Path(sys.prefix) / "harness-overlay"


def resolve(harness: str, sandboxed: bool) -> Launch:
    """A built-in harness by name, else `harness` as a shell command line. A command line sees the built-ins'
    packages too when they are installed (the `openai` client, the Agents SDK, `mcp`), read-only on PYTHONPATH."""
    if not harness.strip():
        raise HarnessError(
            "the harness is empty", hint=f"name a built-in ({', '.join(BUILTIN)}) or give a command line"
        )
    if harness in BUILTIN:
        return BUILTIN[harness].launch(sandboxed)
    overlay = overlay_dir()
    if not overlay.is_dir():
        return Launch(harness)
    if not sandboxed:
        return Launch(harness, {"PYTHONPATH": str(overlay)})
    return Launch(harness, {"PYTHONPATH": SITE_INSIDE}, mounts={str(overlay): SITE_INSIDE})


@dataclass(frozen=True)
class BuiltinHarness:
    """A named harness: its program (a file in envhub.trainer.harness.programs) and the environment it needs."""

    name: str
    program: str  #: file name under programs/
    module: str  #: a top-level package the overlay must hold (checked before the first episode)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def inside_path(self) -> str:
        """Where the program is copied inside the sandbox."""
        return f"/tmp/.envhub-{self.program}"

    def source(self) -> bytes:
        """The program's text."""
        return resources.files("envhub.trainer.harness.programs").joinpath(self.program).read_bytes()

    def launch(self, sandboxed: bool) -> Launch:
        """How to start it: in a sandbox (program copied in, overlay mounted) or on the host (their own paths)."""
        overlay = self.check()
        if not sandboxed:
            program = resources.files("envhub.trainer.harness.programs").joinpath(self.program)
            return Launch(f"python3 {program}", {**self.env, "PYTHONPATH": str(overlay)})
        return Launch(
            f"python3 {self.inside_path}",
            {**self.env, "PYTHONPATH": SITE_INSIDE},
            files={self.inside_path: self.source()},
            mounts={str(overlay): SITE_INSIDE},
        )

    def check(self) -> Path:
        """The overlay folder; HarnessError naming the fix when its packages are not installed."""
        overlay = overlay_dir()
        if not (overlay / self.module).is_dir():
            raise HarnessError(
                f"the {self.name} harness needs its packages in {overlay}, which lacks {self.module!r}",
                hint="run `make install` (it installs the built-in harnesses' packages there)",
            )
        return overlay


BUILTIN = {
    "openai-agents": BuiltinHarness(
        "openai-agents",
        "openai_agents.py",
        "agents",
        {
            "ENVHUB_INSTRUCTIONS": "Solve the task. Put the final answer alone on the last line.",
            "OPENAI_AGENTS_DISABLE_TRACING": "1",  # nothing may leave the machine: traces would go to api.openai.com
        },
    ),
    "mini-swe-agent": BuiltinHarness(
        "mini-swe-agent",
        "mini_swe_agent.py",
        "minisweagent",
        {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM would fetch its cost map at import otherwise
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/.mini-swe-agent",  # it writes a .env there; the sandbox's /tmp is its own
            "MSWEA_COST_TRACKING": "ignore_errors",  # a local model has no price
        },
    ),
}
