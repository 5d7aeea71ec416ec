"""Start SGLang for a training run: `python -m sglang.launch_server` per server and, when asked,
`python -m sglang_router.launch_router` in front of them.

The command lines and their checks are pure functions of the config (`plan_launch`, `check_gpus`), so they are
tested without a GPU. Processes start through a `StartServer` function (a command, its environment and a
readiness URL); the default is envhub's generic managed-process launcher (process group, parent-death signal,
SIGTERM then SIGKILL). Readiness is `/ready` for a server (open without a key, no generation, 200 once it is up)
and `/readiness` for the router (200 once its workers are healthy). The router carries `/generate` only:
weight updates, pause/continue, abort and flush go to every worker URL (sglang-router has no such routes).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from envhub.errors import ConfigError, EngineError

SERVER_MODULE = "sglang.launch_server"
ROUTER_MODULE = "sglang_router.launch_router"
INSTALL_HINT = (
    "SGLang runs on CUDA GPUs only; install it in its own environment (its wheel pins torch 2.14.1): "
    "`make install-gpu ENGINE=sglang` in envhub's checkout, or "
    "python -m venv .venv-sglang && .venv-sglang/bin/pip install sglang==0.5.23 sglang-router==0.3.2; "
    "then set engine.launch.python: .venv-sglang/bin/python"
)
# SGLang returns pre-temperature logprobs when this is set; envhub's learner needs log_softmax(logits / T).
_UNSAFE_ENV = ("SGLANG_RETURN_ORIGINAL_LOGPROB",)
ROUTER_POLICIES = ("manual", "cache_aware", "round_robin", "random", "power_of_two")


@dataclass(frozen=True)
class ServerCommand:
    """One process to start: `python -m module args` with `env`."""

    name: str
    python: str
    module: str
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def argv(self) -> list[str]:
        return [self.python, "-m", self.module, *self.args]


@dataclass(frozen=True)
class PlannedServer:
    """One SGLang server: where it listens, which GPUs it uses, how to start it."""

    url: str
    ready_url: str
    gpus: tuple[int, ...]
    tp_size: int
    command: ServerCommand


@dataclass(frozen=True)
class LaunchPlan:
    """Every process a run starts, with the URLs the trainer talks to."""

    servers: tuple[PlannedServer, ...]
    router: ServerCommand | None = None
    router_url: str | None = None
    startup_timeout: float = 1800.0

    @property
    def worker_urls(self) -> list[str]:
        return [s.url for s in self.servers]


class RunningProcess(Protocol):
    """What a started process must offer (envhub's `launcher.ManagedServer` does): its exit status (None while
    it runs), the error saying how it ended, and stop (SIGTERM, then SIGKILL after `grace` seconds)."""

    @property
    def returncode(self) -> int | None: ...

    def exit_error(self) -> EngineError: ...

    def stop(self, grace: float = ...) -> Any: ...


StartServer = Callable[[ServerCommand, str, float], Awaitable[RunningProcess]]


def _url(host: str, port: int) -> str:
    reach = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    return f"http://{reach}:{port}"


def server_args(
    model_path: str,
    host: str,
    port: int,
    *,
    tp_size: int = 1,
    base_gpu_id: int = 0,
    dtype: str = "auto",
    weight_version: str = "0",
    mem_fraction_static: float = 0.0,
    api_key: str = "",
    admin_api_key: str = "",
    enable_memory_saver: bool = False,
    skip_server_warmup: bool = False,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """`sglang.launch_server` flags (SGLang 0.5.23 names: `--tp-size`, `--base-gpu-id`, ...)."""
    args = ["--model-path", model_path, "--host", host, "--port", str(port), "--tp-size", str(tp_size)]
    args += ["--base-gpu-id", str(base_gpu_id), "--dtype", dtype, "--weight-version", weight_version]
    if mem_fraction_static:
        args += ["--mem-fraction-static", str(mem_fraction_static)]
    if api_key:
        args += ["--api-key", api_key]
    if admin_api_key:
        args += ["--admin-api-key", admin_api_key]
    if enable_memory_saver:
        args.append("--enable-memory-saver")
    if skip_server_warmup:
        args.append("--skip-server-warmup")
    return args + list(extra_args)


def router_args(
    worker_urls: Sequence[str],
    host: str,
    port: int,
    *,
    policy: str = "manual",
    health_check_endpoint: str = "/ready",
    api_key: str = "",
    extra_args: Sequence[str] = (),
    metrics_port: int | None = None,
) -> list[str]:
    """`sglang_router.launch_router` flags. Retries are off (a retried /generate would run twice); the health
    check polls `/ready`, not `/health`, whose generation would mark a paused worker unhealthy. The router's
    Prometheus exporter gets `metrics_port`, or a free port: its default, 29000 for every router, made a second
    router on the host (another run, a parallel test) exit at start."""
    if policy not in ROUTER_POLICIES:
        raise ConfigError(f"router policy must be one of {', '.join(ROUTER_POLICIES)}, got {policy!r}")
    args = ["--worker-urls", *worker_urls, "--host", host, "--port", str(port), "--policy", policy]
    args += ["--health-check-endpoint", health_check_endpoint, "--disable-retries"]
    if metrics_port is None:
        from envhub.trainer.engines.launcher import free_port

        metrics_port = free_port(host)
    args += ["--prometheus-host", host, "--prometheus-port", str(metrics_port)]
    if api_key:
        args += ["--api-key", api_key]  # the key the router sends to its workers
    return args + list(extra_args)


def server_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a server starts with: ours, minus settings that would change what envhub reads back."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _UNSAFE_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def plan_launch(
    launch: Any, *, model_path: str, tp_size: int, dtype: str, api_key: str = "", admin_api_key: str = ""
) -> LaunchPlan:
    """The processes `engine.launch` asks for (an `SGLangLaunchConfig`): server i on port + i and GPUs
    base_gpu_id + i * tp_size ..., the router (if any) on its own port."""
    if launch.num_servers < 1 or tp_size < 1:
        raise ConfigError(f"engine.launch needs num_servers >= 1 and tp_size >= 1, got {launch.num_servers}, {tp_size}")
    ports = [launch.port + i for i in range(launch.num_servers)]
    if not all(0 < p < 65536 for p in ports):
        raise ConfigError(
            f"server ports {ports[0]}..{ports[-1]} are not all valid ports", hint="lower engine.launch.port"
        )
    python = launch.python or sys.executable
    env = server_env()
    servers = []
    for i, port in enumerate(ports):
        first = launch.base_gpu_id + i * tp_size
        args = server_args(
            model_path,
            launch.host,
            port,
            tp_size=tp_size,
            base_gpu_id=first,
            dtype=dtype,
            mem_fraction_static=launch.mem_fraction_static,
            api_key=api_key,
            admin_api_key=admin_api_key,
            enable_memory_saver=launch.enable_memory_saver,
            skip_server_warmup=launch.skip_server_warmup,
            extra_args=launch.extra_args,
        )
        command = ServerCommand(f"sglang-{i}", python, SERVER_MODULE, tuple(args), env)
        url = _url(launch.host, port)
        servers.append(PlannedServer(url, url + "/ready", tuple(range(first, first + tp_size)), tp_size, command))
    router = launch.router
    if router is None:
        return LaunchPlan(tuple(servers), startup_timeout=launch.startup_timeout_s)
    if router.port in ports:
        raise ConfigError(f"engine.launch.router.port {router.port} is also a server port", hint="pick another port")
    urls = [s.url for s in servers]
    args = router_args(
        urls,
        launch.host,
        router.port,
        policy=router.policy,
        health_check_endpoint=router.health_check_endpoint,
        api_key=api_key,
        extra_args=router.extra_args,
    )
    command = ServerCommand("sglang-router", python, ROUTER_MODULE, tuple(args), env)
    return LaunchPlan(tuple(servers), command, _url(launch.host, router.port), launch.startup_timeout_s)


def check_gpus(plan: LaunchPlan, gpu_count: int, trainer_gpu: int | None = None) -> None:
    """Refuse a plan that needs GPUs this machine lacks, puts two servers on one GPU, or (NCCL weight sync)
    shares a GPU with the trainer's rank 0 (NCCL cannot put two ranks of a group on one device)."""
    used = [g for s in plan.servers for g in s.gpus]
    if gpu_count == 0:
        raise EngineError("SGLang needs CUDA GPUs and this machine has none", hint=INSTALL_HINT)
    if max(used) >= gpu_count:
        raise EngineError(
            f"engine.launch needs GPUs {min(used)}..{max(used)} ({len(plan.servers)} server(s) x tp_size "
            f"{plan.servers[0].tp_size} from base_gpu_id {min(used)}); this machine has {gpu_count}",
            hint="lower engine.launch.num_servers, engine.tp_size or engine.launch.base_gpu_id",
        )
    if len(set(used)) != len(used):
        raise EngineError(f"two servers would share a GPU: {used}")
    if trainer_gpu is not None and trainer_gpu in used:
        raise EngineError(
            f"the trainer (NCCL rank 0) is on GPU {trainer_gpu}, which a server uses",
            hint="set engine.launch.base_gpu_id past the trainer's GPU, or use weight_sync: disk or tensor",
        )


