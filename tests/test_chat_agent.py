"""`ChatAgent` against `envhub serve-engine`'s /v1 routes on 127.0.0.1 (tiny Llama behind them), with the `openai`
client."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

import envhub
from envhub.agents import AgentError
from envhub.agents.chat import CONTEXT_MARKER, ChatAgent, ChatEndpoint
from envhub.cli.agent_spec import make_agent_factory
from envhub.eval import EvalConfig, evaluate
from tests.conftest import default_sigint
from tests.openai_server import compat_server, openai_server  # noqa: F401  (fixtures)

pytest.importorskip("openai")


def chat_requests(server):
    return [r for r in server.faults.requests if r["path"].endswith("/chat/completions")]


def agent_for(server, **options):
    return ChatAgent(
        ChatEndpoint(server.base_url, server.model), max_tokens=options.pop("max_tokens", 8), backoff_s=0.01, **options
    )


async def test_replies_come_from_the_model_through_its_chat_template(openai_server):
    """The agent's action is what the model greedily writes for the env's system prompt and observation."""
    env = envhub.make("Letters-v0")
    obs, info = env.reset(seed=0)
    agent = agent_for(openai_server)
    agent.reset(info)
    action = await agent.act(obs, info)
    tokenizer = openai_server.tokenizer
    messages = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": obs}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]
    from envhub.inference import SamplingParams

    sent = chat_requests(openai_server)[0]
    assert sent["messages"] == messages and sent["temperature"] == 0.0 and "tools" not in sent
    assert sent["model"] == openai_server.model
    direct = await _generate_on_server_loop(openai_server, ids, SamplingParams(max_new_tokens=8, temperature=0.0))
    assert action == tokenizer.decode(direct, skip_special_tokens=True) and action


async def _generate_on_server_loop(server, ids, sampling):
    import asyncio

    future = asyncio.run_coroutine_threadsafe(server.engine.generate(list(ids), sampling), server.loop)
    return (await asyncio.wrap_future(future)).output_ids


async def test_model_is_read_from_v1_models_when_not_named(openai_server):
    factory = make_agent_factory(f"openai:{openai_server.base_url}", max_tokens=4)
    summary = await evaluate(["Math-v0"], factory, episodes=2, concurrency=2)
    await factory.aclose()
    assert summary["Math-v0"]["episodes"] == 2 and summary["Math-v0"]["errors"] == {}
    assert {r["model"] for r in chat_requests(openai_server)} == {openai_server.model}
    assert (
        sum(r["path"] == "/v1/models" for r in openai_server.faults.requests) == 1
    )  # asked once, shared by the episodes


async def test_completions_route_speaks_the_openai_protocol(openai_server):
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=openai_server.base_url, api_key="EMPTY", max_retries=0) as client:
        completion = await client.completions.create(
            model=openai_server.model, prompt="Once upon a time", max_tokens=5, temperature=0.0
        )
        models = await client.models.list()
    assert completion.usage.completion_tokens == 5 and completion.choices[0].finish_reason == "length"
    assert [m.id for m in models.data] == [openai_server.model]


async def test_native_tool_calls_round_trip(openai_server):
    """Tools go out as `tools`; a returned tool call reaches the env; its result goes back as a `tool` message."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "move", "arguments": json.dumps({"direction": "up"})},
    }
    extra = {
        "id": "call_2",
        "type": "function",
        "function": {"name": "move", "arguments": json.dumps({"direction": "left"})},
    }
    openai_server.faults.scripted = [{"content": "", "tool_calls": [call, extra]}]
    records = []
    factory = make_agent_factory(f"openai:{openai_server.base_url}#{openai_server.model}", max_tokens=4)
    await evaluate(["FrozenLake-v0"], factory, episodes=1, config=EvalConfig(max_turns=2), on_episode=records.append)
    await factory.aclose()
    first, second = chat_requests(openai_server)[:2]
    assert [t["function"]["name"] for t in first["tools"]] == ["move"]
    assert records[0].turns[0]["tool_calls"] == [{"name": "move", "arguments": {"direction": "up"}}]
    assert "You moved up" in records[0].turns[0]["observation"] or "up" in records[0].turns[0]["observation"].lower()
    assert second["messages"][-3]["tool_calls"][0]["id"] == "call_1"
    assert [(m["role"], m["tool_call_id"]) for m in second["messages"][-2:]] == [("tool", "call_1"), ("tool", "call_2")]
    assert second["messages"][-2]["content"] == records[0].turns[0]["observation"]


