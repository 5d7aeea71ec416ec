"""Adapter families load through the entry point, lazily, from a per-version cache; a missing package registers nothing
and says what to install."""

import json
import subprocess
import sys

import pytest

import envhub
from envhub.envs.adapters import family as family_module
from envhub.envs.adapters.family import STATUS, Family, family_catalogue, family_lines, register_family


def test_import_envhub_does_not_import_the_other_hubs():
    code = (
        "import sys, envhub; print([m for m in ('reasoning_gym', 'textarena', 'gem', 'openenv') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_missing_package_registers_nothing_and_make_names_the_extra():
    ghost = Family(
        name="ghost-hub",
        distribution="envhub-no-such-distribution",
        module="envhub_no_such_module",
        extra="ghost",
        prefix="ghost-",
        licence="MIT",
    )
    built = []
    status = register_family(ghost, lambda: built.append(1) or [], lambda record: "x")
    try:
        assert built == [] and status.ids == 0 and "pip install 'envhub[ghost]'" in status.problem
        assert not [s for s in envhub.list_envs() if s.id.startswith("ghost-")]
        with pytest.raises(envhub.EnvNotFound) as caught:
            envhub.make("ghost-anything-v0")
        assert "ghost-hub is not installed: pip install 'envhub[ghost]'" in str(caught.value)
        assert any("ghost-hub" in line and "0 ids" in line for line in family_lines())
    finally:
        STATUS.pop("ghost-hub", None)


def test_the_id_list_is_cached_per_package_version(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVHUB_CACHE_DIR", str(tmp_path))
    fam = Family(name="t", distribution="t", module="t", extra="t", prefix="t-", licence="MIT")
    calls = []

    def build():
        calls.append(1)
        return [{"task": "a"}]

    assert family_catalogue(fam, "1.0", build) == [{"task": "a"}]
    assert family_catalogue(fam, "1.0", build) == [{"task": "a"}] and len(calls) == 1
    family_catalogue(fam, "2.0", build)  # an upgrade rebuilds
    assert len(calls) == 2
    (cached,) = (tmp_path / "families").glob("t-2.0-f*.json")  # the cache format in the name
    cached.write_text("{broken")
    assert family_catalogue(fam, "2.0", build) == [{"task": "a"}] and len(calls) == 3
    assert json.loads(cached.read_text())["version"] == "2.0"


def test_envhub_list_shows_the_families_with_counts():
    pytest.importorskip("gem", reason="needs the adapters' packages (make install)")
    out = subprocess.run(
        [sys.executable, "-m", "envhub.cli.main", "list"], capture_output=True, text=True, check=True
    ).stdout
    tail = out.split("adapted families")[1]
    for name, prefix in (("reasoning-gym", "rg-*"), ("textarena", "ta-*"), ("gem", "gem-*")):
        line = next(line for line in tail.splitlines() if line.strip().startswith(name))
        assert prefix in line and int(line.split(prefix)[1].split()[0]) > 100


def test_adapted_ids_are_marked_with_their_source_not_envhub():
    pytest.importorskip("gem", reason="needs the adapters' packages (make install)")
    sources = {s.source for s in envhub.list_envs() if s.id.startswith(("rg-", "ta-", "gem-"))}
    assert sources == {"reasoning-gym", "textarena", "gem-llm"}
    assert family_module.installed_version("reasoning-gym") is not None
