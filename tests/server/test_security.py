"""Hostile clients against a real `envhub serve` on 127.0.0.1: the operator's policy holds, the server stays up.

Every test also checks that /health answers and that a well-behaved client's session keeps working.
"""

from __future__ import annotations

import asyncio
import math
import socket
import textwrap
import time

import aiohttp
import pytest

import envhub
from envhub import RemoteEnv, RemoteError
from envhub.server.guard import ServerLimits
from envhub.server.policy import builtin_policies, constructor_parameters, load_policy

GOOD_ID = "TicTacToe-SelfPlay-v0"


async def call(url: str, method: str, path: str, token: str | None = None, **kwargs) -> tuple[int, dict, dict]:
    """One raw request: (status, JSON body, headers)."""
    headers = {**kwargs.pop("headers", {}), **({"Authorization": f"Bearer {token}"} if token else {})}
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url + path, headers=headers, **kwargs) as reply:
            return reply.status, await reply.json(content_type=None), dict(reply.headers)


class GoodClient:
    """A well-behaved client holding one session that must keep working whatever others do."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.env = RemoteEnv(url, GOOD_ID, token=token, opponent="scripted")

    async def start(self) -> None:
        _, self.info = await self.env.areset(seed=0)

    async def still_works(self) -> None:
        status, body, _ = await call(self.env.url, "GET", "/health")
        assert status == 200 and body["status"] == "ok"
        obs, _, terminated, truncated, self.info = await self.env.astep(self.info["legal_moves"][0])
        assert "Your opponent played" in obs or terminated
        if terminated or truncated:
            await self.start()

    async def close(self) -> None:
        await self.still_works()
        await self.env.aclose()


def bundled_single_agent_ids() -> list[str]:
    """Every env envhub ships (not ones tests register), single-agent: what a server serves by default."""
    return [
        s.id
        for s in envhub.list_envs()
        if s.source == "envhub"
        and not s.multiagent
        and isinstance(s.entry_point, str)
        and s.entry_point.startswith("envhub.")
    ]


def hostile_values(rule) -> list:
    """Values the rule must refuse: wrong types, just outside each bound, far outside, traversal strings."""
    values = [{"nested": {"x": 1}}, "../../../../etc/passwd"]
    if rule.choices is not None:
        return values + [
            "not-a-choice",
            10**9,
            -1.5,
            True if None in rule.choices and False not in rule.choices else [1],
        ]
    if rule.min is not None:
        values += [rule.min - 1, -(10**12), math.nan]
    if rule.max is not None:
        values += [rule.max + 1, 10**12]
    if rule.max_length is not None:
        values += ["x" * (rule.max_length + 1)] if "str" in rule.types else []
        values += [[4] * (rule.max_length + 1)] if "list" in rule.types else []
    return [v for v in values if not (isinstance(v, str) and "str" in rule.types and len(v) <= (rule.max_length or 0))]


def edge_values(rule) -> list:
    """Values at the rule's bounds, which a client may send."""
    if rule.choices is not None:
        return list(rule.choices)
    edges = [v for v in (rule.min, rule.max) if v is not None]
    if "list" in rule.types and rule.items is not None and rule.items.min is not None:
        edges.append([int(rule.items.max)] * (rule.max_length or 1))
    if "str" in rule.types and rule.items is None:
        edges.append("a" * (rule.max_length or 1))
    if "bool" in rule.types:
        edges += [True, False]
    return edges


