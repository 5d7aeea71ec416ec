"""envhub envs served in OpenEnv's protocol (driven by OpenEnv's own client), and OpenEnvEnv on OpenEnv's own server."""

import socket
import threading
import time

import pytest
from gymnasium.utils.env_checker import check_env

import envhub
from tests.conftest import start_server

pytest.importorskip("openenv.core.env_server", reason="needs openenv-core (pip install 'envhub[openenv]')")
from openenv.core.env_server import Environment, create_app
from openenv.core.env_server.types import (
    Action,
    Observation,
    State,
    WSErrorResponse,
    WSObservationResponse,
    WSStateResponse,
)
from openenv.core.generic_client import GenericEnvClient

OPENENV_REPLY = {"observation": WSObservationResponse, "state": WSStateResponse, "error": WSErrorResponse}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=[None])
def envhub_openenv_server(request):
    """`envhub serve --protocol openenv` for Sokoban-v0 on 127.0.0.1, in a thread (param: the bearer token)."""
    running, stop = start_server("openenv", env_id="Sokoban-v0", tokens=[request.param] if request.param else [])
    yield running.url
    stop()


class Counter(Environment):
    """A minimal OpenEnv env built with OpenEnv's own server helpers: add the number you send; done at 10."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own instance

    def __init__(self):
        super().__init__()
        self._state = State(episode_id="e", step_count=0)
        self.total = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.total = seed or 0
        self._state = State(episode_id=episode_id or "e", step_count=0)
        return CounterObservation(message=f"total {self.total}", done=False, reward=None)

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        amount = int(action.amount) if action.amount.strip().isdigit() else 0  # check_env sends random text
        self.total += amount
        return CounterObservation(message=f"total {self.total}", done=self.total >= 10, reward=float(amount))

    @property
    def state(self):
        return self._state


class CounterAction(Action):
    amount: str


class CounterObservation(Observation):
    message: str


@pytest.fixture
def openenv_reference_server():
    """OpenEnv's own FastAPI server (create_app + uvicorn) for Counter on 127.0.0.1."""
    import uvicorn

    port = _free_port()
    app = create_app(Counter, CounterAction, CounterObservation, env_name="counter", max_concurrent_envs=32)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_openenv_client_plays_an_envhub_env_over_ws(envhub_openenv_server):
    local = envhub.make("Sokoban-v0")
    expected_obs, _ = local.reset(seed=3)
    expected_step = local.step("up")
    with GenericEnvClient(base_url=envhub_openenv_server, connect_timeout_s=10).sync() as env:
        first = env.reset(seed=3)
        assert first.observation["text"] == expected_obs and first.done is False
        result = env.step({"text": "up"})
        assert result.observation["text"] == expected_step[0]
        assert result.reward == expected_step[1] and result.done == (expected_step[2] or expected_step[3])
        state = env.state()
        assert state["step_count"] == 1 and state["env_id"] == "Sokoban-v0"
        with pytest.raises(Exception, match="text"):
            env.step({"wrong": "field"})


def test_openenv_http_routes_schema_health_and_stateless_reset(envhub_openenv_server):
    import requests

    health = requests.get(envhub_openenv_server + "/health", timeout=10).json()
    assert health["status"] == "healthy" and {"sessions", "max_sessions", "reaped", "timed_out"} <= set(health)
    schema = requests.get(envhub_openenv_server + "/schema", timeout=10).json()
    assert schema["action"]["required"] == ["text"] and "text" in schema["observation"]["properties"]
    reply = requests.post(envhub_openenv_server + "/reset", json={"seed": 3}, timeout=10).json()
    assert reply["observation"]["text"] == envhub.make("Sokoban-v0").reset(seed=3)[0] and reply["done"] is False
    bad = requests.post(envhub_openenv_server + "/step", json={"action": {"nope": 1}}, timeout=10)
    assert bad.status_code == 422 and "text" in bad.json()["detail"]
    assert requests.post(envhub_openenv_server + "/reset", json={"seed": -1}, timeout=10).status_code == 422


@pytest.mark.parametrize("envhub_openenv_server", ["s3cret"], indirect=True)
def test_a_token_protected_server_refuses_clients_without_it(envhub_openenv_server):
    import requests

    assert requests.get(envhub_openenv_server + "/schema", timeout=10).status_code == 401
    ok = requests.get(envhub_openenv_server + "/schema", headers={"Authorization": "Bearer s3cret"}, timeout=10)
    assert ok.status_code == 200
    with pytest.raises(ConnectionError):
        GenericEnvClient(base_url=envhub_openenv_server, connect_timeout_s=5).sync().connect()


def test_openenv_env_plays_openenvs_own_server(openenv_reference_server):
    env = envhub.OpenEnvEnv(openenv_reference_server)
    try:
        obs, info = env.reset(seed=2)
        assert obs == "total 2" and info["action_schema"]["required"] == ["amount"]
        obs, reward, terminated, truncated, info = env.step("5")  # plain text fills the schema's string field
        assert (obs, reward, terminated) == ("total 7", 5.0, False)
        obs, reward, terminated, _, _ = env.step('{"amount": "3"}')  # a JSON object is sent as the action
        assert (obs, reward, terminated) == ("total 10", 3.0, True)
        with pytest.raises(envhub.ResetNeeded):
            env.step("1")
        check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_openenv_env_through_the_registry_and_a_dead_server():
    env = envhub.make("OpenEnv-v0", url=f"http://127.0.0.1:{_free_port()}", request_timeout=5)
    with pytest.raises(envhub.RemoteError, match="cannot be reached"):
        env.reset()
    env.close()


