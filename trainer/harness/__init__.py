"""Harness episodes: an external agent program (a harness) plays an env, its model calls served and recorded by
the gateway (`envhub.trainer.gateway`), inside a sandbox whose only way out is the gateway. See docs/harnesses.md.

    harness = HarnessEnv("Letters-v0", "python3 agent.py", gateway)   # runner="bwrap": sandboxed
    episode = await harness.play(seed=0)   # reward, calls, samples (trajectories), error
"""

from envhub.trainer.harness.env import HarnessEnv, HarnessEpisode
from envhub.trainer.harness.runner import HarnessRunner, SandboxedRunner, UnsafeLocalRunner, make_runner

__all__ = ["HarnessEnv", "HarnessEpisode", "HarnessRunner", "SandboxedRunner", "UnsafeLocalRunner", "make_runner"]
