#!/usr/bin/env bash
# Run a list of independent GPU jobs, one or more lanes per GPU, each under a time cap, with a
# done marker per job (a job done before is skipped) and its small files copied to the results
# folder as soon as it ends (benchmarks/gpu/jobs_lib.sh, the machinery of sft_rl_comparison.sh and
# sft_rl_families.sh). For seeds and ablations that do not fit those two drivers' fixed plans.
#
#   bash benchmarks/gpu/jobs.sh --jobs JOBS --out runs/seeds --results results/seeds \
#        --gpu-ids 0,1 [--per-gpu 1] [--budget 590] [--archive OUT.tgz] [--only REGEX] [--dry-run]
#
# JOBS: one job per line, `NAME CAP_SECONDS LANE [after=JOB[,JOB...]] [mem=F] [resume] COMMAND...`
# (blank lines and `#` comments ignored; LANE picks the lane, lanes map to --gpu-ids in turn,
# --per-gpu lanes per GPU). `mem=F` gives that job F of its GPU's memory
# (XLA_PYTHON_CLIENT_MEM_FRACTION) instead of the lane's even share 0.9 / --per-gpu, so jobs of
# different sizes can share a GPU (e.g. two of 0.35 and two of 0.1); the fractions of the jobs
# that run at the same time must add up to at most ~0.9 (not checked: lanes start jobs on their
# own; benchmarks/gpu/lane_memory.py says, before a session, whether each job's KV cache fits
# its share). A lane runs its jobs in file order; lanes run in parallel. `after=` makes a job
# wait until the named jobs (any lane) are done, e.g. an RL run for the SFT policy it starts from;
# if one of them failed or was skipped, the job is skipped too. With --budget (s, this call) a job
# whose cap does not fit in the time left is skipped (not shortened: runs stay comparable) and
# runs in a later call (the driver run again with the same --out: done jobs are skipped, failed
# and skipped ones tried again, from scratch). A `resume` job is longer than one call: it runs
# for its cap or what is left of the budget less 45 s, whichever is less, then gets SIGTERM
# (launch/run.py then checkpoints its last finished step; SIGKILL 45 s later), and a later call
# runs the same command again in the same folder, which resumes it (launch/run.py resumes from
# its checkpoint and counts train.max_seconds over every session); a job cut off after its
# log's last session printed launch/run.py's "run finished:" summary is done. `{out}` in a
# command is replaced by --out. A job's run folder is OUT/NAME (its small files are collected
# from there, an earlier attempt is moved aside from there): a command whose `--workdir` names
# any other folder is refused before anything starts (exit 2), since its files would be lost
# with the machine. Exit code 1 if any of this call's jobs (the list, after --only) failed or
# was skipped; the failed markers of other jobs (another list sharing --out) are neither
# cleared nor counted. In the results folder a
# JSON-lines file over 64 KiB is stored gzip-compressed (X.jsonl.gz, lossless; results/README.md
# says why).
# --archive FILE packs the results folder into one tar.gz when the call ends (failed jobs or
# not): a GPU call returns only a few files from its output folder, so put FILE there and the
# results folder outside it. --only REGEX keeps the jobs whose NAME matches the extended regular
# expression (e.g. '_s1$': one seed of a file that lists three), the others are not mentioned;
# a selected job that runs `after=` an unselected one not done before is refused (exit 2).
set -uo pipefail
cd "$(dirname "$0")/../.."

JOBS=
OUT=runs/jobs
RESULTS=
GPU_IDS=0
PER_GPU=1
BUDGET=0
DRY_RUN=0
ARCHIVE=
ONLY=
PY=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) JOBS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    --gpu-ids) GPU_IDS=$2; shift 2 ;;
    --per-gpu) PER_GPU=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --archive) ARCHIVE=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -f "$JOBS" ] || { echo "--jobs FILE is required (got '${JOBS}')" >&2; exit 2; }
