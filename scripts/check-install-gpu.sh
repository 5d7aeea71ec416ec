#!/usr/bin/env bash
# `make check-install-gpu`: what this CPU machine can check of `make install-gpu` (docs/gpu.md), without a GPU and
# without installing CUDA wheels (they are GBs).
#   1. Resolve its three requirement sets from PyPI for Linux x86_64 and the GPU virtualenvs' Python into
#      requirements/gpu.txt (envhub[train,ray]), gpu-vllm.txt and gpu-sglang.txt: `make install-gpu` installs with
#      them as constraints, so two GPU machines get the same versions. Commit them when they change.
#   2. Import envhub's trainer in the CPU virtualenv with CUDA hidden (scripts/check_gpu_imports.py), and ask
#      `envhub train --dry-run` to place both GPU recipes on a machine without GPUs: each must be refused by name
#      (exit 1, REFUSED lines), not crash.
# It needs the network (PyPI) and `make install`'s .venv; the test suite never runs it (CI is offline) and reads the
# committed files instead (tests/test_install_gpu.py).
# usage: `make check-install-gpu` (it passes the versions: TORCH_VERSION, VLLM_VERSION, VLLM_TORCH, SGLANG_VERSION,
#        SGLANG_ROUTER_VERSION, SGLANG_TORCH, PYTHON_VERSION; UV and PYTHON default to .venv's)
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-.venv/bin/uv}
python=${PYTHON:-.venv/bin/python}
for tool in "$uv" "$python"; do
  [ -x "$tool" ] || { echo "check-install-gpu: $tool is missing: run \`make install\` first" >&2; exit 1; }
done
: "${TORCH_VERSION:?} ${VLLM_VERSION:?} ${VLLM_TORCH:?} ${SGLANG_VERSION:?} ${SGLANG_ROUTER_VERSION:?} ${SGLANG_TORCH:?}"
: "${PYTHON_VERSION:?}"

# resolve FILE WHAT GLIBC INPUT...: pins for Linux x86_64 with glibc GLIBC or newer (2_28: manylinux_2_28) and Python
# $PYTHON_VERSION, from PyPI alone (uv reads no pip.conf; its own settings and this machine's local mirrors are left
# out), written under requirements/ with a header. SGLang 0.5.23's wheels are manylinux_2_34: glibc 2.34 or newer.
resolve() {
  local file=requirements/$1 what=$2 platform=x86_64-manylinux_$3 pins
  shift 3
  pins=$(env -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_CONSTRAINT -u UV_INDEX_STRATEGY \
    "$uv" pip compile --no-config --quiet --no-header --index-url https://pypi.org/simple \
    --python-platform "$platform" --python-version "$PYTHON_VERSION" "$@")
  {
    echo "# \`make install-gpu\`'s pins for $what: Linux x86_64 ($platform), Python $PYTHON_VERSION."
    echo "# Resolved from PyPI by \`make check-install-gpu\` on $(date -u +%Y-%m-%d); change the Makefile's versions, not this file."
    echo "$pins"
  } > "$file"
  echo "$file: $(grep -c '^[A-Za-z0-9]' "$file") packages, $(grep -E '^(torch|vllm|sglang|transformers)==' "$file" | tr '\n' ' ')"
}

# expect_torch FILE VERSION: the torch a set resolved to is the one the Makefile says its engine pins
expect_torch() {
  grep -qx "torch==$2" "requirements/$1" && return
  echo "check-install-gpu: requirements/$1 resolved $(grep '^torch==' "requirements/$1"), the Makefile expects torch==$2:" \
    "update the Makefile's torch version for it (and docs/gpu.md)" >&2
  exit 1
}

mkdir -p requirements
resolve gpu.txt "envhub[train,ray]" 2_28 pyproject.toml --extra train --extra ray
resolve gpu-vllm.txt "vllm==$VLLM_VERSION" 2_28 - <<< "vllm==$VLLM_VERSION"
resolve gpu-sglang.txt "sglang==$SGLANG_VERSION" 2_34 - <<< "sglang==$SGLANG_VERSION
sglang-router==$SGLANG_ROUTER_VERSION"
expect_torch gpu.txt "$TORCH_VERSION"
expect_torch gpu-vllm.txt "$VLLM_TORCH"
expect_torch gpu-sglang.txt "$SGLANG_TORCH"

echo "imports with CUDA hidden ($python):"
CUDA_VISIBLE_DEVICES="" "$python" scripts/check_gpu_imports.py
for config in configs/qwen2.5-1.5b-1gpu.yaml configs/qwen2.5-7b-8gpu.yaml; do
  status=0
  out=$(CUDA_VISIBLE_DEVICES="" "$(dirname "$python")/envhub" train --dry-run "$config" --gpus 0 2>&1) || status=$?
  if [ "$status" -ne 1 ] || ! grep -q '^REFUSED: ' <<< "$out" || grep -q Traceback <<< "$out"; then
    echo "$out" >&2
    echo "check-install-gpu: the dry-run of $config on a machine without GPUs exited $status: expected 1, refused by name" >&2
    exit 1
  fi
  echo "$config without GPUs: refused ($(grep -c '^REFUSED: ' <<< "$out") REFUSED lines), e.g. $(grep -m1 '^REFUSED: ' <<< "$out")"
done
echo "check-install-gpu: ok"
