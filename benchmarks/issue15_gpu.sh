#!/usr/bin/env bash
# Issue 15 measurements: GiGPO against GRPO (BabyAI, TextCraft; same budget and seeds), and
# base -> SFT -> SFT+RL (BabyAI, TextCraft), each RL / SFT run sized for ~8 minutes on one H100;
# then the comparisons with benchmarks/learning_report.py (paired bootstrap 95% intervals over
# the held-out tasks x 4 samples: 128 BabyAI test tasks, all 118 TextCraft test goals).
#
#   bash benchmarks/issue15_gpu.sh --gpus 4                 # one job per GPU (CUDA_VISIBLE_DEVICES)
#   bash benchmarks/issue15_gpu.sh --gpus 1 --per-gpu 2     # two jobs at a time on one GPU
#   bash benchmarks/issue15_gpu.sh --stage wave1            # one stage: record | wave1 | wave2 | report
#   bash benchmarks/issue15_gpu.sh --smoke --out /tmp/i15   # CPU check of the whole script (tiny model)
#
# Stages (all by default, in this order; each skips what is already done, so the script can be
# run again after an interruption, or stage by stage under a per-command time limit):
#   record  expert episodes (CPU only): BabyAIBot on 2000 BabyAI train tasks, the recipe expert
#           on the 426 TextCraft train goals (launch/record_experts.py), ~2-4 minutes
#   wave1   babyai_grpo, babyai_gigpo, babyai_sft, textcraft_sft            (~8-9 min with 4 GPUs)
#   wave2   textcraft_grpo, textcraft_gigpo, babyai_sft_grpo, textcraft_sft_grpo  (needs wave1's SFT)
#   report  <out>/report_babyai/gain.json, <out>/report_textcraft/gain.json (+ curves.png)
#
# The RL runs train for --rl-seconds (300) after their opening evaluation, then evaluate again;
# GRPO and GiGPO runs of an environment are launched next to each other, so with --per-gpu > 1
# they share a GPU equally. Logs: <out>/logs/<run>.log. Exit code 1 if any job failed.
set -uo pipefail
cd "$(dirname "$0")/.."

GPUS=4
PER_GPU=1
STAGE=all
OUT=runs/issue15
SMOKE=0
RL_SECONDS=300
BABYAI_EXPERTS=2000
TEXTCRAFT_EXPERTS=426
PY=${PYTHON:-python3}

while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) GPUS=$2; shift 2 ;;
    --per-gpu) PER_GPU=$2; shift 2 ;;
    --stage) STAGE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --rl-seconds) RL_SECONDS=$2; shift 2 ;;
    --babyai-experts) BABYAI_EXPERTS=$2; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$STAGE" in all|record|wave1|wave2|report) ;; *) echo "unknown stage $STAGE" >&2; exit 2 ;; esac

LOGS=$OUT/logs
EXPERTS=$OUT/experts
mkdir -p "$LOGS"
FAILED=()

# ------------------------------------------------------------------ per-run command-line overrides
MODEL=()        # model for the runs that start from the base model
RL_ARGS=(--config.train.max_seconds="$RL_SECONDS")
SFT_ARGS=(--config.sft.data="$EXPERTS")
RECORD_ARGS=()
if [ "$SMOKE" = 1 ]; then
  # CPU, tiny random model (SmolLM2's tokenizer), a couple of steps and episodes per run
  export JAX_PLATFORMS=cpu
  GPUS=1; PER_GPU=1; BABYAI_EXPERTS=12; TEXTCRAFT_EXPERTS=6
  TINY=$OUT/tiny_model
  if [ ! -f "$TINY/config.json" ]; then
    "$PY" - "$TINY" <<'EOF'
