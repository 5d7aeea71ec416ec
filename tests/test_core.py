"""AgentEnv: sync and async envs are each usable through both APIs, and pass gymnasium's checker."""

import asyncio
import time

import pytest
from gymnasium.utils.env_checker import check_env

from envhub import AgentEnv, UnicodeText, run_sync, tool


@tool
def guess(number: int) -> str:
    """Guess the hidden number.

    Args:
        number: Your guess.
    """
    return str(number)


class SlowGuess(AgentEnv):
    """An async env that waits on I/O (simulated latency) each step: guess a number in 0..9."""

    tools = (guess,)
    system_prompt = "Guess the number between 0 and 9."

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.target = 0

    async def areset(self, *, seed=None, options=None):
        _, info = await super().areset(seed=seed)
        self.target = int(self.np_random.integers(10))
        return "Guess a number from 0 to 9.", info

    async def astep(self, action):
        from envhub import parse_tool_calls

        await asyncio.sleep(self.delay)
        parsed = parse_tool_calls(action, self.tools)
        if not parsed.ok or not parsed.calls:
            return (parsed.error_message() if not parsed.ok else "Call the guess tool."), 0.0, False, False, {}
        value = parsed.calls[0].arguments["number"]
        if value == self.target:
            return "Correct!", 1.0, True, False, {}
        return ("higher" if value < self.target else "lower"), 0.0, False, False, {}


def call(n):
    return f'<tool_call>{{"name": "guess", "arguments": {{"number": {n}}}}}</tool_call>'


def solve_sync(env):
    lo, hi = 0, 9
    obs, info = env.reset(seed=3)
    assert info["system_prompt"] and info["tools"][0]["function"]["name"] == "guess"
    for _ in range(10):
        mid = (lo + hi) // 2
        obs, reward, terminated, _, _ = env.step(call(mid))
        if terminated:
            return reward
        lo, hi = (mid + 1, hi) if obs == "higher" else (lo, mid - 1)
    return 0.0


def test_async_env_through_the_sync_api():
    assert solve_sync(SlowGuess()) == 1.0


def test_same_seed_same_episode():
    a, b = SlowGuess(), SlowGuess()
    a.reset(seed=11)
    b.reset(seed=11)
    assert a.target == b.target


def test_gymnasium_check_env_passes_for_an_async_env():
    check_env(SlowGuess(), skip_render_check=True)


def test_async_episodes_progress_independently():
    """Fifty envs stepping with 50 ms latency take about one latency in total, not fifty."""

    async def episode(env):
        await env.areset(seed=1)
        for _ in range(3):
            await env.astep(call(5))

    async def main():
        start = time.perf_counter()
        await asyncio.gather(*(episode(SlowGuess(delay=0.05)) for _ in range(50)))
        return time.perf_counter() - start

    elapsed = asyncio.run(main())
    assert elapsed < 50 * 3 * 0.05 / 5  # a lock-step or blocking env would take 7.5 s


def test_sync_methods_work_from_inside_a_running_loop():
    """Notebook users call env.step() while a loop runs; it must not deadlock."""

    async def main():
        return solve_sync(SlowGuess())

    assert asyncio.run(main()) == 1.0


def test_an_env_must_implement_step_or_astep():
    with pytest.raises(TypeError, match="must implement step"):

        class Broken(AgentEnv):
            pass


def test_unicode_text_space_accepts_any_text_utf8_can_carry():
    space = UnicodeText(max_length=20)
    assert space.contains("héllo → 世界\n\tok")
    assert space.contains("a\xa0b\u3000c\x08")  # real data: no-break and ideographic spaces, a backspace in code
    assert not space.contains("lone \ud800")
    assert not space.contains(b"bytes")
    assert not space.contains("x" * 21)
    assert space.contains(space.sample())
    assert run_sync(asyncio.sleep(0, result=5)) == 5


def test_state_digest_is_short_canonical_and_tells_states_apart():
    from envhub.core import state_digest

    assert state_digest({"b": [1, 2], "a": "x"}) == state_digest({"a": "x", "b": [1, 2]})  # key order is not state
    assert len(state_digest([1, 2])) == 16 and state_digest([1, 2]) != state_digest([2, 1])
    assert state_digest(b"grid bytes") != state_digest("grid bytes") and len(state_digest(b"x", size=4)) == 8
    with pytest.raises(TypeError):
        state_digest({1, 2})  # sets have no canonical order in JSON: pass a sorted list
