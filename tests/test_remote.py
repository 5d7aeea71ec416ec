"""Remote envs: the same episodes locally and through `envhub serve`, errors, concurrency, dead servers."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
from gymnasium.utils.env_checker import check_env

import envhub
from envhub import RemoteEnv, RemoteError
from envhub.wire import json_safe

OWN_IDS = ["TicTacToe-SelfPlay-v0", "ConnectFour-SelfPlay-v0", "KuhnPoker-SelfPlay-v0"]


def _pure_python_ids() -> list[str]:
    """Our ids plus every registered game/math env whose module is importable in this checkout."""
    ids = list(OWN_IDS)
    for spec in envhub.list_envs():
        if (
            spec.multiagent or spec.id in ids or not {"game", "math"} & set(spec.tags) or spec.source != "envhub"
        ):  # adapted families: tests/envs/adapters
            continue
        try:
            spec.load()
        except envhub.RegistrationError:
            continue
        ids.append(spec.id)
    return ids


SERVABLE_IDS = _pure_python_ids()
ACTIONS = ["B2", "4", "call", "up", "crane", "42", "hello", "A1", "bet", "left"]


def run_episode(env, seed: int, steps: int = 8) -> list:
    obs, info = env.reset(seed=seed)
    record = [obs, json_safe(info)]
    for i in range(steps):
        obs, reward, terminated, truncated, info = env.step(ACTIONS[(seed + i) % len(ACTIONS)])
        record.append((obs, float(reward), terminated, truncated, json_safe(info)))
        if terminated or truncated:
            break
    return record


@pytest.mark.parametrize("env_id", SERVABLE_IDS)
def test_same_episode_locally_and_remotely(env_server, env_id):
    local, remote = envhub.make(env_id), RemoteEnv(env_server.url, env_id)
    try:
        for seed in (0, 1):
            assert run_episode(remote, seed) == run_episode(local, seed)
    finally:
        local.close()
        remote.close()


@pytest.mark.parametrize("env_id", SERVABLE_IDS)
def test_check_env_passes_through_the_server(env_server, env_id):
    env = RemoteEnv(env_server.url, env_id)
    check_env(env, skip_render_check=True)
    env.close()


def test_kwargs_reach_the_remote_env(env_server):
    env = RemoteEnv(env_server.url, "TicTacToe-SelfPlay-v0", opponent="perfect", seat=1)
    obs, info = env.reset(seed=0)
    assert info["seat"] == 1 and "Your opponent played" in obs
    move = info["legal_moves"][0]
    obs, reward, *_, info = env.step({"name": "move", "arguments": {"move": move}})  # a tool-call dict travels as JSON
    assert reward == 0.0 and move not in info["legal_moves"]
    env.close()


async def test_100_concurrent_sessions_from_the_callers_own_loop(env_server):
    async def episode(seed: int) -> float:
        env = RemoteEnv(env_server.url, "TicTacToe-SelfPlay-v0", seat="random")
        try:
            _, info = await env.areset(seed=seed)
            peak.append(len(env_server.server.sessions))
            while True:
                _, _, terminated, truncated, info = await env.astep(info["legal_moves"][0])
                if terminated or truncated:
                    return info["result"]
        finally:
            await env.aclose()

    before, peak = len(env_server.server.sessions), []
    start = time.perf_counter()
    results = await asyncio.gather(*(episode(seed) for seed in range(100)))
    elapsed = time.perf_counter() - start
    assert len(results) == 100 and set(results) <= {-1.0, 0.0, 1.0}
    assert len(env_server.server.sessions) == before  # every episode closed its session
    assert max(peak) - before >= 50  # they really were open at the same time
    print(f"100 concurrent remote TicTacToe episodes in {elapsed:.2f}s, peak {max(peak) - before} sessions open")


async def _raw(env_server, method: str, path: str, **kwargs) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, env_server.url + path, **kwargs) as reply:
            return reply.status, await reply.json()


async def test_bad_requests_get_4xx_with_a_message(env_server):
    status, body = await _raw(env_server, "POST", "/sessions", data=b"{not json")
    assert status == 400 and "not valid JSON" in body["error"] and body["hint"]
    status, body = await _raw(env_server, "POST", "/sessions", json={"env_id": "TicTacToo-SelfPlay-v0"})
    assert status == 404 and "TicTacToe-SelfPlay-v0" in body["hint"]
    status, body = await _raw(env_server, "POST", "/sessions", json={"env_id": "TicTacToe-v0"})
    assert status == 400 and "TicTacToe-SelfPlay-v0" in body["hint"]
    status, body = await _raw(env_server, "POST", "/sessions", json={"env_id": "RockPaperScissors-v0"})
    assert status == 400 and "make_multiagent" in body["hint"]
    status, body = await _raw(
        env_server, "POST", "/sessions", json={"env_id": "TicTacToe-SelfPlay-v0", "kwargs": {"colour": 3}}
    )
    assert status == 400 and "colour" in body["error"]
    status, body = await _raw(env_server, "POST", "/sessions/nope/step", json={"action": "B2"})
    assert status == 404 and "unknown session" in body["error"]
    status, body = await _raw(env_server, "POST", "/sessions", json={"env_id": "TicTacToe-SelfPlay-v0"})
    sid = body["session_id"]
    status, body = await _raw(env_server, "POST", f"/sessions/{sid}/step", json={"action": "B2"})
    assert status == 409 and "before reset" in body["error"]
    status, body = await _raw(env_server, "POST", f"/sessions/{sid}/step", json={"act": "B2"})
    assert status == 400 and "missing 'action'" in body["error"]
    status, body = await _raw(env_server, "POST", f"/sessions/{sid}/reset", json={"seed": "x"})
    assert status == 400 and "seed" in body["error"]
    status, body = await _raw(env_server, "GET", "/no/such/route")
    assert status == 404 and "error" in body
    status, body = await _raw(env_server, "DELETE", f"/sessions/{sid}")
    assert status == 200 and body == {"closed": sid}
    status, body = await _raw(env_server, "GET", "/envs")
    listed = {spec["id"]: spec for spec in body}
    assert status == 200 and listed["TicTacToe-v0"]["multiagent"] and not listed["TicTacToe-SelfPlay-v0"]["multiagent"]
    status, body = await _raw(env_server, "GET", "/envs/ConectFour-SelfPlay-v0")
    assert status == 404 and "ConnectFour-SelfPlay-v0" in body["hint"]
    status, body = await _raw(env_server, "GET", "/health")
    assert status == 200 and body["status"] == "ok"


def test_client_errors_are_envhub_errors(env_server):
    typo = RemoteEnv(env_server.url, "Tictactoe-SelfPlay-v0")
    with pytest.raises(envhub.EnvNotFound, match="did you mean"):
        typo.reset()
    typo.close()
    env = RemoteEnv(env_server.url, "TicTacToe-SelfPlay-v0", opponent="perfect")
    with pytest.raises(envhub.ResetNeeded):
        env.step("B2")
    env.reset(seed=0)
    for _ in range(3):
        obs, reward, terminated, *_ = env.step("Z9")
    assert terminated and reward == -1.0
    with pytest.raises(envhub.ResetNeeded):
        env.step("B2")
    env.close()


def test_too_many_sessions_get_429_and_idle_ones_are_reaped():
    from tests.conftest import start_server

    # idle_timeout bounds the time between the first reset and the refused third one: under a loaded parallel suite
    # 0.3 s was once too short (the first two were reaped before the third asked)
    running, stop = start_server(idle_timeout=2.0, max_sessions=2)
    try:
        first, second = (RemoteEnv(running.url, "TicTacToe-SelfPlay-v0") for _ in range(2))
        first.reset(seed=0)
        second.reset(seed=0)
        third = RemoteEnv(running.url, "TicTacToe-SelfPlay-v0")
        with pytest.raises(RemoteError, match="429") as err:
            third.reset(seed=0)
        assert "maximum of 2 sessions" in str(err.value)
        deadline = time.monotonic() + 10
        while running.server.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running.server.sessions and running.server.reaped == 2
        with pytest.raises(RemoteError, match="reaped"):
            first.step("B2")
        third.reset(seed=0)  # room again
        for env in (first, second, third):
            env.close()
    finally:
        stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served_process():
    """`envhub serve` in a subprocess, which the test may kill."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "envhub.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert "serving every registered env" in proc.stdout.readline()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "envhub serve did not start"
            time.sleep(0.05)
    yield proc, url
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()


