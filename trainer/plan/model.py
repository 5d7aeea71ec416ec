"""The pipeline model `envhub plan` simulates, fitted to one run's record.

Each stage's time is a base cost times a slowdown that depends on what else runs at the same moment; the record
places every stage on the run's clock (`record.read_run`), so each slowdown is fitted from how the stage's time moved
with the load around it, and each recorded sample is divided by the slowdown it saw to give its base cost:

- engine (continuous batching): one engine step takes `t0 + t1*b` seconds with `b` requests in the batch, plus
  `t2` per env call running on the same machine; a request needs one step per generated token plus one for its
  prefill;
- env calls (reset, step, final step with its grading, sandbox creation): recorded work times
  `1 + e1*(k - 1) + e2*G + e3*L`, with `k` env calls on the host, `G` the engine generating and `L` the learner
  running on the same machine;
- learner: `a + b*tokens` seconds.

A slowdown term is kept only when the record shows it (a positive slope at least twice its standard error);
otherwise it is 0. Engine and learner on one device (`shared` engine-learner or all) share it fairly: while both
are busy each runs at half speed. A sync run never shows that overlap, so it is a prior, not a fit; samples a run
recorded while both were busy are divided by it to give their base costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from envhub.errors import ConfigError
from envhub.trainer.plan.record import Episode, RunRecord, Span

Shared = Literal["none", "engine-learner", "all"]
ENV_KINDS = ("reset", "step", "final", "acquire")


@dataclass(frozen=True)
class EngineModel:
    """Seconds per engine step: (t0 + t1*batch + t2*env_calls) * (1 + share*learner_busy)."""

    t0: float
    t1: float = 0.0
    t2: float = 0.0
    share: float = 0.0  # 1: the learner shares the engine's device (fair share), 0: it does not
    max_batch: int = 16
    fitted: tuple[str, ...] = ()  # which terms the record showed (the rest are 0)

    def step_s(self, batch: int, env_calls: float = 0.0, learner: float = 0.0) -> float:
        return (self.t0 + self.t1 * batch + self.t2 * env_calls) * (1.0 + self.share * learner)


@dataclass(frozen=True)
class EnvModel:
    """An env call's slowdown: 1 + e1*(calls on the host - 1) + e2*engine_busy + e3*learner_busy."""

    e1: float = 0.0
    e2: float = 0.0
    e3: float = 0.0
    fitted: tuple[str, ...] = ()

    def slowdown(self, calls: float, engine: float = 0.0, learner: float = 0.0) -> float:
        return 1.0 + self.e1 * max(calls - 1.0, 0.0) + self.e2 * engine + self.e3 * learner


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
class PoolModel:
    """A sandbox pool per env host: `spares` kept warm, each created in a sampled time (env work)."""

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


def fit_model(record: RunRecord, shared: Shared | None = None) -> PipelineModel:
    """Fit the stage models to `record`; `shared` says which stages share a device (default: from the record)."""
    shared = shared or default_shared(record)
    if shared not in ("none", "engine-learner", "all"):
        raise ConfigError(f"unknown --shared {shared!r}", hint="none, engine-learner or all")
    spans = [s for e in record.episodes for s in e.spans]
    learner_spans = [Span("learn", s.start, s.start + s.learner_s) for s in record.steps]
    notes: list[str] = []
    engine = fit_engine(record, spans, learner_spans, shared, notes)
    env = fit_env(spans, learner_spans, shared, notes)
    learner = fit_learner(record, spans, shared)
    traces = {e.group_id: [] for e in record.episodes}
    loads = Loads(spans, learner_spans)
    for e in record.episodes:
        traces[e.group_id].append(trace(e, env, loads, shared))
    outcomes = [g.outcome for g in record.groups if g.outcome in ("trained", "filtered", "failed")]
    return PipelineModel(
        engine=engine,
        env=env,
        learner=learner,
        pool=fit_pool(record, env, loads, shared),
        groups=[t for t in traces.values() if t],
        publish_s=[s.publish_s for s in record.steps] or [0.0],
        filtered=outcomes.count("filtered") / len(outcomes) if outcomes else 0.0,
        failed=outcomes.count("failed") / len(outcomes) if outcomes else 0.0,
        shared=shared,
        notes=notes,
    )


def default_shared(record: RunRecord) -> Shared:
    """A run with the embedded engine and envs in its own process shares one machine; else only engine+learner
    devices may be shared, which the record cannot tell: assume none."""
    local_engine = record.setting("engine", "kind", "local") == "local"
    remote = any(t.get("remote") for t in record.config.get("tasks", []))
    return "all" if local_engine and not remote else "none"


class Loads:
    """How many stages of each kind ran at each moment of the record (time-averaged over a span)."""

    def __init__(self, spans: list[Span], learner: list[Span]) -> None:
        self._curves = {
            "generate": _load_curve([s for s in spans if s.kind == "generate"]),
            "env": _load_curve([s for s in spans if s.kind in ENV_KINDS]),
            "learn": _load_curve(learner),
        }
        self._busy = {
            "generate": _load_curve([s for s in spans if s.kind == "generate"], indicator=True),
            "learn": _load_curve(learner, indicator=True),
        }

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


def significant_fit(x: np.ndarray, y: np.ndarray, names: list[str]) -> dict[str, float]:
    """Least squares y ~ 1 + x, keeping only slopes that are positive and at least twice their standard error
    (dropping the weakest and refitting until every kept slope qualifies); returns {"1": intercept, name: slope}."""
    keep = [i for i in range(x.shape[1]) if np.ptp(x[:, i]) > 1e-9] if len(y) else []
    while True:
        design = np.column_stack([np.ones(len(y)), *(x[:, i] for i in keep)]) if len(y) else np.ones((0, 1))
        if len(y) <= design.shape[1] + 1:
            return {"1": float(np.mean(y)) if len(y) else 0.0}
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        resid = y - design @ coef
        sigma2 = float(resid @ resid) / (len(y) - design.shape[1])
        cov = sigma2 * np.linalg.pinv(design.T @ design)
        t = [coef[j + 1] / math.sqrt(max(cov[j + 1, j + 1], 1e-30)) for j in range(len(keep))]
        weakest = min(range(len(keep)), key=lambda j: t[j], default=None)
        if weakest is None or t[weakest] >= 2.0:
            return {"1": float(coef[0])} | {names[i]: float(coef[j + 1]) for j, i in enumerate(keep)}
        keep.pop(weakest)


def fit_engine(
    record: RunRecord, spans: list[Span], learner: list[Span], shared: Shared, notes: list[str]
) -> EngineModel:
    """Seconds per engine step against the batch size and the env calls around each generation."""
    loads = Loads(spans, learner)
    gens = [s for s in spans if s.kind == "generate"]
    if not gens:
        raise ConfigError(f"{record.run_dir} recorded no generation", hint="plan from a run that generated tokens")
    engines = max(len([u for u in str(record.setting("engine", "url", "")).split(",") if u]), 1)
    share = 0.0 if shared == "none" else 1.0
    # each generation's time per engine step, without the learner's share of the device when it overlapped
    y = np.array([g.seconds / (g.tokens + 1) / (1.0 + share * loads.mean("learn", g, busy=True)) for g in gens])
    x = np.array([[loads.mean("generate", g) / engines, loads.mean("env", g)] for g in gens])
    if shared != "all":
        x[:, 1] = 0.0  # envs on other machines cannot slow the engine
    fit = significant_fit(x, y, ["t1", "t2"])
    t0 = fit["1"]
    if t0 <= 0:  # every step's time is in the slopes: keep a floor at the fastest step seen
        t0 = float(np.min(y)) / 2
    if share:
        notes.append("engine and learner share a device: each at half speed while both run (prior, not fitted)")
    max_batch = int(record.setting("engine", "max_batch_size", 16)) if engines == 1 else 256
    fitted = tuple(n for n in ("t1", "t2") if n in fit)
    return EngineModel(t0, max(fit.get("t1", 0.0), 0.0), max(fit.get("t2", 0.0), 0.0), share, max_batch, fitted)