def test_envhub_serve_protocol_openenv_from_the_command_line():
    import subprocess
    import sys

    import requests

    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "envhub.cli.main",
            "serve",
            "--protocol",
            "openenv",
            "--env",
            "FrozenLake-v0",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        env = envhub.OpenEnvEnv(f"http://127.0.0.1:{port}")
        obs, _ = env.reset(seed=5)
        assert obs == envhub.make("FrozenLake-v0").reset(seed=5)[0]
        env.close()
    finally:
        server.terminate()
        server.wait(10)
    bad = subprocess.run(
        [sys.executable, "-m", "envhub.cli.main", "serve", "--protocol", "openenv", "--env", "FrozenLak-v0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("envhub: error: unknown environment 'FrozenLak-v0'")


async def test_hostile_websocket_messages_get_errors_and_the_session_survives(envhub_openenv_server):
    import aiohttp

    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(envhub_openenv_server.replace("http", "ws") + "/ws") as ws,
    ):

        async def send(raw):
            await ws.send_str(raw)
            reply = await ws.receive_json(timeout=10)
            OPENENV_REPLY[reply["type"]].model_validate(reply)  # OpenEnv's own models accept every reply
            return reply

        assert (await send("{not json"))["data"]["code"] == "INVALID_JSON"
        assert (await send('{"type": "dance"}'))["data"]["code"] == "UNKNOWN_TYPE"
        assert "reset first" in (await send('{"type": "step", "data": {"text": "up"}}'))["data"]["message"]
        assert (await send('{"type": "reset", "data": {"seed": "x"}}'))["type"] == "error"
        refused = await send('{"type": "reset", "data": {"seed": 1, "env_kwargs": {"size": 99}}}')
        assert refused["data"]["code"] == "VALIDATION_ERROR" and "'env_kwargs'" in refused["data"]["message"]
        assert (await send('{"type": "reset", "data": {"seed": 1}}'))["type"] == "observation"
        assert (await send('{"type": "state"}'))["data"]["step_count"] == 0
        assert (await send('{"type": "step", "data": {"text": 5}}'))["type"] == "error"
        assert (await send('{"type": "step", "data": {"text": "up"}}'))["type"] == "observation"
        # Over the 1 MiB cap: the server closes this socket. It may do so as soon as it reads the frame's length,
        # while the client is still writing the rest, so a lost connection on send is the same outcome.
        try:
            await ws.send_str("x" * (2 << 20))
            closing = (await ws.receive(timeout=10)).type
        except ConnectionError:
            closing = aiohttp.WSMsgType.CLOSED
        assert closing in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)

    async with (  # and the server goes on serving new sessions
        aiohttp.ClientSession() as http,
        http.ws_connect(envhub_openenv_server.replace("http", "ws") + "/ws") as ws,
    ):
        await ws.send_str('{"type": "reset", "data": {"seed": 1}}')
        assert (await ws.receive_json(timeout=10))["type"] == "observation"


@pytest.mark.slow
async def test_envhub_train_runs_on_an_openenv_server_and_a_reasoning_gym_task(openenv_reference_server, tmp_path):
    import json

    pytest.importorskip("envhub.trainer.engines.embedded.engine")
    pytest.importorskip("reasoning_gym")
    from envhub.trainer.config import config_from_dict
    from envhub.trainer.train import Trainer

    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [
                {"env": "OpenEnv-v0", "kwargs": {"url": openenv_reference_server}},
                {"env": "rg-basic_arithmetic-v0"},
            ],
            "rollout": {"group_size": 4, "max_new_tokens": 4, "max_turns": 2},
            "algorithm": {
                "groups_per_step": 2,
                "lr": 0.01,
                "filter_zero_variance": False,
            },  # a random tiny model scores 0 everywhere
            "budget": {"steps": 2, "checkpoint_every": 2},
            "out_dir": str(tmp_path),
        }
    )
    result = await Trainer(config).run()
    assert result.last_step == 2 and not result.interrupted
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    seen = {key for row in rows for key in row}
    assert {"reward/OpenEnv-v0", "reward/rg-basic_arithmetic-v0"} <= seen


async def test_openenvs_own_client_meets_the_trust_layer():
    """OpenEnv's GenericEnvClient is slowed to its rate, sees the trust layer's refusals as OpenEnv errors, and its
    session survives them."""
    from envhub.server.guard import ServerLimits

    # 1 request/s, bursts of 2: the WebSocket upgrade and 4 messages cannot all be answered before 3 s, and all are
    limited, stop = start_server("openenv", env_id="Sokoban-v0", limits=ServerLimits(rate_limit=1))
    try:
        started = time.monotonic()
        async with GenericEnvClient(base_url=limited.url, connect_timeout_s=10) as env:
            await env.reset(seed=3)
            for _ in range(3):
                await env.step({"text": "up"})
        assert time.monotonic() - started >= 2.95
    finally:
        stop()
    running, stop = start_server("openenv", env_id="Sokoban-v0", limits=ServerLimits(max_action_chars=100))
    try:
        async with GenericEnvClient(base_url=running.url, connect_timeout_s=10) as env:
            with pytest.raises(RuntimeError, match="'dim'.*VALIDATION_ERROR"):  # env kwargs are the operator's
                await env.reset(seed=3, dim=10)
            first = await env.reset(seed=3)
            assert first.observation["text"] == envhub.make("Sokoban-v0").reset(seed=3)[0]
            with pytest.raises(RuntimeError, match="limit of 100.*VALIDATION_ERROR"):
                await env.step({"text": "u" * 101})
            assert (await env.step({"text": "up"})).observation["text"]
    finally:
        stop()