def check_installed(python: str, router: bool) -> None:
    """EngineError naming the install command when `python` lacks SGLang (with its CUDA kernels) or the router."""
    modules = ["sglang", "sgl_kernel"] + (["sglang_router"] if router else [])
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        missing = [m for m in modules if m not in sys.modules and importlib.util.find_spec(m) is None]
    else:
        probe = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))"
        try:
            result = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EngineError(f"cannot run engine.launch.python {python!r}: {exc}", hint=INSTALL_HINT) from exc
        if result.returncode != 0:
            raise EngineError(f"{python} failed: {result.stderr.strip()[-500:]}", hint=INSTALL_HINT)
        missing = result.stdout.split()
    if missing:
        raise EngineError(f"SGLang is not installed for {python}: missing {', '.join(missing)}", hint=INSTALL_HINT)


async def start_managed(command: ServerCommand, ready_url: str, timeout: float) -> RunningProcess:
    """Start `command` with envhub's managed-process launcher and wait until `ready_url` answers 200."""
    from envhub.trainer.engines.launcher import ManagedServer, module_command

    server = ManagedServer.start(
        command.name, module_command(command.python, command.module, command.args), env=command.env
    )
    try:
        await server.wait_ready(ready_url, timeout)
    except BaseException:
        await asyncio.to_thread(server.stop)
        raise
    return server


