"""The pipeline model `envhub plan` simulates, fitted to one run's record.

Each stage's time is a base cost times a slowdown that depends on what else runs at the same moment; the record
places every stage on the run's clock (`record.read_run`), so each slowdown is fitted from how the stage's time moved
with the load around it, and each recorded sample is divided by the slowdown it saw to give its base cost:

- engine (continuous batching): one engine step takes `t0 + t1*b` seconds with `b` requests in the batch, plus
  `t2` per env call and `t4` per sandbox being created on the same machine; a request needs one step per generated
  token plus one for its prefill (other requests' prefills, which take turns with decode steps, are in `t1`);
- env calls (reset, step, final step with its grading): recorded work times `1 + e1*(k - 1) + e2*G + e3*L + e4*c`,
  with `k` env calls and `c` sandbox creations on the host, `G` the engine generating and `L` the learner running
  on the same machine. Every sandbox handed out is replaced by a new one (the pool refills), so the record's
  creations are placed at its acquires, each lasting the pool's median start time;
- learner: `a + b*tokens` seconds;
- sandbox creation (when the pool has no spare): a time drawn from the run's cold starts (or its pool metrics).

A slowdown term is kept only when the record shows it (model selection by BIC over every subset of the terms, with
no negative coefficient); otherwise it is 0. Engine and learner on one device (`shared` engine-learner or all) share
it fairly: while both are busy each runs at half speed. A sync run never shows that overlap, so it is a prior, not a
fit; samples a run recorded while both were busy are divided by it to give their base costs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from envhub.errors import ConfigError
from envhub.trainer.plan.record import Episode, RunRecord, Span

Shared = Literal["none", "engine-learner", "all"]
ENV_KINDS = ("reset", "step", "final")


@dataclass(frozen=True)
class EngineModel:
    """Seconds per engine step: (t0 + t1*batch + t2*env_calls + t4*creations) * (1 + share*learner_busy)."""

    t0: float
    t1: float = 0.0
    t2: float = 0.0
    t4: float = 0.0
    share: float = 0.0  # 1: the learner shares the engine's device (fair share), 0: it does not
    max_batch: int = 16
    fitted: tuple[str, ...] = ()  # which terms the record showed (the rest are 0)

    def step_s(self, batch: int, env_calls: float = 0.0, learner: float = 0.0, creations: float = 0.0) -> float:
        load = self.t0 + self.t1 * batch + self.t2 * env_calls + self.t4 * creations
        return load * (1.0 + self.share * learner)


@dataclass(frozen=True)
class EnvModel:
    """An env call's slowdown: 1 + e1*(calls on the host - 1) + e2*engine_busy + e3*learner_busy + e4*creations."""

    e1: float = 0.0
    e2: float = 0.0
    e3: float = 0.0
    e4: float = 0.0
    fitted: tuple[str, ...] = ()

    def slowdown(self, calls: float, engine: float = 0.0, learner: float = 0.0, creations: float = 0.0) -> float:
        return 1.0 + self.e1 * max(calls - 1.0, 0.0) + self.e2 * engine + self.e3 * learner + self.e4 * creations


@dataclass(frozen=True)
class LearnerModel:
    """Seconds per learner step: (a + b*tokens / learners) * (1 + share*engine_busy)."""

    a: float
    b: float = 0.0
    share: float = 0.0  # 1: an engine shares the learner's device (fair share), 0: none does
    fitted: tuple[str, ...] = ()

    def step_s(self, tokens: float, learners: int = 1) -> float:
        return self.a + self.b * tokens / max(learners, 1)


