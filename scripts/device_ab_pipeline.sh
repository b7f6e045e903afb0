#!/usr/bin/env bash
# One device call comparing whole installs end to end: the Offline pipeline without LoadGen (`bench e2e
# --pipeline-only`) on the working tree's install ("tree") and on each variant ab/<variant>/, whose files overlay the
# install at their package paths (ab/before/plugins/network_ops.py replaces trtfuse/plugins/network_ops.py), rounds
# alternating so that a card's drift hits every side alike. Cards differ by a few percent: only sides timed in one
# call compare.
#   run (carry [".whl", "ab", ".devcarry"]): PLANS=bench/results/e2e-b2048-NVIDIA_H200.json BATCH=4096 STREAMS=2 \
#       MODEL=.devcarry/r50_all.onnx bash scripts/device_ab_pipeline.sh
#   (ROUNDS=2, SECONDS_EACH=6; without MODEL one is built here; without PLANS each side uses the heuristic's plans)
# One JSON record per side and round in $OUT/<side>-<round>.json; the summary prints each side's figures.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
sides="tree"
for dir in ab/*/; do
  [ -d "$dir" ] || continue
  v=$(basename "$dir"); sides="$sides $v"
  rm -rf "/tmp/site_$v" && cp -r /tmp/site "/tmp/site_$v"
  (cd "$dir" && find . -type f) | while read -r f; do
    mkdir -p "$(dirname "/tmp/site_$v/trtfuse/$f")" && cp "$dir/$f" "/tmp/site_$v/trtfuse/$f"
  done
done
model=${MODEL:-/tmp/r50_all.onnx}
if [ -z "${MODEL:-}" ]; then
  python3 -m trtfuse.cli models resnet50 -o /tmp/r50.onnx > /dev/null \
    && python3 -m trtfuse.cli rewrite /tmp/r50.onnx -o "$model" --fuse all > /dev/null || exit 1
fi
plans=""; [ -n "${PLANS:-}" ] && plans="--plans $PLANS"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 & SMI=$!
for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in $sides; do
    site=/tmp/site; [ "$side" = tree ] || site=/tmp/site_$side
    PYTHONPATH=$site python3 -m trtfuse.cli bench e2e --pipeline-only --model "$model" --batch "${BATCH:-256}" \
      --streams "${STREAMS:-2}" $plans --seconds "${SECONDS_EACH:-6}" --json -o "$OUT/$side-$round.json" > /dev/null \
      2> "$OUT/$side-$round.err" || { echo "$side round $round failed:"; tail -3 "$OUT/$side-$round.err"; }
  done
done
kill $SMI 2>/dev/null
for side in $sides; do
  python3 - "$OUT" "$side" <<'EOF'
import json, pathlib, sys
out, side = pathlib.Path(sys.argv[1]), sys.argv[2]
figures = [json.loads(p.read_text())["offline_pipeline_samples_per_s"] for p in sorted(out.glob(f"{side}-*.json"))]
print(f"{side}: " + " / ".join(f"{v:,.0f}" for v in figures) + " samples/s (the Offline pipeline without LoadGen)")
EOF
done