async def test_every_kwarg_of_every_bundled_env_is_refused_or_bounded(serve):
    running = serve()
    good = GoodClient(running.url)
    await good.start()
    ids = bundled_single_agent_ids()
    assert {"SWE-v0", "Sokoban-v0", "WebShop-v0", GOOD_ID} <= set(ids)
    tried = refused = accepted = 0
    for env_id in ids:
        params = constructor_parameters(envhub.spec(env_id).load())
        assert params, f"{env_id}: constructor kwargs must be inspectable so that the policy can check them"
        rules = builtin_policies().get(env_id)
        for name in params:
            rule = rules.client_kwargs.get(name) if rules else None
            if rule is None:  # not client-settable: whatever the value, 403 naming the kwarg and the flag
                for value in ("local", "../../../../etc", 10**9, None):
                    status, body, _ = await call(
                        running.url, "POST", "/sessions", json={"env_id": env_id, "kwargs": {name: value}}
                    )
                    tried += 1
                    refused += status == 403
                    assert status == 403 and repr(name) in body["error"] and "--allow-kwarg" in body["hint"], (
                        env_id,
                        name,
                        status,
                        body,
                    )
                continue
            # client-settable: the rule is bounded, values outside are refused, values at the bounds work
            assert rule.choices is not None or not {"any", "dict"} & set(rule.types), (env_id, name)
            assert (
                rule.choices is not None
                or rule.types == ("bool",)
                or rule.max is not None
                or rule.max_length is not None
            ), (env_id, name)
            for value in hostile_values(rule):
                status, body, _ = await call(
                    running.url, "POST", "/sessions", json={"env_id": env_id, "kwargs": {name: value}}
                )
                tried += 1
                refused += status in (400, 403)
                assert status in (400, 403) and repr(name) in body["error"], (env_id, name, value, status, body)
            for value in edge_values(rule):
                reset = not {"swe", "web"} & set(
                    envhub.spec(env_id).tags
                )  # sandboxes and shops are built at reset, elsewhere
                status, body, _ = await call(
                    running.url,
                    "POST",
                    "/sessions",
                    json={"env_id": env_id, "kwargs": {name: value}, "reset": reset, "seed": 1},
                )
                tried += 1
                accepted += status == 200
                assert status == 200, (env_id, name, value, body)
                await call(running.url, "DELETE", f"/sessions/{body['session_id']}")
        await good.still_works()
    await good.close()
    assert tried == refused + accepted and refused > 100 and accepted > 30
    print(f"{tried} kwarg values tried over {len(ids)} envs: {refused} refused, {accepted} accepted at the bounds")


async def test_a_kwarg_of_the_wrong_type_is_a_400_naming_it(env_server):
    status, body, _ = await call(
        env_server.url, "POST", "/sessions", json={"env_id": "Sokoban-v0", "kwargs": {"dim": "big"}}
    )
    assert (
        status == 400 and "'dim'" in body["error"] and "int or list" in body["error"] and "unpack" not in body["error"]
    )
    status, body, _ = await call(
        env_server.url, "POST", "/sessions", json={"env_id": "Sokoban-v0", "kwargs": {"dim": [7, "x"]}}
    )
    assert status == 400 and "'dim' of Sokoban-v0, item 1, must be int" in body["error"]
    status, body, _ = await call(
        env_server.url, "POST", "/sessions", json={"env_id": "Math-v0", "kwargs": {"difficulty": "hard"}}
    )
    assert status == 400 and "'difficulty'" in body["error"] and "one of 1, 2, 3" in body["hint"]
    status, body, _ = await call(
        env_server.url, "POST", "/sessions", json={"env_id": "Sokoban-v0", "kwargs": {"dims": 7}}
    )
    assert status == 400 and "unknown kwarg 'dims'" in body["error"] and "did you mean dim" in body["hint"]


MARKER_ACTION = '<tool_call>{{"name": "bash", "arguments": {{"command": "id; touch {marker}"}}}}</tool_call>'


