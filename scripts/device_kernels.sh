#!/usr/bin/env bash
# One device call (the `device` tool's `run`, kind nvidia-h200): install from the working tree and the
# carried wheels (.whl/), then the GPU tests, compute-sanitizer memcheck + racecheck on small shapes, and
# `trtfuse bench kernels` for the given batch sizes. Results and logs land in $OUT.
#   bash scripts/device_kernels.sh "256" [extra bench args]
set -uo pipefail
BATCHES=${1:-"1 8 256"}; shift || true
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
rm -rf build
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site --upgrade .whl/*.whl . >/dev/null 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRTFUSE_CACHE=/tmp/trtfuse-cache PATH=/tmp/site/bin:$PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -m pytest -q -x -m gpu tests/ -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1; rc=$?
tail -3 "$OUT/gpu_tests.txt"
[ $rc -eq 0 ] || { grep -E "Error|assert|FAILED" "$OUT/gpu_tests.txt" | head -20; exit $rc; }
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool python3 -m trtfuse.bench.sanitize > "$OUT/$tool.txt" 2>&1
  echo "$tool: rc=$? $(grep -c MISMATCH "$OUT/$tool.txt") mismatches; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.txt")"
done
python3 -m trtfuse.cli bench kernels --batch $BATCHES --layers resnet50 --autotune -o "$OUT/kernels.json" "$@" > "$OUT/bench.txt" 2>&1
tail -40 "$OUT/bench.txt"
