"""Does step-level credit learn faster than episode-level GRPO? Each estimator trained from the same SFT checkpoint
for the same learner steps, on multi-turn envs where credit matters, with held-out learning curves.

    python benchmarks/credit_assignment.py --config configs/credit-frozenlake.yaml --seeds 0,1,2
        [--estimators grpo,gigpo,turn,placebo] [--steps 20] [--curve-every 5] [--eval-episodes 64]
        [--warm-start DIR] [--runs-dir benchmarks/results/credit_runs] [--set KEY=VALUE ...]
    python benchmarks/credit_assignment.py --merge benchmarks/results/credit_runs/*.json
        [--out benchmarks/results/credit_assignment.json]

The positive control (configs/corridor-tiny.yaml: the tiny model fine-tuned once on a demonstrator that wastes half
its turns, then RL from that checkpoint; evaluation sampled at the config's temperature, with 4 turns for 4 squares):

    python benchmarks/credit_assignment.py --config configs/corridor-tiny.yaml --seeds 20,21,22,23,24,25,26,27,28,29
        --estimators grpo,gigpo --steps 8 --curve-every 4 --eval-episodes 256
        --runs-dir benchmarks/results/credit_corridor --out benchmarks/results/credit_corridor.json

Its settings and power, fixed before the decisive run (2026-11-28, after pilots on seeds 0-1, not in the set): from
the SFT checkpoint (0.211 held-out), lr 2e-4, grpo reached 0.54/0.43 at step 3, 0.69/0.68 at 6, 0.82/0.87 at 12;
gigpo 0.68/0.67, 0.91/0.90, 0.98/0.99 (gigpo - grpo +0.22 at step 6, +0.14 at 12; SD between seeds ~0.03). The set
runs 8 steps; at an SD of even 0.1, 10 seeds give an SE near 0.03. Goal (issue 44): gigpo - grpo >= 0.1 at equal
steps, beyond 2 SE. Earlier designs, in docs/trainer.md: without SFT the tiny model's runs were bimodal (a first
decisive set on seeds 20-29 at lr 2e-3 was stopped after one seed, -0.75), and the corridor without spare turns
showed no difference.

Each run (config, estimator, seed) is saved to its own file in --runs-dir the moment it ends, so the decisive set is
run over several sittings and merged. A run: the config's SFT stage runs once per config (its own seed) and is saved
to --warm-start (default: beside the runs); every run starts from it with `algorithm.advantage` set to the estimator,
the seed replaced, `budget.steps` exactly (no wall-time stop; zero-variance groups kept, as in learning_parity.py, so
no run stops early as converged), a checkpoint every --curve-every steps, and greedy held-out evaluation of the
checkpoint (step 0) and of every saved step: the learning curve. Greedy, step 0 is the same figure for every run of a
config (one checkpoint, the same held-out seeds), so it is evaluated once and kept beside the runs
(`*-sft-heldout-*.json`); a sampled evaluation is a fresh draw, evaluated per run as before. The last step is the
trainer's own final evaluation, not evaluated again from its checkpoint. Success is the mean held-out reward (1.0 =
solved on these envs).
`placebo` in --estimators is a control, not an estimator: grpo with each group's advantages permuted among its samples
(seeded by the run's seed), so its updates have grpo's sizes and no credit. Its curve is what the learner's noise does
at the config's lr and batch; the merge reports `placebo_minus_grpo` beside the estimators (without a goal).
Each run file also counts the distinct action sequences its final held-out episodes played, and the share of the
commonest one (`final_sequences`): a policy settled on one replay has a share near 1; and, per learner step, the
training batch's mean reward and the gradient's norm (`train`).

The merge writes, per env: each estimator's mean curve over seeds, steps to reach the SFT checkpoint's success + 0.1
(first curve point of the mean curve at or above it, null if none), the mean anchor share of its learner steps, and
`<estimator>_minus_grpo: {mean, se, seeds}`, the final success paired by seed (same checkpoint, same held-out
episodes). Goal (issue 44): a step-level estimator beats grpo by >= 0.05 on both envs, beyond 2 SE.

Power, fixed before the decisive run: 2 SE of the paired difference <= 0.05, i.e. SE <= 0.025. Per seed the
difference's variance is the evaluation's (the same n held-out episodes for both, greedy: at most 2 p (1 - p) / n =
0.0078 at p = 0.5, n = 64) plus the training's (two runs of one seed differ by their sampled episodes). The training
part is taken from this repository's learning-parity runs, whose paired per-seed differences have an SD of about 0.12
on 48 held-out episodes (learning_parity_40seeds_staleness0.5.json: SE 0.020 over 40 seeds, of which ~0.07 is
evaluation): SD of the difference ~0.13, so n_seeds >= (0.13 / 0.025)^2 = 27 seeds per env, at 64 held-out episodes
per run. A pilot's measured SD replaces 0.13 only if it was written here before the decisive set began.

Pilot (2026-12-02, seed 100, not in any decisive set; benchmarks/results/credit_pilot/), on a 2-core EPYC:
- FrozenLake 4x4, 10 turns (the config's first design): the SFT checkpoint solved 1 of 43 greedy held-out episodes,
  and a step took 143-151 s, the learner's (17-22k padded tokens for 2-4k model tokens). Replaced by 3x3, 6 turns.
- FrozenLake 3x3, 6 turns (configs/credit-frozenlake.yaml), 8 steps at lr 1e-5: the checkpoint 0.672 held-out;
  grpo 0.578 at step 4, 0.547 at 8; gigpo 0.672, 0.547; anchor share 0.97 for both; 43-75 s a step; 844 and 934 s a
  run, 3 evaluations of 82-90 s included. Greedy held-out success fell under both estimators: before a decisive set,
  a pilot over a few seeds must find the lr and steps at which RL raises it (none is fixed yet).
- Sokoban (configs/credit-sokoban.yaml), the SFT checkpoint's greedy held-out success: 6x6, 4+ moves, 12 turns, SFT
  on 32 episodes x 1 epoch: 0.000 of 64, and 23 of 32 training episodes passed the 120 s watchdog; 6x6 with SFT on
  96 x 2 epochs (549 s): 0.125 of 16; 5x5, 3+ moves, 8 turns, SFT 96 x 2: 0.812 of 16, training episodes 0.44
  solved, anchor share 1.0, 116 s a step. The config is the 5x5 one.
Pilot 2 (2026-12-02, seed 101, grpo, 12 steps from the same SFT checkpoint, 0.672; /tmp, not kept): lr 3e-6 gave
0.656 at step 4, 0.609 at 8, 0.547 at 12 (1,093 s); lr 3e-5 was stopped at step 6, its training episodes having
collapsed onto move sequences that start down (step 5: 8 of 16 episodes "DDRR", 0.88 solved; step 6: 0 of 15).
Why greedy held-out success falls at every lr, under both estimators, to the same 35 of 64: on a 3x3 lake with 20%
holes, replaying one shortest move sequence without reading the map solves 0.58-0.59 of held-out lakes
(`benchmarks/frozen_lake_ceilings.py`, 2,000 maps; 0.587 on 1,000 with 6 turns), and the SFT checkpoint is only
0.08 above that. Sampled episodes that succeed share such a replay more than anything else, so RL finds it first and
greedy success falls toward its rate: this lake measures how fast a policy collapses, not credit. With 40% holes
(6 turns, 1,000 maps) the best replay solves 0.39, reading one square ahead 0.87, the solver 1.0; but the SFT
checkpoint of this config (32 expert episodes, 1 epoch) solved 0.359 of 64 there, no better than a replay. Before
the decisive set: an SFT stage that reads the map (well above the replay's rate), and a pilot where RL raises greedy
held-out success; no setting is fixed yet.
Pilot 3 (2026-12-03, grpo, 8 steps, seeds 100-103, none in a set; /tmp, not kept): the 3x3 lake with 40%
holes and `neighbours: true` (a line naming the four squares around the player), SFT on 96 solver episodes x 2
epochs (loss 0.240 -> 0.019). The checkpoint: 0.422 greedy held-out, 0.469 sampled at T=1 (a replay solves 0.39
there, reading one square ahead 0.87). Greedy, lr 1e-5, 2 groups a step: 0.422 -> 0.359 (step 4) -> 0.328 (step 8).
Sampled, lr 1e-5, 2 groups: 0.469 -> 0.469 -> 0.375. Sampled, lr 2e-5, 4 groups: 0.469 -> 0.438 -> 0.422 (1,199 s).
Anchor share 0.85-1.0 a step; training batches 0.13-1.0 solved with no trend. A weaker start on the 20% lake (SFT on
16 episodes, 1 epoch: 0.000 greedy held-out, episodes using all 6 turns) stayed at 0.00-0.06 solved in its 8
training batches and at 0.000 held-out at steps 4 and 8 (1,352 s). Greedy, lr 1e-5, 8 groups of 4 a step (seed 103):
0.422 -> 0.359 -> 0.328, the same held-out figures as the first run (21 of 64 at step 8), as if both had settled on
one move sequence (not checked: the runs' episodes were not kept). So RL from these starts did not raise held-out
success within 8 steps, at either lr, batch shape or evaluation temperature; the decisive set still waits for a
pilot where it does.
Pilot 4 (2026-12-03, Sokoban 5x5 of configs/credit-sokoban.yaml, seed 100, grpo, lr 1e-5; /tmp, not kept): the SFT
checkpoint (96 x 2, the same weights as the first pilot's) solved 0.578 of 64 greedy held-out levels. Checks of the
pipeline and of the noise, from that checkpoint:
- lr 1e-12, 2 steps: 0.578 at steps 1 and 2, the checkpoint's own figure through both evaluation paths (the
  benchmark's of a saved checkpoint, the trainer's final one). The falls are the updates', not the measurement's.
- grpo, the same seed twice: 0.578 -> 0.422 (step 4) -> 0.422 (step 8, 1,225 s; 9 distinct move sequences in 64, the
  commonest 0.22), and 0.578 -> 0.578 at step 4. Two runs of one seed differ by 0.16 at step 4: training noise alone
  gives an SD near 0.11 a run, so the 0.13 of the power calculation is not pessimistic.
- placebo, 4 steps: grpo with each group's advantages permuted among its episodes (the same sizes, no relation to
  what the episodes did): 0.578 -> 0.312. Updates of pure noise at this lr and batch (16 episodes a step) cost more
  held-out success than either grpo run lost. Adam moves every trained weight by about lr a step whatever the
  gradient's size, so a noisy gradient is applied in full; grpo's signal offsets part of it. This fits every fall
  seen so far better than the replay reading does (Sokoban has no replay to find); it is one run of each, not tested.
- grpo at lr 3e-6, 8 steps: 0.578 at steps 4 and 8 (2,084 s, beside a CI suite): the greedy policy did not move,
  as the demo saw at 2e-6. Between "no change" and "noise" there was no lr at which Sokoban's held-out success rose.
Pilot 5 (2026-12-03, seed 100, grpo, lr 1e-5): the 3x3 lake with 40% holes, the neighbour line and `random_ends`
(start and goal drawn for each map: the best of 256 replays solves 0.227, a safe move toward the goal 0.949), SFT on
96 solver episodes x 2 epochs (loss 0.298 -> 0.052, 342 s): the checkpoint solved 0.047 of 64 greedy held-out lakes,
below any replay. grpo raised it to 0.141 at step 4 and 0.250 at step 8 (751 s; anchor share 0.99; 19 distinct move
sequences in the final 64 episodes, the commonest 0.36): the first pilot in which RL raised held-out success, and the
setting configs/credit-frozenlake.yaml now holds. Whether 0.25 is reading or the start of a replay (0.227) is open.
gigpo from the same checkpoint and seed: 0.047 at step 4, 0.141 at step 8 (1,003 s beside a CI suite; 14 distinct
sequences, the commonest 0.16). gigpo - grpo = -0.11 on one seed, inside one run's noise (SD ~0.11): nothing decided.
Pilot 6 (2026-12-03, lr 1e-5, 8 steps of 2 groups of 8, seeds 100-102, none in a set;
benchmarks/results/credit_pilot/frozenlake-random-ends-*): the lake of pilot 5 (configs/credit-frozenlake.yaml), its
SFT checkpoint rebuilt bit for bit (the same weights' SHA-256, db9a383c), step 0 0.047 for every run; 591-762 s a run.
| seed | grpo (step 4, 8) | gigpo | placebo |
|---|---|---|---|
| 100 | 0.141, 0.250 | 0.047, 0.141 | 0.188, 0.141 |
| 101 | 0.141, 0.172 | 0.109, 0.109 | 0.047, 0.047 |
| 102 | 0.078, 0.109 | 0.109, 0.141 | 0.219, 0.172 |
| mean | 0.120, 0.177 +- 0.041 | 0.089, 0.130 +- 0.010 | 0.151, 0.120 +- 0.038 |
gigpo - grpo -0.047 +- 0.041 (SD of the paired difference 0.071), placebo - grpo -0.057 +- 0.060 (SD 0.104), over 3
seeds. Updates that carry no credit raised this checkpoint on two seeds of three, and about as far as grpo's did
(means 0.151 at step 4, 0.120 at step 8): its greedy policy (0.047) is below what its own samples solve (0.06-0.19 of
pilot 5's training batches), and an update that reinforces its samples, whichever they are, can move greedy play
toward them. So from this start the lake measures a regression toward the sampled policy more than credit, and
pilot 5's 0.250 is the high end of three seeds. The SD of 0.071 rests on 2 degrees of freedom: it does not replace
the 0.13 above. gigpo without the std division (`--set algorithm.scale_std=false`, verl-agent's default `mean_norm`;
run files *-gigpo-meannorm-*, which also hold each step's batch reward and gradient norm): 0.250 at step 4 and 0.125
at 8 on seed 100, 0.047 throughout on seed 101 (697 and 747 s), no different. At this batch (16 episodes a step) and
8 steps, neither env separates grpo from a placebo: before a decisive set, a setting must do so over a few seeds.
A better start for the lake: SFT on the same 96 solver episodes for 4 epochs instead of 2 (loss 0.298 -> 0.037, 564
s) solved 0.312 of the 64 greedy held-out lakes (above the best replay's 0.227), while its first training batch
(16 episodes at T=1) solved 0.188: greedy play no longer below its samples. One grpo step later: 0.344, 25 distinct
move sequences in 64, the commonest 0.14 (benchmarks/results/credit_pilot/frozenlake-random-ends-sft96x4-*). The
config now trains 4 epochs.
Gradient noise (2026-12-03, benchmarks/gradient_noise.py; benchmarks/results/gradient_noise/): how much of a step
is signal, measured at the checkpoints instead of through 27-seed runs. Each group's gradient alone, on the same
groups for every estimator; |G|^2 is the expected gradient's squared norm (unbiased, jackknife SE), tr Sigma one
group's variance, B = tr Sigma / |G|^2 the noise scale in groups (a step of b groups is b / (b + B) signal):
| checkpoint | estimator | |G|^2 (SE) | tr Sigma | 2-SE bound on B |
|---|---|---|---|---|
| lake, 4-epoch SFT (0.312), 32 groups | grpo | -0.0009 (0.0007) | 0.063 | B > 114 |
| | gigpo | -0.0040 (0.0037) | 0.237 | B > 71 |
| | placebo | -0.0005 (0.0006) | 0.025 | (0 expected) |
| Sokoban 5x5, SFT 96x2 (0.578), 24 groups | grpo | 0.0006 (0.0009) | 0.0175 | B > 7 (estimate 29) |
| | gigpo | 0.0018 (0.0036) | 0.066 | B > 7 (estimate 36) |
| | placebo | -0.00002 (0.0005) | 0.013 | (0 expected) |
| corridor, tiny model (the positive control's start), 32 groups | grpo | 1.13 (0.56) | 2.65 | estimate 2.3 |
| | gigpo | 24.9 (1.9) | 2.30 | estimate 0.09 |
| | placebo | 0.002 (0.034) | 0.56 | (0 expected) |
On the corridor, where gigpo beat grpo by 0.2 in 8 steps of 4 groups, both estimators' halves of 16 groups point
the same way (split cosine 0.98 and 0.997) and the placebo's signal is 0 within its SE: the measurement finds signal
where learning happened. From the lake checkpoint no estimator's expected gradient is measurable in 32 groups (256
episodes): a pilot's 8 steps of 2 groups are under 13% signal (16 / (16 + 114)), and the same holds for gigpo, so
pilot 6's differences were noise by construction. On Sokoban a pilot run is 35% signal at grpo's estimate (B 29),
which is itself within 1 SE of no signal. (The halves' sign agreement was 0.55-0.56 for grpo, gigpo and the placebo
alike: the ratios describe a typical draw, and only |G|^2 with its SE tells signal from none.)
The lake's signal is small because its maps differ: what raises success on one map (a move) is noise on the others,
and what carries over (reading the neighbour line) is a small part of each group's gradient. A decisive set where
grpo's runs are mostly signal needs several B groups a run: on Sokoban ~8 groups a step for 8 steps (64 episodes a
step, ~7 min a step here, ~1 h a run, ~55 CPU-hours for 27 seeds x 2 estimators); on the lake above 114 groups a
run. Neither fits this CPU's sittings; a GPU's do (the H200 check, benchmarks/results/gpu_check_h200.json: a
learner step on 64 episodes of SmolLM2's shape in 1.1 s, 64 replies of 256 tokens generated in 2.4 s).
The screen of 2026-12-04 (benchmarks/results/gradient_noise/, 2-core EPYC, nothing else running but the other
measurements): the lake with fixed corners, the neighbour line and SFT on 96 solver episodes x 4 epochs, at 40% and
20% holes; and Sokoban's checkpoint again (rebuilt bit for bit, 1a4ea59e) on 40 fresh groups (--seed 1):
| checkpoint (sampled success, tied groups) | estimator | |G|^2 (SE) | tr Sigma | 2-SE bound on B | top direction |
|---|---|---|---|---|---|
| lake 40%, fixed corners (0.52, 6 of 24) | grpo | -0.0036 (0.0021) | 0.109 | B > 188 | |
| | gigpo | -0.0096 (0.0069) | 0.329 | B > 78 | |
| lake 20%, fixed corners (0.72, 12 of 24) | grpo | 0.0004 (0.0034) | 0.040 | B > 5.6 | 0.91 |
| | gigpo | 0.0015 (0.0130) | 0.154 | B > 5.6 | 0.92 |
| Sokoban 5x5, 40 more groups (0.38, 3 of 40) | grpo | -0.00008 (0.00042) | 0.0185 | B > 24 | 0.49 |
| Sokoban 5x5, SFT 1 epoch instead of 2 (0.36, 4 of 24) | grpo | 0.00017 (0.00062) | 0.0159 | B > 11 | 0.38 |
(gigpo's measurements on Sokoban were stopped for the sitting's time; the reports, rebuilt from the runs' logs, say
so. The 1-epoch start, a guess at one that wastes more moves, samples about as well as the 2-epoch one.) No estimator's
expected gradient shows on any of them. Sokoban's two measurements together (64 groups, 512
episodes; inverse-variance weighted): |G|^2 = 0.00004 +- 0.00038 for grpo, so B > 22 groups at 2 SE, and the
estimate of 29 from 24 groups is not confirmed: a run of 8 steps of 2 groups is at most 41% signal.
Why the lakes' B is so large, measured (`--probe-moves`, the lake with 20% holes, 16 fresh groups, 11 tied): the
groups' gradients lie along one line (`top_direction_share` 0.93 of their squared norms), and that line is the first
move's preference. The gradient of log p(down) - log p(right) at the first turn of one group's map has a cosine of
+1.00, +0.83, -0.98, +1.00 and -0.83 with the 5 untied groups' gradients (other maps), and 0.989 with their top
direction. Each group pushes "go down first" or "go right first", by which first move won on its map; the signs
differ from map to map and cancel in expectation, and the part that carries over (choose the move the map allows)
is a sliver beside it. The SFT checkpoint's first move hardly depends on the map in the gradient's eyes, so RL
reads a map only through many groups, and a run of few groups walks along the preference line toward one replayed
move order, the fall toward a replay every lake pilot saw. Sokoban's gradients are less one-lined (0.49 in the top
direction), and the probe (12 fresh groups, --seed 2, 1 tied) finds the same kind of push spread over more moves: the
top direction's |cosine| is 0.79 with log p(up) - log p(left) and 0.76 with up - right, and each untied group's
gradient has a cosine of 0.52 to 0.80 in size with some pair of moves, its sign by level. Since the probe's prompt is
one level's first turn and the groups played others, what the groups push is a move's preference whatever the
state; what a level asks for (read the room) is what is left, and it does not show in 64 groups.
Cost, measured: a run of 20 steps and 5 curve points is ~25 min on a 2-core CPU (20 x ~60 s, 3 evaluations; step 0
and the last come free), so 27 seeds x 3 estimators x 2 envs is ~65 hours (~45 with grpo and gigpo only): outside
CI, on whatever machines are free, merged with --merge.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from learning_parity import apply_override, machine, mean_se, warm_start_checkpoint  # noqa: E402

from envhub.errors import ConfigError  # noqa: E402
from envhub.trainer.config import TrainConfig, config_from_dict  # noqa: E402
from envhub.trainer.learner.credit import ESTIMATORS  # noqa: E402
from envhub.trainer.run.metrics import learner_stat  # noqa: E402
from envhub.trainer.run.record import read_episodes  # noqa: E402

TARGET_GAIN = 0.1  # "steps to reach SFT + 0.1"
# `placebo`: grpo whose group advantages are permuted among the group's samples, a control of what updates of the same
# size do when they carry no credit at all (the learner's noise at this lr and batch)
PLACEBO = "placebo"
RUN_ESTIMATORS = (*ESTIMATORS, PLACEBO)


def run_config(path: str, overrides: list[str], *, estimator: str, seed: int, steps: int, curve_every: int,
               eval_episodes: int, model: str | None, before: bool = True) -> TrainConfig:  # fmt: skip
    """The config with --set overrides, then this run's estimator, seed, steps, checkpoints and evaluation."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    for assignment in overrides:
        apply_override(data, assignment)
    data["seed"] = seed
    algorithm = data.setdefault("algorithm", {})
    algorithm["advantage"] = "grpo" if estimator == PLACEBO else estimator
    algorithm["filter_zero_variance"] = False
    data.setdefault("budget", {}).update(
        steps=steps, checkpoint_every=curve_every, checkpoint_keep=0, max_time_s=0.0, max_run_s=0.0
    )
    evaluation = data.setdefault("evaluation", {})
    # greedy, unless the config samples its evaluation (a task whose prompt is the same for every seed, the corridor)
    evaluation.update(episodes=eval_episodes, temperature=evaluation.get("temperature", 0.0), before=before,
                      after_sft=False)  # fmt: skip
    if model is not None:  # RL from the shared SFT checkpoint: no SFT stage of its own
        data.setdefault("model", {})["name"] = model
        data.pop("sft", None)
    return config_from_dict(data)