async def test_the_rce_from_the_issue_is_refused_and_would_be_caught(serve, tmp_path):
    marker = tmp_path / "PWNED"
    rce = {"env_id": "SWE-v0", "kwargs": {"backend": "local"}, "reset": True, "seed": 0}
    default = serve()
    status, body, _ = await call(default.url, "POST", "/sessions", json=rce)
    assert status == 403 and "'backend'" in body["error"] and "--allow-kwarg SWE-v0:backend" in body["hint"]
    for sneaky in (
        {"pool": "local"},
        {"image": "host"},
        {"command_timeout": 1e9},
        {"tasks": "/etc/passwd"},
        {"repos_dir": "/"},
    ):
        status, body, _ = await call(default.url, "POST", "/sessions", json={"env_id": "SWE-v0", "kwargs": sneaky})
        assert status == 403 and repr(next(iter(sneaky))) in body["error"]
    # the operator lets clients choose the backend, but not 'local' without the loud opt-in
    chooser = serve(policy=load_policy(None, allow_kwargs=["SWE-v0:backend"]))
    status, body, _ = await call(chooser.url, "POST", "/sessions", json=rce)
    assert status == 403 and "--unsafe-allow-local-backend" in body["hint"] and "outside any sandbox" in body["error"]
    assert not marker.exists()
    # positive control: with the opt-in the same requests do run on the host, so the checks above would catch it
    unsafe = serve(policy=load_policy(None, allow_kwargs=["SWE-v0:backend"], allow_local_backend=True))
    status, body, _ = await call(unsafe.url, "POST", "/sessions", json=rce)
    assert status == 200, body
    status, body, _ = await call(
        unsafe.url, "POST", f"/sessions/{body['session_id']}/step", json={"action": MARKER_ACTION.format(marker=marker)}
    )
    assert status == 200 and marker.exists()
    with pytest.raises(envhub.ConfigError, match="backend: local"):  # nor can an operator's policy file set it silently
        policy_file = tmp_path / "policy.yaml"
        policy_file.write_text("envs:\n  SWE-v0:\n    kwargs: {backend: local}\n")
        load_policy(policy_file)


class PathEnv(envhub.AgentEnv):
    """An env with a path kwarg, as a user's env over a data directory would have."""

    def __init__(self, data_dir: str = ".", render_mode=None) -> None:
        self.data_dir, self.render_mode = data_dir, render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return f"reading {self.data_dir}", {}

    def step(self, action):
        return "ok", 0.0, True, False, {}


async def test_path_traversal_in_kwargs_and_options(serve, tmp_path):
    envhub.register("PathTest-v0", PathEnv)
    allowed, secret = tmp_path / "allowed", tmp_path / "secret"
    allowed.mkdir(), secret.mkdir()
    (allowed / "escape").symlink_to(secret)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        textwrap.dedent(f"""\
        envs:
          PathTest-v0:
            client_kwargs:
              data_dir: {{type: path, under: ["{allowed}"]}}
          {GOOD_ID}: {{}}
          SWE-v0: {{}}
          Sokoban-v0: {{}}
        """)
    )
    running = serve(policy=load_policy(policy_file))
    good = GoodClient(running.url)
    await good.start()
    for hostile in (f"{allowed}/../secret", str(secret), f"{allowed}/escape", "/etc", "../../..", f"{allowed}/\u0000x"):
        status, body, _ = await call(
            running.url, "POST", "/sessions", json={"env_id": "PathTest-v0", "kwargs": {"data_dir": hostile}}
        )
        assert status in (400, 403) and "'data_dir'" in body["error"], (hostile, body)
    status, body, _ = await call(
        running.url,
        "POST",
        "/sessions",
        json={"env_id": "PathTest-v0", "kwargs": {"data_dir": f"{allowed}/sub"}, "reset": True},
    )
    assert status == 200 and "allowed/sub" in body["observation"]
    # reset options: refused unless the policy names them, and then bounded
    status, body, _ = await call(
        running.url,
        "POST",
        "/sessions",
        json={"env_id": "Sokoban-v0", "reset": True, "options": {"level_file": "../../etc/passwd"}},
    )
    assert status == 403 and "'level_file'" in body["error"] and "--allow-option Sokoban-v0:level_file" in body["hint"]
    status, body, _ = await call(
        running.url, "POST", "/sessions", json={"env_id": "SWE-v0", "kwargs": {"max_steps": 2}}
    )
    sid = body["session_id"]
    for hostile in (
        {"instance_id": "../../../etc/passwd"},
        {"instance_id": "x" * 500},
        {"index": -1},
        {"index": "0"},
        {"tasks": "/etc"},
    ):
        status, body, _ = await call(running.url, "POST", f"/sessions/{sid}/reset", json={"options": hostile})
        assert status in (400, 403) and next(iter(hostile)) in body["error"], (hostile, body)
    status, body, _ = await call(running.url, "POST", "/sessions", json={"env_id": "Wordle-v0"})
    assert status == 403 and "not served" in body["error"] and "--env Wordle-v0" in body["hint"]
    status, listed, _ = await call(running.url, "GET", "/envs")
    assert {e["id"] for e in listed} == {"PathTest-v0", GOOD_ID, "SWE-v0", "Sokoban-v0"}
    await good.close()


