#!/usr/bin/env bash
# The rollout profile and the RL step, this tree side by side with another checkout, on a host
# with 4 GPUs (docs/PERFORMANCE.md, "The agent loop, profiled").
#
#   bash benchmarks/gpu/loop_profile.sh OUT [BASELINE_DIR]
#
# In parallel, one GPU each: GPU 0 the 1-GPU profile (prompt sharing off / on, same engine);
# GPU 1 the 1-GPU profile with prefill KV buckets (1024, max_context); GPU 2 the RL step of
# BASELINE_DIR (a checkout of the code before, with its own benchmarks/speed/rl_step.py; skipped when
# not given; its imports from BASE_PYTHONPATH, default BASE); GPU 3 the RL step of this tree. Then the 4-GPU profile (4 engine replicas, the
# same 256 episodes). Logs and JSON go to OUT.
set -u
OUT=${1:?usage: loop_profile.sh OUT [BASELINE_DIR]}
BASE=${2:-}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
CFG=experiments/babyai.py:grpo_gpu
cd "$HERE"
CUDA_VISIBLE_DEVICES=0 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
    --variants noshare,share --rollouts 3 --label "1 GPU" --json "$OUT/profile_1gpu.json" \
    > "$OUT/profile_1gpu.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
    --variants share --rollouts 3 --set "rollout.prefill_kv_buckets='1024'" \
    --label "1 GPU, prefill KV buckets 1024" --json "$OUT/profile_1gpu_kv1024.json" \
    > "$OUT/profile_1gpu_kv1024.log" 2>&1 &
if [ -n "$BASE" ]; then
  # a checkout from before benchmarks/ had folders keeps rl_step.py at the top of benchmarks/
  BASE_RL_STEP=benchmarks/speed/rl_step.py
  [ -f "$BASE/$BASE_RL_STEP" ] || BASE_RL_STEP="benchmarks/$(basename "$BASE_RL_STEP")"
  (cd "$BASE" && PYTHONPATH=${BASE_PYTHONPATH:-$BASE} CUDA_VISIBLE_DEVICES=2 python3 "$BASE_RL_STEP" --config $CFG --steps 4 \
      --variants packed --label "baseline" --json "$OUT/rl_step_baseline.json" \
      > "$OUT/rl_step_baseline.log" 2>&1) &
fi
CUDA_VISIBLE_DEVICES=3 python3 benchmarks/speed/rl_step.py --config $CFG --steps 4 --variants packed \
    --label "this tree" --json "$OUT/rl_step_new.json" > "$OUT/rl_step_new.log" 2>&1 &
wait
python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 4 \
    --variants noshare,share,workers_switch --workers 8 --rollouts 3 --label "4 GPUs" \
    --json "$OUT/profile_4gpu.json" > "$OUT/profile_4gpu.log" 2>&1
for f in "$OUT"/*.log; do echo "== $f"; grep -E "^rollout wall|^\[|^### |steady" "$f" | head -20; tail -2 "$f"; done