async def test_server_without_tool_calling_falls_back_to_text_tool_calls(openai_server):
    openai_server.faults.no_tools = True
    factory = make_agent_factory(f"openai:{openai_server.base_url}#{openai_server.model}", max_tokens=4)
    summary = await evaluate(["Sokoban-v0"], factory, episodes=1, config=EvalConfig(max_turns=2))
    await factory.aclose()
    sent = chat_requests(openai_server)
    assert "tools" in sent[0] and all("tools" not in r for r in sent[1:]) and len(sent) == 3
    assert '"name": "move"' in sent[1]["messages"][0]["content"] and "<tool_call>" in sent[1]["messages"][0]["content"]
    assert summary["Sokoban-v0"]["errors"] == {}


async def test_malformed_tool_calls_are_counted_and_the_episode_goes_on(openai_server):
    bad = {"id": "call_9", "type": "function", "function": {"name": "move", "arguments": "{direction: up"}}
    openai_server.faults.scripted = [{"content": None, "tool_calls": [bad]}]
    records = []
    factory = make_agent_factory(f"openai:{openai_server.base_url}#{openai_server.model}", max_tokens=4)
    summary = await evaluate(
        ["FrozenLake-v0"], factory, episodes=1, config=EvalConfig(max_turns=2), on_episode=records.append
    )
    await factory.aclose()
    assert records[0].malformed_tool_calls == 1 and records[0].steps == 2 and records[0].error_kind is None
    assert "not valid JSON" in records[0].turns[0]["observation"]
    assert (
        summary["FrozenLake-v0"]["errors"] == {"malformed_tool_call": 1} and summary["FrozenLake-v0"]["episodes"] == 1
    )


async def test_429_and_500_are_retried_with_backoff(openai_server):
    openai_server.faults.statuses = [(429, {"Retry-After": "0"}), (500, {}), (503, {})]
    agent = agent_for(openai_server)
    agent.reset({"system_prompt": "Be brief."})
    assert isinstance(await agent.act("Say hi.", {}), str)
    assert agent.retries == 3 and len(chat_requests(openai_server)) == 4


async def test_errors_are_recorded_per_episode_and_the_run_goes_on(openai_server, tmp_path):
    """401, a 5xx that never stops, and an unreachable endpoint: each episode records its error; the summary counts
    them."""
    openai_server.faults.api_key = "right-key"
    wrong = make_agent_factory(f"openai:{openai_server.base_url}#{openai_server.model}", api_key="wrong-key")
    summary = await evaluate(
        ["Math-v0", "FrozenLake-v0"],
        wrong,
        episodes=2,
        out_dir=tmp_path / "auth",
        agent_name="wrong",
        config=EvalConfig(max_turns=2),
    )
    await wrong.aclose()
    assert {env: row["errors"] for env, row in summary.items()} == {
        "FrozenLake-v0": {"auth": 2},
        "Math-v0": {"auth": 2},
    }
    assert all(row["episodes"] == 0 for row in summary.values())
    record = json.loads((tmp_path / "auth" / "episodes.jsonl").read_text().splitlines()[0])
    assert record["error_kind"] == "auth" and "401" in record["error"] and "Incorrect API key" in record["error"]

    openai_server.faults.api_key = None
    openai_server.faults.statuses = [(500, {})] * 3
    records = []
    failing = make_agent_factory(f"openai:{openai_server.base_url}#{openai_server.model}", max_retries=2)
    summary = await evaluate(["Math-v0"], failing, episodes=1, on_episode=records.append)
    assert (
        summary["Math-v0"]["errors"] == {"server": 1}
        and records[0].retries == 2
        and "after 3 attempts" in records[0].error
    )

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = make_agent_factory(f"openai:http://127.0.0.1:{port}/v1#m", max_retries=1)
    records.clear()
    summary = await evaluate(["Math-v0", "Wordle-v0"], gone, episodes=2, concurrency=4, on_episode=records.append)
    assert {env: row["errors"] for env, row in summary.items()} == {
        "Math-v0": {"unreachable": 2},
        "Wordle-v0": {"unreachable": 2},
    }
    assert "cannot reach http://127.0.0.1" in records[0].error
    # the same run directory, endpoint back: the errored episodes are played again
    back = make_agent_factory(f"openai:{openai_server.base_url}#{openai_server.model}", max_tokens=4)
    summary = await evaluate(
        ["Math-v0", "FrozenLake-v0"],
        back,
        episodes=2,
        out_dir=tmp_path / "auth",
        agent_name="wrong",
        config=EvalConfig(max_turns=2),
    )
    await back.aclose()
    assert all(row["errors"] == {} and row["episodes"] == 2 for row in summary.values())


