"""Soak test of the servers: `envhub serve` (envhub's protocol and OpenEnv's) and `envhub serve-engine` under
sustained load from well-behaved clients, with hostile clients mixed in, for a fixed time.

    python benchmarks/server_soak.py [--seconds 60] [--good 4] [--targets envhub openenv engine] [--out FILE]

Each server runs as its own process, started with the CLI as an operator would (one token per client). The
well-behaved clients (each its own token) play episodes one request at a time with a 20 ms think time and record
every request's latency and every error they see. In another process, at the same time, hostile clients (each
kind its own token, so that one's limits do not hide another's):
- slow bodies: headers, then one byte a second (the env servers answer 408 after --body-timeout, the engine
  server after 60 s);
- oversized bodies: twice --max-body (413; on a WebSocket the server closes it with 1009);
- floods: 16 connections sending as fast as they can (429 past --rate-limit; the engine server has no per-client
  rate: its flood carries a wrong API key, 401);
- abandoned sessions: created and left open (reaped after --idle-timeout), sockets opened and left silent, and
  generations whose client hangs up mid-way.
Written per server: requests the well-behaved clients made and their p50/p99 latency, the errors they saw
(goal: none), the requests they did not send because they themselves had been idle past --idle-timeout on a loaded
machine (`stalled_past_idle_timeout`: the reaper may rightly have closed the session by then), the server's RSS at
start, after a warm-up fifth of the run and at the end (goal: flat), the sessions reaped, and the answers the hostile
clients got.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

ENV_ID = "Letters-v0"
THINK_S = 0.02
MAX_BODY = 65536
IDLE_TIMEOUT = 3.0
ENGINE_KEY = "soak-engine-key"
HOSTILE_KINDS = ("slow", "big", "flood", "abandon")
HOSTILE_GRACE_S = 30.0  # how long past the end the hostile clients may take to finish
ENV_FLAGS = ["--rate-limit", "100", "--max-body", str(MAX_BODY), "--body-timeout", "2"]
ENV_FLAGS += ["--idle-timeout", str(IDLE_TIMEOUT), "--sessions-per-client", "16", "--max-sessions", "512"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process started with the envhub CLI."""

    def __init__(self, target: str, good: int) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        tokens = [f"good-{i}" for i in range(good)] + list(HOSTILE_KINDS)
        cli = [sys.executable, "-m", "envhub.cli.main"]
        if target == "engine":
            argv = cli + ["serve-engine", "--model", "tiny", "--device", "cpu", "--api-key", ENGINE_KEY]
            argv += ["--max-body-mb", "1", "--max-batch-size", "16"]
        else:
            argv = cli + ["serve", *[a for t in tokens for a in ("--token", t)], *ENV_FLAGS]
            argv += ["--protocol", "openenv", "--env", ENV_ID] if target == "openenv" else []
        self.log = tempfile.TemporaryFile()  # a pipe could fill up and stall a chatty server
        self.process = subprocess.Popen(argv + ["--port", str(self.port)], stdout=self.log, stderr=subprocess.STDOUT)

    async def ready(self) -> None:
        async with aiohttp.ClientSession() as http:
            for _ in range(2400):
                if self.process.poll() is not None:
                    self.log.seek(0)
                    raise RuntimeError(f"server exited: {self.log.read().decode(errors='replace')[-2000:]}")
                try:
                    async with http.get(self.url + "/health") as reply:
                        if reply.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.25)
        raise RuntimeError("server did not start")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    async def health(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.get(self.url + "/health") as reply:
            return await reply.json() if reply.content_type == "application/json" else {"status": reply.status}

    async def health_once_idle(self, deadline_s: float) -> dict[str, Any]:
        """/health once the server holds no session (the reaper closed what the hostile clients left open), or as it
        stands after `deadline_s`."""
        until = time.monotonic() + deadline_s
        while True:
            health = await self.health()
            if health.get("sessions") == 0 or time.monotonic() >= until:
                return health
            await asyncio.sleep(0.25)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class Latencies:
    """What the well-behaved clients saw: one latency per request, and every error."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.errors: Counter[str] = Counter()
        self.samples: list[str] = []
        self.stalled = 0  # requests not sent: the client itself had been idle past the server's idle timeout

    def stalled_since(self, last_heard: float) -> bool:
        """Whether this client has been idle longer than the server's idle timeout since `last_heard` (its previous
        request on the session was sent then), so the reaper may rightly have closed the session: counted, not sent.
        On a loaded machine a client can be held up that long between an answer and its next request (seen in the
        parallel suite on 2 cores, beside the server, the hostile clients' process and the other test worker: a
        session created, and its step sent more than 3 s later, found reaped)."""
        if time.monotonic() - last_heard <= IDLE_TIMEOUT:
            return False
        self.stalled += 1
        return True

    def error(self, what: str, detail: str) -> None:
        self.errors[what] += 1
        if len(self.samples) < 5:
            self.samples.append(f"{what}: {detail[:200]}")

    async def request(self, http: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> Any:
        """One timed request; a non-2xx answer or a client error is recorded as an error (returns None)."""
        started = time.perf_counter()
        try:
            async with http.request(method, url, **kwargs) as reply:
                body = await reply.json() if reply.content_type == "application/json" else await reply.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.error(type(exc).__name__, str(exc))
            return None
        self.seconds.append(time.perf_counter() - started)
        if reply.status >= 300:
            self.error(str(reply.status), str(body))
            return None
        return body

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.seconds)
        pick = lambda q: (
            round(ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))] * 1000, 2) if ordered else None
        )
        return {
            "requests": len(self.seconds) + sum(v for k, v in self.errors.items() if not k.isdigit()),
            "ok": len(self.seconds) - sum(v for k, v in self.errors.items() if k.isdigit()),
            "errors": sum(self.errors.values()),
            "errors_by_kind": dict(self.errors),
            "error_samples": self.samples,
            "stalled_past_idle_timeout": self.stalled,
            "p50_ms": pick(0.5),
            "p99_ms": pick(0.99),
        }


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- well-behaved clients --------------------------------------------------------------------------------
async def good_envhub(url: str, token: str, until: float, seen: Latencies) -> None:
    """Episodes through envhub's session API: create (with reset), step, delete."""
    async with aiohttp.ClientSession(headers=_auth(token), timeout=aiohttp.ClientTimeout(total=60)) as http:
        while time.monotonic() < until:
            body = {"env_id": ENV_ID, "reset": True, "seed": random.randrange(1000)}
            sent = time.monotonic()
            made = await seen.request(http, "POST", url + "/sessions", json=body)
            if made is not None:
                session = f"{url}/sessions/{made['session_id']}"
                for method, path, payload in (("POST", "/step", {"action": "aei"}), ("DELETE", "", None)):
                    if seen.stalled_since(sent):
                        break
                    sent = time.monotonic()
                    await seen.request(http, method, session + path, json=payload)
            await asyncio.sleep(THINK_S)


