"""Credit assignment: which advantage each model token of a group's episodes gets (`algorithm.advantage`).

- `grpo` (Shao et al., 2024): every token of episode i gets A_i = (R_i - mean_j R_j) / (std_j R_j + eps), R_i the
  episode's return, normalised over the G episodes of its group (the division is `algorithm.scale_std`).
- `turn`: turn t of episode i gets its discounted return-to-go G_t^i = sum_{k >= t} gamma^(k - t) r_k^i, normalised
  over every turn of every episode in the group: a reward given at turn t credits the turns up to t, discounted.
- `gigpo` (Feng et al., 2025, "Group-in-Group Policy Optimization for LLM Agent Training", eqs. 4-7): the episode
  advantage A^E_i above, plus `step_weight` (omega) times a step advantage. Turns of the group's episodes that act
  from the same environment state (equal anchor keys) form a step group; turn t's step advantage is its discounted
  return R_t^i (gamma) normalised inside its step group: A^S = (R_t^i - mean) / (std + eps). A turn alone in its
  step group gets A^S = 0, so without repeated states gigpo is grpo.

A turn's reward is what the env gave for its action (`TurnSpan.reward`); what the episode's return holds beyond the
turns' sum (a reward added after the last turn, e.g. a grader's) counts as the last turn's. Std is the population
std, as `group_advantages` (GRPO) has always used; a set whose std is at most `tol` has no signal and gets 0. Model
tokens outside every turn span (an episode cut inside a turn) take the turn that follows them, or the last one.
Equations, papers and defaults: docs/trainer.md, "Credit assignment".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from envhub.trainer.trajectory import Trajectory, TurnSpan

if TYPE_CHECKING:
    import torch

ESTIMATORS = ("grpo", "turn", "gigpo")


@dataclass(frozen=True)
class CreditParams:
    """The estimator and its constants (from an AlgorithmConfig)."""

    advantage: str = "grpo"
    gamma: float = 1.0
    step_weight: float = 1.0
    scale_std: bool = True
    eps: float = 1e-6
    tol: float = 1e-6

    @classmethod
    def from_config(cls, cfg: object) -> CreditParams:
        """The constants of an AlgorithmConfig."""
        return cls(
            advantage=cfg.advantage,  # type: ignore[attr-defined]
            gamma=cfg.gamma,  # type: ignore[attr-defined]
            step_weight=cfg.step_weight,  # type: ignore[attr-defined]
            scale_std=cfg.scale_std,  # type: ignore[attr-defined]
            tol=cfg.zero_variance_tol,  # type: ignore[attr-defined]
        )

    @classmethod
    def from_mapping(cls, algorithm: dict[str, Any]) -> CreditParams:
        """The constants of a run's config.json `algorithm` section (AlgorithmConfig's defaults where a key is
        missing)."""
        from envhub.trainer.config import AlgorithmConfig

        default = AlgorithmConfig()
        return cls.from_config(
            SimpleNamespace(
                advantage=str(algorithm.get("advantage", default.advantage)),
                gamma=float(algorithm.get("gamma", default.gamma)),
                step_weight=float(algorithm.get("step_weight", default.step_weight)),
                scale_std=bool(algorithm.get("scale_std", default.scale_std)),
                zero_variance_tol=float(algorithm.get("zero_variance_tol", default.zero_variance_tol)),
            )
        )


def normalise(values: Sequence[float], p: CreditParams) -> list[float]:
    """(x - mean) / (std + eps) over `values` (the division when `scale_std`); all 0 when std <= tol: GRPO's group
    normalisation (`group_advantages`), over a group of any size."""
    import torch

    from envhub.trainer.learner.advantages import group_advantages

    if not values:
        return []
    tensor = torch.tensor(list(values), dtype=torch.float64)
    return group_advantages(tensor, len(values), scale_std=p.scale_std, eps=p.eps, tol=p.tol).tolist()


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = sum_{k >= t} gamma^(k - t) r_k for every t."""
    out = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def turns_of(traj: Trajectory) -> list[TurnSpan]:
    """The episode's turns for credit (`with_residual`); an episode recorded without spans is one turn over its
    model tokens, in an anchor group of its own."""
    if not traj.turn_spans:
        model = [i for i, m in enumerate(traj.loss_mask) if m]
        start, end = (model[0], model[-1] + 1) if model else (0, 0)
        return [TurnSpan(start, end, float(traj.reward), f"episode:{id(traj)}")]
    return with_residual(traj.turn_spans, float(traj.reward))


def with_residual(spans: Sequence[TurnSpan], episode_return: float) -> list[TurnSpan]:
    """`spans` with what the episode's return holds beyond their rewards added to the last one."""
    spans = list(spans)
    residual = episode_return - sum(s.reward for s in spans)
    if spans and abs(residual) > 1e-12:
        last = spans[-1]
        spans[-1] = TurnSpan(last.start, last.end, last.reward + residual, last.anchor)
    return spans