def fit_env(spans: list[Span], learner: list[Span], shared: Shared, notes: list[str]) -> EnvModel:
    """An env call's time (relative to the median of its kind) against the load around it."""
    loads = Loads(spans, learner)
    calls = [s for s in spans if s.kind in ("reset", "step", "final") and s.seconds > 0]
    if len(calls) < 8:
        return EnvModel()
    medians = {k: float(np.median([s.seconds for s in calls if s.kind == k] or [1.0])) for k in ENV_KINDS}
    y = np.array([s.seconds / max(medians[s.kind], 1e-6) for s in calls])
    x = np.array(
        [
            [loads.mean("env", s) - 1.0, loads.mean("generate", s, busy=True), loads.mean("learn", s, busy=True)]
            for s in calls
        ]
    )
    if shared != "all":
        x[:, 1:] = 0.0
    fit = significant_fit(x, y, ["e1", "e2", "e3"])
    base = fit["1"] if fit["1"] > 0 else float(np.min(y))
    terms = {n: max(fit.get(n, 0.0), 0.0) / base for n in ("e1", "e2", "e3")}
    if shared == "all" and "e3" not in fit and terms["e2"] > 0:
        terms["e3"] = terms["e2"]  # the learner loads the machine as generation does
        notes.append("env calls while the learner runs: taken equal to while the engine generates (prior)")
    return EnvModel(terms["e1"], terms["e2"], terms["e3"], tuple(n for n in ("e1", "e2", "e3") if n in fit))


def fit_learner(record: RunRecord, spans: list[Span], shared: Shared) -> LearnerModel:
    """Learner seconds against the step's tokens (without the engine's share of the device when it overlapped)."""
    steps = record.steps
    loads = Loads(spans, [])
    share = 0.0 if shared == "none" else 1.0
    busy = [loads.mean("generate", Span("learn", s.start, s.start + s.learner_s), busy=True) for s in steps]
    y = np.array([s.learner_s / (1.0 + share * b) for s, b in zip(steps, busy)])
    tokens = np.array([float(s.tokens) for s in steps])
    fit = significant_fit(tokens[:, None], y, ["b"])
    if "b" in fit and fit["1"] >= 0:
        return LearnerModel(fit["1"], fit["b"], share, ("a", "b"))
    # the record cannot separate a fixed cost from a per-token one: take the learner's time as proportional to
    # its tokens (compute is), which is what matters when a plan changes the tokens per step or splits them
    per_token = float(np.sum(y) / max(np.sum(tokens), 1.0))
    return LearnerModel(0.0, per_token, share, ())


def trace(episode: Episode, env: EnvModel, loads: Loads, shared: Shared) -> EpisodeTrace:
    """A recorded episode's base costs: each env call's time divided by the slowdown it saw."""
    work = {}
    for s in episode.spans:
        if s.kind in ("reset", "step", "final"):
            engine = loads.mean("generate", s, busy=True) if shared == "all" else 0.0
            learner = loads.mean("learn", s, busy=True) if shared == "all" else 0.0
            work[s.start, s.kind] = s.seconds / env.slowdown(loads.mean("env", s), engine, learner)
    ordered = [w for _, w in sorted(work.items())]
    reset, steps = (ordered[0], ordered[1:]) if ordered else (0.0, [])
    turns = tuple((t.new_tokens + 1, steps[i] if i < len(steps) else t.env_s) for i, t in enumerate(episode.turns))
    return EpisodeTrace(
        build_s=episode.build_s,
        reset_work=reset,
        turns=turns,
        close_s=episode.close_s,
        total_tokens=episode.total_tokens,
        sandboxed=episode.acquire_s > 0 or any(s.kind == "acquire" for s in episode.spans),
    )


def fit_pool(record: RunRecord, env: EnvModel, loads: Loads, shared: Shared) -> PoolModel | None:
    """The sandbox pool: spares from the run's pool metrics, creation times from its cold acquires (or metrics)."""
    acquires = [s for s in (s for e in record.episodes for s in e.spans) if s.kind == "acquire"]
    if not acquires and not record.pool:
        return None
    spares = int(record.pool.get("size", 0)) if record.pool else 0
    cold = [s.seconds / env.slowdown(loads.mean("env", s)) for s in acquires if s.seconds > 0.05]
    if not cold and record.pool.get("start_p50_ms"):
        p50, p99 = record.pool["start_p50_ms"] / 1000, max(record.pool.get("start_p99_ms", 0) / 1000, 1e-6)
        sigma = max(math.log(max(p99, p50) / p50), 0.0) / 2.326 if p50 > 0 else 0.0
        cold = [p50 * math.exp(sigma * z) for z in np.random.default_rng(0).standard_normal(64)]
    # without pool metrics the record cannot say how many spares there were: a pool that never ran dry
    return PoolModel(spares if record.pool else 1 << 30, tuple(cold) or (0.0,))
