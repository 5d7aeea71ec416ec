"""`ToolEnv` / `SandboxToolEnv`: tools declared with @tool, every problem an observation, pooled sandboxes."""

import asyncio
import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envhub
from envhub.toolcalls import ToolCall, run_tool_call
from envhub.tools import ToolContext, bash, create_file, str_replace_edit, tool, view


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class Counter(envhub.ToolEnv):
    """Count up to a target; reward 0.1 per correct increment and 1.0 on reaching the target."""

    system_prompt = "Call add until the total reaches the target, then call done."
    max_calls_per_step = 0  # run every call of an action
    max_steps = 6

    def __init__(self, target: int = 3) -> None:
        self.target = target

    @tool
    def add(self, amount: int) -> str:
        """Add to the total.

        Args:
            amount: How much to add (1 or 2).
        """
        if amount not in (1, 2):
            raise ValueError("amount must be 1 or 2")
        self.total += amount
        self.add_reward(0.1)
        return f"total {self.total}"

    @tool
    def done(self) -> str:
        """Declare the count finished; ends the episode."""
        return self.finish("finished", reward=float(self.total == self.target), total=self.total)

    @tool
    async def wait(self, seconds: float) -> str:
        """Wait a while.

        Args:
            seconds: How long.
        """
        await asyncio.sleep(seconds)
        return "waited"

    tools = (add, done, wait)

    def setup(self, options):
        self.total = 0
        return f"Reach {self.target}."


class SyncCounter(Counter):
    """Counter without the async tool: its sync API runs inline."""

    tools = (Counter.add, Counter.done)


def test_method_tools_have_schemas_without_self_and_run_on_the_env():
    env = SyncCounter(target=3)
    obs, info = env.reset(seed=0)
    assert obs == "Reach 3." and [t["function"]["name"] for t in info["tools"]] == ["add", "done"]
    assert info["tools"][0]["function"]["parameters"]["required"] == ["amount"]
    obs, reward, terminated, truncated, info = env.step(call("add", amount=1) + call("add", amount=2))
    assert obs == "[1: add]\ntotal 1\n\n[2: add]\ntotal 3" and reward == pytest.approx(0.2) and not terminated
    assert [c["ok"] for c in info["tool_calls"]] == [True, True]
    obs, reward, terminated, truncated, info = env.step(call("done") + call("add", amount=1))
    assert (reward, terminated, truncated, info["total"]) == (1.0, True, False, 3)
    assert "the episode ended at call 1" in obs
    with pytest.raises(envhub.ResetNeeded):
        env.step(call("done"))


@pytest.mark.parametrize(
    "action, expected",
    [
        ('<tool_call>{"name": "add", "arguments": {</tool_call>', "not valid JSON"),
        (call("rm_rf"), "unknown tool 'rm_rf'; available tools: add, done"),
        (call("add"), "missing required argument(s) amount"),
        (call("add", amount="lots"), "argument 'amount' should be integer"),
        (call("add", amount=7), "error: add failed: ValueError: amount must be 1 or 2"),
        (
            "I think I will add one.",
            'No tool call found. Call one of your tools (add, done), written as <tool_call>{"name": "add"',
        ),
        (b"\xff\xfe add", "not valid UTF-8"),
    ],
)
def test_every_problem_is_an_observation_and_the_episode_goes_on(action, expected):
    env = SyncCounter()
    env.reset(seed=0)
    obs, reward, terminated, truncated, _ = env.step(action)
    assert expected in obs and env.observation_space.contains(obs)
    assert not terminated and not truncated and reward == 0.0
    assert env.step(call("add", amount=1))[0] == "total 1"


def test_step_limit_truncates_and_calls_past_the_limit_note_it():
    env = SyncCounter()
    env.max_steps = 2
    env.reset(seed=0)
    env.step(call("add", amount=1))
    obs, reward, terminated, truncated, _ = env.step(call("add", amount=1))
    assert "[step limit reached]" in obs and truncated and not terminated


def test_async_tool_past_its_timeout_is_reported_as_timed_out():
    env = Counter()
    env.tool_timeout = 0.2
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(call("wait", seconds=5))
    assert "did not finish within 0.2 s" in obs and info["tool_calls"] == [
        {"name": "wait", "ok": False, "timed_out": True}
    ]
    assert not terminated and env.step(call("add", amount=2))[0] == "total 2"


async def test_async_api_matches_the_sync_one():
    env = Counter()
    obs, _ = await env.areset(seed=0)
    _, reward, terminated, _, _ = await env.astep(call("add", amount=2) + call("add", amount=1) + call("done"))
    assert (reward, terminated) == (pytest.approx(1.2), True)
    await env.aclose()


def test_registered_tool_envs_pass_check_env():
    envhub.register("TestCounter-v0", Counter, max_episode_steps=10)
    envhub.register("TestSyncCounter-v0", SyncCounter, max_episode_steps=10)
    for env_id in ("envhub/TestCounter-v0", "envhub/TestSyncCounter-v0"):
        env = gym.make(env_id)
        check_env(env.unwrapped, skip_render_check=False)
        env.close()


