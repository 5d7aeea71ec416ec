"""envhub envs in TRL's `GRPOTrainer` (trl>=1.16, transformers>=5.13): `pip install 'envhub[trl]'`.

Two ways in, both fed by `dataset(env_ids, seeds)` (one row per episode seed, so the `num_generations` rollouts
of a GRPO group play the same episode):

- `environment_factory(env_id)`: a class in TRL's environment form for a tool env. Its public methods are the
  env's tools (typed, with Google docstrings, which is how TRL renders their schemas), `reset(**row)` starts the
  episode from the row's seed and `get_reward()` is its return. TRL's own tool loop plays it.
- `rollout_func(env_id)` + `env_reward`: envhub plays whole episodes of any env (text or tools) with the
  trainer's model, in the token layout of envhub's own trainer (`envhub.integrations.episode`); TRL trains on
  them, with env tokens masked out of the loss (`env_mask`).

`use_tool_template(tokenizer)` gives a ChatML tokenizer without tool support (SmolLM2) TRL's Qwen2.5 template.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import keyword
from collections.abc import Callable, Sequence
from typing import Any, Literal, Optional

import envhub
from envhub.core import run_sync
from envhub.errors import ConfigError, EnvhubError
from envhub.integrations.episode import TokenEpisode, play_episode

EPISODE_OVER = "The episode is over. Reply without calling a tool."
RESERVED = ("reset", "get_reward")  # TRL's own names on an environment class
_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def require_trl() -> Any:
    """The `trl` module, or an EnvhubError naming the install command."""
    try:
        import trl
    except ImportError:
        raise EnvhubError("TRL is not installed", hint="pip install 'envhub[trl]'  (trl>=1.16,<2)") from None
    return trl


def describe(env_id: str, **make_kwargs: Any) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt, tool schemas) of an env, from one reset."""
    env = envhub.make(env_id, **make_kwargs)
    try:
        _, info = env.reset(seed=0)
        return str(info.get("system_prompt") or ""), list(info.get("tools") or [])
    finally:
        env.close()


def dataset(env_ids: str | Sequence[str], seeds: Sequence[int], **make_kwargs: Any) -> Any:
    """A `datasets.Dataset` with one row per (env, seed): a conversational `prompt` (the env's system prompt and an
    empty user turn that the first observation fills), `seed` and `env_id`; with several envs also `environment`
    (what TRL's dict form of `environment_factory` selects by). The last message also carries `envhub_env` and
    `envhub_seed`, because a `rollout_func` is given prompts only."""
    from datasets import Dataset

    ids = [env_ids] if isinstance(env_ids, str) else list(env_ids)
    rows: dict[str, list[Any]] = {"prompt": [], "seed": [], "env_id": []}
    for env_id in ids:
        system, _ = describe(env_id, **make_kwargs)
        for seed in seeds:
            user = {"role": "user", "content": "", "envhub_env": env_id, "envhub_seed": int(seed)}
            rows["prompt"].append(([{"role": "system", "content": system}] if system else []) + [user])
            rows["seed"].append(int(seed))
            rows["env_id"].append(env_id)
    if len(ids) > 1:
        rows["environment"] = list(rows["env_id"])
    return Dataset.from_dict(rows)


# -- environment_factory ---------------------------------------------------------------------------------------


def environment_factory(env_ids: str | Sequence[str], **make_kwargs: Any) -> type | dict[str, type]:
    """TRL's `environment_factory` for tool envs: a class for one id, or {id: class} for several (then the dataset
    needs its `environment` column, which `dataset()` writes)."""
    if not isinstance(env_ids, str):
        return {env_id: environment_factory(env_id, **make_kwargs) for env_id in env_ids}
    env_id = env_ids
    _, schemas = describe(env_id, **make_kwargs)
    if not schemas:
        raise ConfigError(
            f"{env_id} offers no tools, and TRL's environment_factory plays envs through tool calls only",
            hint="use envhub.integrations.trl.rollout_func for text envs",
        )
    namespace: dict[str, Any] = {
        "__module__": __name__,
        "__doc__": f"envhub's {env_id} as a TRL environment: one method per tool.",
        "env_id": env_id,
        "__init__": _init(env_id, make_kwargs),
        "reset": _reset,
        "get_reward": _get_reward,
        "_act": _act,
    }
    for schema in schemas:
        method = tool_method(schema)
        if method.__name__ in namespace:
            raise ConfigError(f"{env_id} has a tool named {method.__name__!r}, which TRL reserves", hint="rename it")
        namespace[method.__name__] = method
    name = "envhub_" + "".join(c if c.isalnum() else "_" for c in env_id)  # also the name of TRL's reward column
    return type(name, (), namespace)