def test_killed_server_gives_a_clear_error_not_a_hang(served_process):
    proc, url = served_process
    env = RemoteEnv(url, "TicTacToe-SelfPlay-v0")
    env.reset(seed=0)
    env.step("B2")
    proc.kill()
    proc.wait(timeout=10)
    start = time.monotonic()
    with pytest.raises(RemoteError, match="stopped answering") as err:
        env.step("A1")
    assert time.monotonic() - start < 5 and "envhub serve" in str(err.value)
    env.close()  # closing against a dead server does not raise either
    fresh = RemoteEnv(url, "TicTacToe-SelfPlay-v0")
    with pytest.raises(RemoteError, match="cannot be reached"):
        fresh.reset()
    fresh.close()


def test_frozen_server_times_out_instead_of_hanging(served_process):
    proc, url = served_process
    env = RemoteEnv(url, "TicTacToe-SelfPlay-v0", request_timeout=1.0, connect_timeout=1.0)
    env.reset(seed=0)
    os.kill(proc.pid, signal.SIGSTOP)
    start = time.monotonic()
    with pytest.raises(RemoteError, match="no reply to POST"):
        env.step("B2")
    assert time.monotonic() - start < 4
    env.close()  # best effort against a frozen server: bounded by connect_timeout


def test_info_is_made_json_safe():
    import numpy as np

    safe = json_safe(
        {"mask": np.array([1, 0], dtype=np.int8), "x": np.float32(0.5), "s": {1, 2}, "f": float("nan"), "o": object}
    )
    assert safe["mask"] == [1, 0] and safe["x"] == 0.5 and sorted(safe["s"]) == [1, 2] and safe["f"] == "nan"
    assert isinstance(safe["o"], str)


