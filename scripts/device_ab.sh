#!/usr/bin/env bash
# One device call comparing kernel variants in the same run: each directory ab/<variant>/ holds kernel files
# (plugins/kernels/*.cu*, or the profiling hooks of bench/probe_kernels/) that overlay the working tree's install in
# /tmp/site_<variant>, each file over its namesake in either folder; the profiling
# harness then times every variant, two rounds alternating, so drift between runs hits them all alike.
#   run (carry [".whl", "ab"]): bash scripts/device_ab.sh <tag> <python3 -m trtfuse.bench.wgmma_diag args...>
# JSON per variant and round in $OUT/<tag>-<variant>-<round>.json. ab/ is git-ignored (carried explicitly).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
tag=$1; shift
variants=$(ls ab)
for v in $variants; do
  rm -rf /tmp/site_$v && cp -r /tmp/site /tmp/site_$v
  for f in ab/$v/*.cu*; do
    probe=/tmp/site_$v/trtfuse/bench/probe_kernels
    if [ -f "$probe/$(basename "$f")" ]; then cp "$f" "$probe/"; else cp "$f" /tmp/site_$v/trtfuse/plugins/kernels/; fi
  done
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for round in 1 2; do
  for v in $variants; do
    echo "== $tag $v round $round"
    PYTHONPATH=/tmp/site_$v timeout -k 5 ${T_VARIANT:-150} python3 -m trtfuse.bench.wgmma_diag "$@" \
      --out "$OUT/$tag-$v-$round.json" 2>&1 | grep -v "^$\|mma_sync"
  done
done