async def test_oversized_and_malformed_bodies(serve):
    running = serve(limits=ServerLimits(max_body=64 * 1024, max_action_chars=1000))
    good = GoodClient(running.url)
    await good.start()
    url = running.url
    bad = {
        "oversized": (b'{"env_id": "' + b"x" * 100_000 + b'"}', 413, "--max-body"),
        "deep": (b"[" * 5000 + b"]" * 5000, 400, "JSON"),
        "deep object": (b'{"kwargs": ' + b'{"a": ' * 40 + b"1" + b"}" * 41, 400, "deeper"),
        "not UTF-8": (b'{"env_id": "\xff\xfe"}', 400, "JSON"),
        "huge int": (b'{"env_id": "Sokoban-v0", "seed": ' + b"9" * 5000 + b"}", 400, "JSON"),
        "array": (b"[1, 2]", 400, "JSON object"),
        "truncated": (b'{"env_id": "Sok', 400, "JSON"),
    }
    for what, (data, want, text) in bad.items():
        status, body, _ = await call(url, "POST", "/sessions", data=data, headers={"Content-Type": "application/json"})
        assert status == want and text in body["error"] + body["hint"], (what, status, body)
    _, created, _ = await call(url, "POST", "/sessions", json={"env_id": GOOD_ID, "reset": True, "seed": 0})
    sid = created["session_id"]
    for payload, want in (
        ({"action": "B" * 2000}, 413),
        ({"action": {"name": "move", "arguments": {"move": "x" * 2000}}}, 413),
        ({"action": 5}, 400),
        ({"action": None}, 400),
        ({"seed": 2**70}, 400),
        ({"seed": -1}, 400),
    ):
        path = f"/sessions/{sid}/reset" if "seed" in payload else f"/sessions/{sid}/step"
        status, body, _ = await call(url, "POST", path, json=payload)
        assert status == want, (payload, body)
    status, body, _ = await call(
        url, "POST", "/sessions", json={"env_id": "FrozenLake-v0", "kwargs": {"hole_fraction": math.nan}}
    )
    assert status == 403 and "'hole_fraction'" in body["error"]
    for method, path in (("GET", "/sessions"), ("PUT", "/envs"), ("GET", "/admin")):
        status, body, _ = await call(url, method, path)
        assert status in (404, 405) and "POST /sessions/{id}/step" in body["hint"] and "GET /health" in body["hint"]
    await good.close()