def _init(env_id: str, make_kwargs: dict[str, Any]) -> Callable[[Any], None]:
    def __init__(self: Any) -> None:
        self._env = envhub.make(env_id, **make_kwargs)
        self._return, self._done, self._steps, self._info = 0.0, True, 0, {}

    return __init__


def _reset(self: Any, **row: Any) -> str:
    """Start the row's episode; TRL appends the returned observation to the prompt's last message."""
    if row.get("env_id") not in (None, self.env_id):
        raise ConfigError(f"a row for {row['env_id']} reached the {self.env_id} environment", hint="check the dataset")
    seed = row.get("seed")
    obs, self._info = self._env.reset(seed=None if seed is None else int(seed), options=row.get("options") or None)
    self._return, self._done, self._steps = 0.0, False, 0
    prompt = row.get("prompt")
    filled = isinstance(prompt, list) and prompt and (prompt[-1] or {}).get("content")
    return f"\n\n{obs}" if filled else obs  # TRL concatenates without a separator


def _get_reward(self: Any) -> float:
    """The episode's return so far (TRL calls it once the model stops calling tools)."""
    return self._return


def _act(self: Any, name: str, arguments: dict[str, Any]) -> str:
    if self._done:
        return EPISODE_OVER
    obs, reward, terminated, truncated, self._info = self._env.step({"name": name, "arguments": arguments})
    self._return += float(reward)
    self._steps += 1
    self._done = bool(terminated or truncated)
    return f"{obs}\n\n{EPISODE_OVER}" if self._done else obs


def tool_method(schema: dict[str, Any]) -> Callable[..., str]:
    """A method whose signature and Google docstring reproduce an OpenAI-style tool schema (TRL reads them back
    with `transformers.utils.get_json_schema`)."""
    function = schema.get("function", schema)
    name = str(function.get("name", ""))
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise ConfigError(f"tool name {name!r} cannot be a Python method", hint="name tools like functions")
    params = function.get("parameters") or {}
    required = set(params.get("required") or [])

    def method(self: Any, **arguments: Any) -> str:
        return self._act(name, arguments)

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    docs = []
    for arg, prop in (params.get("properties") or {}).items():
        annotation = _annotation(prop)
        default = inspect.Parameter.empty if arg in required else prop.get("default")
        parameters.append(
            inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        )
        docs.append(f"    {arg}: {' '.join(str(prop.get('description') or arg).split())}")  # one line per arg
    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = {p.name: p.annotation for p in parameters[1:]} | {"return": str}
    description = " ".join(str(function.get("description") or name).split())
    method.__doc__ = description + ("\n\nArgs:\n" + "\n".join(docs) if docs else "")
    return method


def _annotation(prop: dict[str, Any]) -> Any:
    if prop.get("enum"):
        return Literal[tuple(prop["enum"])]
    kind = prop.get("type", "string")
    if isinstance(kind, list):  # e.g. ["string", "null"]
        inner = [k for k in kind if k != "null"]
        base = _JSON_TYPES.get(inner[0], str) if inner else str
        return Optional[base] if "null" in kind else base  # noqa: UP045 (get_json_schema reads typing.Optional)
    if kind == "array" and isinstance(prop.get("items"), dict):
        return list[_annotation(prop["items"])]
    return _JSON_TYPES.get(kind, str)


# -- rollout_func ----------------------------------------------------------------------------------------------


def rollout_func(
    env_id: str | None = None, *, max_turns: int = 8, max_new_tokens: int = 256, **make_kwargs: Any
) -> Callable[[list[Any], Any], dict[str, Any]]:
    """TRL's `rollout_func`: each prompt (a `dataset()` row's) becomes one whole envhub episode played with the
    trainer's model; the env comes from the prompt (or `env_id`). Pair it with `reward_funcs=env_reward`.

    Generation is batched across the episodes of a call (one `generate` per turn). TRL's `max_completion_length`
    bounds each episode's tokens after the prompt, model and env tokens together.
    """

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        if getattr(trainer, "use_vllm", False):
            raise ConfigError(
                "envhub's rollout_func generates with the trainer's own model, not vLLM",
                hint="set use_vllm=False, or train tool envs through environment_factory (TRL's tool loop uses vLLM)",
            )
        episodes = run_sync(_play_all(prompts, trainer, env_id, max_turns, max_new_tokens, make_kwargs))
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.response_ids for e in episodes],
            "logprobs": None,  # only vLLM importance sampling reads them
            "env_mask": [e.response_mask for e in episodes],
            "env_reward": [e.reward for e in episodes],
            "env_turns": [e.turns for e in episodes],
        }

    return rollout


