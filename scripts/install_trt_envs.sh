#!/usr/bin/env bash
# NVIDIA's own `tensorrt.plugin` package, one folder per TensorRT version under .trt-envs/, for
# tests/test_trt_nvidia.py: each TensorRT lean bindings wheel carries it (as tensorrt_lean_bindings/plugin/)
# next to the lean runtime's extension module, whose library comes from the matching -libs wheel.
# TensorRT 10.9's lean library is not on PyPI (its -libs package only downloads from NVIDIA's own index), so
# 10.9's bindings and plugin package run over 10.15's library (same major version, same soname).
#   bash scripts/install_trt_envs.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
install() {
  local dir=.trt-envs/$1; shift
  [ -f "$dir/.complete" ] && return 0
  rm -rf "$dir"
  "$PY" -m pip install -q --no-deps --disable-pip-version-check --target "$dir" "$@"
  touch "$dir/.complete"
}
install 10.9 tensorrt-lean-cu12-bindings==10.9.0.34 tensorrt-lean-cu12-libs==10.15.1.29
install 10.15 tensorrt-lean-cu12-bindings==10.15.1.29 tensorrt-lean-cu12-libs==10.15.1.29
install 11.4 tensorrt-lean-cu13-bindings==11.4.0.106 tensorrt-lean-cu13-libs==11.4.0.106
