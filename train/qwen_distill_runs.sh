#!/usr/bin/env bash
# Distil several students from one pack in parallel on one GPU and keep the best by held-out
# 1 − TV: its fp16 weights and results.json go to OUT_DIR/run, each run's log to OUT_DIR.
#
# Usage: bash train/qwen_distill_runs.sh PACK.npz OUT_DIR STEPS NAME:DRAFT_SHARE:LAYERS...
#   ($PYTHON: the interpreter, $DISTILL_ARGS: more qwen_distill.py options, e.g. "--device cpu")
#   e.g. bash train/qwen_distill_runs.sh train/build/qwen_pack.npz "$OUT" 1800 A:0.5:6 B:1.0:6
set -euo pipefail
pack=$1 out=$2 steps=$3
shift 3
export PYTHONUNBUFFERED=1
names=()
for spec in "$@"; do
    IFS=: read -r name share layers <<< "$spec"
    names+=("$name")
    "${PYTHON:-python3}" train/qwen_distill.py "$pack" ${DISTILL_ARGS:-} --out "/tmp/distill-$name" --steps "$steps" --eval_every 200 \
        --draft_share "$share" --layers "$layers" > "$out/$name.log" 2>&1 &
done
wait
best=$(python3 - "${names[@]}" <<'EOF'
import json, sys
score = {}
for n in sys.argv[1:]:
    try:
        score[n] = json.load(open(f"/tmp/distill-{n}/results.json"))["runs"][-1]["best_heldout_1_minus_tv"]
    except (OSError, KeyError, IndexError):
        continue
print(score, file=sys.stderr)
print(max(score, key=score.get) if score else "")
EOF
)
if [ -z "$best" ]; then
    echo "no run finished; see the logs in $out" >&2
    exit 1
fi
mkdir -p "$out/run"
cp /tmp/distill-"$best"/student_* /tmp/distill-"$best"/results.json "$out/run/"
echo "best: $best"