async def good_openenv(url: str, token: str, until: float, seen: Latencies) -> None:
    """Episodes over one OpenEnv WebSocket: reset, step, and again."""
    async with aiohttp.ClientSession(headers=_auth(token), timeout=aiohttp.ClientTimeout(total=60)) as http:
        async with http.ws_connect(url.replace("http", "ws") + "/ws") as ws:
            sent = time.monotonic()
            while time.monotonic() < until:
                for message in (
                    {"type": "reset", "data": {"seed": random.randrange(1000)}},
                    {"type": "step", "data": {"text": "aei"}},
                ):
                    if seen.stalled_since(sent):  # the reaper may have closed the socket: this client is done
                        return
                    started, sent = time.perf_counter(), time.monotonic()
                    await ws.send_json(message)
                    reply = await ws.receive()
                    if reply.type != aiohttp.WSMsgType.TEXT:
                        seen.error(f"ws {reply.type.name}", str(reply.extra))
                        return
                    seen.seconds.append(time.perf_counter() - started)
                    if json.loads(reply.data).get("type") == "error":
                        seen.error("ws error", reply.data)
                await asyncio.sleep(THINK_S)


async def good_engine(url: str, token: str, until: float, seen: Latencies) -> None:
    """Short generations on the engine server's native /generate."""
    async with aiohttp.ClientSession(headers=_auth(ENGINE_KEY), timeout=aiohttp.ClientTimeout(total=120)) as http:
        while time.monotonic() < until:
            prompt = [random.randrange(100, 1000) for _ in range(16)]
            body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 1.0}}
            await seen.request(http, "POST", url + "/generate", json=body)
            await asyncio.sleep(THINK_S)


GOOD = {"envhub": good_envhub, "openenv": good_openenv, "engine": good_engine}


# -- hostile clients -------------------------------------------------------------------------------------
async def slow_body(url: str, path: str, token: str, until: float, got: Counter[str]) -> None:
    """Headers, then a byte a second: the answer (408) or 'held' when none came before the end."""
    while time.monotonic() < until:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        writer.write((head + "Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n{").encode())
        answer = "held"
        try:
            while time.monotonic() < until:
                try:
                    line = await asyncio.wait_for(reader.readline(), 1.0)
                    answer = line.split()[1].decode() if len(line.split()) > 1 else "closed"
                    break
                except TimeoutError:
                    writer.write(b" ")
                    await writer.drain()
        except ConnectionError:
            answer = "closed"
        got[answer] += 1
        writer.close()