def env_reward(completions: list[Any], env_reward: list[float], **kwargs: Any) -> list[float]:
    """TRL reward function for `rollout_func`: each episode's return, as the env gave it."""
    return [float(r) for r in env_reward]


async def _play_all(
    prompts: list[Any], trainer: Any, env_id: str | None, max_turns: int, max_new_tokens: int, make_kwargs: dict
) -> list[TokenEpisode]:
    batch = Lockstep(lambda requests: _generate(trainer, requests), live=len(prompts))

    async def one(prompt: Any) -> TokenEpisode:
        try:
            last = prompt[-1] if isinstance(prompt, list) and prompt else {}
            which = env_id or last.get("envhub_env")
            if not which:
                raise ConfigError(
                    "a prompt names no env",
                    hint="build the dataset with envhub.integrations.trl.dataset, or pass env_id",
                )
            env = envhub.make(which, **make_kwargs)
            try:
                seed = last.get("envhub_seed")
                return await play_episode(
                    env,
                    trainer.processing_class,
                    batch.generate,
                    seed=None if seed is None else int(seed),
                    prompt=prompt,
                    max_turns=max_turns,
                    max_response_tokens=trainer.max_completion_length,
                    max_new_tokens=max_new_tokens,
                )
            finally:
                await env.aclose()
        finally:
            batch.leave()

    return list(await asyncio.gather(*(one(p) for p in prompts)))


class Lockstep:
    """Batches the generate calls of episodes played side by side: once every live episode has asked for its next
    turn, one batched call answers them all."""

    def __init__(self, run_batch: Callable[[list[tuple[list[int], int]]], list[list[int]]], live: int) -> None:
        self.run_batch = run_batch
        self.live = live
        self.waiting: list[tuple[list[int], int, asyncio.Future]] = []
        self.batches = 0

    async def generate(self, ids: list[int], max_new_tokens: int) -> tuple[list[int], None]:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((ids, max_new_tokens, future))
        self._run_if_all_asked()
        return await future, None

    def leave(self) -> None:
        """An episode is over: the others no longer wait for it."""
        self.live -= 1
        self._run_if_all_asked()

    def _run_if_all_asked(self) -> None:
        if not self.waiting or len(self.waiting) < self.live:
            return
        waiting, self.waiting = self.waiting, []
        self.batches += 1
        try:
            outputs = self.run_batch([(ids, n) for ids, n, _ in waiting])
        except Exception as exc:
            for *_, future in waiting:
                future.set_exception(exc)
            return
        for (_, _, future), output in zip(waiting, outputs):
            future.set_result(output)


def _generate(trainer: Any, requests: list[tuple[list[int], int]]) -> list[list[int]]:
    """One left-padded `generate` with the trainer's sampling settings; each row cut after its first stop token."""
    import torch
    from trl.models.utils import unwrap_model_for_generation

    tokenizer = trainer.processing_class
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stops = set(getattr(trainer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    width = max(len(ids) for ids, _ in requests)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids, _ in requests])
    attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _ in requests])
    config = copy.deepcopy(trainer.generation_config)  # TRL's sampling settings, with this round's length
    config.max_new_tokens = max(n for _, n in requests)
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, generation_kwargs=trainer.generation_kwargs
        ) as model,
        torch.no_grad(),
    ):
        output = model.generate(
            input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device), generation_config=config
        )
    rows = []
    for (_, n), row in zip(requests, output[:, width:].tolist()):
        end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        rows.append(row[: min(end, n)])
    return rows


def use_tool_template(tokenizer: Any) -> Any:
    """`tokenizer`, given TRL's Qwen2.5 chat template when its own is ChatML without tool calling (as SmolLM2's is):
    same tokens, plus Hermes-style tool calls that TRL can render and parse."""
    require_trl()
    from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling

    if supports_tool_calling(tokenizer):
        return tokenizer
    if "<|im_start|>" not in str(tokenizer.chat_template or ""):
        raise ConfigError(
            "the tokenizer's chat template supports no tool calls and is not ChatML",
            hint="use a model whose template TRL knows (Qwen2.5/3, Llama 3.1+, ...) or set tokenizer.chat_template",
        )
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer
