#!/usr/bin/env bash
# The main job on a fresh machine, on the embedded default model and data (no downloads):
#   ResNet-50 built here -> INT8 calibration (entropy) -> residual-block fusion rewrite -> CPU golden
#   execution and accuracy report against fp32. Outputs land in ./out/.
# GPU steps (bench kernels, run --backend cuda, offline) are separate: see README.md.
set -euo pipefail
# setuptools prints an "Editable installation" notice for every package-dir mapped editable install (ours maps
# core/ -> trtfuse, ...): informational only, so it is filtered; every other build warning still shows.
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e '.[gpu]'
T=.venv/bin/trtfuse
mkdir -p out
$T models resnet50 -o out/resnet50.onnx
$T calibrate out/resnet50.onnx --data default --count ${CALIB_COUNT:-128} --method entropy -o out/scales.json
$T rewrite out/resnet50.onnx -o out/resnet50.int8.onnx --fuse residual --scales out/scales.json --report out/rewrite.json
$T evaluate out/resnet50.onnx out/resnet50.int8.onnx --data default --count ${EVAL_COUNT:-16} -o out/evaluate.json
echo
echo "quickstart outputs (in $(pwd)/out):"
echo "  out/resnet50.onnx       fp32 ResNet-50 built here"
echo "  out/scales.json         INT8 activation scales (entropy; serve rewrite --fuse residual and --fuse all)"
echo "  out/resnet50.int8.onnx  the rewritten INT8 model (fused residual blocks)"
echo "  out/rewrite.json        every fusion candidate, fused or rejected, and why"
echo "  out/evaluate.json       INT8 vs fp32: logit cosine, top-1 agreement and accuracy, per-layer SQNR"
