"""envhub envs in SkyRL's gym (skyrl-gym 0.4): `pip install 'envhub[skyrl]'`.

SkyRL's generator makes one env per trajectory, `skyrl_gym.make(env_class, env_config=..., extras=...)` (extras: the
dataset row's other columns plus `max_turns`), asks `init(prompt)` for the conversation to start from, then sends
every model reply to `step(text)` until `done`; it tokenizes the messages itself and never passes `tools=` to the
chat template, so `EnvhubTextEnv` writes the env's tool schemas into the system message.

- `register(env_ids)`: every (or the given) single-agent envhub id as `envhub/<id>` in skyrl_gym, plus `envhub`,
  which takes the id from the row (`extras["env_id"]`). Call it where SkyRL's entrypoint registers envs.
- `write_dataset(path, env_ids, seeds)`: the parquet SkyRL's `PromptDataset` reads (`prompt`, `env_class`, `seed`).
- `train_overrides(...)`: SkyRL config overrides for training on that parquet (checked against SkyRL's config
  schema by the tests; training itself needs skyrl's GPU extras).
- `EnvhubTextEnv`: the env class; importing it imports skyrl_gym.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import envhub
from envhub.errors import ConfigError, EnvhubError
from envhub.integrations.episode import first_messages
from envhub.user_modules import load_user_modules

PREFIX = "envhub/"
ENTRY_POINT = f"{__name__}:EnvhubTextEnv"


def require_skyrl_gym() -> Any:
    """The `skyrl_gym` module, or an EnvhubError naming the install command."""
    try:
        import skyrl_gym
    except ImportError:
        raise EnvhubError("skyrl-gym is not installed", hint="pip install 'envhub[skyrl]'  (skyrl-gym>=0.4)") from None
    return skyrl_gym


def tools_text(tools: list[dict[str, Any]]) -> str:
    """The env's tools described in the system message, with the call format envhub's parser reads."""
    schemas = "\n".join(json.dumps(t, sort_keys=True) for t in tools)
    return (
        "\n\nYou can use these tools. Call one by writing "
        '<tool_call>{"name": TOOL_NAME, "arguments": {ARGUMENTS}}</tool_call> in your reply. '
        f"Their JSON schemas:\n{schemas}"
    )


def register(
    env_ids: Sequence[str] | None = None,
    *,
    prefix: str = PREFIX,
    env_kwargs: dict[str, dict[str, Any]] | None = None,
    imports: Sequence[str] = (),
) -> list[str]:
    """Register envhub ids with skyrl_gym as `prefix + id` (and the generic `prefix` without its slash); returns the
    skyrl_gym ids. `imports` are modules or files to import first (envs of your own); `env_kwargs` maps an id to its
    constructor kwargs. Calling it again is harmless."""
    skyrl_gym = require_skyrl_gym()
    from skyrl_gym.envs.registration import registry

    load_user_modules(imports, option="skyrl register imports:")
    ids = list(env_ids) if env_ids is not None else [s.id for s in envhub.list_envs() if not s.multiagent]
    generic = {prefix.rstrip("/"): {}} if prefix.rstrip("/") else {}  # reads env_id from the row
    wanted = generic | {
        prefix + env_id: {"env_id": envhub.spec(env_id).id, **(env_kwargs or {}).get(env_id, {})} for env_id in ids
    }
    for skyrl_id, kwargs in wanted.items():
        existing = registry.get(skyrl_id)
        if existing is not None and existing.entry_point != ENTRY_POINT:
            raise ConfigError(
                f"skyrl_gym already has an env {skyrl_id!r} from {existing.entry_point}", hint="pass another prefix"
            )
        registry.pop(skyrl_id, None)  # re-registering replaces, with the kwargs given now
        skyrl_gym.register(id=skyrl_id, entry_point=ENTRY_POINT, kwargs=kwargs)
    return list(wanted)


def write_dataset(
    path: str | Path, env_ids: str | Sequence[str], seeds: Sequence[int], *, prefix: str = PREFIX
) -> Path:
    """Write SkyRL's dataset parquet: one row per (env, seed) with `prompt` (empty: `init` adds the env's own),
    `env_class` (the registered skyrl_gym id) and `seed`, `data_source` (both reach the env as extras)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = [envhub.spec(env_id).id for env_id in ([env_ids] if isinstance(env_ids, str) else env_ids)]  # known ids
    rows = [
        {
            "prompt": [{"role": "user", "content": ""}],
            "env_class": prefix + env_id,
            "seed": int(seed),
            "data_source": f"envhub/{env_id}",
        }
        for env_id in ids
        for seed in seeds
    ]
    path = Path(path)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def train_overrides(
    train_data: str | Path,
    model: str,
    *,
    val_data: str | Path | None = None,
    group_size: int = 4,
    max_turns: int = 8,
) -> list[str]:
    """`key=value` overrides for SkyRL's trainer config (`SkyRLTrainConfig.from_cli_overrides`) over `write_dataset`'s
    parquet; the env classes come from each row."""
    return [
        f"data.train_data=['{train_data}']",
        f"data.val_data=['{val_data or train_data}']",
        f"trainer.policy.model.path={model}",
        f"generator.n_samples_per_prompt={group_size}",
        f"generator.max_turns={max_turns}",
        "environment.env_class=envhub",  # rows without env_class: the generic class, which reads env_id
    ]


