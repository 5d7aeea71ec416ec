"""reasoning-gym task families as envhub envs: `rg-<task>-v0` for every dataset reasoning-gym registers.

One episode is one question: reset shows the question, the first step is graded and ends it.
- Seeds are dataset indices: `reset(seed=s)` asks item `s % size` of the dataset built with the
  config's `seed` (default 0) and `size` (default 10,000), so a seed names one question forever.
- Config kwargs pass through to the task's own config dataclass (`envhub.make("rg-basic_arithmetic-v0",
  min_terms=3)`); reasoning-gym validates them, and a bad one is one clear error.
- Answer extraction: the text inside the last `<answer>...</answer>` of the reply, as reasoning-gym's
  own `extract_answer` reads it; a reply without tags is graded whole (stripped).
- Reward: the task's own `score_answer(answer, entry)`, unchanged (1.0 correct, partial credit
  where the task gives it).
- Anchor (`info["anchor"]`): the question, named by what makes it: the task, a digest of the dataset's config and
  the item's index, e.g. `task=basic_arithmetic|config=8c02f1d6e9a7b345|index=7`; the graded step's has
  `|answered` after it.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from envhub.core import AgentEnv, state_digest
from envhub.envs.adapters.family import Family, register_family, require, upstream
from envhub.errors import ConfigError, ResetNeeded

FAMILY = Family(
    name="reasoning-gym",
    distribution="reasoning-gym",
    module="reasoning_gym",
    extra="rg",
    prefix="rg-",
    licence="Apache-2.0",
)
DEFAULT_SIZE = 10_000
MAX_SKIPPED = 8  # entries in a row a generator may fail on before reset gives up and says why

SYSTEM_PROMPT = (
    "Solve the problem. Think as needed, then give only the final answer inside <answer></answer> tags, "
    "in the format the question asks for."
)


class ReasoningGymEnv(AgentEnv):
    """One reasoning-gym question per episode, graded by the task's own scorer."""

    system_prompt: ClassVar[str] = SYSTEM_PROMPT
    reward_doc: ClassVar[str] = (
        "the task's own score_answer on the text inside the last <answer></answer> (whole reply if none)"
    )

    def __init__(self, task: str, render_mode: str | None = None, **config: Any) -> None:
        rg = require(FAMILY, f"rg-{task}-v0")
        from reasoning_gym.factory import DATASETS

        if task not in DATASETS:
            raise ConfigError(
                f"reasoning-gym has no task {task!r}", hint="`envhub list --tag reasoning-gym` shows the tasks"
            )
        if task == "composite":  # its datasets come as JSON-friendly dicts: {"name", "weight", "config"}
            config["datasets"] = _composite_specs(config.get("datasets"))
        config.setdefault("seed", 0)
        config.setdefault("size", DEFAULT_SIZE)
        try:
            self.dataset = rg.create_dataset(task, **config)
        except (TypeError, ValueError, AssertionError) as exc:  # reasoning-gym validates configs with asserts
            raise ConfigError(
                f"bad config for reasoning-gym task {task!r}: {exc}",
                hint=f"see the fields of {DATASETS[task][1].__name__} in reasoning-gym",
            ) from None
        except Exception as exc:
            raise upstream(f"reasoning-gym task {task!r}", FAMILY.distribution, exc) from None
        self.task = task
        self.render_mode = render_mode
        self.entry: dict[str, Any] | None = None
        self.index = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        size = len(self.dataset)
        first = seed % size if seed is not None else int(self.np_random.integers(size))
        skipped: list[int] = []
        for k in range(min(size, MAX_SKIPPED + 1)):
            self.index = (first + k) % size
            try:
                self.entry = self._generate(self.index)
                break
            except Exception as exc:  # a generator that fails on some entries (codeio: 2 in 10,000): the next one
                skipped.append(self.index)
                if len(skipped) > MAX_SKIPPED:
                    raise upstream(f"reasoning-gym task {self.task!r}", FAMILY.distribution, exc) from None
        extra = {"skipped_indices": skipped} if skipped else {}
        return self.entry["question"], self.base_info(
            task=self.task, index=self.index, metadata=self.entry.get("metadata", {}), anchor=self.anchor(), **extra
        )

    def _generate(self, index: int) -> dict[str, Any]:
        state = random.getstate()
        random.seed(f"{self.dataset.seed}/{index}")  # some tasks (list_functions) also draw from the global `random`
        try:
            return self.dataset[index]
        finally:
            random.setstate(state)  # the caller's global random stream is left as it was

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.entry is None:
            raise ResetNeeded(f"step() before reset() on rg-{self.task}-v0", hint="call reset() first")
        from reasoning_gym.utils import extract_answer

        text = action if isinstance(action, str) else str(action.get("arguments", action))
        tagged = extract_answer(text)
        answer = tagged if tagged is not None else text.strip()
        try:
            reward = float(self.dataset.score_answer(answer, self.entry))
            score_error = ""
        except Exception as exc:  # some scorers crash on unparsable answers: that answer scores 0
            reward, score_error = 0.0, f"{type(exc).__name__}: {exc}"
        entry, self.entry = self.entry, None
        verdict = "Correct." if reward >= 1.0 else f"Scored {reward:g}. The expected answer was {entry['answer']!s}."
        info = {
            "answer": answer,
            "expected": str(entry["answer"]),
            "extracted_from_tags": tagged is not None,
            "index": self.index,
            "score_error": score_error,
            "anchor": f"{self.anchor()}|answered",
        }
        return verdict, reward, True, False, info

    def anchor(self) -> str | None:
        """The task, a digest of the dataset's config (seed and size included) and the item's index."""
        return f"task={self.task}|config={state_digest(repr(self.dataset.config))}|index={self.index}"

    def render_text(self) -> str:
        return "" if self.entry is None else self.entry["question"]


