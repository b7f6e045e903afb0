# Sourced by the scripts/device_*.sh scripts on the device machine (no network there): install trtfuse
# from the working tree and the wheels carried in .whl/ into /tmp/site, and point Python at it.
rm -rf build
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site --upgrade .whl/*.whl . >/dev/null 2>&1 \
  || { echo "install into /tmp/site failed" >&2; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRTFUSE_CACHE=/tmp/trtfuse-cache
# benchmarks record into the repository copy here (their default is ./bench-results/)
export TRTFUSE_RESULTS_DIR=bench/results
