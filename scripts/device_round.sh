#!/usr/bin/env bash
# One device call (kind nvidia-h200): every GPU test (the carried .whl/ may hold the TensorRT lean runtime
# for the plugin-enqueue test), compute-sanitizer memcheck + racecheck, then `trtfuse bench kernels` with
# the wgmma tactics competing in autotune. Results and logs in $OUT.
#   bash scripts/device_round.sh "1 8 256" all
set -uo pipefail
BATCHES=${1:-"256"}; LAYERS=${2:-resnet50}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
timeout 200 python3 -m pytest -q -rs --maxfail=5 -m gpu tests/ -p no:cacheprovider > $OUT/gpu_tests.txt 2>&1; echo "tests rc=$?"
tail -4 $OUT/gpu_tests.txt; grep -E "^FAILED|^SKIPPED|Error" $OUT/gpu_tests.txt | head
for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool $tool python3 -m trtfuse.bench.sanitize > $OUT/$tool.txt 2>&1
  echo "$tool rc=$? $(grep -c MISMATCH $OUT/$tool.txt) mismatches $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.txt)"
done
TRTFUSE_BENCH_TRACE=1 timeout 480 python3 -m trtfuse.cli bench kernels --batch $BATCHES --layers $LAYERS --autotune \
  -o $OUT/kernels.json --roofline $OUT/roofline.png > $OUT/bench.txt 2>&1; grep -v "^trace:" $OUT/bench.txt | tail -30; grep -B1 -i "launch failure" $OUT/bench.txt | grep trace: | tail -1
