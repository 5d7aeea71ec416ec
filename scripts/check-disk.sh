#!/usr/bin/env bash
# Fail early, with the numbers, when a step would run out of disk half-way through.
# usage: check-disk.sh STEP GIB DIR... (each DIR's filesystem needs GIB GiB free)
# A full disk mid-suite shows up as dozens of unrelated test failures (a checkpoint that cannot be
# written); this names the cause instead. ENVHUB_MIN_FREE_GIB overrides the need (0 turns the check off).
set -uo pipefail
step=$1 need=${ENVHUB_MIN_FREE_GIB:-$2}
shift 2
status=0
for dir in "$@"; do
  mkdir -p "$dir" 2>/dev/null
  free_kib=$(df -Pk "$dir" | awk 'NR == 2 {print $4}')
  if [ -z "$free_kib" ]; then
    echo "envhub: cannot read the free space of $dir (df failed)" >&2
    status=1
    continue
  fi
  free_gib=$((free_kib / 1048576))
  if [ "$free_gib" -lt "$need" ]; then
    echo "envhub: $step needs about $need GiB free on the disk holding $dir; it has $free_gib GiB." >&2
    echo "        Free some space (old runs, /tmp/pytest-of-$(id -un), unused virtualenvs or docker images)" >&2
    echo "        or set ENVHUB_MIN_FREE_GIB to accept less." >&2
    status=1
  fi
done
exit "$status"