async def heldout(config: TrainConfig, model_dir: Path, label: str) -> Any:
    """The held-out evaluation (`PolicyEval`) of the checkpoint in `model_dir` under `config`'s evaluation settings;
    a warning printed, naming `label`, when episodes were left out by error."""
    from envhub.trainer.config import ModelConfig
    from envhub.trainer.evaluation import evaluate_policy
    from envhub.trainer.models import build_policy

    model, tokenizer = build_policy(ModelConfig(name=str(model_dir), dtype=config.model.dtype), config.seed)
    result = await evaluate_policy(model, tokenizer, config)
    warning = result.warning(label, config.evaluation.episode_timeout_s)
    if warning:
        print(f"warning: {warning}", flush=True)
    return result


def shared_start(config: TrainConfig, warm: Path, weights_sha256: str, runs_dir: Path) -> dict[str, Any] | None:
    """The SFT checkpoint's greedy held-out success (every curve's step 0), evaluated once and kept in a file.

    Every run of a config starts from the same checkpoint, and greedy evaluation plays the same held-out seeds
    (`evaluation.seed`, not the run's seed), so step 0 is the same figure for every estimator and seed (~2 min of a
    run on a 2-core CPU). A sampled evaluation (temperature > 0) is a fresh draw: None, each run evaluates its own.
    """
    if config.evaluation.temperature > 0:
        return None
    settings = {
        "weights_sha256": weights_sha256,
        "tasks": [{"env": t.env, "kwargs": t.kwargs} for t in config.tasks],
        "evaluation": {k: getattr(config.evaluation, k) for k in ("episodes", "seed", "max_turns", "temperature")},
        "rollout": {k: getattr(config.rollout, k) for k in ("max_turns", "max_new_tokens", "max_total_tokens")},
    }
    key = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]
    path = runs_dir / f"{Path(warm).name}-heldout-{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    started = time.monotonic()
    result = asyncio.run(heldout(config, warm, "step 0"))
    success, left_out = result.overall(), result.left_out()
    record = {"settings": settings, "success": round(success, 4), "left_out": left_out,
              "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip
    if left_out:  # not kept: a later sitting (with a longer evaluation.episode_timeout_s) evaluates it again
        print(f"step 0 (the SFT checkpoint): {success:.3f} held-out over the episodes left; not kept", flush=True)
        return record
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2))
    print(f"step 0 (the SFT checkpoint, once for every run): {success:.3f} held-out, {path.name}", flush=True)
    return record