class AnchoredCounter(SyncCounter):
    """SyncCounter naming its state: the total (the target is fixed by the constructor)."""

    def anchor(self):
        return f"total={self.total}"


def test_a_tool_env_puts_its_anchor_in_the_reset_and_every_step_info():
    env = AnchoredCounter(target=5)
    assert env.reset(seed=0)[1]["anchor"] == "total=0"
    assert env.step(call("add", amount=1) + call("add", amount=2))[4]["anchor"] == "total=3"
    assert env.step("no tool call here")[4]["anchor"] == "total=3"  # a wasted turn changes no state
    *_, info = env.step(call("done"))
    assert info["anchor"] == "total=3" and info["total"] == 3  # the final step's info too
    env.reset(seed=1)
    assert env.step(call("add", amount=2) + call("add", amount=1))[4]["anchor"] == "total=3"  # another way there


def test_a_tool_env_without_an_anchor_leaves_the_key_out():
    env = SyncCounter()
    _, info = env.reset(seed=0)
    assert "anchor" not in info and "anchor" not in env.step(call("add", amount=1))[4]


# -- sandboxed tool envs -------------------------------------------------------------------------


class FindSecret(envhub.SandboxToolEnv):
    """Find the secret word hidden in a file; reward 1.0 for the right answer."""

    sandbox_spec = envhub.SandboxSpec(backend="bwrap", command_timeout=5)
    system_prompt = "A secret word is hidden in a file under /workspace. Find it and answer."

    @tool
    def answer(self, word: str) -> str:
        """Give the secret word; ends the episode.

        Args:
            word: The secret word.
        """
        right = word.strip() == self.secret
        return self.finish("right" if right else "wrong", reward=float(right))

    tools = (bash, view, answer)

    async def setup(self, options):
        self.secret = str(self.np_random.choice(["apple", "pear", "plum"]))
        await self.sandbox.write_file(f"{self.workdir or '/workspace'}/notes/secret.txt", self.secret + "\n")
        return "Find the secret."


async def test_sandboxed_env_acquires_at_reset_and_releases_at_the_end_on_reset_and_on_close(bwrap_pool):
    env = FindSecret()
    env.pool = bwrap_pool
    await env.areset(seed=1)
    assert bwrap_pool.metrics().in_use == 1
    found, *_ = await env.astep(call("bash", command="cat notes/secret.txt"))
    assert env.secret in found and "[exit code 0]" in found
    await env.areset(seed=2)  # the first episode's sandbox goes back; one is held
    assert bwrap_pool.metrics().in_use == 1
    missing, *_ = await env.astep(call("view", path="notes/nope.txt"))
    assert missing == "error: cannot read notes/nope.txt: no such file or directory"
    _, reward, terminated, _, _ = await env.astep(call("answer", word=env.secret))
    assert (reward, terminated) == (1.0, True) and bwrap_pool.metrics().in_use == 0
    await env.areset(seed=3)
    await env.aclose()
    assert bwrap_pool.metrics().in_use == 0
    with pytest.raises(envhub.SandboxError):
        _ = env.sandbox


def test_sandboxed_env_passes_check_env_through_the_shared_pool(base_rootfs):
    envhub.register("TestFindSecret-v0", FindSecret, max_episode_steps=5)
    env = gym.make("envhub/TestFindSecret-v0")
    try:
        check_env(env.unwrapped, skip_render_check=True)
        env.reset(seed=0)
        obs, reward, terminated, _, _ = env.step(call("answer", word=env.unwrapped.secret))
        assert (obs, reward, terminated) == ("right", 1.0, True)
    finally:
        env.close()


async def test_sandbox_tools_report_timeouts_and_never_leak_helper_commands(bwrap_pool):
    async with bwrap_pool.acquire() as sandbox:
        ctx = ToolContext(sandbox=sandbox, command_timeout=1)
        slow = await run_tool_call(ToolCall("bash", {"command": "sleep 30"}), [bash], ctx)
        assert (slow.ok, slow.timed_out) == (False, True) and "timed out after 1 s and was killed" in slow.output
        fast = await run_tool_call(ToolCall("bash", {"command": "exit 3"}), [bash], ctx)
        assert (fast.ok, fast.timed_out) == (True, False) and "[exit code 3]" in fast.output
        await sandbox.exec("mkdir -p /workspace/ro && chmod 500 /workspace/ro", timeout=10)
        for name, arguments, reason in [
            ("view", {"path": "missing.py"}, "no such file or directory"),
            ("str_replace_edit", {"path": "missing.py", "old_str": "a", "new_str": "b"}, "no such file or directory"),
            ("create_file", {"path": "ro/new.py", "content": "x = 1\n"}, "Permission denied"),
        ]:
            result = await run_tool_call(ToolCall(name, arguments), [view, str_replace_edit, create_file], ctx)
            assert not result.ok and reason in result.output, result.output
            assert not any(word in result.output for word in ("base64", "cat:", "mkdir", "sandbox")), result.output
