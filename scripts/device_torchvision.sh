#!/usr/bin/env bash
# One device call for real exporters' ResNets on trtfuse's kernels (kind nvidia-h200 or nvidia-h100-x1; needs
# torch + torchvision on the machine): the GPU tests of the runner (every classifier form, the torchvision
# fixtures), then torchvision ResNet-50 exported here (TorchScript-based exporter opset 17, dynamo exporter,
# QAT-style fake quant) and ONNX Runtime's quantize_static Q/DQ ResNet-50: `rewrite --fuse all`, `run --backend
# cuda`, compared with the CPU golden (top-1 identical, logits within 1e-5 relative) and with ONNX Runtime
# running the original model. SPLITK=1 also runs a fresh `bench splitk` (repeat timings: measure mode judged).
# Results in $OUT.
#   bash scripts/device_torchvision.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
T="python3 -m trtfuse.cli"
W=/tmp/tv; mkdir -p $W
nvidia-smi --query-gpu=index,name --format=csv,noheader
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)" || { echo "no torch here"; exit 1; }
python3 -m pytest -q tests/test_gpu_runner.py tests/test_classifier_plan.py tests/test_exporters.py -p no:cacheprovider \
  > "$OUT/gpu_tests.txt" 2>&1; tail -3 "$OUT/gpu_tests.txt"
: > "$OUT/torchvision.jsonl"
for variant in torchscript dynamo qat; do
  if ! python3 scripts/export_torchvision.py resnet50 $variant $W/r50_$variant.onnx > $W/export_$variant.log 2>&1; then
    echo "$variant export failed: $(tail -1 $W/export_$variant.log)"; continue
  fi
  $T rewrite $W/r50_$variant.onnx -o $W/r50_$variant.all.onnx --fuse all --json > "$OUT/rewrite_$variant.json" || continue
  python3 -c "import json,sys; s=json.load(open('$OUT/rewrite_$variant.json'))['summary']; print('$variant', {k: s.get(k) for k in ('fused_residual_blocks','plugin_nodes','rejected','scales','why_none_fused')})"
  python3 scripts/device_torchvision.py $W/r50_$variant.onnx $W/r50_$variant.all.onnx "torchvision r50 $variant" --count 16 \
    >> "$OUT/torchvision.jsonl" 2> "$OUT/compare_$variant.err" || tail -3 "$OUT/compare_$variant.err"
done
# ONNX Runtime quantize_static (QDQ, per-channel int8 weights, symmetric int8 activations) of trtfuse's ResNet-50
$T models resnet50 -o $W/r50f.onnx --opset 17 --fold-bn > /dev/null
python3 scripts/quantize_ort.py $W/r50f.onnx $W/r50_ortqdq.onnx
$T rewrite $W/r50_ortqdq.onnx -o $W/r50_ortqdq.all.onnx --fuse all --json > "$OUT/rewrite_ortqdq.json" \
  && python3 scripts/device_torchvision.py $W/r50_ortqdq.onnx $W/r50_ortqdq.all.onnx "ORT quantize_static r50" --count 16 \
  >> "$OUT/torchvision.jsonl" 2> "$OUT/compare_ortqdq.err"
python3 - "$OUT/torchvision.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = ["model", "plugin_nodes", "cuda_vs_cpu_top1_identical", "cuda_vs_cpu_max_rel_logit_diff", "cuda_vs_cpu_ok",
        "cuda_vs_ort_cosine_mean", "cuda_vs_ort_cosine_min", "cuda_vs_ort_top1_agreement"]
print(" | ".join(keys))
for r in rows:
    print(" | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in keys))
PY
if [ "${SPLITK:-0}" = 1 ]; then
  $T bench splitk -o "$OUT/splitk.json" 2>&1 | grep -E "right on|held out|measured"
fi
