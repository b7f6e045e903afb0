#!/usr/bin/env bash
# One device call for serving on Triton Inference Server (kind nvidia-h200; nvidia-h200-x2 with GPUS=2):
# the Triton tests (the cuda executor behind the bundled server on the GPU included), INT8 ResNet-50 built and
# rewritten here (--fuse all), LoadGen Offline in process (the reference), then `trtfuse serve --backend cuda`
# and, through Triton over loopback gRPC, LoadGen Offline and the Server scenario's highest VALID QPS at
# p99 <= 15 ms, the images in CUDA shared memory (SHM=none: in the requests), client and server under the MPS
# control daemon (MPS=0: without). Results in $OUT.
# Carried besides the tree: .whl/ as for the other device scripts plus the client's wheels (tritonclient,
# grpcio, protobuf, python-rapidjson, urllib3), and .whl-triton/ with either tritonserver-tree.tar.gz
# (scripts/pack_triton_tree.sh PYTHON_MINOR: the device Python's stub only, smaller) or nvidia_pytriton-0.7.0-*.whl
# (the server binary, unpacked into the cache by trtfuse.runtime.triton_server, never installed):
#   bash scripts/device_triton.sh
set -uo pipefail
GPUS=${GPUS:-1}
SHM=${SHM:-cuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
TREE=$(ls .whl-triton/tritonserver-tree.tar.* 2>/dev/null | head -1)
if [ -n "$TREE" ]; then  # scripts/pack_triton_tree.sh: the tree for one Python, smaller (.gz, or recompressed .xz)
  mkdir -p /tmp/triton-tree && tar -xf "$TREE" -C /tmp/triton-tree || exit 1
  export TRTFUSE_TRITON_HOME=/tmp/triton-tree/pytriton/tritonserver
else
  TRTFUSE_PYTRITON_WHEEL=$(ls .whl-triton/nvidia_pytriton-*.whl 2>/dev/null | head -1)
  [ -n "$TRTFUSE_PYTRITON_WHEEL" ] || { echo "carry .whl-triton/ (tritonserver-tree.tar.gz or the nvidia-pytriton wheel)" >&2; exit 1; }
  export TRTFUSE_PYTRITON_WHEEL
fi
T="python3 -m trtfuse.cli"
nvidia-smi --query-gpu=index,name --format=csv,noheader
[ "${SKIP_TESTS:-0}" = 1 ] || CI=1 python3 -m pytest -q tests/test_triton.py -p no:cacheprovider > "$OUT/triton_tests.txt" 2>&1
tail -3 "$OUT/triton_tests.txt"
$T models resnet50 -o /tmp/r50.onnx > /dev/null && $T rewrite /tmp/r50.onnx -o /tmp/r50_all.onnx --fuse all > /dev/null || exit 1
if [ "${MPS:-1}" = 1 ]; then
  # The client's gather into CUDA shared memory and the server's kernels are two processes on one GPU: without
  # MPS they take turns (time slices), with it they run side by side. Everything below, the in-process reference
  # included, runs under it.
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" && nvidia-cuda-mps-control -d && echo "MPS control daemon started"
fi
$T offline --model /tmp/r50_all.onnx --backend cuda --gpus "$GPUS" --count 4096 --batch 256 --min-duration 10 \
  --expected-qps $((75000 * GPUS)) --log-dir /tmp/logs-inproc -o "$OUT/offline-inprocess.json" 2>&1 | tail -12
wait_ready() { for _ in $(seq 600); do grep -q '"ready"' "$1" 2>/dev/null && break; kill -0 $2 2>/dev/null || break; sleep 0.5; done; cat "$1"; }
# Offline: large executes (12 runners of 256 per instance), requests of 256 images, 48 in flight
$T serve /tmp/r50_all.onnx --backend cuda --gpus "$GPUS" --streams 12 --max-batch 3072 --preferred-batch 3072 \
  --max-queue-delay-us 6000 --port 18000 --log "$OUT/tritonserver-offline.log" --duration 1500 --json > "$OUT/serve-offline.jsonl" 2> "$OUT/serve-offline.err" & S=$!
wait_ready "$OUT/serve-offline.jsonl" $S; tail -3 "$OUT/serve-offline.err"
$T offline --endpoint 127.0.0.1:18001 --batch 256 --count 4096 --min-duration 10 --expected-qps $((65000 * GPUS)) \
  --max-in-flight 48 --shared-memory "$SHM" --log-dir /tmp/logs-triton-offline -o "$OUT/offline-triton.json" 2>&1 | tail -20
kill -TERM $S; wait $S; tail -1 "$OUT/serve-offline.jsonl"
# Server: one image per request, the dynamic batcher forming batches of up to 256
$T serve /tmp/r50_all.onnx --backend cuda --gpus "$GPUS" --streams 4 --max-batch 256 --preferred-batch 64,128,256 \
  --max-queue-delay-us 2000 --port 18010 --log "$OUT/tritonserver-server.log" --duration 1500 --json > "$OUT/serve-server.jsonl" 2> "$OUT/serve-server.err" & S=$!
wait_ready "$OUT/serve-server.jsonl" $S; tail -3 "$OUT/serve-server.err"
$T server --endpoint 127.0.0.1:18011 --target-qps 4000 --find-peak --max-runs 8 --min-duration 10 --count 4096 \
  --max-in-flight 512 --shared-memory "$SHM" --log-dir /tmp/logs-triton-server -o "$OUT/server-triton.json" 2>&1 | tail -30
kill -TERM $S; wait $S; tail -1 "$OUT/serve-server.jsonl"
[ "${MPS:-1}" = 1 ] && echo quit | nvidia-cuda-mps-control
