"""How much of a learner step is signal? Each advantage estimator's gradient noise scale at a checkpoint.

    python benchmarks/gradient_noise.py --config configs/credit-frozenlake.yaml --warm-start DIR
        [--groups 32] [--estimators grpo,gigpo,placebo] [--seed 0] [--set KEY=VALUE ...] [--probe-moves]
        [--out benchmarks/results/gradient_noise.json]

The checkpoint in DIR (an SFT checkpoint of benchmarks/credit_assignment.py, or any saved policy) plays --groups
groups of the config's first task at its rollout settings, all from the same weights (no update between them). For
each estimator the learner then computes each group's gradient alone (`Learner.gradient`: what a step on that group
would apply, before clipping), g_1 .. g_K, and from their dot products:
- `signal_sq`: |G|^2, the squared norm of the expected gradient, estimated without bias by the mean of g_i . g_j over
  pairs i != j (independent groups: E[g_i . g_j] = |G|^2), with its jackknife SE over groups;
- `noise_sq`: tr(Sigma), the variance of one group's gradient, the mean of |g_i|^2 less |G|^2;
- `noise_scale_groups`: B = tr(Sigma) / |G|^2, the gradient noise scale in groups (McCandlish et al., 2018, "An
  Empirical Model of Large-Batch Training", B_simple). A step on b groups has an expected squared signal |G|^2 and
  noise tr(Sigma) / b: signal is the larger part from b > B on. Over s steps at a small lr, signal adds as s and noise
  as sqrt(s), so a run of s steps of b groups has about the signal-to-noise of one step of s * b groups;
- `noise_scale_bound`: the smallest B within 2 SE, tr(Sigma) / (|G|^2 + 2 SE): where no signal shows, how much
  noise a step of b groups at least carries;
- `split_cosine`: the cosine between the mean gradients of two disjoint halves of the groups, averaged over random
  halvings, the same quantity measured directly (expected b / (b + B) for halves of b groups). B counts every part
  of a group's deviation, its size along G too: where groups differ mostly in size (the corridor's grpo gradients),
  the split cosine comes out above b / (b + B), and it is the direct measure of the direction's agreement;
- `split_sign_agreement`: the share of trained weights whose gradient sign agrees between two such halves (0.5: none
  beyond chance). Adam moves each weight by about lr in its gradient's sign at first, whatever the size: this is the
  split cosine as Adam sees it. Both are ratios over few groups and describe a typical draw: the placebo's came out
  at 0.06 and 0.55 on Sokoban with no signal to find. Read `signal_sq` and its SE first;
- `step_signal_share`: b / (b + B), the share of a step's expected squared gradient that is signal, at the config's
  groups per step; `run_signal_share` at groups per step x --steps (a run's worth of groups).
- `top_direction_share`: the Gram matrix's largest eigenvalue over its trace, the share of the groups' gradients
  that lies along one line (whatever each one's sign). Near 1, the groups differ in little but a sign along one
  direction: that direction is the noise, unless its signs agree;
- `first_move_cosines` (with --probe-moves, grid envs: FrozenLake, Sokoban): the first group's first episode's first
  reply rewritten with each move, and the gradient of log p(reply | prompt) for each; per pair of moves a, b, the
  cosine of each group's gradient with log p(a) - log p(b) (None for a tied group), and of the groups' top direction
  (the Gram matrix's leading eigenvector, as |cos|). A group gradient at +-1 with one pair is that group pushing the
  first move's preference and nothing else, on a map other than the probe's;
Each estimator's `gram` (the K x K matrix of g_i . g_j, in the order of `group_rewards`) is kept in the report: every
figure above is a function of it, so a report can be read again (which groups carry the signal) without playing and
differentiating its groups again.
`placebo` (grpo with each group's advantages permuted among its samples, as in credit_assignment.py) is the negative
control: its expected gradient is exactly 0 (a permuted advantage has mean 0 for every sample), so its `signal_sq`
must be 0 within its SE, or the measurement is wrong. Its typical draw is not neutral, though: in a group of 7
successes and 1 failure the failure's large negative advantage lands on a success 7 times in 8, and the failure is
reinforced; the rare draw that keeps it makes up the mean. On the same groups its mean gradient can point against
grpo's (corridor: cosine -0.95). `cosines` gives the cosine between estimators' mean gradients.
Groups whose episodes were left out by error are dropped and counted; every group, tied rewards included, is a group
a step would have taken when `algorithm.filter_zero_variance` is false (as in credit_assignment.py); `tied_groups`
counts them (grpo's gradient on a tied group is 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from credit_assignment import PLACEBO, RUN_ESTIMATORS, placebo_advantages, run_config  # noqa: E402
from learning_parity import WARM_START_RECORD, machine  # noqa: E402

from envhub.errors import ConfigError  # noqa: E402
from envhub.trainer.config import TrainConfig  # noqa: E402
from envhub.trainer.trajectory import Trajectory  # noqa: E402

SPLITS = 64  # random halvings averaged in `split_cosine`


def noise_figures(gram: torch.Tensor) -> dict[str, float | None]:
    """Signal, noise and noise scale from the Gram matrix of K >= 3 independent per-group gradients (float64)."""
    k = gram.shape[0]
    if k < 3:
        raise ConfigError(f"a noise scale needs at least 3 groups' gradients, got {k}", hint="raise --groups")
    diag = torch.diagonal(gram)

    def signal(rows: torch.Tensor) -> float:
        sub = gram[rows][:, rows]
        n = len(rows)
        return float((sub.sum() - torch.diagonal(sub).sum()) / (n * (n - 1)))

    everyone = torch.arange(k)
    signal_sq = signal(everyone)
    noise_sq = float(diag.mean()) - signal_sq
    leave_one = [signal(torch.cat([everyone[:i], everyone[i + 1 :]])) for i in range(k)]
    mean_loo = sum(leave_one) / k
    se = math.sqrt((k - 1) / k * sum((x - mean_loo) ** 2 for x in leave_one))
    return {
        "signal_sq": signal_sq,
        "signal_sq_se": se,
        "noise_sq": noise_sq,
        "noise_scale_groups": noise_sq / signal_sq if signal_sq > 0 else None,  # None: no signal measured
        "noise_scale_bound": noise_scale_bound(signal_sq, se, noise_sq),
    }


def noise_scale_bound(signal_sq: float, se: float, noise_sq: float) -> float | None:
    """The smallest noise scale the measurement allows at 2 SE: tr(Sigma) / (|G|^2 + 2 SE); None when even that
    signal is not positive."""
    top = signal_sq + 2 * se
    return noise_sq / top if top > 0 else None


def split_cosine(gram: torch.Tensor, splits: int = SPLITS, seed: int = 0) -> float:
    """The mean cosine between the mean gradients of two disjoint random halves of the groups."""
    k, rng, cosines = gram.shape[0], random.Random(seed), []
    for _ in range(splits):
        order = rng.sample(range(k), k)
        a, b = torch.tensor(order[: k // 2]), torch.tensor(order[k // 2 : 2 * (k // 2)])
        ab, aa, bb = gram[a][:, b].sum(), gram[a][:, a].sum(), gram[b][:, b].sum()
        cosines.append(float(ab / math.sqrt(max(float(aa * bb), 1e-300))))
    return sum(cosines) / len(cosines)


def split_sign_agreement(grads: list[torch.Tensor], splits: int = 8, seed: int = 0) -> float:
    """The share of coordinates whose sign agrees between the mean gradients of two disjoint random halves, averaged
    over random halvings: 0.5 is no agreement. Adam's first steps move each weight by about lr in the direction of its
    gradient's sign, so this is the split cosine as Adam sees it."""
    k, rng, shares = len(grads), random.Random(seed), []
    for _ in range(splits):
        order = rng.sample(range(k), k)
        a, b = torch.zeros_like(grads[0]), torch.zeros_like(grads[0])
        for i in order[: k // 2]:
            a += grads[i]
        for i in order[k // 2 : 2 * (k // 2)]:
            b += grads[i]
        nonzero = (a != 0) & (b != 0)
        shares.append(float(((a > 0) == (b > 0))[nonzero].float().mean()) if nonzero.any() else 0.5)
    return sum(shares) / len(shares)


def signal_share(groups: float, scale: float | None) -> float:
    """b / (b + B): the share of a `groups`-group gradient's expected squared norm that is signal, which is also the
    expected cosine between two independent gradients of that many groups each (0 when no signal was measured)."""
    return 0.0 if scale is None else groups / (groups + scale)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """The cosine of two flattened gradients, summed in float64 (float32 sums over tens of millions of weights came
    out at 1.003 for parallel vectors)."""
    a64, b64 = a.double(), b.double()
    return float(a64 @ b64 / max(float(a64.norm() * b64.norm()), 1e-300))


def top_direction_share(gram: torch.Tensor) -> float:
    """The largest eigenvalue of the Gram matrix over its trace: the share of the groups' gradients (their squared
    norms, summed) that lies along one direction. Near 1, every group pushes along the same line, whatever its sign."""
    trace = float(torch.diagonal(gram).sum())
    return float(torch.linalg.eigvalsh(gram)[-1]) / trace if trace > 0 else 0.0


def first_move_replies(tokenizer: Any, groups: list[list[Trajectory]]) -> tuple[list[int], dict[str, list[int]]]:
    """The prompt of the first group's first episode's first turn, and that turn's reply rewritten with each move of
    a grid env (the last direction word replaced: "up", "down", "left", "right"), as token ids."""
    from envhub.envs.directions import DIRECTIONS

    episode = groups[0][0]
    if not episode.turn_spans:
        raise ConfigError("--probe-moves: the first episode has no model turn", hint="probe a multi-turn grid env")
    span = episode.turn_spans[0]
    reply = tokenizer.decode(episode.input_ids[span.start : span.end])
    found = list(re.finditer(r"\b(" + "|".join(DIRECTIONS) + r")\b", reply))  # words: not the "up" of "setup"
    if not found:
        raise ConfigError(
            f"--probe-moves: the first reply names no move ({reply[:80]!r})",
            hint="probe an env whose actions are the moves up, down, left and right (FrozenLake, Sokoban)",
        )
    start, end = found[-1].span()
    replies = {
        move: tokenizer.encode(reply[:start] + move + reply[end:], add_special_tokens=False) for move in DIRECTIONS
    }
    return list(episode.input_ids[: span.start]), replies


def move_gradients(learner: Any, prompt: list[int], replies: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """For each move, the gradient of log p(reply | prompt) over the learner's trained weights, flattened as
    `Learner.gradient` flattens a step's gradient (`Learner.flat_grad`)."""
    out = {}
    learner.scorer.train()
    for move, reply in replies.items():
        ids = torch.tensor([prompt + reply])
        mask = torch.zeros_like(ids)
        mask[0, len(prompt) :] = 1
        learner.scorer(ids, torch.ones_like(ids), mask).sum().backward()
        out[move] = learner.flat_grad()
        for p in learner.scorer.parameters():
            p.grad = None
    learner.scorer.eval()
    return out


def move_cosines(grads: list[torch.Tensor], gram: torch.Tensor, moves: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The cosine of each group's gradient (None for a zero gradient: a tied group) and of the groups' top direction
    (the Gram matrix's leading eigenvector) with each pair of moves' difference, log p(a) - log p(b)."""
    _, vectors = torch.linalg.eigh(gram)
    top = torch.zeros_like(grads[0])
    for weight, grad in zip(vectors[:, -1].tolist(), grads):
        top += weight * grad
    names = list(moves)
    out: dict[str, Any] = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            diff = moves[a] - moves[b]
            cos = [cosine(g, diff) if g.any() else None for g in grads]
            out[f"{a}-{b}"] = {
                "top_direction": abs(cosine(top, diff)),
                "groups": [None if c is None else round(c, 4) for c in cos],
            }
    return out


def warm_start_sha256(warm: Path) -> str | None:
    """The weights' SHA-256 in the record of a checkpoint credit_assignment.py made (None for another checkpoint)."""
    record = warm / WARM_START_RECORD
    return json.loads(record.read_text()).get("weights_sha256") if record.exists() else None


async def play_groups(
    config: TrainConfig, model: Any, tokenizer: Any, count: int
) -> tuple[list[list[Trajectory]], int]:
    """`count` groups of the config's tasks played by `model` on its engine, `rollout.concurrent_groups` at a time;
    returns the groups whose episodes all finished without error, and how many were dropped."""
    from envhub.trainer.engines.kinds import engine_kind
    from envhub.trainer.rollout.sources import LocalRollouts
    from envhub.trainer.rollout.tasks import TaskSampler, env_factory
    from envhub.trainer.rollout.worker import RolloutWorker

    kind = engine_kind(config.engine.kind)
    engine = kind.watch(await kind.build(config, model, tokenizer), config)
    try:
        rollouts = LocalRollouts(
            RolloutWorker(engine, tokenizer, config.rollout), {t.env: env_factory(t) for t in config.tasks}
        )
        sampler = TaskSampler(config.tasks, config.seed)
        draws = [sampler.sample() for _ in range(count)]
        gate = asyncio.Semaphore(max(1, config.rollout.concurrent_groups))

        async def one(index: int) -> list[Trajectory] | None:
            task, seed = draws[index]
            async with gate:
                group = await rollouts.play_group(task, seed, f"noise-{index}")
            print(f"group {index + 1}/{count}: rewards {[t.reward for t in group or []]}", flush=True)
            return group

        played = await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await engine.close()
    kept = [g for g in played if g and all(t.finish_reason != "error" for t in g)]
    return kept, count - len(kept)


def measure(config: TrainConfig, model: Any, tokenizer: Any, groups: list[list[Trajectory]], estimator: str,
            seed: int, probe_moves: bool = False) -> tuple[dict[str, Any], torch.Tensor]:  # fmt: skip
    """One estimator's figures over `groups`, and its mean gradient; with `probe_moves`, how far each group's
    gradient is the first move's preference (`move_cosines`)."""
    from dataclasses import replace

    from envhub.trainer.learner.step import Learner

    algorithm = replace(config.algorithm, advantage="grpo" if estimator == PLACEBO else estimator)
    learner = Learner.from_config(replace(config, algorithm=algorithm), model, tokenizer)
    started = time.monotonic()
    grads: list[torch.Tensor] = []
    gram = torch.zeros(len(groups), len(groups), dtype=torch.float64)
    with placebo_advantages(seed) if estimator == PLACEBO else contextlib.nullcontext():
        for i, group in enumerate(groups):
            grads.append(learner.gradient([group]))
            for j in range(i + 1):
                gram[i, j] = gram[j, i] = float(torch.dot(grads[i], grads[j]))
            print(f"{estimator}: gradient {i + 1}/{len(groups)} |g| {math.sqrt(gram[i, i]):.4g}", flush=True)
    mean = torch.zeros_like(grads[0])
    for grad in grads:  # in place: a stack of every group's gradient would double the memory
        mean += grad / len(grads)
    figures = noise_figures(gram)
    per_step = config.algorithm.groups_per_step
    scale = figures["noise_scale_groups"]
    figures |= {
        "split_cosine": split_cosine(gram, seed=seed),
        "split_cosine_expected": signal_share(len(groups) // 2, scale),
        "split_sign_agreement": split_sign_agreement(grads, seed=seed),
        "step_signal_share": signal_share(per_step, scale),
        "mean_grad_norm": float(mean.norm()),
        "group_grad_norm": float(torch.diagonal(gram).sqrt().mean()),
        "group_norms": [round(float(x), 6) for x in torch.diagonal(gram).sqrt()],  # in the order of `group_rewards`
        "gram": gram.tolist(),
        "gradient_s": round(time.monotonic() - started, 1),
        "trained_parameters": int(mean.numel()),
        "top_direction_share": top_direction_share(gram),
    }
    if probe_moves:
        figures["first_move_cosines"] = move_cosines(
            grads, gram, move_gradients(learner, *first_move_replies(tokenizer, groups))
        )
    del grads, learner
    return figures, mean


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/credit-frozenlake.yaml")
    parser.add_argument("--warm-start", required=True, help="the checkpoint directory measured")
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--estimators", default="grpo,gigpo,placebo")
    parser.add_argument("--steps", type=int, default=8, help="a run's steps, for `run_signal_share`")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--probe-moves", action="store_true",
                        help="grid envs: compare each group's gradient with the first move's preferences")  # fmt: skip
    parser.add_argument("--out", default="benchmarks/results/gradient_noise.json")
    args = parser.parse_args(argv)
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    if unknown := [e for e in estimators if e not in RUN_ESTIMATORS]:
        parser.error(f"--estimators: unknown {unknown}; choose from {', '.join(RUN_ESTIMATORS)}")
    if args.groups < 4:
        parser.error(f"--groups must be at least 4 (two halves of two), got {args.groups}")
    warm = Path(args.warm_start)
    if not (warm / "config.json").exists():
        parser.error(f"--warm-start {warm}: no saved model there (no config.json)")
    from envhub.trainer.config import ModelConfig
    from envhub.trainer.models import build_policy

    # the benchmark's run config from the checkpoint (no SFT stage, every group kept); `measure` sets the estimator
    config = run_config(args.config, args.overrides, estimator="grpo", seed=args.seed, steps=args.steps, curve_every=1,
                        eval_episodes=1, model=str(warm))  # fmt: skip
    if args.probe_moves:  # refused before any work: the probe rewrites a reply's move
        from envhub.envs.directions import GridToolEnv
        from envhub.trainer.rollout.tasks import env_factory

        env = env_factory(config.tasks[0])()
        try:
            grid = isinstance(getattr(env, "unwrapped", env), GridToolEnv)
        finally:
            env.close()
        if not grid:
            parser.error(f"--probe-moves: {config.tasks[0].env} is not a grid env whose actions are moves")
    started = time.monotonic()
    model, tokenizer = build_policy(ModelConfig(name=str(warm), dtype=config.model.dtype), config.seed)
    groups, dropped = asyncio.run(play_groups(config, model, tokenizer, args.groups))
    rollout_s = time.monotonic() - started
    rewards = [t.reward for g in groups for t in g]
    report: dict[str, Any] = {
        "config": args.config,
        "overrides": args.overrides,
        "warm_start": str(warm),
        "warm_start_sha256": warm_start_sha256(warm),
        "seed": args.seed,
        "groups": len(groups),
        "dropped_groups": dropped,
        "group_size": config.rollout.group_size,
        "groups_per_step": config.algorithm.groups_per_step,
        "mean_reward": round(sum(rewards) / max(1, len(rewards)), 4),
        "tied_groups": sum(1 for g in groups if len({t.reward for t in g}) == 1),
        "group_rewards": [[t.reward for t in g] for g in groups],
        "rollout_s": round(rollout_s, 1),
        "machine": machine(),
        "estimators": {},
    }
    means: dict[str, torch.Tensor] = {}
    for estimator in estimators:
        figures, means[estimator] = measure(config, model, tokenizer, groups, estimator, args.seed, args.probe_moves)
        figures["run_signal_share"] = signal_share(
            config.algorithm.groups_per_step * args.steps, figures["noise_scale_groups"]
        )
        report["estimators"][estimator] = figures
        print(f"{estimator}: {json.dumps(figures)}", flush=True)
    names = list(means)
    report["cosines"] = {f"{a}:{b}": cosine(means[a], means[b]) for i, a in enumerate(names) for b in names[i + 1 :]}
    report["wall_s"] = round(time.monotonic() - started, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