async def test_a_flood_of_session_creations_and_requests(serve):
    running = serve(
        tokens=["flooder", "polite"], max_sessions=100, limits=ServerLimits(sessions_per_client=5, rate_limit=40)
    )
    good = GoodClient(running.url, token="polite")
    await good.start()
    created = [{"env_id": GOOD_ID}] * 30
    replies = await asyncio.gather(
        *(call(running.url, "POST", "/sessions", token="flooder", json=body) for body in created)
    )
    statuses = [status for status, _, _ in replies]
    assert statuses.count(200) == 5 and statuses.count(429) == 25
    assert any("maximum of 5 sessions" in body["error"] for status, body, _ in replies if status == 429)
    await good.still_works()
    # past the request rate: 429 with Retry-After, per client. The rate (2/s, bursts of 4) is far below what any
    # machine sends: to pass unlimited, these 40 requests would have to be spread over 18 s
    slow = serve(tokens=["flooder", "polite"], limits=ServerLimits(rate_limit=2))
    replies = await asyncio.gather(*(call(slow.url, "GET", "/envs", token="flooder") for _ in range(40)))
    limited = [headers for status, _, headers in replies if status == 429]
    assert limited and all(int(h["Retry-After"]) >= 1 for h in limited)
    assert (await call(slow.url, "GET", "/envs", token="polite"))[0] == 200  # another client's bucket is its own
    await good.close()
    status, body, _ = await call(running.url, "GET", "/health")
    assert status == 200 and body["sessions"] == 5  # the flooder's; the polite client closed its own
    env = RemoteEnv(running.url, "Wordle-v0", token="flooder")
    with pytest.raises(RemoteError, match="maximum of 5 sessions"):  # the session cap is not waited out
        await env.areset(seed=0)
    await env.aclose()


async def test_remote_env_waits_out_a_retry_after(serve):
    running = serve(limits=ServerLimits(rate_limit=0.5))  # a bucket of one request, refilled every 2 s
    statuses = [status for status, _, _ in await asyncio.gather(*(call(running.url, "GET", "/envs") for _ in range(5)))]
    assert 429 in statuses  # the burst emptied the bucket: the next request must wait
    env = RemoteEnv(running.url, "Wordle-v0")
    start = time.monotonic()
    obs, _ = await env.areset(seed=0)  # rate limited first, then served after Retry-After
    assert "five-letter word" in obs and time.monotonic() - start >= 0.9
    await env.aclose()


class SlowStepEnv(envhub.AgentEnv):
    """A sync env whose step takes `delay` seconds."""

    def __init__(self, delay: float = 0.3, render_mode=None) -> None:
        self.delay, self.render_mode = delay, render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "ready", {}

    def step(self, action):
        time.sleep(self.delay)
        return "done", 1.0, False, False, {}


async def test_a_vanished_or_slow_client_cannot_pin_a_session(serve):
    envhub.register("SlowStepTest-v0", SlowStepEnv)
    envhub.register("StuckStepTest-v0", SlowStepEnv, kwargs={"delay": 3.0})
    running = serve(idle_timeout=1.0, limits=ServerLimits(body_timeout=0.5, step_timeout=1.0))
    good = GoodClient(running.url)
    await good.start()

    async def keep_playing() -> None:  # the good client steps throughout, well within the idle timeout
        while True:
            await good.still_works()
            await asyncio.sleep(0.2)

    playing = asyncio.ensure_future(keep_playing())
    port = int(running.url.rsplit(":", 1)[1])
    _, created, _ = await call(running.url, "POST", "/sessions", json={"env_id": "SlowStepTest-v0", "reset": True})
    vanished = created["session_id"]
    # 1. the client sends a step and disconnects before the answer
    body = b'{"action": "go"}'
    with socket.create_connection(("127.0.0.1", port)) as raw:
        raw.sendall(
            b"POST /sessions/%s/step HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
            b"%d\r\n\r\n%s" % (vanished.encode(), len(body), body)
        )
    # 2. a client announces a body and trickles a few bytes of it
    _, created, _ = await call(running.url, "POST", "/sessions", json={"env_id": "SlowStepTest-v0", "reset": True})
    trickled = created["session_id"]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /sessions/%s/step HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
        b"1000\r\n\r\n{\"act" % trickled.encode()
    )
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(4096), 5)
    assert b" 408 " in answer.split(b"\r\n", 1)[0]
    writer.close()
    # 3. an env step that hangs is cut off: 504, session closed
    _, created, _ = await call(running.url, "POST", "/sessions", json={"env_id": "StuckStepTest-v0", "reset": True})
    start = time.monotonic()
    status, body, _ = await call(running.url, "POST", f"/sessions/{created['session_id']}/step", json={"action": "go"})
    assert status == 504 and time.monotonic() - start < 2.5 and created["session_id"] not in running.server.sessions
    # the abandoned sessions are reaped while the good client, which keeps stepping, keeps its own
    deadline = time.monotonic() + 8
    while (vanished in running.server.sessions or trickled in running.server.sessions) and time.monotonic() < deadline:
        assert not playing.done(), playing.exception()
        await asyncio.sleep(0.1)
    assert (
        vanished not in running.server.sessions
        and trickled not in running.server.sessions
        and running.server.reaped >= 2
    )
    assert not playing.done(), playing.exception()
    playing.cancel()
    await good.close()


