#!/usr/bin/env bash
# The learner changes of docs/PERFORMANCE.md "Learner: compile ahead and segment-skipping
# attention" measured on a host with 2 GPUs, each arm on its own GPU, side by side:
#
#   bash benchmarks/gpu/learner_speedups.sh OUT [GPU_A] [GPU_B]
#
# 1. The whole BabyAI RL step (benchmarks/speed/rl_step.py, experiments/babyai.py:grpo_gpu, 4 steps)
#    with train.compile_ahead on (GPU_A) and off (GPU_B), at the same time: the first step and the
#    run's wall clock show the compile moved out of the way.
# 2. GPU_A: packed attention forward + backward (benchmarks/contenders/packed_attention.py), float32 (the
#    learner's dtype) and bfloat16, JAX's Pallas flash attention against ours that skips the
#    blocks between packed sequences (learner.attention_impl="pallas_segments"), each checked
#    against a float32 reference on the device. GPU_B: a learner update with each
#    (benchmarks/speed/update_profile.py). Logs and JSON -> OUT.
set -u
OUT=${1:?usage: learner_speedups.sh OUT [GPU_A] [GPU_B]}
GA=${2:-0}
GB=${3:-1}
cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
CFG=experiments/babyai.py:grpo_gpu
(
  export CUDA_VISIBLE_DEVICES=$GA
  timeout -k 10 250 python3 benchmarks/speed/rl_step.py --config $CFG --steps 4 --variants packed \
      --set train.compile_ahead=True --label "compile_ahead on" \
      --json "$OUT/rl_step_ahead_on.json" > "$OUT/rl_step_ahead_on.log" 2>&1
  timeout -k 10 100 python3 benchmarks/contenders/packed_attention.py --dtype float32 --segments 3 \
      --impls xla_masked,pallas,pallas_segments --json "$OUT/attention_f32.json" \
      > "$OUT/attention_f32.log" 2>&1
  timeout -k 10 80 python3 benchmarks/contenders/packed_attention.py --dtype bfloat16 --segments 3 \
      --impls cudnn_causal,pallas,pallas_segments --json "$OUT/attention_bf16.json" \
      > "$OUT/attention_bf16.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=$GB
  timeout -k 10 250 python3 benchmarks/speed/rl_step.py --config $CFG --steps 4 --variants packed \
      --set train.compile_ahead=False --label "compile_ahead off" \
      --json "$OUT/rl_step_ahead_off.json" > "$OUT/rl_step_ahead_off.log" 2>&1
  timeout -k 10 200 python3 benchmarks/speed/update_profile.py --config $CFG \
      --variants pallas,pallas_segments --repeats 2 --json "$OUT/update_profile.json" \
      > "$OUT/update_profile.log" 2>&1
) &
wait
for f in "$OUT"/*.log; do
  echo "== $f"; grep -E "steady|first step|fwd\+bwd|failed|update|Error" "$f" | head -16
  tail -2 "$f"
done
