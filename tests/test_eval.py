"""`envhub.eval`: the pass@k estimator, the summary, the episode runner, resume and the `envhub eval` command."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import statistics
from fractions import Fraction

import pytest

from envhub.agents import Agent, ExpertAgent, RandomAgent
from envhub.cli.main import build_parser, main
from envhub.errors import ConfigError
from envhub.eval import EpisodeLog, EpisodeRecord, EvalConfig, episode_success, evaluate, pass_at_k, summarize


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Share of k-subsets of n attempts (c of them successes) that hold at least one success."""
    attempts = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(attempts[i] for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize(
    "n,c,k", [(1, 0, 1), (1, 1, 1), (5, 2, 1), (5, 2, 3), (6, 1, 4), (8, 3, 5), (8, 0, 8), (7, 7, 2)]
)
def test_pass_at_k_matches_counting_subsets(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12)


def test_pass_at_k_is_stable_where_binomials_overflow_floats():
    n, c, k = 2000, 7, 100
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))  # math.comb(2000, 100) is far beyond float range
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9)
    assert pass_at_k(10, 5, 1) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)


def test_summary_mean_stderr_pass_at_k_and_error_counts():
    rows = []
    rewards = {0: [1.0, 0.0, 1.0], 1: [0.0, 0.0, 0.0], 2: [1.0, 1.0, 0.5]}
    for seed, values in rewards.items():
        for attempt, reward in enumerate(values):
            rows.append(
                {
                    "env_id": "Math-v0",
                    "seed": seed,
                    "attempt": attempt,
                    "seat": None,
                    "reward": reward,
                    "success": reward >= 1.0,
                    "error_kind": None,
                    "malformed_tool_calls": 1 if seed == 1 else 0,
                }
            )
    rows.append(
        {
            "env_id": "Math-v0",
            "seed": 3,
            "attempt": 0,
            "seat": None,
            "reward": 0.0,
            "success": False,
            "error_kind": "auth",
            "malformed_tool_calls": 0,
        }
    )
    summary = summarize(rows, [1, 2])
    assert set(summary) == {"Math-v0"} and set(summary["Math-v0"]) == {
        "episodes",
        "mean_reward",
        "stderr",
        "pass_at_k",
        "errors",
    }
    row = summary["Math-v0"]
    flat = [r for values in rewards.values() for r in values]
    assert row["episodes"] == 9 and row["mean_reward"] == pytest.approx(statistics.mean(flat))
    assert row["stderr"] == pytest.approx(statistics.stdev(flat) / math.sqrt(9), abs=1e-6)  # 6 decimals
    assert row["pass_at_k"]["1"] == pytest.approx((2 / 3 + 0 + 2 / 3) / 3)
    assert row["pass_at_k"]["2"] == pytest.approx((1 + 0 + 1) / 3)
    assert row["errors"] == {"auth": 1, "malformed_tool_call": 3}


async def test_expert_run_writes_summary_and_turn_by_turn_episodes(tmp_path):
    summary = await evaluate(
        ["FrozenLake-v0", "Math-v0"],
        ExpertAgent,
        episodes=3,
        seeds=5,
        concurrency=4,
        out_dir=tmp_path,
        agent_name="expert",
    )
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary and set(summary) == {"FrozenLake-v0", "Math-v0"}
    assert all(
        row == {"episodes": 3, "mean_reward": 1.0, "stderr": 0.0, "pass_at_k": {"1": 1.0}, "errors": {}}
        for row in summary.values()
    )
    records = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert sorted((r["env_id"], r["seed"]) for r in records) == [
        (e, s) for e in ("FrozenLake-v0", "Math-v0") for s in (5, 6, 7)
    ]
    lake = next(r for r in records if r["env_id"] == "FrozenLake-v0")
    assert lake["turns"] and set(lake["turns"][0]) == {"action", "observation", "reward", "tool_calls"}
    assert lake["turns"][-1]["reward"] == 1.0 and lake["finish"] == "terminated" and lake["first_observation"]


async def test_runs_are_deterministic_and_random_attempts_differ(tmp_path):
    def strip(path):
        return [
            {k: v for k, v in json.loads(line).items() if k != "duration_s"}
            for line in sorted(path.read_text().splitlines())
        ]

    for name in ("a", "b"):
        await evaluate(
            ["Sokoban-v0", "TicTacToe-v0"],
            RandomAgent,
            episodes=2,
            concurrency=3,
            out_dir=tmp_path / name,
            k=[2],
            agent_name="random",
        )
    first, second = strip(tmp_path / "a" / "episodes.jsonl"), strip(tmp_path / "b" / "episodes.jsonl")
    assert first == second
    sokoban = [r for r in first if r["env_id"] == "Sokoban-v0" and r["seed"] == 0]
    assert len(sokoban) == 2 and sokoban[0]["turns"] != sokoban[1]["turns"]  # two attempts, two agent seeds


async def test_resume_skips_finished_episodes_and_reruns_errored_ones(tmp_path):
    played = []
    await evaluate(
        ["Math-v0"], ExpertAgent, episodes=3, out_dir=tmp_path, agent_name="expert", on_episode=played.append
    )
    assert len(played) == 3
    # an errored record (e.g. the endpoint was down) and a torn last line (a crash mid-write)
    log = tmp_path / "episodes.jsonl"
    lines = log.read_text().splitlines()
    broken = json.loads(lines[0]) | {"error_kind": "unreachable", "error": "down", "reward": 0.0}
    log.write_text("\n".join([json.dumps(broken), *lines[1:]]) + '\n{"env_id": "Math-v0", "se')
    played.clear()
    summary = await evaluate(
        ["Math-v0"], ExpertAgent, episodes=5, out_dir=tmp_path, agent_name="expert", on_episode=played.append
    )
    assert sorted(r.seed for r in played) == [0, 3, 4]  # seed 0 errored before, 3 and 4 are new
    assert summary["Math-v0"]["episodes"] == 5 and summary["Math-v0"]["errors"] == {}
    reread = EpisodeLog(log)
    assert len(reread.load()) == 3 + 3 and reread.skipped_lines == 1  # the torn line is skipped, nothing else lost


async def test_cancelled_run_keeps_finished_episodes_and_summary(tmp_path):
    """What Ctrl-C does: asyncio.run cancels the evaluation; finished episodes stay on disk, a re-run completes it."""
    played = []
    task = asyncio.create_task(
        evaluate(
            ["Wordle-v0"],
            ExpertAgent,
            episodes=40,
            concurrency=1,
            out_dir=tmp_path,
            agent_name="expert",
            on_episode=played.append,
        )
    )
    while len(played) < 3:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    kept = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert len(kept) == len(played) >= 3 and all(json.loads(line)["reward"] == 1.0 for line in kept)
    assert json.loads((tmp_path / "summary.json").read_text())["Wordle-v0"]["episodes"] == len(kept)
    played.clear()
    summary = await evaluate(
        ["Wordle-v0"],
        ExpertAgent,
        episodes=40,
        concurrency=8,
        out_dir=tmp_path,
        agent_name="expert",
        on_episode=played.append,
    )
    assert len(played) == 40 - len(kept) and summary["Wordle-v0"]["episodes"] == 40


async def test_games_are_played_seat_by_seat_against_the_chosen_opponent(tmp_path):
    perfect = await evaluate(["TicTacToe-v0"], ExpertAgent, episodes=4, config=EvalConfig(opponent="expert"))
    assert set(perfect) == {"TicTacToe-v0#seat0", "TicTacToe-v0#seat1"}
    assert all(
        row["mean_reward"] == 0.0 and row["episodes"] == 4 for row in perfect.values()
    )  # perfect vs perfect: draws
    vs_random_agent = await evaluate(
        ["ConnectFour-v0"], ExpertAgent, episodes=3, config=EvalConfig(opponent=RandomAgent, seats=(1,))
    )
    assert (
        list(vs_random_agent) == ["ConnectFour-v0#seat1"]
        and vs_random_agent["ConnectFour-v0#seat1"]["mean_reward"] == 1.0
    )


class AlwaysRock(Agent):
    name = "rock"

    async def act(self, observation, info):
        return "rock"


class BeatsWhatItSees(Agent):
    """Plays what beats the move named in 'Your opponent played X.': a cheat if that X were the current round's."""

    name = "peeker"

    async def act(self, observation, info):
        seen = re.search(r"Your opponent played (rock|paper|scissors)", observation)
        return {"rock": "paper", "paper": "scissors", "scissors": "rock"}[seen.group(1)] if seen else "rock"


async def test_simultaneous_game_is_played_seat_by_seat_as_sealed_turns():
    records = []
    summary = await evaluate(
        ["RockPaperScissors-v0"],
        AlwaysRock,
        episodes=3,
        config=EvalConfig(opponent="scripted"),
        on_episode=records.append,
    )
    assert set(summary) == {"RockPaperScissors-v0#seat0", "RockPaperScissors-v0#seat1"}
    assert all(row["episodes"] == 3 and row["errors"] == {} for row in summary.values())
    # scripted plays what beats the last move from round 2 on: rock loses rounds 2-5; the reward sums the rounds
    assert all(
        r.steps == 5 and r.reward in (-5.0, -4.0, -3.0) and "Round 1: choose" in r.first_observation for r in records
    )
    expert = await evaluate(["RockPaperScissors-v0"], ExpertAgent, episodes=4, config=EvalConfig(opponent="expert"))
    assert all(
        row["episodes"] == 4 and row["errors"] == {} and -5 <= row["mean_reward"] <= 5 for row in expert.values()
    )
    # neither seat ever sees the other's move of the round it is choosing: a peeker would otherwise win every round (+5)
    peeker = []
    await evaluate(
        ["RockPaperScissors-v0"],
        BeatsWhatItSees,
        episodes=4,
        config=EvalConfig(opponent="random"),
        on_episode=peeker.append,
    )
    assert len(peeker) == 8 and max(r.reward for r in peeker) < 5.0


