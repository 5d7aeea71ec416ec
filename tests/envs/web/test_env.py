"""WebShop-v0: the oracle, a random policy, bad input, tool calls, step limits, check_env, concurrency."""

import asyncio
import random

import pytest
from gymnasium.utils.env_checker import check_env

import envhub
from envhub.envs.web.env import WebShopEnv


async def run_oracle(env, seed):
    obs, info = await env.areset(seed=seed)
    assert info["instruction"] in obs and "[Search]" in obs
    reward = 0.0
    for action in env.unwrapped.oracle_actions():
        obs, reward, terminated, truncated, info = await env.astep(action)
        assert "error" not in info, (action, info["error"])
    assert terminated and not truncated
    return reward


async def test_oracle_scores_one_on_50_seeds():
    env = envhub.make("WebShop-v0")
    paged = 0
    try:
        rewards = []
        for seed in range(50):
            rewards.append(await run_oracle(env, seed))
            paged += "click[Next >]" in env.unwrapped.oracle_actions()
    finally:
        await env.aclose()
    assert rewards == [1.0] * 50
    assert paged >= 1  # some targets sit past the first result page, so paging is exercised too


def random_action(rng, obs, info):
    if info["has_search"]:
        words = obs.split("Instruction:", 1)[-1].split("\n", 1)[0].split()
        return f"search[{' '.join(rng.sample(words, k=min(3, len(words))))}]"
    return f"click[{rng.choice(info['available_actions'])}]"


async def test_random_policy_scores_clearly_less():
    rng = random.Random(0)
    env = envhub.make("WebShop-v0")
    rewards = []
    try:
        for seed in range(30):
            obs, info = await env.areset(seed=seed)
            reward, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, info = await env.astep(random_action(rng, obs, info))
                done = terminated or truncated
            rewards.append(reward)
    finally:
        await env.aclose()
    assert sum(rewards) / len(rewards) < 0.35  # the oracle gets 1.0


async def test_bad_input_gives_readable_observations_and_the_episode_continues():
    env = WebShopEnv()
    try:
        obs, _ = await env.areset(seed=1)
        cases = {
            "buy the cheapest thing": "Invalid action",
            "search[]": "search is empty",
            "search[   ]": "search is empty",
            "click[Nowhere]": "no element [Nowhere]",
            "click[Search]": "write search[your query]",
            '<tool_call>{"name": "click", "arguments": {}}</tool_call>': "missing required argument",
            '<tool_call>{"name": "fly", "arguments": {}}</tool_call>': "unknown tool",
            "<tool_call>{not json</tool_call>": "not valid JSON",
            "": "Invalid action",
        }
        for action, expected in cases.items():
            obs, reward, terminated, truncated, info = await env.astep(action)
            assert expected.lower() in obs.lower() and expected.lower() in info["error"].lower(), action
            assert reward == 0.0 and not terminated and "[Search]" in obs  # still on the home page
        obs, *_, info = await env.astep("search[café & crème / qq% <i>zz</i>?page=kk]")  # odd characters are just words
        assert "error" not in info and "No products matched" in obs
        await env.astep("click[Back to Search]")
        obs, *_, info = await env.astep("search[" + "blanket " * 500 + "]")  # long queries are cut, not refused
        assert "error" not in info and "[Next >]" in obs
        obs, *_, info = await env.astep("search[lamp]")
        assert "not available on this page" in info["error"] and "Back to Search" in obs
        obs, *_, info = await env.astep("click[Buy Now]")
        assert "no element" in info["error"]
    finally:
        await env.aclose()


