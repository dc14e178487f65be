# Shared job machinery of the GPU drivers (benchmarks/gpu/sft_rl_comparison.sh, benchmarks/gpu/sft_rl_families.sh):
# lanes (one job at a time per lane, lane -> GPU), time caps under a call's --budget, done
# markers (a job done before is skipped), per-job timings and the copy of each job's small files
# to the results folder right after it ends. Sourced, not run.
#
# The sourcing script sets, before calling anything here:
#   OUT RESULTS LOGS   run folders, the results folder and the job logs
#   T0 BUDGET REPORT_RESERVE STAGE   the call's start (s), its budget (0: none), the seconds
#                      kept for the report, the stages asked for (recorded in timings.jsonl)
#   GPUS LANES PY SMOKE   GPUs, lanes, the Python interpreter, 1 for the CPU smoke mode
# and may set (defaults below): PER_GPU, MEM_FRACTION (with PER_GPU > 1), DRY_RUN
# (print the plan, write nothing), FIXED_LENGTH (never shorten a job to fit the budget), and
# JOB_RESUME=1 for one run_job call (a job that resumes in its folder: never skipped for a cap
# longer than the time left, never moved aside), JOB_MEM_FRACTION for one run_job call (that
# job's XLA_PYTHON_CLIENT_MEM_FRACTION instead of MEM_FRACTION), and
# the arrays LANE_GPU (lane -> the CUDA device id it runs on; default lane % GPUS) and LANE_LOCK
# (lane -> the name of its lock in $OUT/.lanes; default the lane number): two drivers sharing
# one $OUT on different GPUs must not share a lock name, or one waits for the other.

PER_GPU=${PER_GPU:-1}
DRY_RUN=${DRY_RUN:-0}
FIXED_LENGTH=${FIXED_LENGTH:-0}
MEM_FRACTION=${MEM_FRACTION:-0.90}

say() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
time_left() {  # seconds a job starting now may run (a large number without --budget)
  if [ "$BUDGET" -gt 0 ]; then echo $(( BUDGET - REPORT_RESERVE - ($(date +%s) - T0) )); else echo 100000; fi
}

make_tiny_model() {  # make_tiny_model DIR: a tiny random Llama with SmolLM2's tokenizer (smoke runs)
  [ -f "$1/config.json" ] && return 0
  "$PY" - "$1" <<'PYEOF'
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
PYEOF
}

