"""`make install-gpu` against the pins it installs (requirements/gpu*.txt, written by `make check-install-gpu`):
the Makefile, pyproject.toml and the resolved files must name the same versions, so a bumped pin that was not
resolved again fails here, offline, instead of on a GPU machine."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from envhub.trainer.engines.sglang.launch import INSTALL_HINT

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements"


def makefile_variables() -> dict[str, str]:
    text = (ROOT / "Makefile").read_text()
    return dict(re.findall(r"^([A-Z_]+) [:?]= (\S+)$", text, re.MULTILINE))


def pins(name: str) -> dict[str, str]:
    """A resolved file's `package==version` lines, by normalised package name."""
    lines = (REQUIREMENTS / name).read_text().splitlines()
    found = [line.split("==") for line in lines if line and not line.startswith((" ", "#"))]
    return {canonicalize_name(package): version for package, version in found}


@pytest.fixture(scope="module")
def make() -> dict[str, str]:
    return makefile_variables()


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_install_gpu_installs_envhub_and_the_engine_against_the_resolved_pins(engine, make):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under `make test`
    dry = subprocess.run(
        ["make", "-n", "-B", "install-gpu", f"ENGINE={engine}"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stderr
    assert "--constraint requirements/gpu.txt -e '.[train,ray]'" in dry.stdout
    assert f"--constraint requirements/gpu-{engine}.txt" in dry.stdout
    assert f"{engine}=={make[f'{engine.upper()}_VERSION']}" in dry.stdout
    assert dry.stdout.count("check_gpu_imports.py --cuda-build") == 2  # envhub's venv and the engine's


def test_envhubs_pins_hold_pyprojects_torch_and_every_dependency(make, project):
    resolved = pins("gpu.txt")
    assert f"torch=={make['TORCH_VERSION']}" in project["optional-dependencies"]["train"]
    assert resolved["torch"] == make["TORCH_VERSION"]
    # PyPI's Linux torch is the CUDA build: its CUDA libraries come along (a CPU wheel's resolution has none)
    assert "+" not in resolved["torch"] and any(name.startswith("nvidia-cuda-runtime") for name in resolved)
    wanted = project["dependencies"] + [
        spec for extra in ("train", "ray") for spec in project["optional-dependencies"][extra]
    ]
    for spec in map(Requirement, wanted):
        version = resolved.get(canonicalize_name(spec.name))
        assert version is not None and spec.specifier.contains(version, prereleases=True), (
            f"requirements/gpu.txt has {spec.name}=={version}, pyproject.toml wants {spec}: run make check-install-gpu"
        )


def test_each_engine_is_resolved_at_its_pinned_version_with_the_torch_the_makefile_names(make, project):
    vllm, sglang = pins("gpu-vllm.txt"), pins("gpu-sglang.txt")
    assert (vllm["vllm"], vllm["torch"]) == (make["VLLM_VERSION"], make["VLLM_TORCH"])
    assert (sglang["sglang"], sglang["torch"]) == (make["SGLANG_VERSION"], make["SGLANG_TORCH"])
    assert sglang["sglang-router"] == make["SGLANG_ROUTER_VERSION"]
    extra = f"sglang=={make['SGLANG_VERSION']}", f"sglang-router=={make['SGLANG_ROUTER_VERSION']}"
    assert project["optional-dependencies"]["sglang"] == list(extra)
    assert f"torch {make['SGLANG_TORCH']}" in INSTALL_HINT and extra[0] in INSTALL_HINT


@pytest.mark.parametrize("name", ["gpu.txt", "gpu-vllm.txt", "gpu-sglang.txt"])
def test_the_pins_are_for_the_python_the_gpu_virtualenvs_use(name, make):
    header = (REQUIREMENTS / name).read_text().splitlines()[0]
    assert header.endswith(f"Python {make['GPU_PYTHON_VERSION']}."), header
    assert "Linux x86_64" in header