async def oversized(url: str, target: str, token: str, until: float, got: Counter[str]) -> None:
    """Bodies (and WebSocket messages) twice the limit."""
    size = 2 * (1 << 20) if target == "engine" else 2 * MAX_BODY
    path = {"envhub": "/sessions", "openenv": "/step", "engine": "/generate"}[target]
    async with aiohttp.ClientSession(headers=_auth(ENGINE_KEY if target == "engine" else token)) as http:
        while time.monotonic() < until:
            try:
                async with http.post(url + path, data=b"x" * size, headers={"Content-Type": "application/json"}) as r:
                    got[str(r.status)] += 1
            except aiohttp.ClientError as exc:
                got[type(exc).__name__] += 1
            if target == "openenv":
                async with http.ws_connect(url.replace("http", "ws") + "/ws") as ws:
                    await ws.send_str(json.dumps({"type": "step", "data": {"text": "x" * size}}))
                    reply = await ws.receive()
                    got[f"ws {reply.type.name} {ws.close_code}"] += 1
            await asyncio.sleep(0.2)


async def flood(url: str, target: str, token: str, until: float, got: Counter[str]) -> None:
    """16 connections as fast as they go (the engine's flood has a wrong key)."""
    path, method = {"envhub": ("/envs", "GET"), "openenv": ("/schema", "GET"), "engine": ("/generate", "POST")}[target]
    headers = _auth("wrong-key" if target == "engine" else token)

    async def one(http: aiohttp.ClientSession) -> None:
        while time.monotonic() < until:
            try:
                async with http.request(method, url + path, json={} if method == "POST" else None) as r:
                    await r.read()
                    got[str(r.status)] += 1
            except aiohttp.ClientError as exc:
                got[type(exc).__name__] += 1

    async with aiohttp.ClientSession(headers=headers) as http:
        await asyncio.gather(*(one(http) for _ in range(16)))


async def abandon(url: str, target: str, token: str, until: float, got: Counter[str]) -> None:
    """Sessions created and never closed; silent sockets; generations dropped mid-way."""
    left_open: list[aiohttp.ClientWebSocketResponse] = []  # kept referenced: only the server's reaper closes them
    headers = _auth(ENGINE_KEY if target == "engine" else token)
    # no connection limit: each silent socket holds a connection, and aiohttp's default 100 would stall us
    async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=0)) as http:
        while time.monotonic() < until:
            if target == "envhub":
                async with http.post(url + "/sessions", json={"env_id": ENV_ID, "reset": True}) as r:
                    got[str(r.status)] += 1
            elif target == "openenv":
                await _silent_socket(http, url, got, left_open)
            else:
                body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 256, "ignore_eos": True}}
                try:
                    async with asyncio.timeout(0.3), http.post(url + "/generate", json=body) as reply:
                        await reply.read()
                        got[f"finished {reply.status}"] += 1
                except TimeoutError:
                    got["hung up mid-generation"] += 1
            await asyncio.sleep(0.1)
        for ws in left_open:  # a socket the reaper closed has its close frame waiting
            try:
                message = await ws.receive(timeout=1.0)
                closed = message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            except TimeoutError:  # opened in the last idle-timeout of the run: not reaped yet
                closed = False
            got[f"ws then closed by the server ({ws.close_code})" if closed else "ws still open at the end"] += 1
            await asyncio.wait_for(ws.close(), 5.0)


async def _silent_socket(
    http: aiohttp.ClientSession, url: str, got: Counter[str], left_open: list[aiohttp.ClientWebSocketResponse]
) -> None:
    """An OpenEnv socket that resets once and then says nothing (or is refused past --sessions-per-client)."""
    ws = await http.ws_connect(url.replace("http", "ws") + "/ws")
    await ws.send_json({"type": "reset", "data": {}})
    reply = await ws.receive(timeout=30.0)
    if reply.type == aiohttp.WSMsgType.TEXT and json.loads(reply.data).get("type") != "error":
        left_open.append(ws)
        got["ws left open"] += 1  # never closed by us: the reaper must
    else:
        text = reply.type == aiohttp.WSMsgType.TEXT
        got[f"ws refused ({json.loads(reply.data)['data'].get('code') if text else reply.type.name})"] += 1
        await ws.close()


