"""Rollouts on Ray: `EnvWorker` actors play episodes on CPU nodes against an engine reachable over HTTP.

The driver (the learner's process) keeps the queue and the train loop. `RayRolloutSource.play_group`
sends each episode of a group to the least-loaded `EnvWorker`; an actor runs many episodes at once as
asyncio tasks, each with its own env, and returns finished `Trajectory` objects. When an actor dies
(`RayActorError`), the driver starts a new one in its slot and resubmits the episodes that were running
there; trajectories already returned are kept. What the workers generate through is the engine kind's
`worker_endpoint` and its `worker_client`: the driver serves an in-process engine (the embedded one) over the
SGLang-compatible HTTP API; SGLang's workers call its router or servers (several comma-separated URLs are routed
least-loaded by each worker); vLLM's workers call the run's vLLM servers, failing over between them when one dies.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

import envhub
from envhub.errors import EngineError
from envhub.trainer.config import RolloutConfig, TaskConfig, TrainConfig
from envhub.trainer.engines import engine_kind
from envhub.trainer.rollout.sources import EpisodeCallback, keep_first_finished
from envhub.trainer.trajectory import Trajectory
from envhub.user_modules import load_user_modules


@dataclass
class RayOptions:
    """Where and how many env workers run."""

    #: "local" starts a Ray instance in this process; else a cluster address ("auto", "ray://host:10001", "host:6379")
    address: str = "local"
    workers: int = 2  #: EnvWorker actors
    cpus_per_worker: float = 1.0  #: Ray CPUs each actor reserves (its envs and sandboxes run there)
    episodes_per_worker: int = 16  #: episodes one actor runs at once (its sandbox budget)
    resources: dict[str, float] = field(
        default_factory=dict
    )  #: custom Ray resources, e.g. {"env_host": 1} to pin actors to CPU hosts
    max_episode_retries: int = 3  #: resubmissions of an episode whose actor died
    engine_host: str = (
        ""  #: address the workers reach the driver's engine on (default 127.0.0.1 locally, the node IP on a cluster)
    )


def _portable_entry_points(tasks: list[TaskConfig]) -> dict[str, str]:
    """ "module:Class" entry points of the tasks' envs, so a worker process can register envs the driver registered at
    run time."""
    points = {}
    for task in tasks:
        if task.remote:
            continue
        entry = envhub.spec(task.env).entry_point
        points[task.env] = entry if isinstance(entry, str) else f"{entry.__module__}:{entry.__qualname__}"
    return points


class EnvWorker:
    """Plays episodes against an HTTP engine; one instance per Ray actor (an asyncio actor)."""

    def __init__(
        self,
        engine_urls: str,
        tokenizer_name: str,
        rollout: RolloutConfig,
        entry_points: dict[str, str],
        api_key: str | None = None,
        max_outage_s: float = 300.0,
        imports: tuple[str, ...] = (),
        engine_kind_name: str = "embedded",
    ) -> None:
        from envhub.trainer.models import load_tokenizer
        from envhub.trainer.rollout.tasks import env_factory
        from envhub.trainer.rollout.worker import RolloutWorker

        load_user_modules(imports, option="imports:")  # the driver's --import / imports: list, in the same order
        known = {s.id for s in envhub.list_envs()}
        for env_id, entry in entry_points.items():
            if env_id not in known:
                envhub.register(env_id, entry)
        self._env_factory = env_factory
        # an engine server that dies mid-run is waited for (or failed over) and the request resubmitted, as in the
        # driver; the kind is looked up after the imports, which may register it
        kind = engine_kind(engine_kind_name)
        self.engine = kind.worker_client(engine_urls, api_key=api_key, max_outage_s=max_outage_s)
        self.worker = RolloutWorker(self.engine, load_tokenizer(tokenizer_name), rollout)
        self.factories: dict[str, Any] = {}

    async def run_episode(self, task: TaskConfig, seed: int, group_id: str, episode: int = 0) -> Trajectory:
        """Play one episode of `task` to its end; an error ends it as an "error" trajectory (never raised)."""
        if task.env not in self.factories:
            self.factories[task.env] = lambda: self._env_factory(task)()  # an unknown id fails at build, counted
        return await self.worker.run_episode(self.factories[task.env], task.env, seed, group_id, episode)

    async def pid(self) -> int:
        """The actor's process id (tests and diagnostics)."""
        return os.getpid()

    async def close(self) -> None:
        """Close the engine client."""
        await self.engine.close()


