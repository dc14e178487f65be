#!/usr/bin/env bash
# The SFT -> RL comparison: base -> SFT -> SFT+RL and GiGPO against GRPO (same budget and seeds) on
# BabyAI and TextCraft, every final evaluation on the held-out tasks x 4 samples (128 BabyAI test
# tasks; TextCraft's test split is 118 goals: all of them), then the differences with paired
# bootstrap 95% intervals over tasks (benchmarks/analysis/learning_report.py).
#
#   bash benchmarks/gpu/sft_rl_comparison.sh --stage wave1,report --gpus 4 --budget 540   # call 1 (~9 min)
#   bash benchmarks/gpu/sft_rl_comparison.sh --stage wave2,report --gpus 4 --budget 540   # call 2 (~7.5 min)
#   bash benchmarks/gpu/sft_rl_comparison.sh --gpus 2 --per-gpu 2     # 4 lanes on 2 GPUs (2 jobs per GPU)
#   bash benchmarks/gpu/sft_rl_comparison.sh --smoke --out /tmp/i15   # CPU check of everything (tiny model)
#   bash benchmarks/gpu/sft_rl_comparison.sh --seed 1 --stage wave1,wave2 --dry-run   # print the job plan
#
# --seed N (default 0) trains every SFT and RL run with --config.seed=N and names its jobs with
# the suffix _sN (none for seed 0: babyai_sft_grpo, babyai_sft_grpo_s1, ...), the label form
# `learning_report.py --seeds` groups; the base-model evaluation and the expert recordings do not
# depend on the training seed and run once. --dry-run prints each job (lane, GPU, time cap,
# command) instead of running it; jobs already done are listed as skipped. --fixed-length (for
# runs that must be comparable across calls, e.g. seeds) never shortens a run to fit --budget:
# a job whose cap does not fit in the time left is skipped, to run in a later call; a job that
# failed before is started again in a fresh work directory (the old one moved to <out>/.attempts).
#
# Stages (--stage: all, or a comma-separated list, run in this order; a job already done, i.e.
# with a marker in <out>/.done, is skipped, so a stage can be run again after an interruption):
#   record  expert episodes on the CPU (launch/record_experts.py, --record-workers processes):
#           BabyAIBot on --babyai-experts (2000) BabyAI train tasks, the recipe expert on the 426
#           TextCraft train goals (~30 s; wave1 records what is missing itself)
#   wave1   per environment E (babyai, textcraft) two lanes (one GPU each with --gpus 4):
#             lane A: record E -> E_sft (SFT for --sft-seconds, 90) -> E_sft_grpo
#             lane B: E_base (the base model on the held-out tasks)  -> E_sft_gigpo
#           E_sft_grpo / E_sft_gigpo start together from E_sft's policy, evaluate it (step 0),
#           train --rl-sft-seconds (110, less if the budget is short: the same for both) and
#           evaluate again.                                           ~8.5 min on 4 GPUs
#   wave2   BabyAI GRPO and GiGPO from the base model, --rl-seconds (210) each, seed 0 on lanes
#           0/1 and (--wave2-pair2) a second pair on lanes 2/3: babyai_seed1 (seed 1; default),
#           textcraft_base (TextCraft GRPO / GiGPO from the base model), horizons (BabyAI GRPO
#           with a fixed 6-turn and a fixed 20-turn horizon, babyai_fixed6 / babyai_fixed20:
#           against babyai_grpo's ScalingInter-RL 6 -> 13 -> 20 at equal wall time) or none.
#   report  <results>/report_babyai/gain.json, <results>/report_textcraft/gain.json (+ curves)
#
# Every job runs under `timeout` (its cap, and with --budget S no later than S seconds after the
# start minus 25 s for the report); its wall time goes to <results>/timings.jsonl. After each job
# its small files (metrics.jsonl, summary.json, config.json, eval_episodes.jsonl: one line per
# evaluation episode with task, step, status, success, the input of the paired bootstrap; each as
# .jsonl.gz when over 64 KiB) and a filtered copy of its log are copied to <results>/<job>/ and
# <results>/logs/, so they exist even if a later job or the call itself is cut short. Runs (checkpoints, full trajectories) stay in
# --out. Exit code 1 if any job failed or was skipped.
set -uo pipefail
cd "$(dirname "$0")/../.."

