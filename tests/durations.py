"""The suite's slowest tests, measured, so that parallel workers start them first (longest first).

xdist hands tests out in collection order; a 100 s test collected last leaves one worker busy while the others
idle. `tests/durations.json` holds the seconds (setup + call + teardown) of every test that took 5 s or more in a
`make test` run; `pytest_collection_modifyitems` in conftest.py moves those to the front, longest first, and keeps
the order of the rest. A stale file only costs wall time, never a test. To refresh it from a run's output:

    python -m tests.durations LOG   # LOG: the output of `make test PYTEST_ARGS="--durations=0"`
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

FILE = Path(__file__).with_name("durations.json")
KEEP_S = 5.0  # shorter tests stay where they are collected
_GROUP = re.compile(r"@[\w.-]+$")
_LINE = re.compile(r"^\s*(?:\[\s*[\d.]+\]\s*)?(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S+)\s*$")


def load() -> dict[str, float]:
    """Seconds by node id; empty when the file is missing or unreadable."""
    try:
        return {str(k): float(v) for k, v in json.loads(FILE.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def plain_id(item: pytest.Item) -> str:
    """The node id without the `@group` that xdist's loadgroup appends to the tests of an `xdist_group`."""
    if item.get_closest_marker("xdist_group") is not None:
        return item.nodeid.rsplit("@", 1)[0]
    return item.nodeid


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """`items` with the measured slow ones first, longest first; the others in their collected order."""
    slow = sorted((item for item in items if plain_id(item) in seconds), key=lambda item: -seconds[plain_id(item)])
    return slow + [item for item in items if plain_id(item) not in seconds]


def parse(log: str) -> dict[str, float]:
    """Seconds by node id from pytest's `--durations` lines, phases added up, those of KEEP_S or more."""
    total: dict[str, float] = defaultdict(float)
    for line in log.splitlines():
        match = _LINE.match(line)
        if match:  # xdist's loadgroup appends `@group` to a grouped test's id; the file keys the plain id
            total[_GROUP.sub("", match.group(2))] += float(match.group(1))
    return {node: round(s, 1) for node, s in sorted(total.items(), key=lambda kv: -kv[1]) if s >= KEEP_S}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.durations LOG  (the output of a run with --durations=0)")
    measured = parse(Path(sys.argv[1]).read_text())
    FILE.write_text(json.dumps(measured, indent=1) + "\n")
    print(f"wrote {len(measured)} tests of {KEEP_S:g} s or more to {FILE}")