@dataclass(frozen=True)
class CpuModel:
    """The machine's CPU work per episode, from the run's CPU accounting (runs on one machine, `shared` all).

    The stage models are times, and a stage that waits (a remote call, a sleep) costs no CPU while one that works
    (a `docker exec`, a grader, the learner) does: the simulation cannot tell them apart, so a pipeline that keeps
    the machine's CPUs busy is bounded here: at most `cpus / machine_s` episodes a second, however it overlaps."""

    cpus: int
    machine_s: float  # every CPU second of the machine per finished episode (trainer, sandboxes, dockerd, others)
    trainer_s: float  # of which the trainer process's (engine, learner, event loop)

    @property
    def episodes_per_s(self) -> float:
        return self.cpus / self.machine_s if self.machine_s > 0 else float("inf")


@dataclass(frozen=True)
class PoolModel:
    """A sandbox pool per env host: `spares` kept warm, each created in a time drawn from the record's."""

    spares: int
    create_s: tuple[float, ...]


@dataclass(frozen=True)
class EpisodeTrace:
    """A recorded episode as base costs: delays (s), env work (s at no contention) and tokens per turn."""

    build_s: float
    reset_work: float
    turns: tuple[tuple[int, float], ...]  # (engine steps, env work) per turn
    close_s: float
    total_tokens: int
    sandboxed: bool


@dataclass
class PipelineModel:
    """Everything the simulator needs, fitted to one record."""

    engine: EngineModel
    env: EnvModel
    learner: LearnerModel
    pool: PoolModel | None
    groups: list[list[EpisodeTrace]]  # recorded groups, resampled whole (their episodes share a seed)
    publish_s: list[float]
    filtered: float  # share of finished groups filtered (zero variance)
    failed: float  # share of finished groups that failed
    shared: Shared
    notes: list[str] = field(default_factory=list)
    cpu: CpuModel | None = None  # None: the record has no CPU accounting, or the stages are not on one machine


def fit_model(record: RunRecord, shared: Shared | None = None) -> PipelineModel:
    """Fit the stage models to `record`; `shared` says which stages share a device (default: from the record)."""
    shared = shared or default_shared(record)
    if shared not in ("none", "engine-learner", "all"):
        raise ConfigError(f"unknown --shared {shared!r}", hint="none, engine-learner or all")
    notes: list[str] = []
    pool = fit_pool(record)
    loads = Loads(record, pool)
    engine = fit_engine(record, loads, shared, notes)
    env = fit_env(loads, shared, notes)
    traces: dict[str, list[EpisodeTrace]] = {e.group_id: [] for e in record.episodes}
    for e in record.episodes:
        traces[e.group_id].append(trace(e, env, loads, shared))
    outcomes = [g.outcome for g in record.groups if g.outcome in ("trained", "filtered", "failed")]
    return PipelineModel(
        engine=engine,
        env=env,
        learner=fit_learner(record, loads, shared),
        pool=pool,
        groups=[t for t in traces.values() if t],
        publish_s=[s.publish_s for s in record.steps] or [0.0],
        filtered=outcomes.count("filtered") / len(outcomes) if outcomes else 0.0,
        failed=outcomes.count("failed") / len(outcomes) if outcomes else 0.0,
        shared=shared,
        notes=notes,
        cpu=fit_cpu(record) if shared == "all" else None,
    )


def fit_cpu(record: RunRecord) -> CpuModel | None:
    """CPU seconds per episode between the first and the last metrics row (start-up left out): the machine's and the
    trainer process's, from the rows' cumulative accounting. A resumed run counts again from its own start: only the
    rows since the last restart are used."""
    samples = record.cpu
    restarts = [i for i in range(1, len(samples)) if samples[i].machine_s < samples[i - 1].machine_s]
    samples = samples[restarts[-1] :] if restarts else samples
    if len(samples) < 2:
        return None
    first, last = samples[0], samples[-1]
    episodes = sum(1 for e in record.episodes if first.time < _end(e) <= last.time)
    if episodes == 0 or last.machine_s <= first.machine_s:
        return None
    return CpuModel(
        last.cpus, (last.machine_s - first.machine_s) / episodes, (last.trainer_s - first.trainer_s) / episodes
    )