async def checkpoint_curve(config: TrainConfig, run_dir: Path, last: int) -> tuple[dict[int, float], int]:
    """Held-out mean reward of every saved checkpoint of a run before step `last` (the run's own evaluation
    settings; the trainer's final evaluation measured `last`), and the held-out episodes left out by error."""
    curve, left_out = {}, 0
    for path in sorted((run_dir / "checkpoints").glob("step_*")):
        step = int(path.name.split("_")[1])
        if step >= last:
            continue
        result = await heldout(config, path, f"step {step}")
        curve[step], left_out = result.overall(), left_out + result.left_out()
    return curve, left_out


def sequence_spread(eval_dir: Path) -> dict[str, Any] | None:
    """How many distinct action sequences the held-out episodes recorded in `eval_dir` played, and the share that
    played the commonest one: a policy that collapsed onto one replay has a share near 1. None when no episode is
    recorded there. `read_episodes` reads the evaluation's record shape and skips a line torn by a crash."""
    sequences = Counter(
        tuple(entry["text"] for entry in episode["log"] if entry["kind"] == "turn")
        for episode in read_episodes(eval_dir)
    )
    if not sequences:
        return None
    return {"distinct": len(sequences), "top_share": round(sequences.most_common(1)[0][1] / sequences.total(), 4)}


