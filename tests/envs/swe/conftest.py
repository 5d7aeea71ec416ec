"""One locally built image per published format, laid out as that data set's images are (repo at /testbed)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from envhub.envs.swe.datasets import convert
from envhub.envs.swe.published import published_row
from envhub.envs.swe.tasks import BUNDLED_TASKS, SWEInstance, load_instances

# format -> (bundled instance the row is made from, renames); the SWE-bench row poses as a repo the swebench
# package knows (pytest test command, pytest log parser), so its official harness grades it
SOURCES = {
    "swebench": ("calcworks__exprcalc-1", {"repo": "pylint-dev/astroid", "version": "3.0"}),
    "swegym": ("tidewater__datewise-1", {}),
    "r2egym": ("inkwell__marklet-1", {}),
    "swesmith": ("cfgkit__tomlette-1", {}),
}


@dataclass(frozen=True)
class Published:
    """Rows as published (one file per format), the instances they load as, and the repos their images are built
    from."""

    rows: dict[str, dict]
    files: dict[str, Path]
    instances: dict[str, SWEInstance]
    repos_dir: Path


@pytest.fixture(scope="session")
def published(tmp_path_factory: pytest.TempPathFactory, base_image: str) -> Published:
    from envhub.envs.swe.local_images import build_instance_image
    from envhub.envs.swe.repos import build_bundled_repos

    bundled = {i.instance_id: i for i in load_instances(BUNDLED_TASKS)}
    root = tmp_path_factory.mktemp("published")
    repos_dir = root / "repos"
    repos_dir.mkdir()
    source_repos = build_bundled_repos()
    rows, files, instances = {}, {}, {}
    for fmt, (source_id, renames) in SOURCES.items():
        source = bundled[source_id]
        rows[fmt] = published_row(source, fmt, **renames)
        files[fmt] = root / f"{fmt}.jsonl"  # the SWE-Gym file is named so its format is recognised
        files[fmt].write_text(json.dumps(rows[fmt]) + "\n")
        instances[fmt] = convert(rows[fmt], fmt)
        (repos_dir / instances[fmt].repo_dirname).symlink_to(source_repos / source.repo_dirname)
        build_instance_image(instances[fmt], repos_dir, base=base_image)  # cached by recipe hash after the first run
    return Published(rows, files, instances, repos_dir)
