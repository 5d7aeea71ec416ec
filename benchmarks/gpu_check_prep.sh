#!/usr/bin/env bash
# Prepare `.gpu/` for benchmarks/gpu_check.py on a GPU machine that can fetch nothing (Python 3.12, torch, transformers,
# numpy, aiohttp, pyyaml and more, but not gymnasium, pettingzoo or docker): run here, from any folder of the checkout,
#   bash benchmarks/gpu_check_prep.sh
# then ship the checkout with `.gpu` carried (it is git-ignored through .git/info/exclude) and run there
#   bash benchmarks/gpu_check_run.sh
# `.gpu/` holds:
#   whl/      wheels of envhub's runtime dependencies that the GPU image lacks (its package list: the device notes'
#             "Python packages already there"), at the versions this checkout's venv runs, for CPython 3.12, and
#             pytest-asyncio for the suite's CUDA-marked tests (`pytest -m gpu` there; the image has pytest)
#   envhub/   envhub's own wheel, built from this checkout now (used there only if building the checkout fails)
#   smollm2/  SmolLM2-135M-Instruct's config and tokenizer, no weights (the check builds random ones there)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
G=.gpu
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
rm -rf "$G"
mkdir -p "$G/whl" "$G/smollm2"

# Missing from the image: gymnasium (and farama-notifications, which it imports), pettingzoo, docker. Everything else
# envhub imports on the check's path is there (torch, transformers, numpy, aiohttp, pyyaml, safetensors, peft,
# accelerate, tensorboard, matplotlib, tqdm, psutil, requests, cloudpickle, typing-extensions).
pins=$("$PYTHON" -c 'from importlib.metadata import version as v
print(" ".join(f"{n}=={v(n)}" for n in ("gymnasium", "farama-notifications", "pettingzoo", "docker", "pytest-asyncio")))')
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$G/whl" $pins

# envhub itself as a wheel, in case the GPU image cannot build the checkout (gpu_check_run.sh tries that first)
mkdir -p "$G/envhub"
"$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$G/envhub" . >"$G/envhub/build.log" 2>&1 ||
  { tail -5 "$G/envhub/build.log"; exit 1; }
rm -rf build

smol=$("$PYTHON" -c 'from envhub.trainer.models import smollm2_dir; print(smollm2_dir())')
for f in config.json generation_config.json tokenizer.json tokenizer_config.json special_tokens_map.json \
  chat_template.jinja; do
  if [ -f "$smol/$f" ]; then cp "$smol/$f" "$G/smollm2/"; fi
done

ls "$G/whl" "$G/envhub"
tracked=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
extra=$(du -sb "$G" | cut -f1)
echo "carried: checkout $((tracked / 1024)) KiB + .gpu $((extra / 1024)) KiB = $(((tracked + extra) / 1048576)) MiB (limit 64)"
