"""The discrete-event simulation behind `envhub plan`: GRPO groups through engines, env hosts and the learner.

Everything in flight is an activity with work left and a rate that depends on what else is running (the fitted
`PipelineModel`): generation on an engine (continuous batching: every running request advances one token per engine
step, and a step takes longer the bigger the batch), env calls and sandbox creations on an env host, the learner
step, and plain delays (env construction, closing, publishing weights). Between two events the rates are constant,
so the clock jumps straight to the next activity to finish.

Each episode is a generator that yields what it needs next, replaying a recorded episode's trace (resampled by
group: the episodes of a recorded group share a task seed). The producer, queue and learner follow the trainer's
rules: a group may start while the queue's admission allows it (`Staleness.capacity`) and fewer than
`concurrent_groups` are in flight; a group starts `group_size + redundancy` episodes and keeps the first
`group_size` to finish; a finished group is filtered or failed with the record's odds; the learner takes
`groups_per_step` groups, dropping those with no token within the bound; the new version is published after the
learner's step and the weight push. Sync mode is the same with max_staleness 0.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from envhub.errors import ConfigError
from envhub.trainer.plan.config import PlanConfig, SimResult
from envhub.trainer.plan.model import EpisodeTrace, PipelineModel
from envhub.trainer.plan.pools import SandboxPools

Request = tuple[Any, ...]  # ("delay", s) | ("slot",) | ("acquire",) | ("env", work) | ("gen", steps)


class _Activity:
    __slots__ = ("kind", "remaining", "place", "owner", "running", "since")

    def __init__(self, kind: str, work: float, place: int = 0, owner: Any = None) -> None:
        self.kind, self.remaining, self.place, self.owner, self.running = kind, max(work, 0.0), place, owner, True
        self.since = 0.0


@dataclass(eq=False)
class _Episode:
    group: _Group
    host: int
    trace: EpisodeTrace
    steps: Generator[Request, None, None] = field(default_factory=lambda: iter(()))  # type: ignore[assignment]
    activity: _Activity | None = None
    versions: list[int] = field(default_factory=list)
    slot: bool = False
    sandbox: bool = False
    acquire_started: float = 0.0
    over: bool = False


@dataclass(eq=False)
class _Group:
    traces: list[EpisodeTrace]
    started: float = 0.0
    episodes: list[_Episode] = field(default_factory=list)
    kept: list[_Episode] = field(default_factory=list)


def simulate(model: PipelineModel, config: PlanConfig) -> SimResult:
    """Run the pipeline until `config.steps` learner steps are published."""
    config.validate()
    return _Simulator(model, config).run()


class _Simulator:
    def __init__(self, model: PipelineModel, config: PlanConfig) -> None:
        self.m, self.c = model, config
        self.rng = random.Random(config.seed)
        self.now = 0.0
        self.active: list[_Activity] = []
        self.running = [0] * config.engines
        self.waiting: list[deque[_Activity]] = [deque() for _ in range(config.engines)]
        self.last_prefill = [-1e9] * config.engines
        self.env_calls = [0] * config.env_hosts
        self.creating = [0] * config.env_hosts  # sandboxes being started (load on the host)
        self.host_episodes = [0] * config.env_hosts  # holding a slot
        self.host_load = [0] * config.env_hosts  # assigned (hosts are chosen least-loaded)
        self.slot_waiters: list[deque[_Episode]] = [deque() for _ in range(config.env_hosts)]
        pool = model.pool  # a pool that never ran dry (no pool metrics) is no pool: acquires never wait
        self.pools = SandboxPools(pool, config.env_hosts, self.rng) if pool and pool.spares < 1 << 20 else None
        self.version = self.started = self.discarded = self.in_flight = 0
        self.ready: deque[_Group] = deque()
        self.batch: list[_Group] = []
        self.learning = self.publishing = False
        self.result = SimResult(0.0, 0, 0)
        self._lags: list[float] = []
        self._integrals = {"engine_busy": 0.0, "engine_rows": 0.0, "env_busy": 0.0, "env_calls": 0.0, "learn": 0.0}
        self._stage_times: dict[str, list[float]] = {}

    # -- the clock ----------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        self._fill()
        limit = 200 * self.c.steps * self.c.groups_per_step + 1000
        while self.result.steps < self.c.steps:
            self._advance()
            if self.started > limit:
                raise ConfigError(
                    f"the simulation started {self.started} groups without reaching {self.c.steps} steps",
                    hint="the record's groups are (almost) all filtered or failed: plan from a run that trained",
                )
        return self._summary()

    def _advance(self) -> None:
        rates = self._rates()
        moving = [(a, r) for a, r in zip(self.active, rates) if r > 0]
        if not moving:
            raise ConfigError("the simulated pipeline stalled (nothing can run)", hint=f"check the settings: {self.c}")
        dt = min(a.remaining / r for a, r in moving)
        self._account(dt)
        self.now += dt
        done = []
        for a, r in moving:
            a.remaining -= r * dt
            if a.remaining <= 1e-9 * max(1.0, r):
                done.append(a)
        for a in done:
            if a in self.active:
                self.active.remove(a)
                self._finished(a)

    def _rates(self) -> list[float]:
        m = self.m
        generating = 1.0 if any(self.running) else 0.0
        learning = 1.0 if self.learning else 0.0
        env_total, creating_total = sum(self.env_calls), sum(self.creating)
        engine_learner = learning if m.shared != "none" else 0.0
        if m.shared == "all":  # one machine: every env call and sandbox start loads the engine and each other
            step_s = [m.engine.step_s(b, env_total, engine_learner, creating_total) for b in self.running]
            env_rate = [1.0 / m.env.slowdown(env_total, generating, learning, creating_total)] * self.c.env_hosts
        else:
            step_s = [m.engine.step_s(b, 0.0, engine_learner) for b in self.running]
            env_rate = [1.0 / m.env.slowdown(k, 0.0, 0.0, c) for k, c in zip(self.env_calls, self.creating)]
        learn_rate = 1.0 / (1.0 + m.learner.share * generating)
        rates = []
        for a in self.active:
            if a.kind == "gen":
                rates.append(1.0 / step_s[a.place] if a.running else 0.0)
            elif a.kind == "env":
                rates.append(env_rate[a.place])
            elif a.kind == "learn":
                rates.append(learn_rate)
            else:
                rates.append(1.0)
        return rates

    def _step_s(self, engine: int) -> float:
        """Seconds per step of `engine` right now."""
        m, learning = self.m, 1.0 if self.learning and self.m.shared != "none" else 0.0
        if m.shared == "all":
            return m.engine.step_s(self.running[engine], sum(self.env_calls), learning, sum(self.creating))
        return m.engine.step_s(self.running[engine], 0.0, learning)

    def _account(self, dt: float) -> None:
        i = self._integrals
        i["engine_busy"] += dt * sum(1 for b in self.running if b)
        i["engine_rows"] += dt * sum(self.running)
        i["env_busy"] += dt * sum(1 for k in self.env_calls if k)
        i["env_calls"] += dt * sum(self.env_calls)
        i["learn"] += dt if self.learning else 0.0

    def _start(self, activity: _Activity) -> _Activity:
        activity.since = self.now
        self.active.append(activity)
        if activity.kind == "gen":
            engine = activity.place
            if self.now - self.last_prefill[engine] >= self._step_s(engine):  # else it joins that prefill step
                self.last_prefill[engine] = self.now  # a new prefill step: every running request waits one step
                for a in self.active:
                    if a.kind == "gen" and a.place == engine and a.running and a is not activity:
                        a.remaining += 1.0
            if self.running[engine] < self.m.engine.max_batch:
                self.running[engine] += 1
            else:
                activity.running = False
                self.waiting[engine].append(activity)
        elif activity.kind == "env":
            self.env_calls[activity.place] += 1
        elif activity.kind == "create":
            self.creating[activity.place] += 1
        return activity

    def _stop(self, activity: _Activity) -> None:
        """Bookkeeping when an activity leaves (finished or cancelled)."""
        if activity.kind == "gen":
            engine = activity.place
            if not activity.running:
                self.waiting[engine].remove(activity)
                return
            self.running[engine] -= 1
            if self.waiting[engine]:
                self.waiting[engine].popleft().running = True
                self.running[engine] += 1
        elif activity.kind == "env":
            self.env_calls[activity.place] -= 1
        elif activity.kind == "create":
            self.creating[activity.place] -= 1

    def _finished(self, activity: _Activity) -> None:
        self._stop(activity)
        self._stage_times.setdefault(activity.kind, []).append(self.now - activity.since)
        if activity.kind == "create" and activity.owner is None:
            self.pools.created(activity.place)  # type: ignore[union-attr]
        elif activity.kind == "learn":
            self.learning, self.publishing = False, True
            self._start(_Activity("publish", self.rng.choice(self.m.publish_s)))
        elif activity.kind == "publish":
            self._published()
        elif isinstance(activity.owner, _Episode):
            if activity.kind == "create":  # a cold start: the episode waited for it
                self.pools.waited(self.now - activity.owner.acquire_started)  # type: ignore[union-attr]
            self._resume(activity.owner)

    # -- episodes -----------------------------------------------------------------------------------------
    def _episode_steps(self, ep: _Episode, t: EpisodeTrace) -> Generator[Request, None, None]:
        yield ("delay", t.build_s)
        if self.c.env_slots:
            yield ("slot",)
        if t.sandboxed and self.pools:
            yield ("acquire",)
        yield ("env", t.reset_work)
        for steps, work in t.turns:
            ep.versions.append(self.version)
            yield ("gen", steps)
            yield ("env", work)
        yield ("delay", t.close_s)

    def _resume(self, ep: _Episode) -> None:
        ep.activity = None
        request = next(ep.steps, None)
        if request is None:
            self._episode_done(ep)
        elif request[0] == "delay":
            ep.activity = self._start(_Activity("delay", request[1], owner=ep))
        elif request[0] == "env":
            ep.activity = self._start(_Activity("env", request[1], ep.host, ep))
        elif request[0] == "gen":
            engine = min(range(self.c.engines), key=lambda e: self.running[e] + len(self.waiting[e]))
            ep.activity = self._start(_Activity("gen", request[1], engine, ep))
        elif request[0] == "slot":
            self._take_slot(ep)
        else:
            self._acquire(ep)

    def _take_slot(self, ep: _Episode) -> None:
        if self.host_episodes[ep.host] < self.c.env_slots:
            self.host_episodes[ep.host] += 1
            ep.slot = True
            self._resume(ep)
        else:
            self.slot_waiters[ep.host].append(ep)

    def _acquire(self, ep: _Episode) -> None:
        assert self.pools is not None
        ep.acquire_started, ep.sandbox = self.now, True
        warm = self.pools.take(ep.host)
        if not warm:  # a cold start of its own, a load on the host like the refills
            ep.activity = self._start(_Activity("create", self.pools.create_s(), ep.host, ep))
        self._refill(ep.host)
        if warm:
            self._resume(ep)

    def _refill(self, host: int) -> None:
        assert self.pools is not None
        for _ in range(self.pools.refills(host)):
            self._start(_Activity("create", self.pools.create_s(), host))

    def _release(self, ep: _Episode) -> None:
        if ep.sandbox:
            ep.sandbox = False
            self._refill(ep.host)
        if ep.slot:
            ep.slot = False
            self.host_episodes[ep.host] -= 1
            if self.slot_waiters[ep.host]:
                self._take_slot(self.slot_waiters[ep.host].popleft())
        self.host_load[ep.host] -= 1

    def _episode_done(self, ep: _Episode) -> None:
        ep.over = True
        self._release(ep)
        group = ep.group
        group.kept.append(ep)
        if len(group.kept) == self.c.group_size:
            for other in group.episodes:
                if not other.over:
                    self._cancel(other)
            self._group_done(group)

    def _cancel(self, ep: _Episode) -> None:
        ep.over = True
        self.result.episodes_cancelled += 1
        if ep in self.slot_waiters[ep.host]:
            self.slot_waiters[ep.host].remove(ep)
        a = ep.activity
        if a is not None:
            if a.kind == "create":  # a cold start already under way becomes a spare
                a.owner = None
                self.pools.orphaned(ep.host)  # type: ignore[union-attr]
                ep.sandbox = False
            else:
                self.active.remove(a)
                self._stop(a)
        self._release(ep)

    # -- groups, queue and learner ------------------------------------------------------------------------
    def _fill(self) -> None:
        """Start groups while the producer's concurrency and the queue's admission allow."""
        concurrency = max(self.c.concurrent_groups, self.c.groups_per_step)
        capacity = self.c.staleness.capacity(self.version, self.c.groups_per_step, self.learning or self.publishing)
        while self.in_flight < concurrency and self.started - self.discarded < capacity:
            self.started += 1
            self.in_flight += 1
            self._start_group()

    def _start_group(self) -> None:
        want = self.c.group_size + self.c.redundancy
        if self.c.resample == "episode":
            traces = [self.rng.choice(self.rng.choice(self.m.groups)) for _ in range(want)]
        else:
            recorded = self.rng.choice(self.m.groups)
            traces = (recorded * (want // len(recorded) + 1))[:want]
            if want > len(recorded):  # more episodes than the record's group had: the extras drawn from it
                traces[len(recorded) :] = [self.rng.choice(recorded) for _ in range(want - len(recorded))]
        group = _Group(traces, self.now)
        for t in traces:
            host = min(range(self.c.env_hosts), key=lambda h: self.host_load[h])
            self.host_load[host] += 1
            ep = _Episode(group, host, t)
            ep.steps = self._episode_steps(ep, t)
            group.episodes.append(ep)
            self.result.episodes_started += 1
        for ep in group.episodes:
            self._resume(ep)

    def _group_done(self, group: _Group) -> None:
        self.in_flight -= 1
        self.result.group_s.append(self.now - group.started)
        draw = self.rng.random()
        if draw < self.m.filtered:
            self.result.groups_filtered += 1
            self.discarded += 1
        elif draw < self.m.filtered + self.m.failed:
            self.result.groups_failed += 1
            self.discarded += 1
        else:
            self.ready.append(group)
        self._try_learn()
        self._fill()

    def _try_learn(self) -> None:
        """Take the next batch when the learner is free: groups with no token within the bound are dropped."""
        if self.learning or self.publishing:
            return
        oldest_usable = self.c.staleness.min_version(self.version)
        while self.ready and len(self.batch) < self.c.groups_per_step:
            group = self.ready.popleft()
            newest = max(v for ep in group.kept for v in ep.versions)
            if self.c.stale == "drop" and newest < oldest_usable:
                self.result.groups_dropped += 1
                self.discarded += 1
                continue
            self.batch.append(group)
        if len(self.batch) < self.c.groups_per_step:
            self._fill()  # dropped groups give back their admission
            return
        self._lags += [self.version - min(v for ep in g.kept for v in ep.versions) for g in self.batch]
        tokens = sum(ep.trace.total_tokens for g in self.batch for ep in g.kept)
        self.learning = True
        self._start(_Activity("learn", self.m.learner.step_s(tokens, self.c.learners)))
        self._fill()  # a fractional staleness bound admits the next step's early groups while the learner works

    def _published(self) -> None:
        self.publishing = False
        self.version += 1
        self.result.steps += 1
        self.result.episodes_trained += self.c.groups_per_step * self.c.group_size
        self.result.step_ends.append(self.now)
        self.batch = []
        self._fill()
        self._try_learn()

    def _summary(self) -> SimResult:
        r, i, t = self.result, self._integrals, max(self.now, 1e-12)
        r.time_s = self.now
        r.mean_staleness = sum(self._lags) / len(self._lags) if self._lags else 0.0
        r.engine_busy = i["engine_busy"] / (t * self.c.engines)
        r.engine_batch = i["engine_rows"] / i["engine_busy"] if i["engine_busy"] else 0.0
        r.env_busy = i["env_busy"] / (t * self.c.env_hosts)
        r.env_calls = i["env_calls"] / (t * self.c.env_hosts)
        r.learner_busy = i["learn"] / t
        if self.pools is not None:
            r.cold_acquires, r.acquire_wait_s = self.pools.cold_acquires, self.pools.mean_wait_s
        r.stage_s = {k: sum(v) / len(v) for k, v in sorted(self._stage_times.items())}
        return r
