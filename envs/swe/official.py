"""The official SWE-bench harness (the `swebench` package, extra `swe`): its eval scripts, log parsers and report.

`swebench.harness/__init__` imports every harness module, Modal's client among them, so it would need the
whole dependency tree of the cloud runner. The parts used here (test specs, log parsers, grading) only need
`datasets`, `unidiff`, `python-dotenv` and `requests`; they are imported under bare parent packages, which
skips those `__init__` files and runs exactly swebench's own code for everything else.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import tempfile
import types
from typing import Any

from envhub.envs.swe.tasks import SWEInstance
from envhub.errors import ConfigError


@functools.lru_cache(maxsize=1)
def harness() -> types.SimpleNamespace | None:
    """swebench's constants, log parsers, test specs and grading; None when the package is not installed."""
    spec = importlib.util.find_spec("swebench")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    for name, path in (("swebench", root), ("swebench.harness", f"{root}/harness")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package
    try:
        constants = importlib.import_module("swebench.harness.constants")
        parsers = importlib.import_module("swebench.harness.log_parsers")
        test_spec = importlib.import_module("swebench.harness.test_spec.test_spec")
        grading = importlib.import_module("swebench.harness.grading")
    except ImportError as exc:
        raise ConfigError(
            f"the swebench package is installed but cannot be imported ({exc})",
            hint="pip install 'envhub[swe]' (swebench 4.x with datasets, unidiff, python-dotenv)",
        ) from None
    return types.SimpleNamespace(constants=constants, parsers=parsers, test_spec=test_spec, grading=grading)


def knows(instance: SWEInstance) -> bool:
    """True when swebench has a test command and a log parser for the instance's repo and version."""
    h = harness()
    if h is None or not instance.version:
        return False
    specs = h.constants.MAP_REPO_VERSION_TO_SPECS.get(instance.repo, {})
    return instance.version in specs and instance.repo in h.parsers.MAP_REPO_TO_PARSER


def _row(instance: SWEInstance) -> dict[str, Any]:
    return {
        **instance.to_json(),
        "FAIL_TO_PASS": list(instance.FAIL_TO_PASS),
        "PASS_TO_PASS": list(instance.PASS_TO_PASS),
    }


def test_spec(instance: SWEInstance) -> Any:
    """swebench's `TestSpec` for the instance (eval script, image keys, test lists)."""
    h = harness()
    assert h is not None
    return h.test_spec.make_test_spec(_row(instance), namespace="swebench")


def eval_script(instance: SWEInstance) -> str:
    """The bash script the official harness runs in the instance's container after applying the model patch."""
    return test_spec(instance).eval_script


def apply_commands() -> tuple[str, ...]:
    """The official harness's patch commands, tried in order on `/tmp/patch.diff`."""
    return ("git apply --verbose", "git apply --verbose --reject", "patch --batch --fuzz=5 -p1 -i")


def test_output(log: str) -> str:
    """The part of an eval script's log between swebench's start and end markers (the whole log without them)."""
    h = harness()
    assert h is not None
    start, end = h.constants.START_TEST_OUTPUT, h.constants.END_TEST_OUTPUT
    return log.split(start, 1)[1].split(end, 1)[0] if start in log else log


def report(
    instance: SWEInstance, model_patch: str | None, log: str, *, applied: bool, timed_out: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """swebench's per-instance report ({patch_exists, patch_successfully_applied, resolved, tests_status}) from the
    log, and the per-test statuses its log parser found there (none: the tests never ran)."""
    h = harness()
    assert h is not None
    c = h.constants
    text = log if applied else f"{c.APPLY_PATCH_FAIL}\n{log}"
    if timed_out:
        text += f"\n\n{c.TESTS_TIMEOUT}"
    prediction = {c.KEY_INSTANCE_ID: instance.instance_id, c.KEY_PREDICTION: model_patch, c.KEY_MODEL: "envhub"}
    spec = test_spec(instance)
    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        result = h.grading.get_eval_report(spec, prediction, file.name, include_tests_status=True)
        parsed, _ = h.grading.get_logs_eval(spec, file.name)
    return result[instance.instance_id], parsed