import sys
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import init_model
from agentrl_jax.models.pretrained import resolve_model_path
from agentrl_jax.models.safetensors_io import save_hf_directory
from agentrl_jax.models.tokenizer import load_tokenizer
tok = load_tokenizer(resolve_model_path("smollm2"))
cfg = ModelConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
save_hf_directory(init_model(cfg, seed=0), sys.argv[1], tok)
print("tiny model in", sys.argv[1])
EOF
  fi
  MODEL=(--config.model.name="$TINY")
  SMALL=(--config.learner.attention_impl=chunked --config.rollout.max_batch=8
         --config.rollout.max_concurrency=8 --config.rollout.max_context=2048
         --config.learner.pack_length=2048 --config.learner.micro_batch_size=1
         --config.learner.logprob_batch_size=1 --config.train.eval_tasks=2
         --config.train.eval_samples=1 --config.train.eval_horizon=2)
  RL_ARGS=(--config.train.max_seconds=0 --config.train.total_steps=2
           --config.train.tasks_per_step=2 --config.train.samples_per_task=2 "${SMALL[@]}")
  SFT_ARGS=(--config.sft.data="$EXPERTS" --config.sft.steps=2 --config.sft.batch_size=4
            "${SMALL[@]}")
  RECORD_ARGS=(--config.rollout.max_context=2048)
fi
SLOTS=$((GPUS * PER_GPU))
MEM_FRACTION=$(awk "BEGIN {printf \"%.2f\", 0.9 / $PER_GPU}")

# ------------------------------------------------------------------ jobs
declare -A JOB_PID=()
RUNNING=()

job_env() {  # the environment of slot $1
  if [ "$SMOKE" = 1 ]; then return; fi
  echo "CUDA_VISIBLE_DEVICES=$(( $1 % GPUS ))"
  if [ "$PER_GPU" -gt 1 ]; then
    echo "XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM_FRACTION"
  fi
}

reap() {  # wait for one running job, record a failure
  local pid status name
  wait -n -p pid "${RUNNING[@]}"
  status=$?
  name=${JOB_PID[$pid]}
  local left=() p
  for p in "${RUNNING[@]}"; do [ "$p" != "$pid" ] && left+=("$p"); done
  RUNNING=("${left[@]}")
  if [ "$status" -ne 0 ]; then
    echo "FAILED: $name (exit $status; $LOGS/$name.log)"
    FAILED+=("$name")
  else
    echo "done: $name"
  fi
}

SLOT=0
launch() {  # launch NAME CMD...: runs when a slot is free; output to $LOGS/NAME.log
  local name=$1; shift
  while [ "${#RUNNING[@]}" -ge "$SLOTS" ]; do reap; done
  local envs=($(job_env $SLOT))
  SLOT=$(( (SLOT + 1) % SLOTS ))
  echo "start: $name ${envs[*]} -> $LOGS/$name.log"
  env "${envs[@]}" "$@" > "$LOGS/$name.log" 2>&1 &
  JOB_PID[$!]=$name
  RUNNING+=($!)
}

wait_all() {
  while [ "${#RUNNING[@]}" -gt 0 ]; do reap; done
}

rl() {  # rl NAME CONFIG [extra args]
  local name=$1 config=$2; shift 2
  launch "$name" "$PY" launch/run.py --config "experiments/$config.py" --workdir "$OUT/$name" \
    "${MODEL[@]}" "${RL_ARGS[@]}" "$@"
}

sft() {  # sft NAME CONFIG
  local name=$1 config=$2
  launch "$name" "$PY" launch/sft.py --config "experiments/$config.py" --workdir "$OUT/$name" \
    "${MODEL[@]}" "${SFT_ARGS[@]}"
}

sft_rl() {  # sft_rl NAME CONFIG SFT_NAME
  local name=$1 config=$2 sft_name=$3
  if [ ! -f "$OUT/$sft_name/model/config.json" ]; then
    echo "FAILED: $name (no SFT policy in $OUT/$sft_name/model: run wave1 first)"
    FAILED+=("$name")
    return
  fi
  launch "$name" "$PY" launch/run.py --config "experiments/$config.py" --workdir "$OUT/$name" \
    "${RL_ARGS[@]}" --config.model.name="$OUT/$sft_name/model"
}