def test_sealed_turns_hide_the_first_move_until_the_round_resolves():
    from envhub.envs.games.simultaneous import SimultaneousTurns
    from envhub.registry import make_multiagent

    game = SimultaneousTurns(make_multiagent("RockPaperScissors-v0", rounds=1), first_seat=1)
    game.reset(seed=0)
    assert game.current_seat() == 1 and game.legal_actions() == [0, 1, 2]
    game.step(game.parse_move("paper"))
    assert (
        game.current_seat() == 0
        and "Round 1: choose" in game.observe_text(0)
        and "opponent paper" not in game.observe_text(0)
        and game.outcome() is None
    )
    game.step(game.parse_move("rock"))
    assert game.game_over() and game.outcome() == (-1.0, 1.0) and "you rock, opponent paper" in game.observe_text(0)
    with pytest.raises(ConfigError, match="game is over"):
        game.step(0)


async def test_bad_arguments_are_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="needs at least 4 attempts"):
        await evaluate(["Math-v0"], RandomAgent, k=[4], samples=2)
    with pytest.raises(ConfigError, match="unknown opponent"):
        await evaluate(["TicTacToe-v0"], RandomAgent, config=EvalConfig(opponent="grandmaster"))
    await evaluate(["Math-v0"], RandomAgent, episodes=1, out_dir=tmp_path, agent_name="random")
    with pytest.raises(ConfigError, match="holds an evaluation of agent 'random'"):
        await evaluate(["Math-v0"], ExpertAgent, episodes=1, out_dir=tmp_path, agent_name="expert")
    # the same agent under settings that change its episodes: resuming would mix two evaluations in one summary
    before = (tmp_path / "episodes.jsonl").read_bytes()
    with pytest.raises(ConfigError, match=r"other settings: max_turns 200 \(now 3\)") as refused:
        await evaluate(["Math-v0"], RandomAgent, episodes=1, out_dir=tmp_path, agent_name="random",
                       config=EvalConfig(max_turns=3))  # fmt: skip
    assert "another --out" in refused.value.hint and (tmp_path / "episodes.jsonl").read_bytes() == before
    await evaluate(["Math-v0"], RandomAgent, episodes=2, out_dir=tmp_path, agent_name="random")  # more episodes: fine