async def test_context_window_is_managed_and_overflow_is_an_episode_error(openai_server):
    agent = agent_for(openai_server, context_chars=900)
    agent.reset({"system_prompt": "Reply."})
    for turn in range(6):
        await agent.act(f"observation {turn}: " + "word " * 40, {})
    last = chat_requests(openai_server)[-1]["messages"]
    assert last[0] == {"role": "system", "content": "Reply."} and last[1]["content"].startswith("observation 0:")
    assert CONTEXT_MARKER.format(n=agent.dropped_turns) in last[1]["content"] and agent.dropped_turns >= 2
    assert last[-1]["content"].startswith("observation 5:")
    # the server's own context-length error (2048 tokens): the budget shrinks, and a task that cannot fit fails clearly
    huge = agent_for(openai_server)
    huge.reset({"system_prompt": "Reply."})
    with pytest.raises(AgentError, match="does not fit the model's context window") as caught:
        await huge.act("token " * 3000, {})
    assert caught.value.kind == "context_length" and "maximum context length is 2048" in str(caught.value)


async def test_context_overflow_has_openais_error_shape(openai_server):
    """serve-engine answers an overflow as OpenAI does: 400, code context_length_exceeded, the token counts in the
    message."""
    import openai

    async with openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="EMPTY", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as chat:
            await client.chat.completions.create(
                model=openai_server.model, messages=[{"role": "user", "content": "token " * 3000}], max_tokens=8
            )
        with pytest.raises(openai.BadRequestError) as plain:
            await client.completions.create(model=openai_server.model, prompt=list(range(10, 2051)), max_tokens=8)
        other = await client.completions.create(model=openai_server.model, prompt=list(range(10, 2040)), max_tokens=8)
    assert chat.value.code == "context_length_exceeded" and chat.value.type == "invalid_request_error"
    assert "maximum context length is 2048 tokens" in chat.value.message and "8 in the completion" in chat.value.message
    assert (
        plain.value.code == "context_length_exceeded"
        and "2049 tokens (2041 in the prompt, 8 in the completion)" in plain.value.message
    )
    assert other.usage.prompt_tokens == 2030  # just under the limit is served


@pytest.mark.slow
def test_ctrl_c_keeps_finished_episodes_and_the_rerun_completes(openai_server, tmp_path):
    """SIGINT to a real `envhub eval` against a slow endpoint: exit 130, whole lines on disk, a re-run plays only the
    rest."""
    import signal
    import subprocess
    import sys
    import time

    openai_server.faults.delay_s = 0.4
    out = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "envhub.cli.main",
        "eval",
        "Math-v0",
        "--agent",
        f"openai:{openai_server.base_url}#{openai_server.model}",
        "-n",
        "100",  # 20 s at 0.4 s an episode, 2 at once: the interrupt comes after the third
        "--concurrency",
        "2",
        "--max-tokens",
        "2",
        "--out",
        str(out),
        "--quiet",
    ]

    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint
    )
    log = out / "episodes.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 3):
        time.sleep(0.1)
    assert process.poll() is None, "the run ended before it could be interrupted; the test needs more episodes"
    status = Path(f"/proc/{process.pid}/status").read_text()
    masks = " ".join(line for line in status.splitlines() if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"envhub eval ignored SIGINT for 60 s (signal masks before it was sent: {masks})")
    assert process.returncode == 130 and "interrupted" in err
    kept = [json.loads(line) for line in log.read_text().splitlines()]  # every line whole
    assert 3 <= len(kept) < 100 and all(r["error_kind"] is None for r in kept)
    assert json.loads((out / "summary.json").read_text())["Math-v0"]["episodes"] == len(kept)
    openai_server.faults.delay_s = 0.0
    assert subprocess.run(argv, capture_output=True, text=True, timeout=300).returncode == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 100 and sorted(r["seed"] for r in records) == list(range(100))


async def test_an_agent_closes_the_client_it_made_but_never_a_shared_one(openai_server):
    env = envhub.make("Letters-v0")
    obs, info = env.reset(seed=0)
    with pytest.raises(RuntimeError, match="the caller's own bug"):
        async with ChatAgent(openai_server.base_url, openai_server.model, max_tokens=4) as agent:
            agent.reset(info)
            await agent.act(obs, info)
            client = agent.endpoint._client
            raise RuntimeError("the caller's own bug")
    assert agent.endpoint._client is None and client.is_closed()  # its own endpoint: closed on the way out
    async with ChatEndpoint(openai_server.base_url, openai_server.model) as shared:
        async with ChatAgent(shared, max_tokens=4) as first:
            first.reset(info)
            await first.act(obs, info)
        assert shared._client is not None and not shared._client.is_closed()  # other agents still use it
        kept = shared._client
    assert shared._client is None and kept.is_closed()