def test_one_client_works_from_sync_code_and_from_several_event_loops(env_server):
    env = RemoteEnv(env_server.url, "TicTacToe-SelfPlay-v0", opponent="scripted")
    _, info = env.reset(seed=0)  # envhub's background loop
    first = asyncio.run(env.astep(info["legal_moves"][0]))  # a loop of the caller's, closed afterwards
    second = asyncio.run(env.astep(first[4]["legal_moves"][0]))  # another one
    third = env.step(second[4]["legal_moves"][0])
    assert "Your opponent played" in first[0] + second[0] + third[0] and not first[2]
    env.close()
    assert not env_server.server.sessions or all(
        s.env_id != "TicTacToe-SelfPlay-v0" for s in env_server.server.sessions.values()
    )


def test_serve_on_a_busy_port_is_one_clear_line(capsys):
    from envhub.cli.main import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert main(["serve", "--port", str(busy.getsockname()[1])]) == 2
    err = capsys.readouterr().err
    assert "cannot serve on 127.0.0.1:" in err and "hint: choose another --port" in err


class SlowSyncEnv(envhub.AgentEnv):
    """A sync-only env whose step blocks for a while, as a CPU-bound or subprocess env would."""

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        return "ready", info

    def step(self, action):
        time.sleep(0.5)
        return "done", 1.0, True, False, {}


async def test_a_slow_sync_env_does_not_stall_other_sessions(env_server):
    envhub.register("SlowSyncTest-v0", SlowSyncEnv)
    slow, fast = RemoteEnv(env_server.url, "SlowSyncTest-v0"), RemoteEnv(env_server.url, "TicTacToe-SelfPlay-v0")
    await slow.areset(seed=0)
    await fast.areset(seed=0)
    slow_step = asyncio.ensure_future(slow.astep("go"))
    await asyncio.sleep(0.05)
    start = time.perf_counter()
    await fast.astep("B2")
    assert time.perf_counter() - start < 0.4 and not slow_step.done()
    assert (await slow_step)[1] == 1.0
    await slow.aclose()
    await fast.aclose()


class BrokenResetEnv(envhub.AgentEnv):
    """An env whose reset raises: the server answers 500 and keeps no orphan session."""

    def reset(self, *, seed=None, options=None):
        raise RuntimeError("the level file is missing")

    def step(self, action):
        return "", 0.0, True, False, {}


