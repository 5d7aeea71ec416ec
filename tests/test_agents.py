"""Baseline agents on the bundled envs, and `EngineAgent` sharing the rollout's chat-template code."""

from __future__ import annotations

import pytest

import envhub
from envhub.agents import AgentError, ExpertAgent, RandomAgent
from envhub.cli.agent_spec import make_agent
from envhub.eval import EvalConfig, evaluate

SOLVED_ENVS = ["Sokoban-v0", "FrozenLake-v0", "Wordle-v0", "Math-v0", "WebShop-v0", "Letters-v0"]


async def test_expert_reaches_reward_one_on_every_env_with_a_solver():
    summary = await evaluate(SOLVED_ENVS, ExpertAgent, episodes=6, seeds=11, concurrency=8)
    assert {env: row["mean_reward"] for env, row in summary.items()} == {env: 1.0 for env in SOLVED_ENVS}
    assert all(row["pass_at_k"] == {"1": 1.0} and row["errors"] == {} for row in summary.values())


async def test_expert_board_game_players_against_random():
    records = []
    summary = await evaluate(
        ["ConnectFour-v0", "TicTacToe-v0", "TicTacToe-SelfPlay-v0", "KuhnPoker-v0"],
        ExpertAgent,
        episodes=30,
        concurrency=8,
        on_episode=records.append,
    )
    assert summary["ConnectFour-v0#seat0"]["mean_reward"] == summary["ConnectFour-v0#seat1"]["mean_reward"] == 1.0
    ttt = [r for r in records if r.env_id.startswith("TicTacToe")]
    assert min(r.reward for r in ttt) == 0.0 and max(r.reward for r in ttt) == 1.0  # the minimax player never loses
    assert sum(r.reward == 1.0 for r in ttt) > len(ttt) // 2
    kuhn = summary["KuhnPoker-v0#seat0"]["mean_reward"] + summary["KuhnPoker-v0#seat1"]["mean_reward"]
    assert kuhn >= 0.3  # the Nash player wins chips from a random one on average (0.3 on these seeds: once 0.3 plus
    # float noise, which passed `> 0.3`; summaries now round to 6 decimals)


@pytest.mark.docker
async def test_expert_resolves_a_swe_task_with_the_gold_patch(docker_pool):
    records = []
    config = EvalConfig(env_kwargs={"pool": docker_pool, "instance_ids": ["calcworks__exprcalc-3"]})
    summary = await evaluate(["SWE-v0"], ExpertAgent, episodes=1, config=config, on_episode=records.append)
    assert summary["SWE-v0"]["mean_reward"] == 1.0, records[0].turns or records[0].error
    assert [c["name"] for turn in records[0].turns for c in turn["tool_calls"]] == ["bash", "submit"]


async def test_expert_without_a_solver_is_a_clear_episode_error():
    envhub.register("NoSolverEval-v0", "envhub.envs.letters:LettersEnv", tags=("test",))
    env = envhub.make("NoSolverEval-v0")
    agent = ExpertAgent()
    with pytest.raises(AgentError, match="needs the env object"):
        await agent.act("hello", {})
    agent.bind_env(env)
    obs, info = env.reset(seed=0)
    agent.reset(info)
    assert await agent.act(obs, info) == "aeiou"  # Letters: its own letters


async def test_random_agent_plays_valid_actions():
    records = []
    await evaluate(["TicTacToe-v0", "Wordle-v0", "Sokoban-v0"], RandomAgent, episodes=8, on_episode=records.append)
    games = [r for r in records if r.env_id == "TicTacToe-v0"]
    assert all(
        "Illegal" not in t["observation"] and "Could not read" not in t["observation"] for r in games for t in r.turns
    )
    wordle = [t for r in records if r.env_id == "Wordle-v0" for t in r.turns]
    assert len(wordle) == 8 * 6 and all(t["tool_calls"][0]["name"] == "guess" for t in wordle)  # six real guesses each
    sokoban = [t for r in records if r.env_id == "Sokoban-v0" for t in r.turns]
    assert {t["tool_calls"][0]["arguments"]["direction"] for t in sokoban} == {"up", "down", "left", "right"}


