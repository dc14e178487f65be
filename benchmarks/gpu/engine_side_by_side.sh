#!/usr/bin/env bash
# The engine alone, this tree beside an older checkout, alternated in one command on one GPU, so
# that a difference between two days' figures can be told from run-to-run noise (issue 49).
#
#   bash benchmarks/gpu/engine_side_by_side.sh OUT OLD_DIR [ROUNDS] [SHAPE] [EXTRA ENGINE ARGS...]
#
# OLD_DIR: a checkout of the older code, e.g.
#   git archive 7e35475 agentrl_jax agentrl_common benchmarks pyproject.toml | tar -x -C OLD_DIR
# (a checkout from before benchmarks/ had folders keeps engine.py at benchmarks/engine.py).
# The device copy bandwidth is measured once (copy_bandwidth.py) and given to every run, so the
# roofline ratios share one denominator; then ROUNDS (default 2) rounds of: this tree, the old
# tree (benchmarks/speed/engine.py --shape SHAPE --skip naive,hf,reuse, random weights, bf16,
# batch 256, prompt 128, 256 new tokens unless EXTRA says otherwise), each in a fresh process.
# Logs and JSON go to OUT (new_R.json / old_R.json); docs/PERFORMANCE.md quotes them.
set -u
OUT=${1:?usage: engine_side_by_side.sh OUT OLD_DIR [ROUNDS] [SHAPE] [ARGS...]}
OLD=${2:?usage: engine_side_by_side.sh OUT OLD_DIR [ROUNDS] [SHAPE] [ARGS...]}
ROUNDS=${3:-2}
SHAPE=${4:-smollm2-135m}
shift $(( $# < 4 ? $# : 4 ))
HERE=$(cd "$(dirname "$0")/../.." && pwd)
OLD=$(cd "$OLD" && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$HERE"
python3 benchmarks/speed/copy_bandwidth.py > "$OUT/copy_bandwidth.json" 2> "$OUT/copy_bandwidth.log"
BW_BPS=$(python3 -c "import json; print(json.load(open('$OUT/copy_bandwidth.json'))['bandwidth_Bps'])" \
         2>/dev/null) || { echo "no bandwidth measured (copy_bandwidth.log)" >&2; BW_BPS=measure; }
OLD_ENGINE=benchmarks/speed/engine.py
[ -f "$OLD/$OLD_ENGINE" ] || OLD_ENGINE=benchmarks/engine.py
for r in $(seq 1 "$ROUNDS"); do
  timeout 150 python3 benchmarks/speed/engine.py --shape "$SHAPE" --bandwidth "$BW_BPS" \
      --skip naive,hf,reuse --json "$OUT/new_$r.json" "$@" > "$OUT/new_$r.log" 2>&1
  (cd "$OLD" && PYTHONPATH=$OLD:${PYTHONPATH:-} timeout 150 python3 "$OLD_ENGINE" --shape "$SHAPE" \
      --bandwidth "$BW_BPS" --skip naive,hf,reuse --json "$OUT/old_$r.json" "$@" \
      > "$OUT/old_$r.log" 2>&1)
done
echo "copy bandwidth $BW_BPS B/s"
for f in "$OUT"/new_*.log "$OUT"/old_*.log; do echo "== $f"; grep -E "done:" "$f" | head -2; tail -2 "$f"; done
