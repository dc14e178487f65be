#!/usr/bin/env bash
# The trainer as 2 JAX processes x 1 GPU (jax.distributed over NCCL, as on a 2-host cluster),
# checkpoint + resume, against a 1-process 2-GPU run of the same config and seed.
#   bash benchmarks/gpu/two_process.sh OUT_DIR [CONFIG]
# Needs 2 GPUs (GPU ids from $GPUS, default "0 1"). Writes OUT_DIR/{2proc,1proc}/ (run
# workdirs), OUT_DIR/*.log and OUT_DIR/compare.json (benchmarks/analysis/compare_runs.py).
set -uo pipefail
OUT=${1:?usage: two_process.sh OUT_DIR [CONFIG]}
CONFIG=${2:-experiments/babyai.py:grpo_gpu}
read -r GPU_A GPU_B <<<"${GPUS:-0 1}"
mkdir -p "$OUT"
COMMON=(--config "$CONFIG" --config.train.tasks_per_step=8 --config.train.samples_per_task=4
        --config.train.eval_tasks=8 --config.train.eval_samples=1 --config.train.max_seconds=0
        --config.train.save_every=1 --config.train.eval_before=False
        --config.rollout.max_batch=64 --config.rollout.max_concurrency=64)
two_proc() {  # $1 = total steps, $2 = log name
  local port=$((20000 + RANDOM % 20000)) pids=() rc=0
  for i in 0 1; do
    local gpu=$GPU_A; [[ $i == 1 ]] && gpu=$GPU_B
    CUDA_VISIBLE_DEVICES=$gpu JAX_COORDINATOR_ADDRESS=127.0.0.1:$port JAX_NUM_PROCESSES=2 \
      JAX_PROCESS_ID=$i python3 launch/run.py --distributed --workdir "$OUT/2proc" \
      "${COMMON[@]}" --config.train.total_steps="$1" >"$OUT/$2.p$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  return $rc
}
t0=$SECONDS
two_proc 2 2proc_steps1-2 || { echo "2-process run failed"; tail -30 "$OUT"/2proc_steps1-2.p*.log; exit 1; }
echo "2 processes x 1 GPU, steps 1-2: $((SECONDS - t0)) s"
t0=$SECONDS
two_proc 3 2proc_resume_step3 || { echo "2-process resume failed"; tail -30 "$OUT"/2proc_resume_step3.p*.log; exit 1; }
echo "2 processes x 1 GPU, resumed for step 3: $((SECONDS - t0)) s"
grep -h "resumed at step" "$OUT"/2proc_resume_step3.p*.log
t0=$SECONDS
CUDA_VISIBLE_DEVICES=$GPU_A,$GPU_B python3 launch/run.py --workdir "$OUT/1proc" "${COMMON[@]}" \
  --config.train.total_steps=3 >"$OUT/1proc.log" 2>&1 || { echo "1-process run failed"; tail -30 "$OUT/1proc.log"; exit 1; }
echo "1 process x 2 GPUs, steps 1-3: $((SECONDS - t0)) s"
python3 benchmarks/analysis/compare_runs.py "$OUT/2proc" "$OUT/1proc" --json "$OUT/compare.json"
