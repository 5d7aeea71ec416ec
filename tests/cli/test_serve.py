"""`envhub serve` on the command line: refusing a public bind without a token, --help, --import, policy files, and the
same trust flags for `--protocol openenv`."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest

import envhub
from envhub import RemoteEnv, RemoteError
from envhub.server.policy import load_policy
from tests.server.test_security import GOOD_ID, PathEnv


def test_serve_refuses_a_public_address_without_a_token(capsys, monkeypatch):
    from envhub.cli.main import main

    monkeypatch.delenv("ENVHUB_TOKEN", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert (
        "refusing to serve on 0.0.0.0 without a token" in err
        and "ENVHUB_TOKEN" in err
        and len(err.strip().splitlines()) <= 2
    )


def test_serve_help_lists_the_endpoints():
    out = subprocess.run(
        [sys.executable, "-m", "envhub.cli.main", "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for needle in (
        "GET    /health",
        "POST   /sessions/{id}/step",
        "DELETE /sessions/{id}",
        "--unsafe-allow-local-backend",
        "--import",
        "--token",
    ):
        assert needle in out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_import_serves_envs_from_a_user_module(tmp_path):
    (tmp_path / "my_envs.py").write_text(
        textwrap.dedent("""\
        import envhub

        class Echo(envhub.AgentEnv):
            def __init__(self, loud: bool = False, render_mode=None):
                self.loud, self.render_mode = loud, render_mode
            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                return "say something", {}
            def step(self, action):
                return action.upper() if self.loud else action, 1.0, True, False, {}

        envhub.register("Echo-v0", Echo)
        """)
    )
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "ENVHUB_TOKEN"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "envhub.cli.main",
            "serve",
            "--port",
            str(port),
            "--import",
            "my_envs",
            "--allow-kwarg",
            "Echo-v0:loud",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert "serving every registered env" in proc.stdout.readline()
        remote = RemoteEnv(f"http://127.0.0.1:{port}", "Echo-v0", loud=True)
        deadline = time.monotonic() + 20
        while True:
            try:
                remote.reset(seed=0)
                break
            except RemoteError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        assert remote.step("hello")[0] == "HELLO"
        remote.close()
        wrong = RemoteEnv(f"http://127.0.0.1:{port}", "Echo-v0", loud="yes")
        with pytest.raises(RemoteError, match="400.*'loud'.*bool"):
            wrong.reset()
        wrong.close()
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
    bad = subprocess.run(
        [sys.executable, "-m", "envhub.cli.main", "serve", "--port", str(port), "--import", "no_such_module_here"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--import no_such_module_here" in bad.stderr


def test_policy_file_errors_are_one_line(tmp_path):
    cases = {
        "envs: [1]": "must be a mapping",
        "envs:\n  Sokoban-v0:\n    client_kwargs:\n      num_boxes: {type: integer}": "unknown type",
        "envs:\n  Sokoban-v0:\n    client_kwargs:\n      num_boxes: {maximum: 3}": "unknown rule field",
        "envs:\n  Sokobn-v0: {}": "did you mean Sokoban-v0",
        "envs:\n  PathTest-v0:\n    client_kwargs:\n      data_dir: {type: path}": "needs `under",
    }
    envhub.register("PathTest-v0", PathEnv)
    for text, message in cases.items():
        path = tmp_path / "p.yaml"
        path.write_text(text)
        with pytest.raises(envhub.EnvhubError) as err:
            load_policy(path)
        assert message in str(err.value), (text, str(err.value))
    with pytest.raises(envhub.ConfigError, match="has no kwarg 'colour'"):
        load_policy(None, allow_kwargs=[f"{GOOD_ID}:colour"])


async def _openenv_session(port: int, token: str) -> dict:
    """The first reply to a reset on a fresh OpenEnv-protocol session (a WebSocket) with this token."""
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"ws://127.0.0.1:{port}/ws", headers=headers) as ws,
    ):
        await ws.send_json({"type": "reset", "data": {"seed": 0}})
        return await ws.receive_json(timeout=30)


async def _check_openenv_server(port: int) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/schema") as reply:
            assert reply.status == 401 and "token" in (await reply.json())["detail"]
    async with (
        aiohttp.ClientSession(headers={"Authorization": "Bearer beta"}) as http,
        http.ws_connect(f"ws://127.0.0.1:{port}/ws") as held,
    ):
        await held.send_json({"type": "reset", "data": {"seed": 0}})
        first = await held.receive_json(timeout=30)
        assert first["data"]["observation"]["text"].endswith("x y z")  # the policy file's server-side kwargs
        refused = await _openenv_session(port, "beta")  # --sessions-per-client 1
        assert refused["data"]["code"] == "CAPACITY_REACHED"
        assert (await _openenv_session(port, "alpha"))["type"] == "observation"  # the other token has its own


def test_serve_protocol_openenv_takes_the_same_trust_flags(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("envs:\n  Letters-v0:\n    kwargs: {letters: xyz}\n")
    port = _free_port()
    serve = [sys.executable, "-m", "envhub.cli.main", "serve", "--protocol", "openenv", "--env", "Letters-v0"]
    env = {k: v for k, v in os.environ.items() if k != "ENVHUB_TOKEN"}
    flags = ["--policy", str(policy), "--token", "alpha", "--token", "beta", "--sessions-per-client", "1"]
    proc = subprocess.Popen(
        [*serve, *flags, "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        started = proc.stdout.readline()
        assert "serving Letters-v0 in OpenEnv's protocol" in started and "2 token(s)" in started, started
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as reply:
                    assert json.load(reply)["status"] == "healthy"  # open without a token
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        asyncio.run(_check_openenv_server(port))
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
    bad = subprocess.run(
        [*serve, "--allow-kwarg", "Letters-v0:turns"], env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "takes no --allow-kwarg" in bad.stderr and len(bad.stderr.strip().splitlines()) <= 2
