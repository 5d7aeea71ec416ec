"""GEM (gem-llm) envs as envhub envs: `gem-<kind>-<Name>[-variant]-v<N>` for every id GEM registers.

GEM id `game:Sokoban-v0-easy` becomes `gem-game-Sokoban-easy-v0`; `rg:basic_arithmetic` becomes
`gem-rg-basic_arithmetic-v0`. GEM envs already speak gymnasium's 5-tuple with text in and out, so
the adapter passes observation, reward and terminated through unchanged (GEM's own reward
semantics), and truncated too except when GEM sets both flags (its one-answer envs do): then the
episode terminated, and GEM's flag stays in `info["gem_truncated"]`. `info` at reset gains the
system prompt and tools envhub rollouts expect.
- `tools=["python"]` wraps the env in GEM's own `ToolEnvWrapper` with its `PythonCodeTool`, run
  under bubblewrap (`sandbox_type="bwrap"`) by default, never unsandboxed unless asked.
- Envs whose data GEM loads from the Hugging Face hub (math, code, qa, eval, logic) are registered
  but fail at `make` with one line: envhub makes no download at run time.
- No anchor (`info["anchor"]`, docs/authoring.md): each GEM env keeps its state in attributes of its own (a board
  array, a list of guesses, a turn count next to them), with no common way to read it, so the adapter cannot
  name an exact state for all of them; the trainer hashes the observation instead.
"""

from __future__ import annotations

import importlib.util
import random
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from envhub.core import AgentEnv, UnicodeText
from envhub.envs.adapters.family import AdapterUnavailable, Family, no_downloads, register_family, require, upstream
from envhub.errors import ConfigError, ResetNeeded

FAMILY = Family(name="gem", distribution="gem-llm", module="gem", extra="gem", prefix="gem-", licence="Apache-2.0")
TEXT_LENGTH = 1 << 16
_GEM_ID = re.compile(r"^(?P<name>.+?)-v(?P<version>\d+)(?P<variant>(-.+)?)$")
TOOLS = ("python",)
# Some GEM constructors reset once, unseeded, drawing from Python's global `random`: the random-size Sokoban picks
# 6x6 with 2 boxes or 8x8 with 5 there, and the 8x8 level search took 0.03-90 s by the draw (seen: 18, 32, 48 s).
# Construction draws from this seed instead (the 6x6 pick: under 0.1 s in 20 of 20), and the caller's state is put
# back. Episodes are unaffected: every reset passes a seed, and GEM seeds its draws from it
CONSTRUCTION_SEED = 1


def envhub_id(gem_id: str) -> str:
    """The envhub id of a GEM id: `kind:Name-vN[-variant]` -> `gem-kind-Name[-variant]-vN`."""
    flat = gem_id.replace(":", "-")
    match = _GEM_ID.match(flat)
    name = flat if match is None else match["name"] + match["variant"]
    version = "0" if match is None else match["version"]
    safe = re.sub(r"[^\w.-]", "_", name)
    return f"{FAMILY.prefix}{safe}-v{version}"


@contextmanager
def _seeded_python_random(seed: int) -> Iterator[None]:
    """Python's global `random` seeded with `seed` inside, as it was before afterwards."""
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