collect() {  # collect NAME: the job's small files (JSONL over 64 KiB as .gz) and log -> $RESULTS
  local name=$1
  if [ -d "$OUT/$name/rl" ] || [ -d "$OUT/$name/sft" ]; then
    # a launch/sft_rl.py pipeline: its RL run as NAME, its SFT run and expert metas as NAME_sft
    local part label
    for part in rl sft; do
      label=$name; [ "$part" = sft ] && label=${name}_sft
      [ -d "$OUT/$name/$part" ] || continue
      timeout 120 "$PY" benchmarks/analysis/learning_report.py "$OUT/$name/$part" --labels "$label" \
        --collect --out "$RESULTS" > /dev/null 2>> "$RESULTS/logs/collect.err" ||
        say "collect $name/$part failed"
    done
    if ls "$OUT/$name"/experts/*.meta.json > /dev/null 2>&1; then
      mkdir -p "$RESULTS/${name}_sft" && cp "$OUT/$name"/experts/*.meta.json "$RESULTS/${name}_sft/"
    fi
  elif [ -d "$OUT/$name" ]; then
    timeout 120 "$PY" benchmarks/analysis/learning_report.py "$OUT/$name" --labels "$name" --collect \
      --out "$RESULTS" > /dev/null 2>> "$RESULTS/logs/collect.err" || say "collect $name failed"
  else
    say "collect $name: no run folder $OUT/$name, only its log reaches $RESULTS"
  fi
  grep -v "Sampling rejected\|Some donated buffers\|warnings.warn(\"Some donated" "$LOGS/$name.log" \
    2>/dev/null | cut -c1-2000 | tail -n 600 > "$RESULTS/logs/$name.log"
}

timing() {  # timing NAME LANE GPU START END EXIT CAP STATUS (times from this call's start, T0)
  printf '{"job": "%s", "lane": %s, "gpu": "%s", "start_s": %s, "end_s": %s, "seconds": %s, "exit": %s, "timeout_s": %s, "status": "%s", "call_t0": %s, "call": "%s", "stages": "%s"}\n' \
    "$1" "$2" "$3" "$(( $4 - T0 ))" "$(( $5 - T0 ))" "$(( $5 - $4 ))" "$6" "$7" "$8" "$T0" "$T0.$$" "$STAGE" \
    >> "$RESULTS/timings.jsonl"
}

run_job() {  # run_job NAME LANE CAP CPU|GPU CMD...: on lane LANE (one job at a time per lane)
  local name=$1 lane=$(( $2 % LANES )) cap=$3 kind=$4; shift 4
  local gpu=${LANE_GPU[$lane]:-$(( lane % GPUS ))} fd left t start end rc status
  if [ -f "$OUT/.done/$name" ]; then
    # done, but its small files never reached $RESULTS (a copy cut short): copy them now
    [ "$DRY_RUN" != 1 ] && [ -d "$OUT/$name" ] && [ ! -d "$RESULTS/$name" ] && collect "$name"
    say "skip $name (done before)"; return 0
  fi
  if [ "$DRY_RUN" = 1 ]; then
    echo "plan: $name  lane $lane$([ "$kind" = GPU ] && echo ", GPU $gpu" || echo ", CPU")$([ -n "${JOB_MEM_FRACTION:-}" ] && echo ", memory $JOB_MEM_FRACTION")  cap $cap s: $*"
    return 0
  fi
  exec {fd}> "$OUT/.lanes/${LANE_LOCK[$lane]:-$lane}"
  flock "$fd"
  left=$(time_left); t=$cap; [ "$left" -lt "$t" ] && t=$left
  local resume=${JOB_RESUME:-0} grace=15
  if [ "$resume" = 1 ]; then
    # SIGTERM at its limit makes launch/run.py checkpoint its last step (an update or an
    # evaluation in progress finishes first): give it time for that inside the budget
    grace=45; [ $(( left - grace )) -lt "$t" ] && t=$(( left - grace ))
  fi
  if [ "$FIXED_LENGTH" = 1 ] && [ "$left" -lt "$cap" ] && [ "$resume" != 1 ]; then
    say "SKIPPED $name: its cap ($cap s) does not fit in the $left s left (--fixed-length)"
    touch "$OUT/.done/$name.failed"; exec {fd}>&-; return 1
  fi
  if [ "$FIXED_LENGTH" = 1 ] && [ -e "$OUT/$name" ] && [ "$resume" != 1 ]; then
    # an earlier attempt: start afresh (a resume job goes on from it)
    mkdir -p "$OUT/.attempts" && mv "$OUT/$name" "$OUT/.attempts/$name.$(date +%s)"
  fi
  # a job gets at least 30 s (or its whole cap, when that is shorter); a resume job's limit is
  # what is left after its checkpoint grace, which may be short or below zero
  local need=30; [ "$cap" -lt "$need" ] && need=$cap
  if [ "$left" -lt 30 ] || [ "$t" -lt "$need" ]; then
    say "SKIPPED $name: $left s left of the budget, $t s for the job after its $grace s grace"
    now=$(date +%s); timing "$name" "$lane" "$gpu" "$now" "$now" -1 "$t" skipped
    touch "$OUT/.done/$name.failed"; exec {fd}>&-; return 1
  fi
  local envs=()
  if [ "$kind" = GPU ] && [ "$SMOKE" != 1 ]; then
    envs+=(CUDA_VISIBLE_DEVICES=$gpu)
    if [ -n "${JOB_MEM_FRACTION:-}" ]; then envs+=(XLA_PYTHON_CLIENT_MEM_FRACTION=$JOB_MEM_FRACTION)
    elif [ "$PER_GPU" -gt 1 ]; then envs+=(XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM_FRACTION); fi
  fi
  [ "$kind" = CPU ] && envs+=(JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES=)
  say "start: $name (lane $lane$([ "$kind" = GPU ] && echo ", GPU $gpu"), limit $t s) -> $LOGS/$name.log"
  start=$(date +%s)
  if [ "$resume" = 1 ]; then  # one log over the job's sessions
    echo "=== session of $(date -u +%FT%TZ), limit $t s" >> "$LOGS/$name.log"
    env "${envs[@]}" timeout -k "$grace" "$t" "$@" < /dev/null >> "$LOGS/$name.log" 2>&1
  else
    env "${envs[@]}" timeout -k 15 "$t" "$@" < /dev/null > "$LOGS/$name.log" 2>&1
  fi
  rc=$?
  end=$(date +%s)
  exec {fd}>&-
  if [ "$rc" -eq 0 ]; then status=ok; touch "$OUT/.done/$name"
  elif { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && finished_in_log "$LOGS/$name.log"; then
    # launch/run.py printed its closing summary and its limit came while it shut down: done
    status=ok; touch "$OUT/.done/$name"
    say "note: $name reached its limit after 'run finished:' (while shutting down): done"
  elif { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && [ "$resume" = 1 ]; then
    status=paused; touch "$OUT/.done/$name.failed"  # the next call resumes it
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status=timeout; touch "$OUT/.done/$name.failed"
  else status=failed; touch "$OUT/.done/$name.failed"; fi
  timing "$name" "$lane" "$gpu" "$start" "$end" "$rc" "$t" "$status"
  collect "$name"
  say "$(case $status in ok) echo done ;; paused) echo "paused (a later call resumes it)" ;;
         *) echo "FAILED ($status)" ;; esac): $name in $(( end - start )) s (exit $rc)$([ "$status" = ok ] || echo "; $RESULTS/logs/$name.log: $(tail -n 1 "$LOGS/$name.log" | cut -c1-300)")"
  [ "$rc" -eq 0 ]
}

finished_in_log() {  # finished_in_log LOG: its last session printed launch/run.py's closing
  # "run finished:" summary, without a final evaluation that is "not a result"
  awk 'index($0, "=== session of") == 1 { f = 0 } /^run finished:/ { f = 1 }
       /^  eval @ step [0-9]+: not a result/ { f = 0 } END { exit !f }' "$1"
}

wait_for() {  # wait_for NAME: until job NAME is done (0) or failed / out of time (1)
  [ "$DRY_RUN" = 1 ] && return 0
  while :; do
    [ -f "$OUT/.done/$1" ] && return 0
    [ -f "$OUT/.done/$1.failed" ] && return 1
    [ "$(time_left)" -lt 30 ] && return 1
    sleep 2
  done
}

finish() {  # finish [-- JOB...]: this call's job timings; exit 1 if any job failed or was skipped
  # (or the report); after `--` only the named jobs' markers count (none named: none count), so a
  # driver sharing --out with another reports its own
  say "finished"
  if [ -f "$RESULTS/timings.jsonl" ]; then
    "$PY" - "$RESULTS/timings.jsonl" "$T0.$$" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("call") == sys.argv[2]]  # start second and driver pid
print("job timings of this call (s, from its start):" if rows else "no job ran in this call")
for r in rows:
    print(f"  {r['job']:<22} lane {r['lane']} GPU {r['gpu']}  {r['start_s']:>5} -> {r['end_s']:>5}"
          f"  {r['seconds']:>4} s  limit {r['timeout_s']:>5}  {r['status']} (exit {r['exit']})")
PYEOF
  fi
  local failed name
  if [ "${1:-}" = "--" ]; then
    shift
    failed=$(for name in "$@"; do [ -f "$OUT/.done/$name.failed" ] && printf '%s ' "$name"; done)
  else
    failed=$([ -d "$OUT/.done" ] && cd "$OUT/.done" && ls -- *.failed 2>/dev/null \
             | sed 's/\.failed$//' | tr '\n' ' ')
  fi
  if [ -n "$failed" ] || [ "${REPORT_FAILED:-0}" = 1 ]; then
    echo "failed or skipped: ${failed}$([ "${REPORT_FAILED:-0}" = 1 ] && echo ' report')"
    exit 1
  fi
}
