#!/usr/bin/env bash
# Base -> SFT -> SFT+GRPO (ScalingInter-RL) on the families without a learning result yet: deep
# search and ScienceWorld (webnav, MiniWoB++, is mapped but has no *_gpu configs yet), every
# evaluation on held-out tasks x 4 samples, then the differences with paired bootstrap 95%
# intervals over tasks (benchmarks/analysis/learning_report.py). The sibling of sft_rl_comparison.sh.
#
#   bash benchmarks/gpu/sft_rl_families.sh --stage record --out runs/families       # CPU: experts
#   bash benchmarks/gpu/sft_rl_families.sh --stage wave1,report --gpus 4 --budget 560 # one GPU call
#   bash benchmarks/gpu/sft_rl_families.sh --smoke --out /tmp/fam                     # CPU, tiny model
#
# Per family F (config prefix: deepsearch, sciworld, webnav; environment: deepsearch,
# scienceworld, miniwob) two lanes, one GPU each with --gpus 4 and two families:
#   lane A: record F's experts (skipped when <out>/experts/<env>.meta.json exists) -> F_sft
#           (launch/sft.py, experiments/F_sft_gpu.py, --sft-seconds) -> F_sft_grpo (RL from the
#           SFT policy: its step-0 evaluation is the SFT policy's, the last one SFT + RL)
#   lane B: F_grpo: RL from the base model (experiments/F_grpo_gpu.py); its step-0 evaluation is
#           the base model's, the last one RL alone
# Both RL runs train for --rl-seconds, less if --budget is short. wave2 (optional, after wave1
# in the same --out): per family two longer RL runs from F_sft's policy, --rl-long-seconds each,
# seeds 0 and 1 (F_sft_grpo_long, F_sft_grpo_long_s1: lanes A and B). Stages (--stage: all =
# record,wave1,report, or a comma-separated list): record (experts only, CPU), wave1, wave2, report
# (<results>/report_F/gain.json and curves.png; ScienceWorld also report_F_score, its 0-100 score,
# and success counted as score 100 only). A job with a marker in <out>/.done is skipped. Each job
# runs under `timeout`; its wall time goes to <results>/timings.jsonl and its small files
# (metrics.jsonl, summary.json, config.json, eval_episodes.jsonl; .jsonl.gz when over 64 KiB)
# and a filtered log to
# <results>/<job>/ and <results>/logs/ as soon as it ends. Exit code 1 if any job failed.
set -uo pipefail
cd "$(dirname "$0")/../.."

GPUS=4
STAGE=all
OUT=runs/families
RESULTS=
SMOKE=0
BUDGET=0
FAMILIES=deepsearch,sciworld
RL_SECONDS=150
RL_LONG_SECONDS=300
SFT_SECONDS=100
RECORD_WORKERS=$(( $(nproc) / 4 ))
[ "$RECORD_WORKERS" -gt 16 ] && RECORD_WORKERS=16
[ "$RECORD_WORKERS" -lt 1 ] && RECORD_WORKERS=1
declare -A EXPERT_EPISODES=([deepsearch]=1000 [sciworld]=300 [webnav]=500)
PY=${PYTHON:-python3}

while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) GPUS=$2; shift 2 ;;
    --stage) STAGE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --families) FAMILIES=$2; shift 2 ;;
    --rl-seconds) RL_SECONDS=$2; shift 2 ;;
    --rl-long-seconds) RL_LONG_SECONDS=$2; shift 2 ;;
    --sft-seconds) SFT_SECONDS=$2; shift 2 ;;
    --experts) EXPERT_EPISODES[${2%%=*}]=${2#*=}; shift 2 ;;   # --experts sciworld=300
    --record-workers) RECORD_WORKERS=$2; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$STAGE" = all ] && STAGE=record,wave1,report
for s in ${STAGE//,/ }; do
  case "$s" in record|wave1|wave2|report) ;; *) echo "unknown stage $s" >&2; exit 2 ;; esac
