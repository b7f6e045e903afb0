#!/usr/bin/env bash
# Packs Triton's server tree (as trtfuse.runtime.triton_server unpacks it from the nvidia-pytriton wheel) into
# .whl-triton/tritonserver-tree.tar.gz for a machine without network, smaller than the wheel: only the Python
# backend stub of one Python minor version (default: this machine's python3) and no bundled libpython of another.
#   bash scripts/pack_triton_tree.sh [3.11]
# On the other machine: tar -xzf .whl-triton/tritonserver-tree.tar.gz -C DIR; TRTFUSE_TRITON_HOME=DIR/pytriton/tritonserver
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${1:-$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}
PY=${PYTHON:-.venv/bin/python}
ROOT=$("$PY" -c 'from trtfuse.runtime import triton_server as t; i = t.locate(); print(i.home.parent.parent)')
[ -f "$ROOT/pytriton/tritonserver/python_backend_stubs/$PYV/triton_python_backend_stub" ] \
  || { echo "no Python backend stub for Python $PYV in $ROOT" >&2; exit 1; }
mkdir -p .whl-triton
EXCLUDE=(--exclude='pytriton/tritonserver/backends/python/triton_python_backend_stub')
for d in "$ROOT"/pytriton/tritonserver/python_backend_stubs/*; do
  [ "$(basename "$d")" = "$PYV" ] || EXCLUDE+=(--exclude="pytriton/tritonserver/python_backend_stubs/$(basename "$d")")
done
for f in "$ROOT"/nvidia_pytriton.libs/libpython3*; do
  case "$(basename "$f")" in *".${PYV#3.}.so"*) ;; *) EXCLUDE+=(--exclude="nvidia_pytriton.libs/$(basename "$f")") ;; esac
done
tar -C "$ROOT" "${EXCLUDE[@]}" -cf - pytriton nvidia_pytriton.libs | gzip -6 > .whl-triton/tritonserver-tree.tar.gz.tmp
mv .whl-triton/tritonserver-tree.tar.gz.tmp .whl-triton/tritonserver-tree.tar.gz
ls -la .whl-triton/tritonserver-tree.tar.gz