async def _hostile(target: str, url: str, seconds: float) -> dict[str, dict[str, int]]:
    until = time.monotonic() + seconds
    got = {kind: Counter() for kind in HOSTILE_KINDS}
    path = {"envhub": "/sessions", "openenv": "/reset", "engine": "/generate"}[target]
    slow_token = ENGINE_KEY if target == "engine" else "slow"
    clients = {
        **{f"slow {i}": slow_body(url, path, slow_token, until, got["slow"]) for i in range(4)},
        "big": oversized(url, target, "big", until, got["big"]),
        "flood": flood(url, target, "flood", until, got["flood"]),
        "abandon": abandon(url, target, "abandon", until, got["abandon"]),
    }
    tasks = {asyncio.ensure_future(client): name for name, client in clients.items()}
    _, stuck = await asyncio.wait(tasks, timeout=seconds + HOSTILE_GRACE_S)
    for task in stuck:  # a hostile client of ours that hangs must not hang the benchmark: named in the report
        print(f"hostile client {tasks[task]} still running at the end:", file=sys.stderr)
        task.print_stack(file=sys.stderr)
        task.cancel()
    report = {kind: dict(counts) for kind, counts in got.items()}
    failed = {tasks[t]: repr(t.exception()) for t in tasks if t not in stuck and t.exception() is not None}
    if stuck or failed:  # our own hostile clients' faults, named so that the figures are not trusted blindly
        report["not_finished"] = {**{tasks[t]: "still running" for t in stuck}, **failed}
    return report


# -- one server --------------------------------------------------------------------------------------------
async def _memory(server: Server, seconds: float, samples: list[tuple[float, float]]) -> None:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        samples.append((round(time.monotonic() - started, 1), round(server.rss_mb(), 1)))
        await asyncio.sleep(1.0)


async def soak(target: str, seconds: float, good: int) -> dict[str, Any]:
    """Run one server under load for `seconds`; what the clients saw, memory and the server's counters."""
    server = Server(target, good)
    try:
        await server.ready()
        rss_start = server.rss_mb()
        # the hostile clients in their own process: their CPU is not the well-behaved clients' event loop
        argv = [sys.executable, __file__, "--hostile", target, server.url, "--seconds", str(seconds)]
        hostile = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        seen, samples = Latencies(), []
        until = time.monotonic() + seconds
        await asyncio.gather(
            *(GOOD[target](server.url, f"good-{i}", until, seen) for i in range(good)),
            _memory(server, seconds, samples),
        )
        out, _ = await asyncio.to_thread(hostile.communicate, timeout=seconds + 120)
        hostile_seen = json.loads(out)
        report = {"well_behaved": seen.summary(), "hostile": hostile_seen}
        warm = [mb for t, mb in samples if t >= seconds / 5]
        report["memory_mb"] = {
            "rss_start": round(rss_start, 1),
            "rss_after_warmup": warm[0] if warm else None,
            "rss_end": round(server.rss_mb(), 1),
            "rss_max": max(mb for _, mb in samples),
            "samples": samples[:: max(1, len(samples) // 12)],
        }
        if target != "engine":
            # the reaper closes what the hostile clients left open, an idle timeout and a reaper pass after its last use
            report["server"] = await server.health_once_idle(IDLE_TIMEOUT * 2 + 1)
        report["served_per_s"] = round(len(seen.seconds) / seconds, 1)
        return report
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="load time per server")
    parser.add_argument("--good", type=int, default=4, help="well-behaved clients per server")
    parser.add_argument("--targets", nargs="+", default=["envhub", "openenv", "engine"], choices=list(GOOD))
    parser.add_argument("--out", default="benchmarks/results/server_soak.json")
    parser.add_argument("--hostile", nargs=2, metavar=("TARGET", "URL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hostile:  # the child process of `soak`: hostile clients only, their counts as JSON on stdout
        print(json.dumps(asyncio.run(_hostile(args.hostile[0], args.hostile[1], args.seconds))))
        return {}
    report: dict[str, Any] = {
        "seconds": args.seconds,
        "well_behaved_clients": args.good,
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "limits": {"env_servers": " ".join(ENV_FLAGS), "engine": "--max-body-mb 1, body deadline 60 s"},
    }
    for target in args.targets:
        report[target] = asyncio.run(soak(target, args.seconds, args.good))
        good = report[target]["well_behaved"]
        memory = report[target]["memory_mb"]
        print(
            f"{target:8} requests {good['requests']:6} errors {good['errors']:3} "
            f"stalled {good['stalled_past_idle_timeout']} p50 {good['p50_ms']} ms "
            f"p99 {good['p99_ms']} ms rss {memory['rss_start']} -> {memory['rss_after_warmup']} -> "
            f"{memory['rss_end']} MB hostile {report[target]['hostile']}",
            flush=True,
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