def test_make_agent_builds_each_kind():
    assert isinstance(make_agent("random"), RandomAgent) and isinstance(make_agent("expert"), ExpertAgent)
    chat = make_agent("openai:http://127.0.0.1:9/v1#some-model")
    assert (
        type(chat).__name__ == "ChatAgent"
        and chat.endpoint.model == "some-model"
        and chat.endpoint.base_url == "http://127.0.0.1:9/v1"
    )
    assert make_agent("openai:http://127.0.0.1:9").endpoint.base_url == "http://127.0.0.1:9/v1"


# -- EngineAgent ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from envhub.trainer.models import load_tokenizer, tiny_llama

    tokenizer = load_tokenizer("tiny")
    return tiny_llama(tokenizer, seed=0), tokenizer


async def test_engine_agent_builds_the_same_tokens_as_the_rollout(tiny):
    """A greedy EngineAgent episode is token for token the trainer's rollout of the same episode."""
    from envhub.agents import EngineAgent
    from envhub.inference import SamplingParams
    from envhub.trainer.config import RolloutConfig
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.rollout.worker import RolloutWorker

    model, tokenizer = tiny
    engine = EmbeddedEngine(model, tokenizer)
    config = RolloutConfig(max_turns=3, max_new_tokens=6, max_total_tokens=4096, temperature=0.0)
    trajectory = await RolloutWorker(engine, tokenizer, config).run_episode(
        lambda: envhub.make("Sokoban-v0"), "Sokoban-v0", seed=4
    )
    agents = []

    def factory():
        agents.append(EngineAgent(engine, tokenizer, SamplingParams(max_new_tokens=6, temperature=0.0)))
        return agents[-1]

    await evaluate(["Sokoban-v0"], factory, episodes=1, seeds=4, config=EvalConfig(max_turns=3))
    await engine.close()
    assert trajectory.turns == 3 and agents[0].turn == 3
    assert agents[0].ids == trajectory.input_ids


async def test_engine_agent_drops_oldest_turns_with_a_marker(tiny):
    from envhub.agents import EngineAgent
    from envhub.agents.chat import CONTEXT_MARKER
    from envhub.inference import SamplingParams
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine

    model, tokenizer = tiny
    engine = EmbeddedEngine(model, tokenizer)
    env = envhub.make("Letters-v0", turns=20)
    obs, info = env.reset(seed=0)
    probe = EngineAgent(engine, tokenizer, SamplingParams(max_new_tokens=8, temperature=0.0))
    probe.reset(info)
    first_prompt = len(
        probe.chat.add_messages(
            [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": obs}]
        )
    )
    agent = EngineAgent(
        engine, tokenizer, SamplingParams(max_new_tokens=8, temperature=0.0), max_total_tokens=first_prompt + 8 + 100
    )
    agent.reset(info)
    for _ in range(8):
        action = await agent.act(obs, info)
        assert len(agent.ids) <= agent.max_total_tokens
        obs, *_ = env.step(action)
    assert agent.dropped_turns >= 1
    marker = CONTEXT_MARKER.format(n=agent.dropped_turns).split("]")[0]
    assert marker in agent.chat.messages[1]["content"] and agent.chat.messages[0]["role"] == "system"
    too_small = EngineAgent(
        engine, tokenizer, SamplingParams(max_new_tokens=8, temperature=0.0), max_total_tokens=first_prompt
    )
    too_small.reset(info)
    with pytest.raises(AgentError, match="the task and the newest turn need") as caught:
        await too_small.act(obs, info)
    assert caught.value.kind == "context_length"
    await engine.close()


async def test_expert_passes_a_structured_oracle_call_through():
    class Structured(envhub.AgentEnv):
        """Answer with the `answer` tool; the oracle gives the call as a dict."""

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return "what is the word?", {"tools": []}

        def step(self, action):
            right = isinstance(action, dict) and action.get("arguments", {}).get("word") == "owl"
            return "done", float(right), True, False, {}

        def oracle_action(self):
            return {"name": "answer", "arguments": {"word": "owl"}}

    envhub.register("StructuredOracle-v0", Structured, tags=("test",))
    summary = await evaluate(["StructuredOracle-v0"], ExpertAgent, episodes=2)
    assert summary["StructuredOracle-v0"]["mean_reward"] == 1.0 and summary["StructuredOracle-v0"]["errors"] == {}
