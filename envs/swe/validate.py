"""Check task instances and grade prediction files, in parallel through one sandbox pool."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envhub.envs.swe.grading import PASSING, GradeResult, RepoError, repo_archive
from envhub.envs.swe.harness import grade
from envhub.envs.swe.tasks import SWEInstance


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one instance, as a single readable line."""

    instance_id: str
    message: str

    def __str__(self) -> str:
        return f"{self.instance_id}: {self.message}"


async def validate_instance(
    instance: SWEInstance, pool: Any, repos_dir: str | Path, *, test_timeout: float = 300
) -> list[Problem]:
    """Everything wrong with one instance: repo, base_commit, patches, and FAIL_TO_PASS behaviour."""

    def problem(message: str) -> Problem:
        return Problem(instance.instance_id, message)

    try:
        if not instance.image:
            await repo_archive(instance, repos_dir)
    except RepoError as exc:
        return [problem(str(exc))]
    before, after = await asyncio.gather(
        grade(instance, "", pool, repos_dir, test_timeout=test_timeout),
        grade(instance, instance.patch, pool, repos_dir, test_timeout=test_timeout),
    )
    problems = []
    test_patch_broken = "test patch" in (before.error or "")
    if test_patch_broken:
        problems.append(problem(str(before.error)))
    elif before.is_error:
        problems.append(problem(f"before the gold patch: {before.error}"))
    else:
        problems += [
            problem(f"FAIL_TO_PASS test {t} passes before the gold patch")
            for t in instance.FAIL_TO_PASS
            if before.tests.get(t) in PASSING
        ]
    if after.error and "model patch" in after.error:
        problems.append(problem(after.error.replace("model patch", "gold patch", 1)))
    elif test_patch_broken:
        pass
    elif after.is_error:
        problems.append(problem(f"after the gold patch: {after.error}"))
    else:
        for kind, tests in (("FAIL_TO_PASS", instance.FAIL_TO_PASS), ("PASS_TO_PASS", instance.PASS_TO_PASS)):
            problems += [
                problem(f"{kind} test {t} does not pass after the gold patch ({after.tests.get(t, 'MISSING')})")
                for t in tests
                if after.tests.get(t) not in PASSING
            ]
    return problems


async def validate_all(
    instances: list[SWEInstance], pool: Any, repos_dir: str | Path, *, concurrency: int = 4, test_timeout: float = 300
) -> list[Problem]:
    """Validate every instance, `concurrency` at a time; returns all problems in instance order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(instance: SWEInstance) -> list[Problem]:
        async with gate:
            return await validate_instance(instance, pool, repos_dir, test_timeout=test_timeout)

    results = await asyncio.gather(*(one(i) for i in instances))
    return [p for problems in results for p in problems]


@dataclass(frozen=True)
class Prediction:
    """A SWE-bench prediction: the model's patch for one instance."""

    instance_id: str
    model_patch: str
    model_name_or_path: str = ""


async def grade_predictions(
    instances: list[SWEInstance],
    predictions: list[Prediction],
    pool: Any,
    repos_dir: str | Path,
    *,
    concurrency: int = 4,
    test_timeout: float = 300,
) -> dict[str, Any]:
    """Grade predictions in parallel; a SWE-bench-like report with resolved / unresolved / error ids."""
    by_id = {i.instance_id: i for i in instances}
    gate = asyncio.Semaphore(concurrency)

    async def one(pred: Prediction) -> GradeResult:
        if pred.instance_id not in by_id:
            return GradeResult(pred.instance_id, resolved=False, error="unknown instance_id (not in the task file)")
        async with gate:
            return await grade(by_id[pred.instance_id], pred.model_patch, pool, repos_dir, test_timeout=test_timeout)

    results = await asyncio.gather(*(one(p) for p in predictions))

    # An error means the patch could not be evaluated (it did not apply, the tests never ran or were killed);
    # failing tests are merely unresolved.
    resolved = [r.instance_id for r in results if r.resolved]
    errors = [r.instance_id for r in results if not r.resolved and r.is_error]
    unresolved = [r.instance_id for r in results if not r.resolved and not r.is_error]
    submitted = {p.instance_id for p in predictions}
    patches = {p.instance_id: p.model_patch for p in predictions}
    return {
        "total_instances": len(instances),
        "submitted_instances": len(predictions),
        "completed_instances": len(resolved) + len(unresolved),
        "resolved_instances": len(resolved),
        "unresolved_instances": len(unresolved),
        "error_instances": len(errors),
        "resolved_ids": sorted(resolved),
        "unresolved_ids": sorted(unresolved),
        "error_ids": sorted(errors),
        "empty_patch_ids": sorted(p.instance_id for p in predictions if not p.model_patch.strip()),
        "incomplete_ids": sorted(set(by_id) - submitted),
        "model_name_or_path": sorted({p.model_name_or_path for p in predictions if p.model_name_or_path}),
        "details": {r.instance_id: r.to_json() for r in results},
        # the official harness's per-instance report.json content, one entry per prediction
        "reports": {r.instance_id: r.swebench_report(patches.get(r.instance_id)) for r in results},
    }
