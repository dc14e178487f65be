#!/usr/bin/env bash
# The rollout's prefill and environment knobs on one GPU each, side by side with the config as
# committed (docs/PERFORMANCE.md, "Prefill KV buckets and environment replicas"), on a host with
# 2 GPUs:
#
#   bash benchmarks/gpu/prefill_knobs.sh OUT [GPU_A] [GPU_B]
#
# GPU_A (default 0), one after the other: the rollout profile of experiments/babyai.py:grpo_gpu
# as committed; with prefill KV buckets (rollout.prefill_kv_buckets='auto': each prefill call
# attends over the smallest power-of-two prefix of its rows that holds them, not the whole
# 3,072-position row); with the buckets and 4 BabyAI servers (env.replicas=4), also with
# Python's GIL switch interval at 0.5 ms. GPU_B, one after the other: the whole RL step
# (benchmarks/speed/rl_step.py, 4 steps) as committed and with buckets + 4 servers. Logs and JSON -> OUT.
set -u
OUT=${1:?usage: prefill_knobs.sh OUT [GPU_A] [GPU_B]}
GA=${2:-0}
GB=${3:-1}
cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
CFG=experiments/babyai.py:grpo_gpu
KV="rollout.prefill_kv_buckets='auto'"
(
  export CUDA_VISIBLE_DEVICES=$GA
  timeout -k 10 110 python3 benchmarks/speed/rollout_profile.py --config $CFG --variants share \
      --rollouts 3 --label "as committed" --json "$OUT/profile_base.json" > "$OUT/profile_base.log" 2>&1
  timeout -k 10 140 python3 benchmarks/speed/rollout_profile.py --config $CFG --variants share \
      --rollouts 3 --set "$KV" --label "prefill KV buckets auto" \
      --json "$OUT/profile_kv.json" > "$OUT/profile_kv.log" 2>&1
  timeout -k 10 170 python3 benchmarks/speed/rollout_profile.py --config $CFG --variants share,switch \
      --rollouts 3 --set "$KV" --set env.replicas=4 --label "KV buckets + 4 BabyAI servers" \
      --json "$OUT/profile_kv_env4.json" > "$OUT/profile_kv_env4.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=$GB
  timeout -k 10 200 python3 benchmarks/speed/rl_step.py --config $CFG --steps 4 --variants packed \
      --label "as committed" --json "$OUT/rl_step_base.json" > "$OUT/rl_step_base.log" 2>&1
  timeout -k 10 220 python3 benchmarks/speed/rl_step.py --config $CFG --steps 4 --variants packed \
      --set "$KV" --set env.replicas=4 --label "KV buckets + 4 BabyAI servers" \
      --json "$OUT/rl_step_kv_env4.json" > "$OUT/rl_step_kv_env4.log" 2>&1
) &
wait
for f in "$OUT"/*.log; do
  echo "== $f"; grep -E "^rollout wall|^## |^\| (device|host|idle)|steady|first step" "$f" | head -24
  tail -2 "$f"
done