done
has_stage() { [[ ",$STAGE," == *",$1,"* ]]; }
env_of() {  # the environment family of a config prefix
  case "$1" in deepsearch) echo deepsearch ;; sciworld) echo scienceworld ;; webnav) echo miniwob ;;
    *) echo "unknown family $1 (deepsearch | sciworld | webnav)" >&2; return 1 ;; esac
}
for f in ${FAMILIES//,/ }; do env_of "$f" > /dev/null || exit 2; done

RESULTS=${RESULTS:-$OUT/results}
LOGS=$OUT/logs
EXPERTS=$OUT/experts
mkdir -p "$LOGS" "$RESULTS/logs" "$OUT/.done" "$OUT/.lanes"
rm -f "$OUT"/.done/*.failed
T0=$(date +%s)
REPORT_RESERVE=25
source benchmarks/gpu/jobs_lib.sh  # say, time_left, make_tiny_model, collect, timing, run_job, wait_for

MODEL=()
declare -A FAMILY_ARGS=()   # per family: extra overrides of its runs (word-split)
RL_ARGS=(--config.train.save_every=100000)
SFT_ARGS=(--config.sft.data="$EXPERTS" --config.sft.max_seconds="$SFT_SECONDS"
          --config.sft.eval_after=False)
RECORD_ARGS=()
CAP_RECORD=900
CAP_SFT=$(( SFT_SECONDS + 150 ))
RL_OVERHEAD=230   # an RL run's time besides training: start, two evaluations, compile, save
# ScienceWorld's evaluations (512 episodes of up to 30 turns) are the longest (docs/RESULTS.md)
declare -A FAMILY_OVERHEAD=([sciworld]=330)
RL_SLACK=60
if [ "$SMOKE" = 1 ]; then
  export JAX_PLATFORMS=cpu
  GPUS=1; RECORD_WORKERS=1
  EXPERT_EPISODES=([deepsearch]=4 [sciworld]=2 [webnav]=4)
  TINY=$OUT/tiny_model
  make_tiny_model "$TINY"
  MODEL=(--config.model.name="$TINY")
  SMALL=(--config.learner.attention_impl=chunked --config.rollout.max_batch=8
         --config.rollout.max_concurrency=4 --config.learner.micro_batch_size=1
         --config.learner.logprob_batch_size=1 --config.train.eval_tasks=2
         --config.train.eval_samples=1 --config.train.eval_horizon=3)
  RL_ARGS=(--config.train.save_every=100000 --config.train.total_steps=1
           --config.train.tasks_per_step=2 --config.train.samples_per_task=2 "${SMALL[@]}")
  RL_SECONDS=0; RL_OVERHEAD=0; RL_SLACK=1200
  SFT_ARGS=(--config.sft.data="$EXPERTS" --config.sft.steps=2 --config.sft.batch_size=2
            --config.sft.eval_after=False "${SMALL[@]}")
  CAP_SFT=900
  # two JVMs (~2 GB each) at most on a small machine
  FAMILY_ARGS[sciworld]="--config.env.replicas=1 --config.env.server_args.scienceworld=--pool-size=2"
fi
FAM_LIST=(${FAMILIES//,/ })
LANES=$(( 2 * ${#FAM_LIST[@]} ))


record() {  # record FAMILY LANE
  local fam=$1 lane=$2 env episodes workers=$RECORD_WORKERS
  env=$(env_of "$fam"); episodes=${EXPERT_EPISODES[$fam]}
  if [ -f "$EXPERTS/$env.meta.json" ]; then touch "$OUT/.done/record_$env"
  else
    [ $(( episodes / 50 + 1 )) -lt "$workers" ] && workers=$(( episodes / 50 + 1 ))
    run_job "record_$env" "$lane" "$CAP_RECORD" CPU "$PY" launch/record_experts.py --env "$env" \
      --episodes "$episodes" --out "$EXPERTS" --config "experiments/${fam}.py:sft_gpu" \
      --workers "$workers" --timeout $(( CAP_RECORD - 30 )) --progress_every 100 \
      "${MODEL[@]}" "${RECORD_ARGS[@]}" ${FAMILY_ARGS[$fam]:-} || true
  fi
  [ -f "$EXPERTS/$env.meta.json" ] && cp "$EXPERTS/$env.meta.json" "$RESULTS/experts_$env.meta.json"
  [ -f "$EXPERTS/$env.meta.json" ]
}

overhead() { if [ "$SMOKE" = 1 ]; then echo 0; else echo "${FAMILY_OVERHEAD[$1]:-$RL_OVERHEAD}"; fi; }

rl_seconds_now() {  # rl_seconds_now FAMILY: training seconds of an RL run that starts now
  local left=$(( $(time_left) - $(overhead "$1") ))
  if [ "$BUDGET" -gt 0 ] && [ "$SMOKE" != 1 ] && [ "$left" -lt "$RL_SECONDS" ]; then echo "$left"
  else echo "$RL_SECONDS"; fi
}

lane_a() {  # lane_a FAMILY LANE: record -> SFT -> SFT+GRPO
  local fam=$1 lane=$2 secs
  record "$fam" "$lane" || { say "no expert data for $fam"; touch "$OUT/.done/${fam}_sft.failed"; return 1; }
  run_job "${fam}_sft" "$lane" "$CAP_SFT" GPU "$PY" launch/sft.py \
    --config "experiments/${fam}.py:sft_gpu" --workdir "$OUT/${fam}_sft" "${MODEL[@]}" \
    "${SFT_ARGS[@]}" ${FAMILY_ARGS[$fam]:-} || return 1
  secs=$(rl_seconds_now "$fam")
  if [ "$SMOKE" != 1 ] && [ "$secs" -lt 30 ]; then
    say "SKIPPED ${fam}_sft_grpo: $secs s of training left"; touch "$OUT/.done/${fam}_sft_grpo.failed"
    return 1
  fi
  run_job "${fam}_sft_grpo" "$lane" $(( secs + $(overhead "$fam") + RL_SLACK )) GPU "$PY" launch/run.py \
    --config "experiments/${fam}.py:sft_grpo_gpu" --workdir "$OUT/${fam}_sft_grpo" \
    --config.model.name="$OUT/${fam}_sft/model" --config.train.max_seconds="$secs" "${RL_ARGS[@]}" \
    ${FAMILY_ARGS[$fam]:-}
}

lane_b() {  # lane_b FAMILY LANE: GRPO from the base model (step 0 = the base model)
  local fam=$1 lane=$2 secs
  secs=$(rl_seconds_now "$fam")
  run_job "${fam}_grpo" "$lane" $(( secs + $(overhead "$fam") + RL_SLACK )) GPU "$PY" launch/run.py \
    --config "experiments/${fam}.py:grpo_gpu" --workdir "$OUT/${fam}_grpo" "${MODEL[@]}" \
    --config.train.max_seconds="$secs" "${RL_ARGS[@]}" ${FAMILY_ARGS[$fam]:-}
}

lane_long() {  # lane_long FAMILY LANE SEED: longer RL from F_sft's policy
  local fam=$1 lane=$2 seed=$3 secs=$RL_LONG_SECONDS name left
  name=${fam}_sft_grpo_long$([ "$seed" = 0 ] || echo "_s$seed")
  if [ ! -f "$OUT/.done/${fam}_sft" ]; then say "SKIPPED $name: no ${fam}_sft"; return 1; fi
  left=$(( $(time_left) - $(overhead "$fam") ))
  if [ "$BUDGET" -gt 0 ] && [ "$SMOKE" != 1 ] && [ "$left" -lt "$secs" ]; then secs=$left; fi
  run_job "$name" "$lane" $(( secs + $(overhead "$fam") + RL_SLACK )) GPU "$PY" launch/run.py \
    --config "experiments/${fam}.py:sft_grpo_gpu" --workdir "$OUT/$name" \
    --config.model.name="$OUT/${fam}_sft/model" --config.train.max_seconds="$secs" \
    --config.seed="$seed" "${RL_ARGS[@]}" ${FAMILY_ARGS[$fam]:-}
}

report() {  # report FAMILY [--metric M SUFFIX]
  local fam=$1 metric=${2:-success} suffix=${3:-} dest
  dest=$RESULTS/report_${fam}${suffix}
  say "report $fam ($metric) -> $dest"
  if ! timeout 300 "$PY" benchmarks/analysis/learning_report.py "$RESULTS/${fam}_grpo" \
      "$RESULTS/${fam}_sft_grpo" "$RESULTS/${fam}_sft_grpo_long" "$RESULTS/${fam}_sft_grpo_long_s1" \
      --labels grpo,sft_grpo,long,long_s1 --metric "$metric" \
      --diff "sft_grpo@first:grpo@first,sft_grpo:sft_grpo@first,sft_grpo:grpo@first,grpo:grpo@first,sft_grpo:grpo,long:sft_grpo@first,long_s1:sft_grpo@first,long:grpo@first,long_s1:grpo@first" \
      --out "$dest" > "$RESULTS/logs/report_${fam}${suffix}.log" 2>&1; then
    say "FAILED: report $fam ($RESULTS/logs/report_${fam}${suffix}.log)"
    tail -n 3 "$RESULTS/logs/report_${fam}${suffix}.log"; REPORT_FAILED=1; return
  fi
  "$PY" - "$dest/gain.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
names = {"sft_grpo@first:grpo@first": "SFT - base", "sft_grpo:sft_grpo@first": "SFT+RL - SFT",
         "sft_grpo:grpo@first": "SFT+RL - base", "grpo:grpo@first": "RL - base",
         "sft_grpo:grpo": "SFT+RL - RL", "long:sft_grpo@first": "SFT+RL(long) - SFT",
         "long_s1:sft_grpo@first": "SFT+RL(long, seed 1) - SFT",
         "long:grpo@first": "SFT+RL(long) - base", "long_s1:grpo@first": "SFT+RL(long, seed 1) - base"}
for label in ("grpo", "sft_grpo", "long", "long_s1"):
    e = r.get(label, {})
    steps = e.get("avg_by_step", {})
    if steps or label in ("grpo", "sft_grpo"):
        print(f"  {label}: " + (", ".join(f"step {k}: {v:.3f}" for k, v in steps.items())
                                or e.get("missing", "no evaluation")))
for pair, e in r.get("differences", {}).items():
    if "gain" not in e:
        if "long" not in pair:
            print(f"  {names.get(pair, pair)}: {e.get('missing')}")
        continue
    print(f"  {names.get(pair, pair)}: {e['before_avg']:.3f} -> {e['after_avg']:.3f}  diff "
          f"{100 * e['gain']:+.1f} points, 95% CI [{100 * e['gain_ci95_low']:+.1f}, "
          f"{100 * e['gain_ci95_high']:+.1f}] ({e['tasks']} tasks x {e['samples_per_task']})")
EOF
}

echo "families $FAMILIES in $OUT (results: $RESULTS): $LANES lane(s) on $GPUS GPU(s), stages" \
  "$STAGE$([ "$BUDGET" -gt 0 ] && echo ", budget $BUDGET s")$([ "$SMOKE" = 1 ] && echo ' (smoke: CPU, tiny model)')"
if has_stage record; then
  i=0; for f in "${FAM_LIST[@]}"; do record "$f" $(( 2 * i )) & i=$(( i + 1 )); done; wait
fi
if has_stage wave1; then
  i=0
  for f in "${FAM_LIST[@]}"; do
    lane_a "$f" $(( 2 * i )) &
    lane_b "$f" $(( 2 * i + 1 )) &
    i=$(( i + 1 ))
  done
  wait
fi
if has_stage wave2; then
  i=0
  for f in "${FAM_LIST[@]}"; do
    lane_long "$f" $(( 2 * i )) 0 &
    lane_long "$f" $(( 2 * i + 1 )) 1 &
    i=$(( i + 1 ))
  done
  wait
fi
REPORT_FAILED=0
if has_stage report; then
  for f in "${FAM_LIST[@]}"; do
    report "$f"
    if [ "$f" = sciworld ]; then
      report "$f" reward _score
      report "$f" strict_success _strict
    fi
  done
fi
finish