@contextlib.contextmanager
def placebo_advantages(seed: int) -> Iterator[list[int]]:
    """While open, the in-process learner's grpo advantages come permuted within each group (a torch generator seeded
    by `seed`): the same values, given to samples they say nothing about. Yields a one-item list counting the groups
    permuted; a placebo run that counted none did not run the placebo (a learner outside this process), and
    `train_one` refuses its result."""
    import torch

    from envhub.trainer.learner import step

    original, generator, groups = step.sample_advantages, torch.Generator().manual_seed(seed), [0]

    def permuted(group: Any, **kwargs: Any) -> Any:
        advantages = original(group, **kwargs)
        groups[0] += 1
        return advantages[torch.randperm(len(advantages), generator=generator)]

    step.sample_advantages = permuted
    try:
        yield groups
    finally:
        step.sample_advantages = original


def train_one(config: TrainConfig, run_dir: Path, start: dict[str, Any] | None = None,
              placebo: bool = False) -> dict[str, Any]:  # fmt: skip
    """One run: train, then evaluate its checkpoints; the record a runs file holds. `start`: step 0 evaluated once
    for every run (`shared_start`), else the run's own evaluation before training."""
    from envhub.trainer.train import Trainer

    started = time.monotonic()
    with placebo_advantages(config.seed) if placebo else contextlib.nullcontext([0]) as permuted:
        result = asyncio.run(Trainer(config, out_dir=run_dir).run(overwrite=True))  # a scratch dir of this benchmark
    if placebo and not permuted[0]:
        raise ConfigError(
            "placebo run: no group's advantages were permuted (the learner ran outside this process, or computed no "
            "grpo advantages); run the placebo with the in-process learner and algorithm.advantage grpo"
        )
    evaluated = json.loads((run_dir / "eval.json").read_text())
    report = evaluated["overall"]

    def left_out(label: str) -> int:  # eval.json's per-task `<label>_left_out` counts, summed
        return sum(sum(row.get(f"{label}_left_out", {}).values()) for row in evaluated.values())

    curve, curve_left_out = asyncio.run(checkpoint_curve(config, run_dir, result.last_step))
    curve[0] = start["success"] if start else report["before"]
    curve[result.last_step] = report["after"]  # the final weights, evaluated once by the trainer
    shares = [learner_stat(r, "anchor_share", None) for r in result.history]
    shares = [s for s in shares if s is not None]
    return {
        "env": "+".join(task.env for task in config.tasks),
        "estimator": PLACEBO if placebo else config.algorithm.advantage,
        "seed": config.seed,
        "steps": result.last_step,
        "curve": {str(k): round(v, 4) for k, v in sorted(curve.items())},
        "final": report["after"],
        "anchor_share": round(sum(shares) / len(shares), 4) if shares else None,
        # each learner step: its batch's mean reward (sampled, at the rollout's temperature) and the gradient's
        # norm before clipping, so a curve can be read after the run's work directory is gone
        "train": [
            {"batch_reward": round(row["batch_reward"], 4), "grad_norm": round(learner_stat(row, "grad_norm", 0.0), 4)}
            for row in result.history
        ],
        # the final held-out episodes' action sequences: did the policy settle on one replay?
        "final_sequences": sequence_spread(run_dir / "eval-after"),
        # held-out episodes left out of the means by error (a timeout on a slow machine): 0 in a sound run
        "eval_left_out": (start["left_out"] if start else left_out("before")) + left_out("after") + curve_left_out,
        "wall_s": round(time.monotonic() - started, 1),
    } | ({"placebo_groups": permuted[0]} if placebo else {})