class GemEnv(AgentEnv):
    """A GEM env; its text, rewards and episode ends pass through unchanged."""

    system_prompt: ClassVar[str] = (
        "Solve the task. Follow the format the observation asks for (GEM tasks usually want \\boxed{...} or [action])."
    )
    reward_doc: ClassVar[str] = "GEM's own reward, unchanged"

    def __init__(
        self,
        gem_id: str,
        tools: list[str] | tuple[str, ...] = (),
        sandbox: str = "bwrap",
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        gem = require(FAMILY, f"GEM env {gem_id}")
        unknown = [t for t in tools if t not in TOOLS]
        if unknown:
            raise ConfigError(f"unknown GEM tool(s) {unknown} for {gem_id}", hint=f"available: {', '.join(TOOLS)}")
        try:
            with no_downloads(f"GEM's {gem_id}"), _seeded_python_random(CONSTRUCTION_SEED):
                env = gem.make(gem_id, **kwargs)
        except ImportError as exc:
            raise AdapterUnavailable(
                f"GEM's {gem_id} cannot load its data offline ({type(exc).__name__}: {str(exc)[:200]})",
                hint="GEM fetches this dataset from the Hugging Face hub with `datasets`; envhub does not download at "
                "run time",
            ) from None
        except TypeError as exc:
            if "unexpected keyword" in str(exc):
                raise ConfigError(f"bad kwargs for GEM's {gem_id}: {exc}") from None
            raise upstream(f"GEM's {gem_id}", FAMILY.distribution, exc) from None
        except Exception as exc:
            raise upstream(f"GEM's {gem_id}", FAMILY.distribution, exc) from None
        if tools:
            from gem.tools.python_code_tool import PythonCodeTool
            from gem.tools.tool_env_wrapper import ToolEnvWrapper

            if sandbox == "bwrap":
                _bind_a_whole_python()

            env = ToolEnvWrapper(env, tools=[PythonCodeTool(sandbox_type=sandbox)])
        self.gem_id = gem_id
        self.env = env
        self.render_mode = render_mode
        self.observation_space = UnicodeText(TEXT_LENGTH)
        self._done = True
        self._last = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        try:
            with no_downloads(f"GEM's {self.gem_id}"):
                observation, info = self.env.reset(
                    seed=seed if seed is not None else int(self.np_random.integers(2**31))
                )
        except Exception as exc:
            raise upstream(f"GEM's {self.gem_id}", FAMILY.distribution, exc) from None
        self._done = False
        self._last = str(observation)[-TEXT_LENGTH:]
        return self._last, self.base_info(
            **{k: v for k, v in (info or {}).items() if k not in ("system_prompt", "tools")},
            legal_actions=self.legal_actions(),
        )

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise ResetNeeded(f"the {self.gem_id} episode is over", hint="call reset() to start a new one")
        text = action if isinstance(action, str) else str(action.get("arguments", action))
        try:
            with no_downloads(f"GEM's {self.gem_id}"):
                observation, reward, terminated, truncated, info = self.env.step(text)
        except Exception as exc:
            raise upstream(f"GEM's {self.gem_id}", FAMILY.distribution, exc) from None
        self._done = bool(terminated or truncated)
        self._last = str(observation)[-TEXT_LENGTH:]
        # GEM's one-answer envs report terminated and truncated together; the answer was graded, so the episode
        # terminated (gymnasium treats truncated as a cut, which bootstrapping would read wrongly)
        info = {**(info or {}), "gem_truncated": bool(truncated), "legal_actions": self.legal_actions()}
        return self._last, float(reward), bool(terminated), bool(truncated) and not terminated, info

    def legal_actions(self, samples: int = 32) -> list[str]:
        """Well-formed actions for the current state ([] when GEM has no notion of them): a game's own action
        list when it keeps one (Sokoban's directions), else distinct draws of GEM's `sample_random_action()`
        (seeded by the observation, so the same state gives the same list)."""
        if self._done:
            return []
        game = getattr(self.env, "unwrapped", self.env)
        listed = getattr(game, "action_space", None)
        if isinstance(listed, (list, tuple)) and listed and all(isinstance(a, str) for a in listed):
            return [f"\\boxed{{{a}}}" for a in listed]
        if not hasattr(game, "sample_random_action"):
            return []
        # GEM draws from the global `random`: the caller's stream is left as it was
        with _seeded_python_random(zlib.crc32(self._last.encode())):
            try:
                drawn = [str(game.sample_random_action()) for _ in range(samples)]
            except Exception:  # a game that cannot sample in this state
                drawn = []
        return sorted(set(drawn))

    def render_text(self) -> str:
        return self._last


def _catalogue() -> list[dict[str, Any]]:
    """Every id in GEM's registry."""
    require(FAMILY)
    from gem.envs.registration import ENV_REGISTRY

    records = []
    for gem_id, spec in ENV_REGISTRY.items():
        kind = gem_id.split(":")[0] if ":" in gem_id else "other"
        entry = (
            spec.entry_point
            if isinstance(spec.entry_point, str)
            else f"{spec.entry_point.__module__}:{spec.entry_point.__qualname__}"
        )
        records.append(
            {"gem_id": gem_id, "id": envhub_id(gem_id), "kind": kind, "entry_point": entry, "needs": _needs(spec)}
        )
    return records


def _needs(spec: Any) -> list[str]:
    """What a GEM env needs from outside (`envhub.availability`): its Hugging Face dataset, NLTK's word list."""
    needs = []
    dataset = (spec.kwargs or {}).get("dataset_name")
    if isinstance(dataset, str) and dataset:
        needs.append(f"hf-dataset:{dataset}")
    entry = spec.entry_point if isinstance(spec.entry_point, str) else spec.entry_point.__module__
    try:  # read the env's module without importing it
        found = importlib.util.find_spec(entry.split(":")[0])
    except (ImportError, ValueError):
        found = None
    origin = getattr(found, "origin", None)
    source = Path(origin).read_text(errors="replace") if origin and origin.endswith(".py") else ""
    if "nltk" in source:  # Wordle, Hangman, WordSearch draw words from NLTK's corpus
        needs.append("nltk:words")
    return needs


def _register(record: dict[str, Any]) -> str:
    from envhub.registry import register

    register(
        record["id"],
        "envhub.envs.adapters.gem:GemEnv",
        kwargs={"gem_id": record["gem_id"]},
        max_episode_steps=200,
        tags=("gem", record["kind"], "single-agent"),
        requires=tuple(record.get("needs", ())),
        description=f"GEM {record['gem_id']} ({record['entry_point'].split(':')[-1]})",
        source=FAMILY.distribution,
    )
    return record["kind"]


def register_envs() -> None:
    """Entry point: register every GEM id under `gem-`."""
    register_family(FAMILY, _catalogue, _register)


def _bind_a_whole_python() -> None:
    """Let GEM's bwrap sandbox start Python from a virtual environment.

    GEM binds `sys.prefix` read-only as the sandbox's only Python; a venv's `bin/python` is a symlink to an
    interpreter outside it, so inside the sandbox it does not exist ("execvp python"). `sys.prefix` is the only
    thing GEM's sandbox module reads from `sys`: point it at the base interpreter, a whole Python installation
    (the sandboxed code then sees the standard library only, not the venv's packages).
    """
    import sys
    import types

    import gem.utils.sandbox as gem_sandbox

    if sys.prefix != sys.base_prefix and getattr(gem_sandbox.sys, "prefix", None) == sys.prefix:
        gem_sandbox.sys = types.SimpleNamespace(prefix=sys.base_prefix)  # type: ignore[assignment]
