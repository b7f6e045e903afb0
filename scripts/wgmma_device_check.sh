#!/usr/bin/env bash
# One device call for the Hopper wgmma tactic: build + SASS census, correctness vs the golden on edge
# shapes, compute-sanitizer memcheck/racecheck on tiny shapes, b256 timings vs mma.sync and torch._int_mm.
# Logs under $OUT (the device tool's output folder) or ./out.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
git log -1 --oneline; ls plugins/kernels
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout -k 5 60 python3 -m trtfuse.bench.wgmma_check build 2>&1 | tee "$OUT/build.log"
timeout -k 5 ${T_CORRECT:-80} python3 -m trtfuse.bench.wgmma_check correctness > "$OUT/correctness.log" 2>&1; echo "correctness rc=$?"
grep -v "^ok \|skip" "$OUT/correctness.log" | head -30
for tool in memcheck racecheck; do
  timeout -k 5 ${T_SAN:-45} compute-sanitizer --tool $tool --print-limit 3 python3 -m trtfuse.bench.wgmma_check tiny > "$OUT/$tool.log" 2>&1
  echo "$tool rc=$?"; tail -3 "$OUT/$tool.log"
done
timeout -k 5 ${T_TIME:-110} python3 -m trtfuse.bench.wgmma_check timing --out "$OUT/timing.json" 2>&1 | tee "$OUT/timing.log" | tail -16
# Optional (RUN_BENCH=1): the standard kernel benchmark with the wgmma tactics in the heuristic and
# autotune; writes bench/results/kernels-<device>-<date>.json (records carry "tactic" and "family").
if [ "${RUN_BENCH:-0}" = 1 ]; then
  timeout -k 5 ${T_BENCH:-240} python3 -m trtfuse.cli bench kernels --batch 256 --layers resnet50 \
    --filter conv2 --autotune --no-baselines 2>&1 | tail -12
  cp bench/results/kernels-*.json "$OUT/" 2>/dev/null
fi