async def test_tool_calls_and_loose_text_are_accepted():
    env = WebShopEnv()
    try:
        await env.areset(seed=2)
        target = env.goal.target_asin
        obs, _, _, _, info = await env.astep({"name": "search", "arguments": {"query": target}})
        assert "error" not in info and f"[{target}]" in obs
        obs, _, _, _, info = await env.astep(
            f'Let me open it.\n<tool_call>{{"name": "click", "arguments": {{"element": "{target}"}}}}</tool_call>'
        )
        assert "[Buy Now]" in obs
        dim, value = next(iter(env.goal.options.items()))
        obs, _, _, _, info = await env.astep(
            f"The {dim} should be {value}, so: click[[{value}]]"
        )  # value alone, bracketed
        assert "error" not in info and f"[{dim}: {value}] (selected)" in obs
        two = '<tool_call>{"name": "click", "arguments": {"element": "Back to Search"}}</tool_call>' * 2
        obs, _, _, _, info = await env.astep(two)
        assert "only the first of your 2 tool calls" in obs and info["has_search"]
    finally:
        await env.aclose()


def test_sync_api_step_limit_and_determinism():
    env = envhub.make("WebShop-v0")
    try:
        first, _ = env.reset(seed=11)
        assert env.reset(seed=11)[0] == first
        truncated = False
        for _ in range(20):
            _, reward, terminated, truncated, _ = env.step("click[Nowhere]")
            assert not terminated
        assert truncated and reward == 0.0
    finally:
        env.close()


@pytest.mark.filterwarnings("ignore:.*alternative render modes")  # built without gym.make, on purpose
def test_passes_gymnasium_check_env():
    env = WebShopEnv()
    try:
        check_env(env)
    finally:
        env.close()


async def test_64_concurrent_episodes_against_one_server():
    envs = [WebShopEnv() for _ in range(64)]
    try:
        rewards = await asyncio.gather(*(run_oracle(env, 1000 + i) for i, env in enumerate(envs)))
        servers = {env._server for env in envs}
    finally:
        await asyncio.gather(*(env.aclose() for env in envs))
    assert rewards == [1.0] * 64 and len(servers) == 1
    assert not next(iter(servers)).running  # the last episode closed the shared server


def test_unknown_render_mode_is_a_clear_error():
    with pytest.raises(envhub.ConfigError, match="render"):
        WebShopEnv(render="video")


async def browse(env, seed, actions):
    """The anchors of reset and of each action, checking every action worked."""
    _, info = await env.areset(seed=seed)
    anchors = [info["anchor"]]
    for action in actions:
        *_, info = await env.astep(action)
        assert "error" not in info, (action, info["error"])
        anchors.append(info["anchor"])
    return anchors


async def test_anchor_names_the_page_and_its_selections_not_the_way_there(shop_server):
    env = WebShopEnv(shop_url=shop_server.url)
    try:
        for seed in range(50):  # a goal with two options to choose, so they can be chosen in either order
            await env.areset(seed=seed)
            if len(env.goal.options) >= 2:
                break
        plan = env.oracle_actions()
        to_item = plan[: plan.index(f"click[{env.goal.target_asin}]") + 1]
        options = [a for a in plan if a.startswith("click[") and ": " in a]
        one_way = await browse(env, seed, to_item + options)
        other_way = await browse(env, seed, to_item + options[::-1])
        assert one_way[-1] == other_way[-1] and one_way[-1].startswith(f"page=/item/{env.goal.target_asin}|")
        assert one_way[-2] != other_way[-2]  # one option chosen, not the same one: different pages
        assert len(set(one_way)) == len(one_way)  # each step on the way showed a new page
        back = await browse(env, seed, [to_item[0], "click[Back to Search]"])
        assert back[2] == back[0] == one_way[0] and back[0].startswith("page=/|")
        again = WebShopEnv(shop_url=shop_server.url)  # another session: the session id is not in the anchor
        try:
            assert await browse(again, seed, to_item) == one_way[: len(to_item) + 1]
            assert (await again.areset(seed=seed + 1))[1]["anchor"] != one_way[0]  # another goal
        finally:
            await again.aclose()
    finally:
        await env.aclose()


async def test_anchor_stays_when_an_action_changes_nothing(shop_server):
    env = WebShopEnv(shop_url=shop_server.url)
    try:
        _, info = await env.areset(seed=1)
        for action in ("click[No Such Button]", "buy it please", "click[Buy Now]"):
            *_, after = await env.astep(action)
            assert "error" in after and after["anchor"] == info["anchor"]
    finally:
        await env.aclose()