@dataclass
class Launched:
    """The processes of one launch; `stop()` ends them all (router first)."""

    servers: list[RunningProcess]
    router: RunningProcess | None = None

    def raise_if_failed(self) -> None:
        """Raise the exit (code and log tail) of the first process that has stopped on its own."""
        for process in [*self.servers, self.router]:
            if process is not None and process.returncode is not None:
                raise process.exit_error()

    async def stop(self) -> None:
        """Stop the router, then every server (each SIGTERM, SIGKILL after a grace period)."""
        for process in [self.router, *self.servers]:
            if process is not None:
                await asyncio.to_thread(process.stop)


async def launch(plan: LaunchPlan, start: StartServer = start_managed) -> Launched:
    """Start every server at once, wait until each is ready, then the router; on any failure stop what started."""
    results = await asyncio.gather(
        *[start(s.command, s.ready_url, plan.startup_timeout) for s in plan.servers], return_exceptions=True
    )
    launched = Launched([r for r in results if not isinstance(r, BaseException)])
    failures = [r for r in results if isinstance(r, BaseException)]
    try:
        if failures:
            raise failures[0]
        if plan.router is not None:
            launched.router = await start(plan.router, f"{plan.router_url}/readiness", plan.startup_timeout)
    except BaseException:
        await launched.stop()
        raise
    return launched
