"""`DockerSandbox`: one hardened container per sandbox; commands run through streamed `docker exec`.

The container runs `sleep infinity` under docker's init as nobody; commands run as uid 1000; with no network, no
capabilities, no-new-privileges, a read-only root, size-capped tmpfs at /workspace and /tmp, and
memory / CPU / pids limits. Container lifecycle goes through the docker SDK in a thread; exec
output streams over the engine socket on the event loop (see `engine_api`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import uuid
from typing import Any

from envhub.errors import SandboxError
from envhub.sandboxes.base import (
    SANDBOX_GID,
    SANDBOX_UID,
    WORKDIR,
    ExecResult,
    ImageLayout,
    OutputCap,
    Sandbox,
    SandboxLimits,
)
from envhub.sandboxes.engine_api import EngineAPI
from envhub.sandboxes.process import pid_alive

LABEL_POOL = "envhub.pool"
LABEL_OWNER = "envhub.owner_pid"
LABEL_SANDBOX = "envhub.sandbox"
_USER = f"{SANDBOX_UID}:{SANDBOX_GID}"
_KEEPER = "65534:65534"
log = logging.getLogger(__name__)
_OOM_PROBE = "cat /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events 2>/dev/null"

_client: Any = None


def shared_client() -> Any:
    """One docker SDK client per process (created on first use; SandboxError when no engine answers)."""
    global _client
    if _client is None:
        from envhub.sandboxes.images import docker_client

        _client = docker_client()
    return _client


class DockerSandbox(Sandbox):
    """A sandbox backed by one Docker container made from `image`."""

    def __init__(
        self,
        image: str | None = None,
        *,
        limits: SandboxLimits | None = None,
        labels: dict[str, str] | None = None,
        layout: ImageLayout | None = None,
    ) -> None:
        self.image = image
        self.layout = layout
        self.user = layout.user if layout else _USER
        self.limits = limits or SandboxLimits()
        self.labels = {LABEL_SANDBOX: "1", LABEL_OWNER: str(os.getpid()), **(labels or {})}
        self.container_id: str | None = None
        self.name = f"envhub-sbx-{uuid.uuid4().hex[:12]}"
        self.dead = False
        self._api = EngineAPI()
        self._oom_kills = 0

    async def start(self) -> None:
        """Create and start the container (about 0.3-1 s)."""
        if self.image is None:
            from envhub.sandboxes.images import require_base_image

            self.image = await asyncio.to_thread(require_base_image)
        self.container_id = await asyncio.to_thread(self._create)

    def _create(self) -> str:
        import docker.errors

        limits, layout = self.limits, self.layout
        uid, _, gid = (layout.user if layout else _USER).partition(":")
        environment = {"HOME": layout.home if layout else WORKDIR, "PYTHONDONTWRITEBYTECODE": "1"}
        if layout and layout.path_prefix:
            image_env = dict(
                e.split("=", 1)
                for e in (shared_client().images.get(self.image).attrs["Config"].get("Env") or [])
                if "=" in e
            )
            environment["PATH"] = ":".join([*layout.path_prefix, image_env.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
        try:
            # create + start, never `run`: the SDK's run() pulls a missing image, and no registry is reachable
            container = shared_client().containers.create(
                self.image,
                ["sleep", "infinity"],
                name=self.name,
                detach=True,
                init=True,
                user=_KEEPER,  # not the sandbox user, so `kill -9 -1` on a timeout leaves the container up
                working_dir=WORKDIR,
                network_mode="bridge" if limits.network else "none",
                mem_limit=f"{limits.memory_mb}m",
                memswap_limit=f"{limits.memory_mb}m",
                nano_cpus=int(limits.cpus * 1e9),
                cpuset_cpus=limits.cpuset or None,
                pids_limit=limits.pids,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                read_only=not (layout and layout.writable_root),
                tmpfs={
                    WORKDIR: f"size={limits.workdir_mb}m,uid={uid},gid={gid or uid},mode=0755,exec",
                    "/tmp": f"size={limits.tmp_mb}m,mode=1777,exec",
                },
                environment=environment,
                labels=self.labels,
            )
            container.start()
        except docker.errors.ImageNotFound:
            raise SandboxError(
                f"image {self.image} missing",
                hint="run `envhub sandbox build`"
                if self.layout is None
                else "run `envhub swe prepare --tasks ...` (pulls or builds it, or says how to `docker load` it)",
            ) from None
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"cannot start a sandbox container: {exc.explanation or exc}", hint="check `docker info`"
            ) from None
        except OSError as exc:  # the SDK's connection errors (requests') while the daemon is down or restarting
            raise SandboxError(
                f"Docker engine not reachable while starting a sandbox ({type(exc).__name__})",
                hint="check `docker info`; the pool rebuilds its spares once the daemon answers again",
            ) from None
        return container.id

    async def _run(
        self, argv: list[str], *, timeout: float, stdin: bytes | None, cwd: str, env: dict[str, str], max_output: int
    ) -> ExecResult:
        if self.container_id is None or self.dead:
            raise SandboxError(
                "sandbox is not running (never started, closed, or killed after a runaway command)",
                hint="acquire a fresh sandbox from the pool",
            )
        started = time.perf_counter()
        exec_id = await self._api.exec_create(
            self.container_id, argv, user=self.user, workdir=cwd, env=env, stdin=stdin is not None
        )
        stdout, stderr = OutputCap(max_output), OutputCap(max_output)
        timed_out = False
        try:
            await asyncio.wait_for(self._api.exec_stream(exec_id, stdin, stdout, stderr), timeout)
        except TimeoutError:
            timed_out = True
            await self._kill_all()
        exit_code = -9 if timed_out else await self._api.exit_code(exec_id)
        oom = exit_code == 137 and not timed_out and await self._oom_happened()
        return ExecResult(
            exit_code=exit_code,
            stdout=stdout.text(),
            stderr=stderr.text(),
            timed_out=timed_out,
            truncated=stdout.truncated or stderr.truncated,
            duration=time.perf_counter() - started,
            oom_killed=oom,
        )

    async def _kill_all(self) -> None:
        """Kill every sandbox-user process (never PID 1); kill the container when even that cannot run."""
        try:
            exec_id = await self._api.exec_create(
                self.container_id, ["kill", "-9", "-1"], user=self.user, workdir="/", env={}, stdin=False
            )
            await asyncio.wait_for(self._api.exec_stream(exec_id, None, OutputCap(4096), OutputCap(4096)), 5)
            if await self._api.exit_code(exec_id) in (0, 1):  # 1: it may have killed nothing but itself's peers
                return
        except (TimeoutError, SandboxError, OSError):
            pass
        # A fork bomb can leave no pid free for `kill`: stop the whole container instead.
        self.dead = True
        await asyncio.to_thread(self._remove)

    async def running(self) -> bool:
        """Whether the container still runs (one GET over the engine socket: a restarted Docker daemon stops
        every container, and a stopped one must not be handed out)."""
        return self.container_id is not None and not self.dead and await self._api.container_running(self.container_id)

    async def reset(self) -> None:
        """Kill every sandbox process, then empty /workspace and /tmp."""
        if self.container_id is not None and not self.dead:
            await self._kill_all()
        await super().reset()

    async def _oom_happened(self) -> bool:
        try:
            exec_id = await self._api.exec_create(
                self.container_id, ["sh", "-c", _OOM_PROBE], user=self.user, workdir="/", env={}, stdin=False
            )
            out = OutputCap(4096)
            await asyncio.wait_for(self._api.exec_stream(exec_id, None, out, OutputCap(4096)), 5)
        except (TimeoutError, SandboxError, OSError):
            return False
        match = re.search(r"oom_kill (\d+)", out.text())
        count = int(match.group(1)) if match else 0
        happened, self._oom_kills = count > self._oom_kills, count
        return happened

    async def close(self) -> None:
        """Remove the container (and its tmpfs contents)."""
        if self.container_id is not None:
            await asyncio.to_thread(self._remove)
            self.container_id = None
        self.dead = True

    def _remove(self) -> None:
        import docker.errors

        try:
            shared_client().api.remove_container(self.container_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                raise SandboxError(f"cannot remove sandbox container {self.name}: {exc}") from None


def remove_orphans(*, pool_id: str | None = None, all_sandboxes: bool = False) -> list[str]:
    """Remove sandbox containers whose owner process is dead (or of one pool, or all); return their names.

    A container that another process is removing at the same moment (a pool starting elsewhere removes orphans too)
    is waited for, so that it is gone when this returns; one that cannot be removed is logged and left.
    """
    removed = []
    client = shared_client()
    # the low-level list is one call; the high-level one inspects each container and fails when
    # another process removes one meanwhile
    for container in client.api.containers(all=True, filters={"label": LABEL_SANDBOX}):
        labels = container.get("Labels") or {}
        owner = int(labels.get(LABEL_OWNER, "0") or 0)
        if all_sandboxes or (pool_id is not None and labels.get(LABEL_POOL) == pool_id) or not pid_alive(owner):
            if _remove_container(client, container["Id"]):
                removed.append((container.get("Names") or [container["Id"][:12]])[0].lstrip("/"))
    return removed


def _remove_container(client: Any, container_id: str, wait_s: float = 30.0) -> bool:
    """Force-remove one container; True when this call removed it, False when it was already gone or another
    process's removal finished it (waited for up to `wait_s`)."""
    import docker.errors

    try:
        client.api.remove_container(container_id, force=True)
        return True
    except docker.errors.NotFound:
        return False
    except docker.errors.APIError as exc:
        if "in progress" not in str(exc):
            log.warning("cannot remove sandbox container %s: %s", container_id[:12], exc)
            return False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return False
        time.sleep(0.05)
    log.warning("sandbox container %s is still being removed after %.0f s", container_id[:12], wait_s)
    return False