def __getattr__(name: str) -> Any:
    """`EnvhubTextEnv` is built on first use, since it subclasses skyrl_gym's `BaseTextEnv`."""
    if name == "EnvhubTextEnv":
        globals()[name] = cls = _text_env_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _plain(mapping: Any) -> dict[str, Any]:
    """A plain dict of a mapping (SkyRL hands OmegaConf configs around), {} for None."""
    return {str(k): v for k, v in mapping.items()} if mapping is not None else {}


def _text_env_class() -> type:
    require_skyrl_gym()
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

    class EnvhubTextEnv(BaseTextEnv):
        """One envhub episode in SkyRL's text-env form; `extras` carry `seed`, `max_turns` and maybe `env_id`."""

        def __init__(self, env_config: Any = None, extras: Any = None, *, env_id: str | None = None, **kwargs: Any):
            super().__init__()
            extras = _plain(extras)
            self.env_id = env_id or extras.get("env_id")
            if not self.env_id:
                raise ConfigError(
                    "no envhub env id: the generic 'envhub' class reads it from the row",
                    hint="add an env_id column, or use env_class 'envhub/<id>'",
                )
            self.seed = extras.get("seed")
            self.max_turns = int(extras.get("max_turns") or 0)  # 0: the env's own step limit decides
            self.env = envhub.make(self.env_id, **{**_plain(env_config), **kwargs, **_plain(extras.get("env_kwargs"))})
            self.total, self.terminated, self.info = 0.0, False, {}

        def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
            obs, info = self.env.reset(seed=None if self.seed is None else int(self.seed))
            messages = first_messages(info, obs, prompt)
            if info.get("tools"):
                if messages[0]["role"] != "system":
                    messages.insert(0, {"role": "system", "content": ""})
                messages[0]["content"] = (messages[0]["content"] + tools_text(info["tools"])).strip()
            return messages, {"env_id": self.env_id}

        def step(self, action: str) -> BaseTextEnvStepOutput:
            self.turns += 1
            obs, reward, terminated, truncated, self.info = self.env.step(action)
            self.total += float(reward)
            self.terminated = bool(terminated)
            done = bool(terminated or truncated) or (self.max_turns > 0 and self.turns >= self.max_turns)
            return BaseTextEnvStepOutput(
                observations=[] if done else [{"role": "user", "content": obs}],
                reward=float(reward),
                done=done,
                metadata={"terminated": bool(terminated), "truncated": bool(truncated)},
            )

        def get_metrics(self) -> dict[str, Any]:
            return {"return": self.total, "turns": self.turns, "terminated": float(self.terminated)}

        def close(self) -> None:
            self.env.close()

    EnvhubTextEnv.__module__ = __name__  # skyrl_gym loads "module:EnvhubTextEnv" strings
    return EnvhubTextEnv
