#!/usr/bin/env bash
# One device call for the end-to-end figures (kind nvidia-h200, or nvidia-h200-x2 for GPU scaling):
# GPU tests of the runner/offline/TensorRT-plugin paths, INT8 ResNet-50 built and rewritten here
# (--fuse all), the graph-loop throughput with the per-step breakdown (bench/e2e.py, PyTorch fp16 in the
# same run), then LoadGen Offline on 1..N GPUs. Results in $OUT.
#   bash scripts/device_e2e.sh "1 2"      (MIN_DURATION=300: LoadGen's minimum duration; SKIP_E2E=1: no graph loop;
#                                          BATCH=512 STREAMS=3: batch size and graphs in flight per GPU; QPS: per GPU;
#                                          COUNT=8192: samples in the sample library (default 4096);
#                                          PLANS=bench/results/e2e-NVIDIA_H200.json: its tuned plans for both steps, no autotune;
#                                          ENERGY=1: the graph loop also reads the board's energy counter, bench e2e --energy;
#                                          MODEL=.devcarry/r50_all.onnx: a rewritten ResNet-50 carried along, no build here
#                                          (made on any machine: trtfuse models resnet50 -o r50.onnx && trtfuse rewrite
#                                          r50.onnx -o .devcarry/r50_all.onnx --fuse all; carry [".whl", ".devcarry"]);
#                                          GATE=100400: first time the Offline pipeline without LoadGen for 4 s (bench e2e
#                                          --pipeline-only on PLANS) and stop, exit 3, where this card runs it below GATE samples/s: cards of this
#                                          kind settle at 1800-1905 MHz under the power cap, and samples/s follows (docs/PERF.md,
#                                          the card row); each offline record names its card's clock in `cards`)
set -uo pipefail
GPUS=${1:-1}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
T="python3 -m trtfuse.cli"
# sm_90: the wgmma tactics compete in --autotune by default (plugins/tactics.py: wgmma_enabled)
nvidia-smi --query-gpu=index,name,clocks.max.sm,uuid --format=csv,noheader
# clocks, power and throttle reasons every 250 ms for the whole call: tells a slower long run from a hot GPU
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 & SMI=$!
[ "${SKIP_TESTS:-0}" = 1 ] || python3 -m pytest -q -m gpu tests/test_gpu_runner.py tests/test_trt_v3.py tests/test_offline.py tests/test_network_ops.py \
  -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1; tail -2 "$OUT/gpu_tests.txt"
tune="--autotune"; [ -n "${PLANS:-}" ] && tune="--plans $PLANS"  # a results file's plans, tuned at BATCH or a divisor of it: minutes saved
# MODEL: a `trtfuse rewrite --fuse all` ResNet-50 brought along (carry it: a card turned away then costs no build);
# otherwise one is built here, once, for the gate and the offline runs (bench e2e builds its own, for PyTorch's baseline)
model=${MODEL:-/tmp/r50_all.onnx}
if [ -z "${MODEL:-}" ]; then
  $T models resnet50 -o /tmp/r50.onnx > /dev/null && $T rewrite /tmp/r50.onnx -o "$model" --fuse all > /dev/null \
    || { kill $SMI 2>/dev/null; exit 1; }
fi
if [ -n "${GATE:-}" ]; then
  [ -n "${PLANS:-}" ] || { echo "GATE needs PLANS (the gate times the run's own plans)" >&2; kill $SMI 2>/dev/null; exit 1; }
  $T bench e2e --model "$model" --pipeline-only --batch "${BATCH:-256}" --streams "${STREAMS:-6}" $tune --seconds 4 \
    -o /tmp/gate.json > /tmp/gate.txt 2>&1 || { tail -3 /tmp/gate.txt; kill $SMI 2>/dev/null; exit 1; }
  rate=$(python3 -c "import json; print(int(json.load(open('/tmp/gate.json'))['offline_pipeline_samples_per_s']))")
  cp /tmp/gate.json "$OUT/gate.json"
  echo "gate: the Offline pipeline without LoadGen ran $rate samples/s on this card (GATE $GATE)"
  [ "$rate" -ge "$GATE" ] || { kill $SMI 2>/dev/null; exit 3; }
fi
energy=""; [ "${ENERGY:-0}" = 1 ] && energy="--energy"
[ "${SKIP_E2E:-0}" = 1 ] || $T bench e2e --batch "${BATCH:-256}" --streams "${STREAMS:-6}" $tune $energy -o "$OUT/e2e.json" 2>&1 | tail -50
for g in $GPUS; do
  extra=""; [ "$g" = "1" ] && extra="--compare-torch"
  [ "$g" != "1" ] && extra="--scaling"  # the 1-GPU run of the same call first: scaling_vs_1gpu in the record
  $T offline --model "$model" --backend cuda --count "${COUNT:-4096}" --batch "${BATCH:-256}" --streams "${STREAMS:-6}" \
    --gpus "$g" --min-duration "${MIN_DURATION:-10}" --expected-qps $((${QPS:-75000} * g)) $tune --log-dir "/tmp/logs-g$g" -o "$OUT/offline-g$g.json" $extra 2>&1 | tail -14
  mkdir -p "$OUT/logs-g$g"; cp /tmp/logs-g$g/mlperf_log_summary.txt /tmp/logs-g$g/mlperf_log_detail.txt "$OUT/logs-g$g/" 2>/dev/null
done
kill $SMI 2>/dev/null