record() {  # record ENV CONFIG EPISODES
  local env=$1 config=$2 episodes=$3
  if [ -f "$EXPERTS/$env.meta.json" ]; then
    echo "expert data for $env exists ($EXPERTS/$env.meta.json)"
    return
  fi
  echo "recording $episodes $env expert episodes -> $EXPERTS ($LOGS/record_$env.log)"
  if ! JAX_PLATFORMS=cpu "$PY" launch/record_experts.py --env "$env" --episodes "$episodes" \
      --out "$EXPERTS" --config "experiments/$config.py" "${MODEL[@]}" "${RECORD_ARGS[@]}" \
      > "$LOGS/record_$env.log" 2>&1; then
    echo "FAILED: recording $env ($LOGS/record_$env.log)"
    FAILED+=("record_$env")
    rm -f "$EXPERTS/$env.meta.json"
  fi
  tail -n 1 "$LOGS/record_$env.log"
}

report() {  # report ENV
  local env=$1
  echo "report $env -> $OUT/report_$env"
  if ! "$PY" benchmarks/learning_report.py "$OUT/${env}_grpo" "$OUT/${env}_gigpo" \
      "$OUT/${env}_sft" "$OUT/${env}_sft_grpo" --labels grpo,gigpo,sft,sft_grpo \
      --diff "gigpo:grpo,sft:grpo@first,sft_grpo:sft,sft_grpo:grpo@first,sft_grpo:grpo" \
      --out "$OUT/report_$env" > "$LOGS/report_$env.log" 2>&1; then
    echo "FAILED: report $env ($LOGS/report_$env.log)"
    FAILED+=("report_$env")
    return
  fi
  "$PY" - "$OUT/report_$env/gain.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
def line(name, e):
    if "gain" not in e:
        return f"  {name}: no pair of evaluations"
    return (f"  {name}: {e['before_avg']:.3f} -> {e['after_avg']:.3f}  diff {100 * e['gain']:+.1f} "
            f"points, 95% CI [{100 * e['gain_ci95_low']:+.1f}, {100 * e['gain_ci95_high']:+.1f}] "
            f"({e['tasks']} tasks x {e['samples_per_task']})")
for label, e in r.items():
    if label != "differences":
        print(line(f"{label} (first -> last evaluation)", e))
for pair, e in r.get("differences", {}).items():
    print(line(f"{pair} ({e['a']}@{e['a_step']} -> {e['b']}@{e['b_step']})", e))
EOF
}

echo "issue 15 runs in $OUT: $SLOTS job slot(s) on $GPUS GPU(s) ($PER_GPU per GPU), stage $STAGE" \
  "$([ "$SMOKE" = 1 ] && echo '(smoke: CPU, tiny model)')"
T0=$(date +%s)
if [ "$STAGE" = all ] || [ "$STAGE" = record ]; then
  record babyai babyai_sft_gpu "$BABYAI_EXPERTS"
  record textcraft textcraft_sft_gpu "$TEXTCRAFT_EXPERTS"
fi
if [ "$STAGE" = all ] || [ "$STAGE" = wave1 ]; then
  rl babyai_grpo babyai_grpo_gpu
  rl babyai_gigpo babyai_gigpo_gpu
  sft babyai_sft babyai_sft_gpu
  sft textcraft_sft textcraft_sft_gpu
  wait_all
fi
if [ "$STAGE" = all ] || [ "$STAGE" = wave2 ]; then
  rl textcraft_grpo textcraft_grpo_gpu
  rl textcraft_gigpo textcraft_gigpo_gpu
  sft_rl babyai_sft_grpo babyai_sft_grpo_gpu babyai_sft
  sft_rl textcraft_sft_grpo textcraft_sft_grpo_gpu textcraft_sft
  wait_all
fi
if [ "$STAGE" = all ] || [ "$STAGE" = report ]; then
  report babyai
  report textcraft
fi
echo "finished in $(( $(date +%s) - T0 )) s"
if [ "${#FAILED[@]}" -gt 0 ]; then
  echo "failed: ${FAILED[*]}"
  exit 1
fi