RESULTS=${RESULTS:-$OUT/results}
IFS=, read -r -a GPU_LIST <<< "$GPU_IDS"
GPUS=${#GPU_LIST[@]}
LANES=$(( GPUS * PER_GPU ))
MEM_FRACTION=$(awk "BEGIN {printf \"%.2f\", 0.9 / $PER_GPU}")
T0=$(date +%s)
REPORT_RESERVE=5
STAGE=jobs
SMOKE=0
FIXED_LENGTH=1
LOGS=$OUT/logs
# shellcheck source=benchmarks/gpu/jobs_lib.sh
source benchmarks/gpu/jobs_lib.sh
# lane l runs on GPU GPU_LIST[l % GPUS]; its lock is named by that GPU, so drivers sharing one
# --out on different GPUs run side by side and two on the same GPU lane take turns
declare -a LANE_GPU=() LANE_LOCK=()
for (( l = 0; l < LANES; l++ )); do
  LANE_GPU[l]=${GPU_LIST[$(( l % GPUS ))]}
  LANE_LOCK[l]="gpu${LANE_GPU[l]}_$(( l / GPUS ))"
done

job_command() {  # job_command REST: a jobs-file command with {out} replaced by --out
  printf '%s' "${1//\{out\}/$OUT}"
}

job_lines() {  # the jobs file without blank lines and # comments (with --only, its matches)
  local name rest
  grep -v -E '^[[:space:]]*(#|$)' "$JOBS" | while read -r name rest; do
    if [ -z "$ONLY" ] || [[ "$name" =~ $ONLY ]]; then printf '%s %s\n' "$name" "$rest"; fi
  done
}

check_workdirs() {  # every job's --workdir must be OUT/NAME (collect, move-aside and resume use it)
  local name cap lane rest cmd wd bad=0
  while read -r name cap lane rest; do
    cmd=$(job_command "$rest")
    [[ "$cmd" =~ --workdir[=\ ]+([^ ]+) ]] || continue
    wd=${BASH_REMATCH[1]}
    if [ "$(realpath -m -- "$wd")" != "$(realpath -m -- "$OUT/$name")" ]; then
      echo "job $name writes to --workdir $wd, not to $OUT/$name: its files would not be collected into $RESULTS (use --out $(dirname -- "$wd"), or {out}/$name in $JOBS)" >&2
      bad=1
    fi
  done < <(job_lines)
  return "$bad"
}

lane_jobs() {  # lane_jobs LANE: the lane's jobs, in file order, on its physical GPU
  local want=$1 name cap lane rest
  while read -r name cap lane rest; do
    [ $(( lane % LANES )) -eq "$want" ] || continue
    if [[ "$rest" == after=* ]]; then
      local deps=${rest%% *} dep ready=1
      rest=${rest#* }
      deps=${deps#after=}
      for dep in ${deps//,/ }; do wait_for "$dep" || ready=0; done
      if [ "$ready" != 1 ] && [ ! -f "$OUT/.done/$name" ]; then
        say "SKIPPED $name: a job it runs after ($deps) failed or ran out of time"
        [ "$DRY_RUN" = 1 ] || touch "$OUT/.done/$name.failed"
        continue
      fi
    fi
    local mem=
    if [[ "$rest" == mem=* ]]; then mem=${rest%% *}; mem=${mem#mem=}; rest=${rest#* }; fi
    local resume=0
    if [[ "$rest" == "resume "* ]]; then resume=1; rest=${rest#resume }; fi
    JOB_MEM_FRACTION=$mem JOB_RESUME=$resume run_job "$name" "$lane" "$cap" GPU \
      bash -c "$(job_command "$rest")"
  done < <(job_lines)
}

check_mem_fractions() {  # every mem=F is a fraction in (0, 0.95]
  local name cap lane rest f bad=0
  while read -r name cap lane rest; do
    [[ "$rest" == after=* ]] && rest=${rest#* }
    [[ "$rest" == mem=* ]] || continue
    f=${rest%% *}; f=${f#mem=}
    if ! [[ "$f" =~ ^(0?\.[0-9]+|0)$ ]] || awk "BEGIN {exit !($f <= 0 || $f > 0.95)}"; then
      echo "job $name: mem=$f is not a fraction of the GPU's memory in (0, 0.95]" >&2
      bad=1
    fi
  done < <(job_lines)
  return "$bad"
}

check_selection() {  # with --only: a selected job's after= jobs are selected or done before
  local name cap lane rest dep bad=0
  [ -n "$ONLY" ] || return 0
  while read -r name cap lane rest; do
    [[ "$rest" == after=* ]] || continue
    rest=${rest%% *}
    rest=${rest#after=}
    for dep in ${rest//,/ }; do
      if ! [[ "$dep" =~ $ONLY ]] && [ ! -f "$OUT/.done/$dep" ]; then
        echo "job $name runs after $dep, which --only '$ONLY' leaves out and no call has done:" \
             "select it too" >&2
        bad=1
      fi
    done
  done < <(job_lines)
  return "$bad"
}

check_workdirs || exit 2
check_mem_fractions || exit 2
check_selection || exit 2
if [ "$DRY_RUN" != 1 ]; then
  mkdir -p "$OUT/.done" "$OUT/.lanes" "$LOGS" "$RESULTS/logs"
  # this call's jobs that failed or were skipped in an earlier call are tried again; the markers
  # of jobs it does not run (another list sharing --out, or left out by --only) stay
  while read -r name _; do rm -f "$OUT/.done/$name.failed"; done < <(job_lines)
fi
echo "jobs of $JOBS: $LANES lane(s) on GPU(s) $GPU_IDS ($PER_GPU per GPU), out $OUT, results $RESULTS"
for (( l = 0; l < LANES; l++ )); do lane_jobs "$l" & done
wait
if [ -n "$ARCHIVE" ] && [ "$DRY_RUN" != 1 ]; then  # before finish, which exits 1 on a failure
  mkdir -p "$(dirname "$ARCHIVE")"
  if tar czf "$ARCHIVE" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"; then
    say "results packed into $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
  else
    say "packing $RESULTS into $ARCHIVE failed"
  fi
fi
mapfile -t CALL_JOBS < <(job_lines | cut -d' ' -f1)
finish -- "${CALL_JOBS[@]}"  # this call's jobs only: another list may share --out