def test_an_env_that_raises_gives_500_and_leaves_no_session(env_server):
    envhub.register("BrokenResetTest-v0", BrokenResetEnv)
    before = len(env_server.server.sessions)
    env = RemoteEnv(env_server.url, "BrokenResetTest-v0")
    with pytest.raises(RemoteError, match="500.*level file is missing"):
        env.reset(seed=0)
    assert len(env_server.server.sessions) == before
    env.close()


class CrashingStepEnv(envhub.AgentEnv):
    """An env whose step raises: the server answers 500."""

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        return "ready", info

    def step(self, action):
        raise RuntimeError("the grader crashed")


def _sessions_of(server, env_id: str) -> int:
    return sum(1 for s in server.server.sessions.values() if s.env_id == env_id)


async def test_a_failed_step_closes_its_session_at_once(env_server):
    envhub.register("CrashingStepTest-v0", CrashingStepEnv)
    env = RemoteEnv(env_server.url, "CrashingStepTest-v0")
    await env.areset(seed=0)
    assert _sessions_of(env_server, "CrashingStepTest-v0") == 1
    with pytest.raises(RemoteError, match="500.*grader crashed") as err:
        await env.astep("go")
    assert err.value.status == 500 and env.session_id is None
    assert _sessions_of(env_server, "CrashingStepTest-v0") == 0  # freed without waiting for aclose or the reaper
    await env.aclose()


async def test_a_cancelled_step_closes_its_session(env_server):
    envhub.register("SlowSyncTest-v0", SlowSyncEnv)
    env = RemoteEnv(env_server.url, "SlowSyncTest-v0")
    await env.areset(seed=0)
    step = asyncio.ensure_future(env.astep("go"))
    while _sessions_of(env_server, "SlowSyncTest-v0") and not any(
        s.lock.locked() for s in env_server.server.sessions.values() if s.env_id == "SlowSyncTest-v0"
    ):
        await asyncio.sleep(0.01)  # until the server is inside the step
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    assert env.session_id is None and _sessions_of(env_server, "SlowSyncTest-v0") == 0
    await env.aclose()


async def test_a_refused_action_keeps_the_session_for_the_next_step():
    from envhub.server.guard import ServerLimits
    from tests.conftest import start_server

    running, stop = start_server(limits=ServerLimits(max_action_chars=8))
    try:
        env = RemoteEnv(running.url, "TicTacToe-SelfPlay-v0")
        await env.areset(seed=0)
        with pytest.raises(RemoteError, match="413") as err:
            await env.astep("B2" * 100)
        assert err.value.status == 413 and env.session_id is not None  # never reached the env: the episode goes on
        await env.astep("B2")
        await env.aclose()
        assert not running.server.sessions
    finally:
        stop()


def test_with_and_async_with_close_the_session_however_the_block_ends(env_server):
    with pytest.raises(ValueError, match="the caller's own bug"):
        with RemoteEnv(env_server.url, "TicTacToe-SelfPlay-v0") as env:
            env.reset(seed=0)
            sid = env.session_id
            raise ValueError("the caller's own bug")
    assert sid not in env_server.server.sessions and not env._clients

    opened = []

    async def inside_a_loop():
        async with RemoteEnv(env_server.url, "TicTacToe-SelfPlay-v0") as env:
            await env.areset(seed=0)
            opened.append(env.session_id)
            raise ValueError("the caller's own bug")

    with pytest.raises(ValueError, match="the caller's own bug"):
        asyncio.run(inside_a_loop())
    assert opened and opened[0] not in env_server.server.sessions


async def test_the_env_listing_is_cached_yet_shows_an_env_registered_later(env_server):
    async with aiohttp.ClientSession() as http:
        async with http.get(env_server.url + "/envs") as reply:
            before = {e["id"] for e in await reply.json()}
        envhub.register("ListedLaterTest-v0", CrashingStepEnv)
        async with http.get(env_server.url + "/envs") as reply:
            after = {e["id"] for e in await reply.json()}
        async with http.get(env_server.url + "/envs", params={"tag": "no-such-tag"}) as reply:
            assert await reply.json() == []
    assert after - before == {"ListedLaterTest-v0"}
