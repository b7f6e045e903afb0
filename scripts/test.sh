#!/usr/bin/env bash
# One command for the test suite on a fresh machine: makes .venv, installs trtfuse[test], runs pytest.
# GPU and TensorRT tests skip themselves, saying why, where there is no GPU or no TensorRT; the tests that run
# trtfuse's plugin registration under NVIDIA's own tensorrt.plugin use the wheels installed into .trt-envs/.
set -euo pipefail
# setuptools prints an "Editable installation" notice for every package-dir mapped editable install (ours maps
# core/ -> trtfuse, ...): informational only, so it is filtered; every other build warning still shows.
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e '.[test]'
bash scripts/install_trt_envs.sh .venv/bin/python  # NVIDIA's tensorrt.plugin of TensorRT 10.9, 10.15, 11.4
exec .venv/bin/python -m pytest -ra "$@"
