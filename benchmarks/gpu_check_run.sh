#!/usr/bin/env bash
# Run benchmarks/gpu_check.py on a GPU machine, from a checkout that carries `.gpu/` (benchmarks/gpu_check_prep.sh):
#   bash benchmarks/gpu_check_run.sh [gpu_check.py options]
# installs the carried wheels and envhub itself into $SITE with no index (nothing is fetched), then writes the
# figures to $OUT/gpu_check.json (beside it each stage's log and nvidia-smi's view). About five minutes on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
OUT=${OUT:-gpu-check-out}
SITE=${SITE:-/tmp/envhub-site}
mkdir -p "$OUT"
pip_install() { "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$@"; }
pip_install .gpu/whl/*.whl || { echo "installing .gpu/whl failed: run benchmarks/gpu_check_prep.sh first"; exit 3; }
# envhub itself, built from this checkout with the image's setuptools and wheel; else the wheel made at prep time
if ! pip_install --no-build-isolation . >"$OUT/pip-envhub.log" 2>&1; then
  tail -3 "$OUT/pip-envhub.log"
  echo "building envhub from the checkout failed: installing .gpu/envhub (built by gpu_check_prep.sh)"
  pip_install .gpu/envhub/*.whl || exit 4
fi
rm -rf build
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >"$OUT/nvidia-smi.txt" 2>&1
fi
exec "$PYTHON" benchmarks/gpu_check.py --out "$OUT/gpu_check.json" "$@"