GPUS=4
PER_GPU=1
STAGE=all
OUT=runs/issue15
RESULTS=
SMOKE=0
BUDGET=0
RL_SECONDS=210
SFT_SECONDS=90
RL_SFT_SECONDS=110
BABYAI_EXPERTS=2000
TEXTCRAFT_EXPERTS=426
RECORD_WORKERS=$(( $(nproc) / 4 ))
[ "$RECORD_WORKERS" -gt 16 ] && RECORD_WORKERS=16
[ "$RECORD_WORKERS" -lt 1 ] && RECORD_WORKERS=1
WAVE2_PAIR2=babyai_seed1
SEED=0
DRY_RUN=0
FIXED_LENGTH=0
PY=${PYTHON:-python3}

while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) GPUS=$2; shift 2 ;;
    --per-gpu) PER_GPU=$2; shift 2 ;;
    --stage) STAGE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --rl-seconds) RL_SECONDS=$2; shift 2 ;;
    --sft-seconds) SFT_SECONDS=$2; shift 2 ;;
    --rl-sft-seconds) RL_SFT_SECONDS=$2; shift 2 ;;
    --babyai-experts) BABYAI_EXPERTS=$2; shift 2 ;;
    --record-workers) RECORD_WORKERS=$2; shift 2 ;;
    --wave2-pair2) WAVE2_PAIR2=$2; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    --seed) SEED=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --fixed-length) FIXED_LENGTH=1; shift ;;
    -h|--help) sed -n '2,44p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$STAGE" = all ] && STAGE=record,wave1,wave2,report
for s in ${STAGE//,/ }; do
  case "$s" in record|wave1|wave2|report) ;; *) echo "unknown stage $s" >&2; exit 2 ;; esac
done
case "$WAVE2_PAIR2" in babyai_seed1|textcraft_base|horizons|none) ;;
  *) echo "--wave2-pair2: babyai_seed1 | textcraft_base | horizons | none" >&2; exit 2 ;; esac
[[ "$SEED" =~ ^[0-9]+$ ]] || { echo "--seed takes a number, got $SEED" >&2; exit 2; }
SUF=$([ "$SEED" -gt 0 ] && echo "_s$SEED")  # job-name suffix of this training seed
has_stage() { [[ ",$STAGE," == *",$1,"* ]]; }