def turn_advantages(group: Sequence[Trajectory], p: CreditParams) -> list[list[float]]:
    """Per episode of `group`, one advantage per turn (`turns_of`) under `p.advantage`."""
    return advantages_of([float(t.reward) for t in group], [turns_of(t) for t in group], p)


def advantages_of(episode_returns: Sequence[float], turns: list[list[TurnSpan]], p: CreditParams) -> list[list[float]]:
    """Per episode, one advantage per turn, from the group's returns and turns (the equations in the docstring)."""
    episode = normalise(episode_returns, p)
    if p.advantage == "grpo":
        return [[a] * len(ts) for a, ts in zip(episode, turns)]
    returns = [discounted_returns([s.reward for s in ts], p.gamma) for ts in turns]
    if p.advantage == "turn":
        flat = normalise([g for rs in returns for g in rs], p)
        out, at = [], 0
        for rs in returns:
            out.append(flat[at : at + len(rs)])
            at += len(rs)
        return out
    if p.advantage != "gigpo":
        raise ValueError(f"unknown advantage estimator {p.advantage!r}; expected one of {', '.join(ESTIMATORS)}")
    step = step_advantages(turns, returns, p)
    return [[e + p.step_weight * s for s in steps] for e, steps in zip(episode, step)]


def step_advantages(turns: list[list[TurnSpan]], returns: list[list[float]], p: CreditParams) -> list[list[float]]:
    """GiGPO's A^S: each turn's discounted return normalised inside its anchor group (0 for a singleton)."""
    members: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for i, ts in enumerate(turns):
        for t, span in enumerate(ts):
            members[span.anchor].append((i, t))
    out = [[0.0] * len(ts) for ts in turns]
    for places in members.values():
        for (i, t), a in zip(places, normalise([returns[i][t] for i, t in places], p)):
            out[i][t] = a
    return out


def anchor_share(groups: Sequence[Sequence[Trajectory]]) -> tuple[float, int]:
    """The share of the step's turns whose anchor state recurs in their group (step groups of size >= 2), and the
    number of turns."""
    shared = total = 0
    for group in groups:
        counts: dict[str, int] = defaultdict(int)
        turns = [s for t in group for s in turns_of(t)]
        for span in turns:
            counts[span.anchor] += 1
        total += len(turns)
        shared += sum(counts[s.anchor] >= 2 for s in turns)
    return (shared / total if total else 0.0), total


def token_advantages(traj: Trajectory, per_turn: Sequence[float]) -> torch.Tensor:
    """[len(input_ids)]: each turn's advantage on its tokens; model tokens between spans take the next turn's."""
    import torch

    turns = turns_of(traj)
    out = torch.zeros(len(traj.input_ids), dtype=torch.float32)
    begin = 0
    for span, a in zip(turns, per_turn):
        out[begin : span.end] = a
        begin = span.end
    if turns:
        out[begin:] = per_turn[len(turns) - 1]
    return out * torch.tensor(traj.loss_mask, dtype=torch.float32)


def has_signal(group: Sequence[Trajectory], p: CreditParams) -> bool:
    """True when some turn of `group` gets a nonzero advantage (grpo: the episode returns differ)."""
    return any(abs(a) > 0.0 for per in turn_advantages(group, p) for a in per)


def credit_signal(cfg: object) -> Callable[[Sequence[Trajectory]], bool] | None:
    """The queue's test for a group worth training under an AlgorithmConfig's estimator (None: returns differ)."""
    p = CreditParams.from_config(cfg)
    if p.advantage == "grpo":
        return None
    return lambda group: has_signal(group, p)


def recorded_advantages(episode: dict[str, Any], episodes: Sequence[dict[str, Any]], p: CreditParams) -> list[float]:
    """Per model turn of a recorded episode (an episodes.jsonl line), the advantage the learner gives it: computed
    over the episodes of its group the learner keeps (not cancelled, not cut by the watchdog), from each turn's
    recorded span, reward and anchor. [] when the episode has no recorded turns or is not in such a group."""

    def turns(record: dict[str, Any]) -> list[TurnSpan]:
        log = [t for t in record.get("log") or [] if isinstance(t, dict) and t.get("kind") == "turn" and "span" in t]
        spans = [TurnSpan(*t["span"], float(t.get("reward") or 0.0), str(t.get("anchor"))) for t in log]
        return with_residual(spans, float(record.get("reward") or 0.0))

    group = [
        e
        for e in episodes
        if e.get("group_id") == episode.get("group_id") and e.get("finish_reason") not in ("cancelled", "timeout")
    ]
    if not episode.get("group_id") or not any(e is episode for e in group):
        return []
    advantages = advantages_of([float(e.get("reward") or 0.0) for e in group], [turns(e) for e in group], p)
    return next(a for e, a in zip(group, advantages) if e is episode)