def _end(episode: Episode) -> float:
    return max((s.end for s in episode.spans), default=0.0)


def default_shared(record: RunRecord) -> Shared:
    """A run with the embedded engine and envs in its own process shares one machine; else only engine+learner
    devices may be shared, which the record cannot tell: assume none."""
    from envhub.trainer.engines.kinds import engine_kind, is_engine_kind

    kind = record.setting("engine", "kind", "embedded")  # a kind the record names but this process lacks: a server
    local_engine = is_engine_kind(kind) and engine_kind(kind).in_process
    remote = any(t.get("remote") for t in record.config.get("tasks", []))
    return "all" if local_engine and not remote else "none"


class Loads:
    """How many stages of each kind ran at each moment of the record (time-averaged over a span)."""

    def __init__(self, record: RunRecord, pool: PoolModel | None = None) -> None:
        self.spans = [s for e in record.episodes for s in e.spans]
        self.learner = [Span("learn", s.start, s.start + s.learner_s) for s in record.steps]
        typical = float(np.median(pool.create_s)) if pool is not None else 0.0
        creations = [  # the one each acquire set off (the pool refilling), or the cold start the acquire waited for
            Span("create", s.start, s.start + max(s.seconds, typical)) for s in self.spans if s.kind == "acquire"
        ]
        generations = [s for s in self.spans if s.kind == "generate"]
        self._curves = {
            "generate": _load_curve(generations),
            "env": _load_curve([s for s in self.spans if s.kind in ENV_KINDS]),
            "create": _load_curve([c for c in creations if c.end > c.start]),
            "learn": _load_curve(self.learner),
        }
        self._busy = {"generate": _load_curve(generations, indicator=True), "learn": _load_curve(self.learner, True)}

    def mean(self, kind: str, span: Span, busy: bool = False) -> float:
        """Mean count of `kind` stages during `span` (or the share of it during which any ran, `busy`)."""
        times, integral = (self._busy if busy else self._curves)[kind]
        if len(times) == 0 or span.end <= span.start:
            return 0.0
        area = np.interp(span.end, times, integral) - np.interp(span.start, times, integral)
        return float(area / (span.end - span.start))