def summarise_env(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One env's runs: mean curves, steps to SFT + 0.1, anchor shares, and each estimator minus grpo by seed."""
    by = {(r["estimator"], r["seed"]): r for r in runs}
    estimators = sorted({r["estimator"] for r in runs}, key=RUN_ESTIMATORS.index)
    out: dict[str, Any] = {"estimators": {}}
    for name in estimators:
        mine = [r for r in runs if r["estimator"] == name]
        steps = sorted({int(s) for r in mine for s in r["curve"]})
        curve = {s: mean_se([r["curve"][str(s)] for r in mine if str(s) in r["curve"]])[0] for s in steps}
        start = curve.get(0, 0.0)
        reach = next((s for s in steps if curve[s] >= start + TARGET_GAIN), None)
        shares = [r["anchor_share"] for r in mine if r.get("anchor_share") is not None]
        final, final_se = mean_se([r["final"] for r in mine])
        out["estimators"][name] = {
            "seeds": sorted(r["seed"] for r in mine),
            "curve": {str(s): round(v, 4) for s, v in curve.items()},
            "final": round(final, 4),
            "final_se": round(final_se, 4),
            "steps_to_sft_plus_0.1": reach,
            "anchor_share": round(sum(shares) / len(shares), 4) if shares else None,
        }
        if name != "grpo":
            seeds = sorted(s for (e, s) in by if e == name and ("grpo", s) in by)
            if seeds:
                diff, se = mean_se([by[name, s]["final"] - by["grpo", s]["final"] for s in seeds])
                beats = diff >= 0.05 and diff - 2 * se > 0
                out[f"{name}_minus_grpo"] = {"mean": round(diff, 4), "se": round(se, 4), "seeds": seeds}
                if name != PLACEBO:  # the placebo is a control, not a candidate
                    out[f"{name}_minus_grpo"]["goal_met"] = beats
    return out


def merge(paths: list[str], out: Path) -> dict[str, Any]:
    """`--merge`: every run file, grouped by env and summarised."""
    runs = []
    for name in paths:
        try:
            record = json.loads(Path(name).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"--merge {name}: cannot read it as a run file ({exc})") from exc
        if not isinstance(record, dict) or "estimator" not in record or "curve" not in record:
            raise ConfigError(f"--merge {name}: not a credit_assignment run file (no estimator and curve)")
        runs.append(record)
    envs = sorted({r["env"] for r in runs})
    report = {"envs": {env: summarise_env([r for r in runs if r["env"] == env]) for env in envs}, "runs": len(runs)}
    # a run whose held-out episodes were left out by error has curve points over fewer episodes than the others
    flawed = {name: r["eval_left_out"] for name, r in zip(paths, runs) if r.get("eval_left_out")}
    if flawed:
        report["runs_with_eval_episodes_left_out"] = flawed
        print(f"warning: {len(flawed)} runs left held-out episodes out by error (see the runs' files); rerun "
              "them with a longer evaluation.episode_timeout_s (--set evaluation.episode_timeout_s=1800)",
              flush=True)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    for env, summary in report["envs"].items():
        for name, row in summary["estimators"].items():
            print(f"{env:20s} {name:6s} final {row['final']:.3f} ± {row['final_se']:.3f} curve {row['curve']} "
                  f"anchor share {row['anchor_share']}")  # fmt: skip
        for key, diff in summary.items():
            if key.endswith("_minus_grpo"):
                print(f"{env:20s} {key}: {diff['mean']:+.3f} ± {diff['se']:.3f} over {len(diff['seeds'])} seeds")
    print(f"wrote {out}")
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/credit-frozenlake.yaml")
    parser.add_argument("--estimators", default="grpo,gigpo,turn")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--curve-every", type=int, default=5)
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--warm-start", default="", help="SFT checkpoint directory (default: beside the runs)")
    parser.add_argument("--runs-dir", default="benchmarks/results/credit_runs")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--merge", nargs="+", metavar="RUN_FILE")
    parser.add_argument("--out", default="benchmarks/results/credit_assignment.json")
    args = parser.parse_args(argv)
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    unknown = [e for e in estimators if e not in RUN_ESTIMATORS]
    if unknown:
        parser.error(f"--estimators: unknown {unknown}; choose from {', '.join(RUN_ESTIMATORS)}")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be integers separated by commas, got {args.seeds!r}")
    if args.steps < 1 or args.curve_every < 1 or args.eval_episodes < 1:
        parser.error("--steps, --curve-every and --eval-episodes must be at least 1")
    args.estimators = estimators
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.merge:
        merge(args.merge, Path(args.out))
        return
    runs_dir = Path(args.runs_dir)
    stem = Path(args.config).stem
    warm = Path(args.warm_start) if args.warm_start else runs_dir / f"{stem}-sft"
    base = run_config(args.config, args.overrides, estimator="grpo", seed=0, steps=args.steps,
                      curve_every=args.curve_every, eval_episodes=args.eval_episodes, model=None)  # fmt: skip
    # a config without an SFT stage starts every run from the model its seed initialises (the same weights for
    # each estimator of one seed)
    record = warm_start_checkpoint(base, warm) if base.sft.collect or base.sft.data else {}
    start = shared_start(base, warm, record["weights_sha256"], runs_dir) if record else None
    for seed in args.seeds:
        for estimator in args.estimators:
            path = runs_dir / f"{stem}-{estimator}-seed{seed}.json"
            if path.exists():
                print(f"{path} exists: skipped (delete it to run again)", flush=True)
                continue
            config = run_config(args.config, args.overrides, estimator=estimator, seed=seed, steps=args.steps,
                                curve_every=args.curve_every, eval_episodes=args.eval_episodes,
                                model=str(warm) if record else None, before=start is None)  # fmt: skip
            work = runs_dir / "work" / path.stem
            result = train_one(config, work, start, placebo=estimator == PLACEBO)
            result |= {"config": args.config, "overrides": args.overrides, "warm_start_sha256":
                       record.get("weights_sha256"), "machine": machine()}  # fmt: skip
            path.write_text(json.dumps(result, indent=2))
            print(
                f"{path.name}: final {result['final']:.3f} curve {result['curve']} ({result['wall_s']:.0f}s)",
                flush=True,
            )
            shutil.rmtree(work, ignore_errors=True)  # checkpoints are large; the curve is in the file
    # the merged view of every run file so far (all envs), current after every sitting
    merge(sorted(str(p) for p in runs_dir.glob("*-seed*.json")), Path(args.out))


if __name__ == "__main__":
    main()
