"""HarnessEnv's contract with real programs in real bubblewrap sandboxes, through a real gateway and engine."""

from __future__ import annotations

import asyncio
import os

import pytest

from envhub.errors import HarnessError
from envhub.trainer.harness import HarnessEnv
from tests.trainer.harness.conftest import AddEnv, AddToolEnv
from tests.trainer.harness.scripts import CRASH, HANG, NO_CALL, SOLVER, TOOL_SOLVER, command


async def test_a_program_solves_the_task_and_its_calls_become_a_trajectory(gateway, base_rootfs):
    harness = HarnessEnv(AddEnv, command(SOLVER), gateway, wall_clock_s=60)
    episode = await harness.play(seed=3)
    assert episode.error is None, episode.error
    assert episode.reward == 1.0 and episode.action == str(episode.info["answer"])
    assert len(episode.calls) == 1 and episode.merged
    [trajectory] = episode.samples.trajectories
    call = episode.calls[0]
    assert trajectory.input_ids == call.prompt_ids + call.output_ids
    assert trajectory.loss_mask == [0] * len(call.prompt_ids) + [1] * len(call.output_ids)
    assert gateway.tokenizer.decode(call.prompt_ids).count("What is") == 1  # ENVHUB_TASK reached the model
    assert episode.as_record()["calls"][0]["output_ids"] == call.output_ids


async def test_a_tool_env_serves_its_tools_over_mcp_inside_the_sandbox(gateway, base_rootfs):
    episode = await HarnessEnv(AddToolEnv, command(TOOL_SOLVER), gateway, wall_clock_s=60).play(seed=3)
    assert episode.error is None, episode.error
    assert episode.reward == 1.0 and episode.merged and len(episode.calls) == 1
    assert episode.action == "True"  # the second answer was refused: the env had ended


@pytest.mark.parametrize(
    ("source", "wall_clock_s", "expected", "stderr"),
    [
        (CRASH, 60, "exited with status 3", "something broke"),
        (HANG, 2, "ran past its wall clock of 2 s", "waiting forever"),
        (NO_CALL, 60, "never called the model", "I forgot the model"),
    ],
    ids=["crash", "hang", "no-model-call"],
)
async def test_a_failing_program_ends_the_episode_as_an_error_and_releases_everything(
    gateway, base_rootfs, source, wall_clock_s, expected, stderr
):
    from envhub.sandboxes.bwrap_backend import sandboxes_dir

    # this process's sandboxes only: another xdist worker's harness test may be running one in the same folder
    # (a sandbox's folder is named after its owner's pid)
    mine = f"{os.getpid()}-*"
    before = set(sandboxes_dir().glob(mine)) if sandboxes_dir().exists() else set()
    episode = await HarnessEnv(AddEnv, command(source), gateway, wall_clock_s=wall_clock_s).play(seed=0)
    assert expected in episode.error and stderr in episode.error
    assert episode.samples is None and episode.reward == 0.0
    assert len(gateway.book) == 0  # the episode's key is closed
    after = set(sandboxes_dir().glob(mine)) if sandboxes_dir().exists() else set()
    # the harness's sandbox is gone (its forwarder marks it: other tests of this process may hold bwrap sandboxes)
    assert not [d for d in after - before if (d / "tmp" / ".envhub-forward.py").exists()]


async def test_bad_setups_are_refused_with_the_fix(gateway):
    with pytest.raises(HarnessError, match="harness is empty"):
        HarnessEnv(AddEnv, "  ", gateway)
    with pytest.raises(HarnessError, match="allow_unsafe=True"):
        HarnessEnv(AddEnv, "true", gateway, runner="local")
    with pytest.raises(HarnessError, match="unknown harness runner"):
        HarnessEnv(AddEnv, "true", gateway, runner="docker-ish")
    with pytest.raises(HarnessError, match="wall_clock_s"):
        HarnessEnv(AddEnv, "true", gateway, wall_clock_s=0)


async def test_the_unsafe_local_runner_plays_when_asked_for(gateway):
    harness = HarnessEnv(AddEnv, command(SOLVER), gateway, runner="local", allow_unsafe=True, wall_clock_s=60)
    episode = await harness.play(seed=1)
    assert episode.error is None and episode.reward == 1.0 and len(episode.calls) == 1


async def test_a_sampling_key_seeds_the_episodes_model_calls(gateway, base_rootfs):
    """rollout.seeded for harness tasks: the same key samples the same tokens whatever else the engine runs at
    the same time; another key samples others (the untaught model at temperature 1 has no sure token)."""
    harness = HarnessEnv(AddEnv, command(SOLVER), gateway, wall_clock_s=60)
    first = await harness.play(seed=3, sampling_key="Add|3|0-1|0")  # alone on the engine
    again, other = await asyncio.gather(  # batched with another episode
        harness.play(seed=3, sampling_key="Add|3|0-1|0"), harness.play(seed=3, sampling_key="Add|3|0-1|1")
    )
    outputs = [[call.output_ids for call in episode.calls] for episode in (first, again, other)]
    assert outputs[0] == outputs[1] and outputs[0] != outputs[2]
    # the same tokens exactly; their logprobs up to float reduction order: a 1-row and a 2-row fp32 matmul may sum in
    # different orders (seen in a CI run: -5.4237957 alone, -5.4237947 batched)
    assert first.calls[0].logprobs == pytest.approx(again.calls[0].logprobs, rel=0, abs=1e-5)
