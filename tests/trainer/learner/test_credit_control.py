"""The positive control of step-level credit (docs/trainer.md, "Credit assignment"): on Corridor-v0, with turns to
spare in training (an episode's reward cannot tell a wasted turn from a move) and none in the held-out evaluation,
gigpo learns not to waste turns faster than grpo at equal steps.

Twice: with the tiny model through the whole trainer (configs/corridor-tiny.yaml: SFT on a demonstrator that wastes
half its turns, then RL; one seed of benchmarks/credit_assignment.py's decisive set at a test's size), and at the
estimators' own level, a policy with one move probability per square trained by REINFORCE on each estimator's
per-turn advantages (`credit.advantages_of`, the learner's own function) over real corridor episodes: seeded, exact.
"""

import json
import math
import random
from pathlib import Path

import pytest
import yaml

from envhub.envs.corridor import CorridorEnv
from envhub.trainer.config import config_from_dict
from envhub.trainer.learner.credit import CreditParams, advantages_of
from envhub.trainer.train import Trainer
from envhub.trainer.trajectory import TurnSpan

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "corridor-tiny.yaml"

SQUARES, TURNS, GROUP, GROUPS_PER_STEP, STEPS, LR = 4, 8, 8, 4, 12, 0.2
RL_STEPS = 5  # the tiny model's run


def play(env: CorridorEnv, logits: list[float], rng: random.Random) -> tuple[float, list[TurnSpan], list[tuple]]:
    """One episode: its return, its turns (as the rollout records them) and each turn's (square, moved, p)."""
    _, info = env.reset(seed=0)
    spans, decisions, ret, done = [], [], 0.0, False
    while not done:
        square = env.position
        p = 1 / (1 + math.exp(-logits[square]))
        moved = rng.random() < p
        anchor = info["anchor"]
        _, reward, terminated, truncated, info = env.step("a step" if moved else "z wait")
        spans.append(TurnSpan(len(spans), len(spans) + 1, reward=reward, anchor="env:" + anchor))
        decisions.append((square, moved, p))
        ret, done = ret + reward, terminated or truncated
    return ret, spans, decisions


def train(advantage: str, seed: int, step_weight: float = 1.0) -> float:
    """The policy after STEPS steps of GROUPS_PER_STEP groups (Adam); its chance of walking without waste."""
    rng = random.Random(seed)
    credit = CreditParams.from_mapping({"advantage": advantage, "step_weight": step_weight})
    logits, m, v = [0.4] * SQUARES, [0.0] * SQUARES, [0.0] * SQUARES  # sigmoid(0.4) = 0.6
    env = CorridorEnv(length=SQUARES, max_turns=TURNS)
    for step in range(1, STEPS + 1):
        grad = [0.0] * SQUARES
        for _ in range(GROUPS_PER_STEP):
            episodes = [play(env, logits, rng) for _ in range(GROUP)]
            per_turn = advantages_of([e[0] for e in episodes], [e[1] for e in episodes], credit)
            for (_, _, decisions), advantages in zip(episodes, per_turn):
                for (square, moved, p), a in zip(decisions, advantages):
                    grad[square] += a * (moved - p) / (GROUP * GROUPS_PER_STEP)  # a * d log pi / d logit
        for s in range(SQUARES):  # Adam, ascending
            m[s] = 0.9 * m[s] + 0.1 * grad[s]
            v[s] = 0.999 * v[s] + 0.001 * grad[s] ** 2
            logits[s] += LR * (m[s] / (1 - 0.9**step)) / (math.sqrt(v[s] / (1 - 0.999**step)) + 1e-8)
    return math.prod(1 / (1 + math.exp(-x)) for x in logits)


@pytest.fixture(scope="module")
def finals() -> dict[str, list[float]]:
    return {name: [train(name, seed) for seed in range(30)] for name in ("grpo", "gigpo", "turn")}


def test_gigpo_beats_grpo_by_a_tenth_at_equal_steps(finals):
    diffs = [a - b for a, b in zip(finals["gigpo"], finals["grpo"])]
    mean = sum(diffs) / len(diffs)
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
    means = {name: sum(values) / len(values) for name, values in finals.items()}
    print(f"no-waste success after {STEPS} steps: {means}; gigpo - grpo {mean:+.3f} ± {se:.3f}")
    assert mean >= 0.1 and mean - 2 * se > 0.1, (mean, se)
    assert sum(d > 0 for d in diffs) >= 27  # not a few lucky seeds


def test_turn_level_returns_also_beat_episode_credit(finals):
    assert sum(finals["turn"]) / len(finals["turn"]) >= sum(finals["grpo"]) / len(finals["grpo"]) + 0.1


def test_without_its_step_term_gigpo_is_grpo():
    assert [train("gigpo", seed, step_weight=0.0) for seed in range(3)] == [train("grpo", seed) for seed in range(3)]


async def held_out_success(out_dir: Path, advantage: str, after_sft: bool = True) -> dict[str, float]:
    data = yaml.safe_load(CONFIG.read_text())
    data["algorithm"]["advantage"] = advantage
    # 5 of the config's 8 steps: the gap is there by then (seeded, this machine: grpo 0.523, gigpo 0.828 after 5
    # steps; 0.609 and 0.922 after 8; SFT 0.211), and the test is CI's
    data["budget"]["steps"] = RL_STEPS
    data["evaluation"].update(episodes=128, after_sft=after_sft)
    data["out_dir"] = str(out_dir / advantage)
    await Trainer(config_from_dict(data)).run()
    return json.loads((out_dir / advantage / "eval.json").read_text())["Corridor-v0"]


@pytest.mark.slow
async def test_the_tiny_model_learns_not_to_waste_turns_faster_with_gigpo(tmp_path):
    grpo = await held_out_success(tmp_path, "grpo")
    gigpo = await held_out_success(tmp_path, "gigpo", after_sft=False)  # the same SFT checkpoint (seed, data)
    print(f"held-out no-waste success: SFT {grpo['sft']:.3f}; after {RL_STEPS} RL steps grpo {grpo['after']:.3f}, "
          f"gigpo {gigpo['after']:.3f}")  # fmt: skip
    assert grpo["after"] > grpo["sft"]  # both learn
    assert gigpo["after"] >= grpo["after"] + 0.1