def _composite_specs(datasets: Any) -> list[Any]:
    """reasoning-gym's DatasetSpec list for the composite task, from dicts (or specs) given as kwargs."""
    from reasoning_gym.composite import DatasetSpec

    if not datasets:
        raise ConfigError(
            "rg-composite-v0 needs datasets",
            hint='pass datasets=[{"name": "basic_arithmetic", "weight": 1, "config": {}}, ...]',
        )
    try:
        return [
            d
            if isinstance(d, DatasetSpec)
            else DatasetSpec(name=d["name"], weight=float(d.get("weight", 1)), config=dict(d.get("config", {})))
            for d in datasets
        ]
    except (TypeError, KeyError, ValueError) as exc:
        raise ConfigError(
            f"bad datasets for rg-composite-v0: {exc!r}",
            hint='each one is {"name": task, "weight": number, "config": {...}}',
        ) from None


def _catalogue() -> list[dict[str, Any]]:
    """Every dataset reasoning-gym registers, read from its factory."""
    require(FAMILY)
    from reasoning_gym.factory import DATASETS

    records = []
    for name, (dataset_cls, _config_cls) in sorted(DATASETS.items()):
        doc = (dataset_cls.__doc__ or "").strip().splitlines()
        category = dataset_cls.__module__.split(".")[1] if dataset_cls.__module__.count(".") >= 2 else "other"
        records.append(
            {"task": name, "category": category, "description": doc[0] if doc else f"reasoning-gym task {name}"}
        )
    return records


def _register(record: dict[str, Any]) -> str:
    from envhub.registry import register

    register(
        f"{FAMILY.prefix}{record['task']}-v0",
        "envhub.envs.adapters.reasoning_gym:ReasoningGymEnv",
        kwargs={"task": record["task"]},
        max_episode_steps=1,
        tags=("reasoning-gym", "rlvr", record["category"], "single-agent"),
        description=record["description"],
        source=FAMILY.distribution,
    )
    return "tasks"


def register_envs() -> None:
    """Entry point: register `rg-<task>-v0` for every installed reasoning-gym task."""
    register_family(FAMILY, _catalogue, _register)