RESULTS=${RESULTS:-$OUT/results}
LOGS=$OUT/logs
EXPERTS=$OUT/experts
if [ "$DRY_RUN" != 1 ]; then  # a dry run writes nothing
  mkdir -p "$LOGS" "$RESULTS/logs" "$OUT/.done" "$OUT/.lanes"
  rm -f "$OUT"/.done/*.failed
fi
T0=$(date +%s)
REPORT_RESERVE=25
source benchmarks/gpu/jobs_lib.sh  # say, time_left, make_tiny_model, collect, timing, run_job, wait_for

# ------------------------------------------------------------------ per-run command-line overrides
MODEL=()        # model of the runs that start from the base model
RL_ARGS=(--config.train.save_every=100000)
SFT_ARGS=(--config.sft.data="$EXPERTS" --config.sft.max_seconds="$SFT_SECONDS"
          --config.sft.eval_after=False)
RECORD_ARGS=()
EVAL_ARGS=(--k 4 --tasks 128)
# job caps (seconds): fixed overheads measured on H100 (start ~60 s, compile ~30 s, evaluations
# ~35 s each, the SFT data and export ~10 s) plus the training time
CAP_RECORD=180
CAP_SFT=$(( SFT_SECONDS + 150 ))
CAP_EVAL=200
RL_OVERHEAD=200   # an RL run's time besides training: start, two evaluations, compile, save (~190 s)
RL_SLACK=60       # an RL job's cap: its training time + RL_OVERHEAD + RL_SLACK
if [ "$SMOKE" = 1 ]; then
  # CPU, tiny random model (SmolLM2's tokenizer), a couple of steps and episodes per run
  export JAX_PLATFORMS=cpu
  GPUS=1; PER_GPU=1; BABYAI_EXPERTS=12; TEXTCRAFT_EXPERTS=6; RECORD_WORKERS=2
  TINY=$OUT/tiny_model
  [ "$DRY_RUN" != 1 ] && make_tiny_model "$TINY"
  MODEL=(--config.model.name="$TINY")
  SMALL=(--config.learner.attention_impl=chunked --config.rollout.max_batch=8
         --config.rollout.max_concurrency=8 --config.rollout.max_context=2048
         --config.learner.pack_length=2048 --config.learner.micro_batch_size=1
         --config.learner.logprob_batch_size=1 --config.train.eval_tasks=2
         --config.train.eval_samples=1 --config.train.eval_horizon=2)
  RL_ARGS=(--config.train.save_every=100000 --config.train.total_steps=2
           --config.train.tasks_per_step=2 --config.train.samples_per_task=2 "${SMALL[@]}")
  RL_SECONDS=0; RL_SFT_SECONDS=0; RL_OVERHEAD=0; RL_SLACK=900
  SFT_ARGS=(--config.sft.data="$EXPERTS" --config.sft.steps=2 --config.sft.batch_size=4
            --config.sft.eval_after=False "${SMALL[@]}")
  RECORD_ARGS=(--config.rollout.max_context=2048)
  EVAL_ARGS=(--k 1 --tasks 2 "${SMALL[@]}")
  CAP_RECORD=600; CAP_SFT=900; CAP_EVAL=900
fi
RL_ARGS+=(--config.seed="$SEED")
SFT_ARGS+=(--config.seed="$SEED")
LANES=$(( GPUS * PER_GPU ))
MEM_FRACTION=$(awk "BEGIN {printf \"%.2f\", 0.9 / $PER_GPU}")


record() {  # record ENV CONFIG EPISODES LANE
  local env=$1 config=$2 episodes=$3 lane=$4 workers=$RECORD_WORKERS
  if [ -f "$EXPERTS/$env.meta.json" ]; then touch "$OUT/.done/record_$env"; return 0; fi
  # at least ~100 episodes per worker (a worker's start costs a few seconds)
  [ $(( episodes / 100 + 1 )) -lt "$workers" ] && [ "$SMOKE" != 1 ] && workers=$(( episodes / 100 + 1 ))
  # --expert "$env": the environment's own expert (the table's SFT rows: the primitive
  # BabyAIBot), whatever the config's sft.expert (babyai.py:sft_gpu: the macro expert)
  run_job "record_$env" "$lane" "$CAP_RECORD" CPU "$PY" launch/record_experts.py --env "$env" \
    --expert "$env" --episodes "$episodes" --out "$EXPERTS" --config "experiments/$config" \
    --workers "$workers" --timeout $(( CAP_RECORD - 30 )) --progress_every 250 \
    "${MODEL[@]}" "${RECORD_ARGS[@]}"
  local rc=$?
  [ -f "$EXPERTS/$env.meta.json" ] && cp "$EXPERTS/$env.meta.json" "$RESULTS/experts_$env.meta.json"
  return $rc
}

rl_seconds_after() {  # the training seconds of an RL pair whose runs start now (same for both)
  local want=$1 marker=$2 left
  [ -f "$marker" ] && [ "$FIXED_LENGTH" != 1 ] || { echo "$want"; return; }  # dry run / fixed
  # measured from the end of the job both runs wait for, so both lanes compute the same number
  left=$(( BUDGET - REPORT_RESERVE - ($(stat -c %Y "$marker") - T0) - RL_OVERHEAD ))
  if [ "$BUDGET" -gt 0 ] && [ "$left" -lt "$want" ]; then echo "$left"; else echo "$want"; fi
}

sft_rl() {  # sft_rl ENV ALGO LANE: ENV_sft_ALGO from ENV_sft's policy (this seed's)
  local env=$1 algo=$2 lane=$3 secs sft="${1}_sft$SUF" job="${1}_sft_$2$SUF"
  if ! wait_for "$sft"; then
    say "SKIPPED $job: no SFT policy ($sft failed or out of time)"
    touch "$OUT/.done/$job.failed"; return 1
  fi
  secs=$(rl_seconds_after "$RL_SFT_SECONDS" "$OUT/.done/$sft")
  if [ "$SMOKE" != 1 ] && [ "$secs" -lt 30 ]; then
    say "SKIPPED $job: $secs s of training left"; touch "$OUT/.done/$job.failed"
    return 1
  fi
  run_job "$job" "$lane" $(( secs + RL_OVERHEAD + RL_SLACK )) GPU "$PY" launch/run.py \
    --config "experiments/${env}.py:sft_${algo}_gpu" --workdir "$OUT/$job" \
    --config.model.name="$OUT/$sft/model" --config.train.max_seconds="$secs" "${RL_ARGS[@]}"
}

lane_a() {  # lane_a ENV EPISODES LANE: record -> SFT -> SFT+GRPO
  local env=$1 episodes=$2 lane=$3
  record "$env" "${env}_sft_gpu" "$episodes" "$lane" || { touch "$OUT/.done/${env}_sft$SUF.failed"; return 1; }
  run_job "${env}_sft$SUF" "$lane" "$CAP_SFT" GPU "$PY" launch/sft.py \
    --config "experiments/${env}.py:sft_gpu" --workdir "$OUT/${env}_sft$SUF" "${MODEL[@]}" "${SFT_ARGS[@]}"
  sft_rl "$env" grpo "$lane"
}

lane_b() {  # lane_b ENV LANE: base-model evaluation -> SFT+GiGPO
  local env=$1 lane=$2
  run_job "${env}_base" "$lane" "$CAP_EVAL" GPU "$PY" launch/eval.py \
    --config "experiments/${env}.py:grpo_gpu" --output "$OUT/${env}_base/eval.json" \
    "${MODEL[@]}" "${EVAL_ARGS[@]}"
  sft_rl "$env" gigpo "$lane"
}

rl_base() {  # rl_base NAME CONFIG LANE [args]: RL from the base model for --rl-seconds
  local name=$1 config=$2 lane=$3 secs=$RL_SECONDS; shift 3
  local left=$(( $(time_left) - RL_OVERHEAD ))
  # both runs of a pair start together: the same shortened budget
  if [ "$BUDGET" -gt 0 ] && [ "$SMOKE" != 1 ] && [ "$FIXED_LENGTH" != 1 ] && [ "$left" -lt "$secs" ]; then
    secs=$left
  fi
  run_job "$name" "$lane" $(( secs + RL_OVERHEAD + RL_SLACK )) GPU "$PY" launch/run.py \
    --config "experiments/$config" --workdir "$OUT/$name" "${MODEL[@]}" \
    --config.train.max_seconds="$secs" "${RL_ARGS[@]}" "$@"
}

report() {  # report ENV LABELS DIFFS: learning_report on the collected results
  local env=$1 labels=$2 diffs=$3 runs=() l
  for l in ${labels//,/ }; do runs+=("$RESULTS/${env}_$l"); done
  say "report $env -> $RESULTS/report_$env"
  if ! timeout 300 "$PY" benchmarks/analysis/learning_report.py "${runs[@]}" --labels "$labels" \
      --diff "$diffs" --seeds --out "$RESULTS/report_$env" > "$RESULTS/logs/report_$env.log" 2>&1; then
    say "FAILED: report $env ($RESULTS/logs/report_$env.log)"; tail -n 3 "$RESULTS/logs/report_$env.log"
    REPORT_FAILED=1
    return
  fi
  "$PY" - "$RESULTS/report_$env/gain.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
def line(name, e):
    if "gain" not in e:
        return f"  {name}: {e.get('missing', 'no pair of evaluations')}"
    return (f"  {name}: {e['before_avg']:.3f} -> {e['after_avg']:.3f}  diff {100 * e['gain']:+.1f} "
            f"points, 95% CI [{100 * e['gain_ci95_low']:+.1f}, {100 * e['gain_ci95_high']:+.1f}] "
            f"({e['tasks']} tasks x {e['samples_per_task']})")
for label, e in r.items():
    if label != "differences":
        steps = e.get("avg_by_step", {})
        print(f"  {label}: " + (", ".join(f"step {k}: {v:.3f}" for k, v in steps.items())
                                or e.get("missing", "no evaluation")))
for pair, e in r.get("differences", {}).items():
    where = f" ({e['b']}@{e['b_step']} - {e['a']}@{e['a_step']})" if "b" in e else ""
    print(line(pair + where, e))
EOF
}

echo "SFT -> RL comparison in $OUT (results: $RESULTS): $LANES lane(s) on $GPUS GPU(s) ($PER_GPU per GPU)," \
  "stages $STAGE$([ "$BUDGET" -gt 0 ] && echo ", budget $BUDGET s")$([ "$SMOKE" = 1 ] && echo ' (smoke: CPU, tiny model)')"
if has_stage record; then
  record babyai babyai.py:sft_gpu "$BABYAI_EXPERTS" 0 &
  record textcraft textcraft.py:sft_gpu "$TEXTCRAFT_EXPERTS" 2 &
  wait
fi
if has_stage wave1; then
  lane_a babyai "$BABYAI_EXPERTS" 0 &
  lane_b babyai 1 &
  lane_a textcraft "$TEXTCRAFT_EXPERTS" 2 &
  lane_b textcraft 3 &
  wait
fi
if has_stage wave2; then
  rl_base "babyai_grpo$SUF" babyai.py:grpo_gpu 0 &
  rl_base "babyai_gigpo$SUF" babyai.py:gigpo_gpu 1 &
  case "$WAVE2_PAIR2" in
    horizons)
      rl_base "babyai_fixed6$SUF" babyai.py:grpo_gpu 2 --config.horizon.type=fixed \
        --config.horizon.turns=6 &
      rl_base "babyai_fixed20$SUF" babyai.py:grpo_gpu 3 --config.horizon.type=fixed \
        --config.horizon.turns=20 & ;;
    babyai_seed1)
      rl_base babyai_grpo_s1 babyai.py:grpo_gpu 2 --config.seed=1 &
      rl_base babyai_gigpo_s1 babyai.py:gigpo_gpu 3 --config.seed=1 & ;;
    textcraft_base)
      rl_base "textcraft_grpo$SUF" textcraft.py:grpo_gpu 2 &
      rl_base "textcraft_gigpo$SUF" textcraft.py:gigpo_gpu 3 & ;;
  esac
  wait
fi
REPORT_FAILED=0
if has_stage report; then
  # sft = the SFT policy (step-0 evaluation of the run that continues from it); a second
  # evaluation of the same policy (sft_gigpo@first) and of the base model (grpo@first) are
  # controls: their differences show the evaluation's own sampling noise
  report babyai base,sft_grpo,sft_gigpo,grpo,gigpo,grpo_s1,gigpo_s1 \
    "sft_grpo@first:base,sft_grpo:sft_grpo@first,sft_gigpo:sft_gigpo@first,sft_gigpo:sft_grpo,sft_grpo:base,gigpo:grpo,gigpo_s1:grpo_s1,sft_gigpo@first:sft_grpo@first,grpo@first:base"
  report textcraft base,sft_grpo,sft_gigpo,grpo,gigpo \
    "sft_grpo@first:base,sft_grpo:sft_grpo@first,sft_gigpo:sft_gigpo@first,sft_gigpo:sft_grpo,sft_grpo:base,gigpo:grpo,sft_gigpo@first:sft_grpo@first"
fi
finish