class RayRolloutSource:
    """The driver side: runs GRPO groups on EnvWorker actors and retries the episodes of dead actors."""

    def __init__(
        self, options: RayOptions, config: TrainConfig, engine_urls: str, server: Any = None, owns_ray: bool = False
    ) -> None:
        import ray

        self.ray = ray
        self.options = options
        self.rollout = config.rollout
        self.engine_urls = engine_urls
        self._server = server
        self._owns_ray = owns_ray
        api_key = getattr(server, "api_key", None) or config.engine.api_key or None
        self._args = (
            engine_urls,
            config.model.name,
            config.rollout,
            _portable_entry_points(config.tasks),
            api_key,
            config.engine.max_outage_s,
            tuple(config.imports),
            engine_kind(config.engine.kind).name,
        )
        self._actor_cls = ray.remote(EnvWorker)
        self.actors = [self._new_actor() for _ in range(options.workers)]
        self.load = [0] * options.workers
        self._slots = asyncio.Semaphore(options.workers * options.episodes_per_worker)
        self.episodes_finished = 0
        self.peak_in_flight = 0  # most episodes running on the actors at once (what scaling out buys)
        self.episodes_retried = 0
        self.on_episode: EpisodeCallback | None = None  # sees every episode an actor returns
        self.actors_restarted = 0

    @classmethod
    async def start(cls, options: RayOptions, config: TrainConfig, engine: Any = None) -> RayRolloutSource:
        """Connect to (or start) Ray, make the engine reachable over HTTP and start the actors."""
        import ray

        if options.workers < 1 or options.episodes_per_worker < 1:
            raise EngineError("ray workers and episodes_per_worker must be at least 1")
        kind = engine_kind(config.engine.kind)
        owns_ray = not ray.is_initialized()
        if owns_ray:
            await asyncio.to_thread(init_ray, options)
        local = options.address == "local"
        try:  # an in-process engine is served over HTTP, reachable from other hosts only with a fresh API key
            urls, server = await kind.worker_endpoint(
                engine,
                host=options.engine_host or ("127.0.0.1" if local else ray.util.get_node_ip_address()),
                bind="127.0.0.1" if local else "0.0.0.0",
                api_key=None if local else secrets.token_urlsafe(24),
            )
        except BaseException:
            if owns_ray:
                ray.shutdown()
            raise
        source = cls(options, config, urls, server, owns_ray)
        await source.ready()
        return source

    def _new_actor(self) -> Any:
        opts = {"num_cpus": self.options.cpus_per_worker, "num_gpus": 0, "max_restarts": 0}
        if self.options.resources:
            opts["resources"] = dict(self.options.resources)
        token = os.environ.get("ENVHUB_TOKEN")
        if (
            token
        ):  # RemoteEnv tasks authenticate from the actors too; actors on other hosts do not inherit this environment
            opts["runtime_env"] = {"env_vars": {"ENVHUB_TOKEN": token}}
        return self._actor_cls.options(**opts).remote(*self._args)

    async def resize(self, workers: int) -> None:
        """Use `workers` actors (start more or stop the surplus); call it while no episode is running."""
        if workers < 1 or any(self.load):
            raise EngineError("resize needs at least one worker and no episode in flight")
        while len(self.actors) > workers:
            self.ray.kill(self.actors.pop(), no_restart=True)
        self.actors += [self._new_actor() for _ in range(workers - len(self.actors))]
        self.load = [0] * workers
        self._slots = asyncio.Semaphore(workers * self.options.episodes_per_worker)
        await self.ready()

    async def ready(self) -> None:
        """Wait until every actor has started (its tokenizer loaded)."""
        await asyncio.gather(*[a.pid.remote() for a in self.actors])

    async def _episode(self, task: TaskConfig, seed: int, group_id: str, episode: int) -> Trajectory:
        async with self._slots:
            for _attempt in range(self.options.max_episode_retries + 1):
                index = min(range(len(self.actors)), key=self.load.__getitem__)
                actor = self.actors[index]
                self.load[index] += 1
                self.peak_in_flight = max(self.peak_in_flight, sum(self.load))
                ref = actor.run_episode.remote(task, seed, group_id, episode)
                try:
                    traj = await ref
                    self.episodes_finished += 1
                    if self.on_episode is not None:
                        self.on_episode(traj)
                    return traj
                except asyncio.CancelledError:
                    self.ray.cancel(ref)
                    raise
                except (
                    self.ray.exceptions.RayActorError,
                    getattr(self.ray.exceptions, "ActorUnavailableError", self.ray.exceptions.RayActorError),
                ):
                    self.episodes_retried += 1
                    if self.actors[index] is actor:  # the first episode to notice replaces the actor
                        self.actors_restarted += 1
                        self.actors[index] = self._new_actor()
                        self.ray.kill(actor, no_restart=True)
                finally:
                    self.load[index] -= 1
        raise EngineError(
            f"episode of {task.env} (seed {seed}) failed on {self.options.max_episode_retries + 1} env workers in a row"
        )

    async def play_group(self, task: TaskConfig, seed: int, group_id: str) -> list[Trajectory] | None:
        """group_size + redundancy episodes of one seed on the actors; the first group_size to finish are kept."""
        size = self.rollout.group_size
        episodes = [self._episode(task, seed, group_id, i) for i in range(size + self.rollout.redundancy)]
        return await keep_first_finished(episodes, size)

    async def close(self) -> None:
        """Stop the actors, the engine server and (if this source started it) Ray."""
        await asyncio.gather(*[a.close.remote() for a in self.actors], return_exceptions=True)
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        if self._server is not None:
            await self._server.stop()  # also closes the engine it serves (closing twice is harmless)
        if self._owns_ray:
            await asyncio.to_thread(self.ray.shutdown)


def init_ray(options: RayOptions) -> None:
    """`ray.init` for a local single-machine instance or a cluster address (no dashboard locally)."""
    import ray

    if options.address == "local":
        cpus = max(os.cpu_count() or 1, int(options.workers * options.cpus_per_worker + 0.999))
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    else:
        ray.init(address=options.address, log_to_driver=False, configure_logging=False)
