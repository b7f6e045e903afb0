#!/usr/bin/env bash
# Run on the GPU machine (device tool): install trtfuse without network, run the GPU tests.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .whl/*.whl . 2>&1 | tail -2
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRTFUSE_CACHE=/tmp/trtfuse-cache
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
python3 -m pytest -x -q -p no:cacheprovider tests/test_conv_kernel_gpu.py 2>&1 | tail -25
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --print-limit 3 python3 -m trtfuse.bench.sanitize > /tmp/$tool.log 2>&1; head -40 /tmp/$tool.log; tail -3 /tmp/$tool.log
done