def _load_curve(spans: list[Span], indicator: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Breakpoints and the running integral of the number of spans open (or of 'any open')."""
    if not spans:
        return np.array([]), np.array([])
    times = np.array([s.start for s in spans] + [s.end for s in spans])
    delta = np.array([1] * len(spans) + [-1] * len(spans))
    order = np.argsort(times, kind="stable")
    times, count = times[order], np.cumsum(delta[order])
    level = (count > 0).astype(float) if indicator else count.astype(float)
    integral = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])
    return times, integral


def select_fit(
    x: np.ndarray, y: np.ndarray, names: list[str], required: tuple[str, ...] = (), free_intercept: bool = False
) -> dict[str, float]:
    """Least squares y ~ 1 + some columns of x: of every subset of the columns (always with the `required` ones the
    record shows), the fit with no negative coefficient (no stage takes negative time) and the lowest BIC; returns
    {"1": intercept, name: slope} for the kept columns.

    BIC weighs fit against the number of terms, so a term the record does not show stays out, and of two terms that
    moved together in the record (a big batch while the pool refilled) the one that explains more is kept."""
    n = len(y)
    if n == 0:
        return {"1": 0.0}
    usable = [i for i in range(x.shape[1]) if np.ptp(x[:, i]) > 1e-9]
    forced = [i for i in usable if names[i] in required]
    optional = [i for i in usable if i not in forced]
    best, best_bic = {"1": float(np.mean(y))}, math.inf
    for size in range(len(optional) + 1):
        for extra in itertools.combinations(optional, size):
            subset = (*forced, *extra)
            size = len(subset)
            if n <= size + 2:
                continue
            design = np.column_stack([np.ones(n), *(x[:, i] for i in subset)])
            coef, *_ = np.linalg.lstsq(design, y, rcond=None)
            if np.any(coef[1 if free_intercept else 0 :] < 0):
                continue
            rss = float(np.sum((y - design @ coef) ** 2))
            bic = n * math.log(max(rss / n, 1e-300)) + (size + 1) * math.log(n)
            if bic < best_bic:
                best_bic = bic
                best = {"1": float(coef[0])} | {names[i]: float(coef[j + 1]) for j, i in enumerate(subset)}
    return best


def fit_engine(record: RunRecord, loads: Loads, shared: Shared, notes: list[str]) -> EngineModel:
    """Seconds per engine step against the batch size and what else ran on the machine during each generation."""
    gens = [s for s in loads.spans if s.kind == "generate"]
    if not gens:
        raise ConfigError(f"{record.run_dir} recorded no generation", hint="plan from a run that generated tokens")
    engines = max(len([u for u in str(record.setting("engine", "url", "")).split(",") if u]), 1)
    share = 0.0 if shared == "none" else 1.0
    # each generation's time per engine step (its tokens, its prefill, and the prefill steps of requests that
    # arrived while it ran), without the learner's share of the device when it overlapped
    y = np.array(
        [
            g.seconds
            / (g.tokens + 1 + _prefills_during(g, gens, engines))
            / (1.0 + share * loads.mean("learn", g, busy=True))
            for g in gens
        ]
    )
    x = np.array([[loads.mean("generate", g) / engines, loads.mean("env", g), loads.mean("create", g)] for g in gens])
    if shared != "all":
        x[:, 1:] = 0.0  # envs and sandboxes on other machines cannot slow the engine
    fit = select_fit(x, y, ["t1", "t2", "t4"], required=("t1",))  # a bigger batch always costs more per step
    t0 = fit["1"]
    if t0 <= 0:  # every step's time is in the slopes: keep a floor at the fastest step seen
        t0 = float(np.min(y)) / 2
    if share:
        notes.append("engine and learner share a device: each at half speed while both run (prior, not fitted)")
    max_batch = int(record.setting("engine", "max_batch_size", 16)) if engines == 1 else 256
    terms = {n: max(fit.get(n, 0.0), 0.0) for n in ("t1", "t2", "t4")}
    fitted = tuple(n for n in terms if n in fit)
    return EngineModel(t0, terms["t1"], terms["t2"], terms["t4"], share, max_batch, fitted)


def _prefills_during(gen: Span, gens: list[Span], engines: int) -> float:
    """Prefill steps of other requests while `gen` ran: arrivals less than one of its steps apart share one."""
    step = gen.seconds / (gen.tokens + 1)
    arrivals = sorted(g.start for g in gens if gen.start < g.start < gen.end)
    steps, last = 0, gen.start
    for t in arrivals:
        if t - last >= step:
            steps, last = steps + 1, t
    return steps / engines


def fit_env(loads: Loads, shared: Shared, notes: list[str]) -> EnvModel:
    """An env call's time (relative to the median of its kind) against the load around it, fitted on the log: env
    latencies are heavy-tailed (a sandbox's test run, a remote call), and on the log one slow call is one sample,
    not a lever. A log-slope b per unit of load becomes the slowdown term exp(b) - 1."""
    calls = [s for s in loads.spans if s.kind in ENV_KINDS and s.seconds > 0]
    if len(calls) < 8:
        return EnvModel()
    medians = {k: float(np.median([s.seconds for s in calls if s.kind == k] or [1.0])) for k in ENV_KINDS}
    y = np.log([s.seconds / max(medians[s.kind], 1e-6) for s in calls])
    x = np.array([_env_load(loads, s, shared) for s in calls])
    names = ["e1", "e2", "e3", "e4"]
    fit = select_fit(x, y, names, free_intercept=True)
    terms = {n: math.expm1(max(fit.get(n, 0.0), 0.0)) for n in names}
    if shared == "all" and "e3" not in fit and terms["e2"] > 0:
        terms["e3"] = terms["e2"]  # the learner loads the machine as generation does
        notes.append("env calls while the learner runs: taken equal to while the engine generates (prior)")
    return EnvModel(terms["e1"], terms["e2"], terms["e3"], terms["e4"], tuple(n for n in names if n in fit))


def _env_load(loads: Loads, span: Span, shared: Shared) -> list[float]:
    """What ran beside an env call: other env calls, engine busy, learner busy, sandbox creations."""
    if shared != "all":
        return [loads.mean("env", span) - 1.0, 0.0, 0.0, loads.mean("create", span)]
    return [
        loads.mean("env", span) - 1.0,
        loads.mean("generate", span, busy=True),
        loads.mean("learn", span, busy=True),
        loads.mean("create", span),
    ]


def fit_learner(record: RunRecord, loads: Loads, shared: Shared) -> LearnerModel:
    """Learner seconds against the step's tokens (without the engine's share of the device when it overlapped)."""
    steps = record.steps
    share = 0.0 if shared == "none" else 1.0
    busy = [loads.mean("generate", Span("learn", s.start, s.start + s.learner_s), busy=True) for s in steps]
    y = np.array([s.learner_s / (1.0 + share * b) for s, b in zip(steps, busy)])
    tokens = np.array([float(s.tokens) for s in steps])
    fit = select_fit(tokens[:, None], y, ["b"])
    if "b" in fit and fit["1"] >= 0:
        return LearnerModel(fit["1"], fit["b"], share, ("a", "b"))
    # the record cannot separate a fixed cost from a per-token one: take the learner's time as proportional to
    # its tokens (compute is), which is what matters when a plan changes the tokens per step or splits them
    per_token = float(np.sum(y) / max(np.sum(tokens), 1.0))
    return LearnerModel(0.0, per_token, share, ())


def trace(episode: Episode, env: EnvModel, loads: Loads, shared: Shared) -> EpisodeTrace:
    """A recorded episode's base costs: each env call's time divided by the slowdown it saw."""
    work = [
        s.seconds / env.slowdown(*_env_load(loads, s, shared))
        for s in sorted(episode.spans, key=lambda s: s.start)
        if s.kind in ENV_KINDS
    ]
    reset, steps = (work[0], work[1:]) if work else (0.0, [])
    turns = tuple((t.new_tokens + 1, steps[i] if i < len(steps) else t.env_s) for i, t in enumerate(episode.turns))
    return EpisodeTrace(
        build_s=episode.build_s,
        reset_work=reset,
        turns=turns,
        close_s=episode.close_s,
        total_tokens=episode.total_tokens,
        sandboxed=any(s.kind == "acquire" for s in episode.spans),
    )


def fit_pool(record: RunRecord) -> PoolModel | None:
    """The sandbox pool: spares from the run's pool metrics, creation times from them (or from cold acquires)."""
    acquires = [s for e in record.episodes for s in e.spans if s.kind == "acquire"]
    if not acquires:
        return None
    metrics = record.pool
    create_s = [s.seconds for s in acquires if s.seconds > 0.05]  # cold starts, as they happened
    if metrics.get("start_p50_ms"):  # every start the pool made, warm spares included: a log-normal through them
        p50, p99 = metrics["start_p50_ms"] / 1000, max(metrics.get("start_p99_ms", 0) / 1000, 1e-6)
        sigma = max(math.log(max(p99, p50) / p50), 0.0) / 2.326 if p50 > 0 else 0.0
        create_s = [p50 * math.exp(sigma * z) for z in np.random.default_rng(0).standard_normal(64)]
    # without pool metrics the record cannot say how many spares there were: a pool that never ran dry
    spares = int(metrics.get("size", 0)) if metrics else 1 << 30
    return PoolModel(spares, tuple(create_s) or (0.0,))