async def test_tokens(serve, monkeypatch):
    running = serve(tokens=["alpha-secret", "beta-secret"])
    url = running.url
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic YWxwaGEtc2VjcmV0"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer alpha-secre"},
        {"Authorization": "Bearer alpha-secretX"},
        {"Authorization": "Bearer \u00e9t\u00e9"},
    ):
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/envs", headers=headers) as reply:
                body = await reply.json()
                assert (
                    reply.status == 401
                    and "token" in body["error"]
                    and reply.headers["WWW-Authenticate"].startswith("Bearer")
                ), headers
    status, body, _ = await call(url, "GET", "/health")
    assert status == 200
    _, created, _ = await call(
        url, "POST", "/sessions", token="alpha-secret", json={"env_id": GOOD_ID, "reset": True, "seed": 0}
    )
    status, body, _ = await call(
        url, "POST", f"/sessions/{created['session_id']}/step", token="beta-secret", json={"action": "B2"}
    )
    assert status == 404  # another client's session is invisible
    status, body, _ = await call(url, "DELETE", f"/sessions/{created['session_id']}", token="beta-secret")
    assert status == 404 and created["session_id"] in running.server.sessions
    monkeypatch.delenv("ENVHUB_TOKEN", raising=False)
    anonymous = RemoteEnv(url, GOOD_ID)
    with pytest.raises(RemoteError, match="401.*ENVHUB_TOKEN"):
        await anonymous.areset(seed=0)
    await anonymous.aclose()
    by_argument = RemoteEnv(url, GOOD_ID, token="beta-secret")
    await by_argument.areset(seed=0)
    await by_argument.aclose()
    monkeypatch.setenv("ENVHUB_TOKEN", "alpha-secret")
    by_env_var = RemoteEnv(url, GOOD_ID)
    await by_env_var.areset(seed=0)
    await by_env_var.astep("B2")
    await by_env_var.aclose()


async def test_operator_kwargs_are_fixed_server_side(serve, tmp_path):
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        "envs:\n  Letters-v0:\n    kwargs: {letters: xyz}\n    client_kwargs: {turns: {type: int, min: 1, max: 3}}\n"
    )
    running = serve(policy=load_policy(policy_file))
    status, body, _ = await call(
        running.url, "POST", "/sessions", json={"env_id": "Letters-v0", "kwargs": {"turns": 2}, "reset": True}
    )
    assert status == 200 and body["observation"].endswith("x y z")
    status, body, _ = await call(
        running.url, "POST", "/sessions", json={"env_id": "Letters-v0", "kwargs": {"letters": "abc"}}
    )
    assert status == 403 and "'letters'" in body["error"]
    status, body, _ = await call(
        running.url, "POST", "/sessions", json={"env_id": "Letters-v0", "kwargs": {"turns": 4}}
    )
    assert status == 403 and "outside" in body["error"] and "[1, 3]" in body["error"]