def test_cli_prints_a_table_writes_files_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    argv = [
        "eval",
        "Math-v0",
        "KuhnPoker-v0",
        "--agent",
        "expert",
        "-n",
        "3",
        "-k",
        "1,2",
        "--concurrency",
        "4",
        "--out",
        str(out),
        "--seed",
        "7",
        "--quiet",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "pass@2" in printed and "KuhnPoker-v0#seat1" in printed and "Math-v0" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["Math-v0"]["pass_at_k"] == {"1": 1.0, "2": 1.0} and summary["Math-v0"]["episodes"] == 6
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 6 + 2 * 6
    assert main(argv) == 0  # resumed: nothing left to play, same summary
    assert json.loads((out / "summary.json").read_text()) == summary
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 18


def test_cli_says_how_many_episodes_its_limits_cut(capsys):
    argv = ["eval", "Letters-v0", "--agent", "random", "-n", "3", "--kwargs", '{"turns": 10}', "--max-turns", "2"]
    assert main([*argv, "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "episodes cut short: 3 at the 2-turn limit (--max-turns)" in err
    assert build_parser().parse_args(["eval", "Math-v0", "--agent", "random"]).max_turns == 50  # a person's wait


def test_cli_shows_the_first_error_of_each_kind_with_its_message(capsys):
    """A typo in --kwargs makes every episode an env error: the message is on the terminal once, not only in
    episodes.jsonl (and nowhere without --out)."""
    argv = ["eval", "Math-v0", "--agent", "random", "-n", "3", "--kwargs", '{"dimm": 5}', "--quiet"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    first = [line for line in err.splitlines() if "env_error:" in line]
    assert len(first) == 1 and "dimm" in first[0] and re.match(r"envhub: Math-v0 seed \d: env_error: ", first[0])
    assert "3 episode(s) ended in an error" in err


@pytest.mark.parametrize(
    "spec,message",
    [
        ("gpt4", "unknown agent spec 'gpt4'"),
        ("openai:", "has no URL"),
        ("openai:localhost:8000", "not an http(s) URL"),
        ("hf:", "has no directory"),
    ],
)
def test_wrong_agent_spec_is_one_line(spec, message, capsys):
    assert main(["eval", "Math-v0", "--agent", spec]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[0] and err[0].startswith("envhub: error:") and err[1].startswith("hint:") and len(err) == 2


def test_cli_exits_non_zero_when_every_episode_failed(capsys):
    assert main(["eval", "Math-v0", "--agent", "openai:http://127.0.0.1:1/v1#m", "-n", "2", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "2 episode(s) ended in an error" in err


def test_progress_is_recorded_per_episode_and_summarized_with_its_standard_error():
    from envhub.eval import summarize

    rows = [
        {"env_id": "A-v0", "seed": s, "attempt": 0, "seat": None, "reward": 0.0, "success": False, "progress": p}
        for s, p in enumerate((0.0, 100.0))
    ]
    rows.append({"env_id": "B-v0", "seed": 0, "attempt": 0, "seat": None, "reward": 1.0, "success": True})
    summary = summarize(rows, [1])
    assert summary["A-v0"]["progress"] == {"mean": 50.0, "stderr": 50.0, "episodes": 2}
    assert "progress" not in summary["B-v0"]  # envs that report none get no progress figure


def test_an_expert_on_a_suite_with_progress_reaches_100():
    pytest.importorskip("minigrid", reason="needs minigrid (pip install 'envhub[minigrid]')")
    from envhub.agents import ExpertAgent

    summary = asyncio.run(evaluate(["minigrid-BabyAI-GoToRedBallNoDists-v0"], ExpertAgent, episodes=2, seeds=500))
    assert summary["minigrid-BabyAI-GoToRedBallNoDists-v0"]["progress"]["mean"] == 100.0


class ClosingAgent(RandomAgent):
    """A random agent that notes when it is closed."""

    closed = 0

    async def aclose(self) -> None:
        ClosingAgent.closed += 1


async def test_an_env_whose_construction_fails_is_an_env_error_and_the_agent_is_closed(tmp_path):
    ClosingAgent.closed = 0

    def broken_env():
        raise FileNotFoundError("levels.txt is missing")

    config = EvalConfig(env_factories={"Broken-v0": broken_env})
    summary = await evaluate(["Broken-v0"], ClosingAgent, episodes=2, out_dir=tmp_path, config=config)
    assert summary["Broken-v0"]["errors"] == {"env_error": 2}  # the env's failure, not the agent's
    records = EpisodeLog(tmp_path / "episodes.jsonl").load()
    assert {r["error_kind"] for r in records} == {"env_error"} and "levels.txt is missing" in records[0]["error"]
    assert ClosingAgent.closed == 2  # every episode's agent is closed, on the failure path too


async def test_success_is_the_envs_own_verdict_not_a_global_reward_of_one():
    """MiniGrid pays 1 - 0.9 * steps / max_steps for a solved level, always below 1, and says so in
    info["success"]: the expert's episodes are successes (pass@1 1.0) though no reward reaches 1.0."""
    summary = await evaluate(["minigrid-BabyAI-GoToLocal-v0"], ExpertAgent, episodes=3, seeds=1000)
    row = summary["minigrid-BabyAI-GoToLocal-v0"]
    assert 0.5 < row["mean_reward"] < 1.0 and row["pass_at_k"]["1"] == 1.0
    assert row["mean_reward"] == round(row["mean_reward"], 6)  # no float noise in the report
    record = EpisodeRecord("Math-v0", 0, 0, None, "a", reward=0.5)
    assert not episode_success(record, 1.0) and episode_success(record, 0.5)  # no verdict: the threshold
    record.progress = 100.0
    assert episode_success(record, 1.0)
    record.env_success = False  # the env's own word comes first
    assert not episode_success(record, 1.0)


def test_off_a_terminal_progress_is_a_few_plain_lines_and_ids_stay_whole(capsys):
    """In a log (stderr and stdout not terminals, as under capsys): no carriage-return redraws, a line per tenth of
    the run; the table keeps every id and error whole instead of cutting them to 80 columns."""
    from envhub.cli.eval import print_table

    assert main(["eval", "Letters-v0", "--agent", "random", "-n", "40"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("eval ")]
    assert "\r" not in err and len(lines) == 10 and lines[-1].startswith("eval 40/40 ep (100%)")
    long_id = "minigrid-BabyAI-GoToRedBallNoDistractions-v0-with-a-long-suffix"
    row = {"episodes": 3, "mean_reward": 0.5, "stderr": 0.1, "pass_at_k": {"1": 0.25}}
    print_table({long_id: {**row, "errors": {"env_error": 2, "agent_error": 1}}}, [1], title="x" * 100)
    out = capsys.readouterr().out
    assert long_id in out and "env_error 2, agent_error 1" in out and "…" not in out
