set -uo pipefail
export T_CORRECT=75 T_SAN=35 T_TIME=70
bash scripts/wgmma_device_check.sh 2>&1 | tail -45
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRTFUSE_CACHE=/tmp/trtfuse-cache
timeout 150 python3 -m pytest -q --maxfail=5 -m gpu tests/ --ignore=tests/test_wgmma_gpu.py -p no:cacheprovider > $OUT/gpu_tests.txt 2>&1; echo "tests rc=$?"; tail -3 $OUT/gpu_tests.txt; grep -E "^FAILED|Error" $OUT/gpu_tests.txt | head
timeout 40 compute-sanitizer --tool memcheck python3 -m trtfuse.bench.sanitize > $OUT/memcheck.txt 2>&1; echo "memcheck $(grep -c MISMATCH $OUT/memcheck.txt) $(grep 'ERROR SUMMARY' $OUT/memcheck.txt)"
TRTFUSE_WGMMA=1 timeout 200 python3 -m trtfuse.cli bench kernels --batch 256 --layers resnet50 --autotune -o $OUT/kernels.json > $OUT/bench.txt 2>&1; tail -28 $OUT/bench.txt
