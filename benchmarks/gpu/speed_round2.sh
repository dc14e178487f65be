#!/usr/bin/env bash
# Issue 49 (the agent loop at engine speed, round 2): this tree beside an older checkout on one
# H200, in two calls that each fit a 10-minute command.
#
#   bash benchmarks/gpu/speed_round2.sh step  OUT [BASELINE_DIR]   # RL step, old then new
#   bash benchmarks/gpu/speed_round2.sh parts OUT                   # update, engine, rollout
#   bash benchmarks/gpu/speed_round2.sh dtype OUT                   # learner dtype, rollout waits
#   bash benchmarks/gpu/speed_round2.sh engine_dtype OUT            # engine and learner dtype
#   bash benchmarks/gpu/speed_round2.sh prefill OUT                 # prefill call, knobs
#   bash benchmarks/gpu/speed_round2.sh prefill_bf16 OUT            # prefill call in bfloat16
#   bash benchmarks/gpu/speed_round2.sh learner_mfu OUT             # Qwen2.5-1.5B update MFU
#   bash benchmarks/gpu/speed_round2.sh gil OUT                     # the rollout's shared GIL
#   bash benchmarks/gpu/speed_round2.sh trace OUT                   # the rollout's device time
#   bash benchmarks/gpu/speed_round2.sh env OUT                     # BabyAI server replicas
#   bash benchmarks/gpu/speed_round2.sh launch OUT                  # the decode loop on device
#   bash benchmarks/gpu/speed_round2.sh decode_loop OUT             # sampler and loop, split
#   bash benchmarks/gpu/speed_round2.sh host OUT BASELINE_DIR       # host work at 20 turns
#   bash benchmarks/gpu/speed_round2.sh overlap_step OUT            # overlap x workers, 20 turns
#   bash benchmarks/gpu/speed_round2.sh headline_workers OUT        # the headline run, workers
#   bash benchmarks/gpu/speed_round2.sh donation OUT                # a donated launch's wait
#   bash benchmarks/gpu/speed_round2.sh decode_call OUT             # a decode call's fixed cost
#
# step:  the device copy bandwidth; then benchmarks/speed/rl_step.py (--variants packed, 6 steps,
#        --fresh-process) of BASELINE_DIR (a checkout of the code before, e.g.
#        `git archive 2554fb5 agentrl_jax launch experiments environments agentrl_common
#        benchmarks pyproject.toml | tar -x -C DIR`) and of this tree, one after the other, alone
#        on the GPU.
# parts: the learner update with the LM head at every position vs only at scored ones
#        (update_profile.py), the engine alone for both model shapes with the roofline from a
#        bandwidth measured in the same process (engine.py --bandwidth measure), and the
#        rollout's profile (rollout_profile.py: engine busy vs idle, prefill vs decode, host,
#        environment).
# dtype: this tree's RL step with a float32 learner and with a bfloat16 one (the engine
#        float32 in both, the recipe's until 2026-12-03), each a fresh process, one
#        after the other (docs/RESULTS.md: the two learn alike over three seeds); then the rollout
#        profile with the engine's results handed over as they come and after the next decode
#        call is launched (rollout_profile.py --variants base,deliver_late), with the engine
#        thread's CPU and collection seconds that tell waiting from work.
# engine_dtype: this tree's RL step (rl_step.py --steps 6 --variants packed --fresh-process),
#        each a fresh process, one after the other (every arm names both dtypes: the recipe's
#        are bfloat16 since 2026-12-03): (a) float32 engine and learner (the recipe until
#        then), (b) the bfloat16 learner (`--set learner.dtype="'bfloat16'"`, the engine
#        float32), (c) the bfloat16 engine and learner (`--set
#        rollout.engine_dtype="'bfloat16'"`: weights, compute and KV cache of the sampler); then
#        the rollout profile (rollout_profile.py, variant base) with the float32 engine and with
#        the bfloat16 one, each its own process. Timeouts 130 s a step run and 75 s a profile:
#        at most 540 s, within one 10-minute call.
# prefill: why the bfloat16 engine prefills no faster than the float32 one (docs/PERFORMANCE.md,
#        "A bfloat16 engine beside the bfloat16 learner"): the engine's prefill call alone
#        (prefill.py, float32 and bfloat16, dense / flash / flash_in_cache, 20 reps); then the
#        RL step with both in bfloat16 (a) as is, (b) with larger prefill calls
#        (`--set rollout.prefill_tokens="'16384'"`: fewer calls per rollout), (c) with results
#        handed over after the next decode call is launched (`--set
#        rollout.deliver_after_launch=True`). Timeouts 150 s and 3 x 130 s: at most 540 s.
# prefill_bf16: the prefill call alone in bfloat16 (the recipe's engine dtype since 2026-12-03;
#        `prefill`'s 150-s cap cut its bfloat16 half on 2026-12-03): prefill.py --dtypes bfloat16
#        with dense and flash_in_cache, 20 reps. Timeout 150 s.
# learner_mfu: the learner's MFU for the Qwen2.5-1.5B shape (benchmarks/speed/learner.py's
#        default: random weights, T=4096, bf16 compute, float32 masters, 4 x 1 micro-batches, no
#        remat; --steps 3 --warmup 1 --no-forward, as docs/PERFORMANCE.md's "Learner" rows).
#        Timeout 150 s.
# gil:   whether the trainer process's GIL holds the rollout back (the event loop and the engine
#        thread together hold most of one GIL in the bfloat16 profile, docs/PERFORMANCE.md): the
#        rollout profile (rollout_profile.py, one process) with the variants base, switch (GIL
#        switch interval 0.5 ms), workers (the episodes in 4 actor worker processes) and
#        workers_switch, each 3 measured rollouts after a warm-up. Timeout 240 s.
# trace: whether the rollout's prefill calls cost the device what the call alone costs
#        (docs/PERFORMANCE.md, "The rollout's shared GIL, the bfloat16 prefill call and the
#        learner's MFU": a call costs the rollout about twice what prefill.py measures for it
#        alone): the rollout profile, variant base, 3 measured
#        rollouts and one more under the profiler (rollout_profile.py --trace: the device's
#        span and kernel time by XLA program beside the engine's dispatch-to-results clocks
#        and the part of them blocked on the device).
#        Timeout 240 s.
# env:   whether the environment's round trips hold the rollout back (a turn's 256 BabyAI steps
#        queue at one server process: docs/PERFORMANCE.md, "Environments"; four servers did not
#        move a 3.5-s horizon-6 rollout on 2026-11-28, "Prefill KV buckets by default", but the
#        rollout is faster now and 20 turns were never measured): the rollout profile (variant
#        base, 3 measured rollouts) at horizons 6 and 20, each with one BabyAI server (the
#        recipe's `env.replicas`) and with four (`--set env.replicas=4`), each its own process.
#        Timeouts 4 x 110 s.
# launch: whether the decode call's launch waiting for the device costs the rollout time
#        (docs/PERFORMANCE.md, "Issue 49 on one H100: step, rollout and engine on the tree of
#        2026-12-06": the decode window is all dispatch, since XLA:GPU reads the condition of
#        the decode's `lax.while_loop` on the host each iteration): the rollout profile (variant
#        base, 3 measured rollouts) as is, then with XLA's command buffers over while loops and
#        conditionals (`XLA_FLAGS=--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,
#        CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL`: the loop runs as a CUDA graph with conditional
#        nodes, its condition on the device), each its own process. Timeouts 2 x 110 s.
# decode_loop: what makes the rollout's decode step 2.7 ms when the engine alone decodes a
#        greedy batch-256 step in 1.6 ms (docs/PERFORMANCE.md, "Issue 49 on one H100: the
#        rollout's device time and the decode loop on the device"): the engine benchmark
#        (SmolLM2 shape, batch 256, 8 steps a call as the recipe) greedy and at temperature 1
#        (the rollout's sampler), each with the `while` and the `fixed` decode loop
#        (EngineConfig.decode_loop: a trip count XLA knows) in one process; then the rollout
#        profile (variant base, 3 measured rollouts) as is and with `rollout.decode_loop`
#        "fixed", each its own process. Timeouts 2 x 150 s and 2 x 110 s.
# host:  the engine thread's host work at 20 turns, where it is the rollout's critical path
#        (docs/PERFORMANCE.md, "Issue 49 on one H100: our engine beside SGLang in one command,
#        the decode loop, the environment servers"), a baseline tree against this one (the
#        weights as leaves, a prompt's intake: "The weights as leaves", "A prompt's intake"):
#        the rollout profile (variant base, 3 measured rollouts, horizon 20) of BASELINE_DIR
#        (e.g. `git archive 147dc4d agentrl_jax agentrl_common environments launch experiments
#        benchmarks pyproject.toml | tar -x -C DIR`) and of this tree, alternating (baseline,
#        this, baseline, this), each its own process. Timeouts 4 x 130 s.
# gil20: what the engine thread waits for inside its prefill launches at 20 turns (~10 ms a
#        call off the CPU: docs/PERFORMANCE.md, "The two host changes in a 20-turn rollout"):
#        the rollout profile (one process, horizon 20, 3 measured rollouts a variant after a
#        warm-up) with the variants base, switch (GIL switch interval 0.5 ms) and workers (the
#        episodes in 4 actor worker processes: the event loop's Python leaves the engine's
#        process). Timeout 360 s.
# workers_step: whether the episodes in 4 actor worker processes shorten the RL step (one sample
#        of the 20-turn rollout said so: docs/PERFORMANCE.md, "The 20-turn rollout on the fixed
#        tree"): rl_step.py (--steps 6, packed, fresh process) at a fixed horizon of 20 and of 6,
#        rollout.actor_workers 0 then 4, alternating twice at 20. Timeouts 6 x 120 s.
# overlap_step: whether the next rollout overlapped with the update (train.max_staleness 1)
#        shortens the step now that the rollout keeps the device busy a third of its wall
#        (docs/PERFORMANCE.md, "Issue 49 on one H100: the rollout's device time"; on
#        2026-11-29 the overlap did not help, when the update took 1.8 s), with and without 4
#        actor workers: rl_step.py (--steps 6, fresh process) at a fixed horizon of 20, the
#        variants packed and overlap for actor_workers 0 then 4, then both variants at 6 with
#        4 workers. Timeouts 3 x 240 s (each rl_step call runs its two variants).
# headline_workers: the headline run (launch/run.py, experiments/babyai.py:grpo_gpu, its
#        horizons 6 -> 13 -> 20) cut to 240 s of training as in session 53's mean-step
#        measurement, in-process episodes then 4 actor workers (spawned beside the model load),
#        each a fresh process; the mean step over the run and per horizon from each run's
#        metrics. Timeouts 2 x 480 s: under detached.sh, not within one call.
# donation: whether a launch that donates the KV cache its previous call still writes waits for
#        that call (the prefill launches' time off the CPU; benchmarks/speed/
#        donation_dispatch.py, its defaults: 60 arrays [256, 1024, 192] bf16, 100 chained
#        2048^2 products a step). Timeout 120 s.
# decode_call: what the ~5 ms a decode call costs beside its steps is (docs/PERFORMANCE.md,
#        "Issue 49 on one H100, session 64": 16 / 32 / 64 steps a call fit 1.41 ms a step +
#        5.0 ms a call, one sample a row): the engine benchmark (SmolLM2 shape, batch 256,
#        greedy, the bandwidth measured in the first run and given to the others) at 16 and 64
#        steps a call as is, then both with XLA's command buffers (CUDA graphs) off
#        (`--xla_gpu_enable_command_buffer=`: a graph updated each call for buffers that move
#        would be a per-call cost), each its own process; then 16 steps a call under the
#        profiler with the decode program's optimized HLO dumped (a copy of the KV cache at the
#        loop's entry or exit would be a per-call cost): the trace's device time by program
#        (engine.py --profile: the decode program's span against its kernels' busy time, in
#        OUT/engine_traced_16.json and its log), the HLO in OUT/hlo/. Timeouts 120 + 3 x 100
#        + 150 s: at most 570 s, within one 10-minute call.
# Logs and JSON go to OUT; docs/PERFORMANCE.md quotes them with this command.
set -u
PARTS="step|parts|dtype|engine_dtype|prefill|prefill_bf16|learner_mfu|gil|trace|env|launch"
PARTS="$PARTS|decode_loop|host|gil20|workers_step|overlap_step|headline_workers|donation"
PARTS="$PARTS|decode_call"
USAGE="usage: speed_round2.sh $PARTS OUT [BASELINE_DIR]"
PART=${1:?$USAGE}
OUT=${2:?$USAGE}
BASE=${3:-}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
CFG=experiments/babyai.py:grpo_gpu
cd "$HERE"
case "$PART" in
  step)
    python3 benchmarks/speed/copy_bandwidth.py > "$OUT/copy_bandwidth.log" 2>&1
    if [ -n "$BASE" ]; then
      # a checkout from before benchmarks/ had folders keeps rl_step.py at its top level and one
      # experiment file per run
      BASE_RL_STEP=benchmarks/speed/rl_step.py BASE_CFG=$CFG
      [ -f "$BASE/$BASE_RL_STEP" ] || { BASE_RL_STEP=benchmarks/rl_step.py; BASE_CFG=experiments/babyai_grpo_gpu.py; }
      (cd "$BASE" && PYTHONPATH=$BASE:${PYTHONPATH:-} timeout 280 python3 "$BASE_RL_STEP" --config $BASE_CFG --steps 6 \
          --variants packed --fresh-process --label "baseline" --json "$OUT/rl_step_baseline.json" \
          > "$OUT/rl_step_baseline.log" 2>&1)
    fi
    timeout 280 python3 benchmarks/speed/rl_step.py --config $CFG --steps 6 --variants packed \
        --fresh-process --label "this tree" --json "$OUT/rl_step_new.json" > "$OUT/rl_step_new.log" 2>&1
    ;;
  parts)
    [ -n "$BASE" ] && (cd "$BASE" && PYTHONPATH=$BASE:${PYTHONPATH:-} timeout 200 python3 benchmarks/rl_step.py --config experiments/babyai_grpo_gpu.py --steps 6 \
        --variants packed --fresh-process --label "baseline" --json "$OUT/rl_step_baseline.json" \
        > "$OUT/rl_step_baseline.log" 2>&1)
    timeout 150 python3 benchmarks/speed/update_profile.py --config $CFG --variants pallas_segments \
        --lm-head full,scored --json "$OUT/update_profile.json" > "$OUT/update_profile.log" 2>&1
    for shape in smollm2-135m qwen2.5-1.5b; do
      timeout 150 python3 benchmarks/speed/engine.py --shape $shape --bandwidth measure \
          --skip naive,hf,reuse --json "$OUT/engine_$shape.json" > "$OUT/engine_$shape.log" 2>&1
    done
    timeout 150 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 --rollouts 3 \
        --json "$OUT/rollout_profile.json" > "$OUT/rollout_profile.log" 2>&1
    ;;
  dtype)
    F32_ENGINE=(--set rollout.engine_dtype="'float32'")  # the recipe's until 2026-12-03
    python3 benchmarks/speed/copy_bandwidth.py > "$OUT/copy_bandwidth.log" 2>&1
    timeout 200 python3 benchmarks/speed/rl_step.py --config $CFG --steps 6 --variants packed \
        --fresh-process "${F32_ENGINE[@]}" --set learner.dtype="'float32'" \
        --label "float32 learner" --json "$OUT/rl_step_float32.json" \
        > "$OUT/rl_step_float32.log" 2>&1
    timeout 200 python3 benchmarks/speed/rl_step.py --config $CFG --steps 6 --variants packed \
        --fresh-process "${F32_ENGINE[@]}" --set learner.dtype="'bfloat16'" \
        --label "bfloat16 learner" \
        --json "$OUT/rl_step_bfloat16.json" > "$OUT/rl_step_bfloat16.log" 2>&1
    timeout 150 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 --rollouts 3 \
        "${F32_ENGINE[@]}" --variants base,deliver_late --json "$OUT/rollout_profile.json" \
        > "$OUT/rollout_profile.log" 2>&1
    ;;
  engine_dtype)
    # every arm names both dtypes: the recipe's are bfloat16 since 2026-12-03 (float32 before)
    F32_LEARNER=(--set learner.dtype="'float32'")
    BF16_LEARNER=(--set learner.dtype="'bfloat16'")
    F32_ENGINE=(--set rollout.engine_dtype="'float32'")
    BF16_ENGINE=(--set rollout.engine_dtype="'bfloat16'")
    timeout 130 python3 benchmarks/speed/rl_step.py --config $CFG --steps 6 --variants packed \
        --fresh-process "${F32_ENGINE[@]}" "${F32_LEARNER[@]}" \
        --label "float32 engine, float32 learner" \
        --json "$OUT/rl_step_f32_f32.json" > "$OUT/rl_step_f32_f32.log" 2>&1
    timeout 130 python3 benchmarks/speed/rl_step.py --config $CFG --steps 6 --variants packed \
        --fresh-process "${F32_ENGINE[@]}" "${BF16_LEARNER[@]}" \
        --label "float32 engine, bfloat16 learner" \
        --json "$OUT/rl_step_f32_bf16.json" > "$OUT/rl_step_f32_bf16.log" 2>&1
    timeout 130 python3 benchmarks/speed/rl_step.py --config $CFG --steps 6 --variants packed \
        --fresh-process "${BF16_ENGINE[@]}" "${BF16_LEARNER[@]}" \
        --label "bfloat16 engine, bfloat16 learner" \
        --json "$OUT/rl_step_bf16_bf16.json" > "$OUT/rl_step_bf16_bf16.log" 2>&1
    timeout 75 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
        --rollouts 3 "${F32_ENGINE[@]}" --label "float32 engine" \
        --json "$OUT/rollout_profile_f32.json" > "$OUT/rollout_profile_f32.log" 2>&1
    timeout 75 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
        --rollouts 3 "${BF16_ENGINE[@]}" --label "bfloat16 engine" \
        --json "$OUT/rollout_profile_bf16.json" > "$OUT/rollout_profile_bf16.log" 2>&1
    ;;
  prefill)
    BF16=(--set learner.dtype="'bfloat16'" --set rollout.engine_dtype="'bfloat16'")
    timeout 150 python3 benchmarks/speed/prefill.py --dtypes float32,bfloat16 \
        --contenders dense,flash,flash_in_cache --reps 20 --json "$OUT/prefill.json" \
        > "$OUT/prefill.log" 2>&1
    timeout 130 python3 benchmarks/speed/rl_step.py --config $CFG --steps 6 --variants packed \
        --fresh-process "${BF16[@]}" --label "bfloat16, as is" \
        --json "$OUT/rl_step_bf16.json" > "$OUT/rl_step_bf16.log" 2>&1
    timeout 130 python3 benchmarks/speed/rl_step.py --config $CFG --steps 6 --variants packed \
        --fresh-process "${BF16[@]}" --set rollout.prefill_tokens="'16384'" \
        --label "bfloat16, prefill calls of 16,384 tokens" \
        --json "$OUT/rl_step_bf16_prefill16k.json" > "$OUT/rl_step_bf16_prefill16k.log" 2>&1
    timeout 130 python3 benchmarks/speed/rl_step.py --config $CFG --steps 6 --variants packed \
        --fresh-process "${BF16[@]}" --set rollout.deliver_after_launch=True \
        --label "bfloat16, deliver after launch" \
        --json "$OUT/rl_step_bf16_deliver_late.json" > "$OUT/rl_step_bf16_deliver_late.log" 2>&1
    ;;
  prefill_bf16)
    timeout 150 python3 benchmarks/speed/prefill.py --dtypes bfloat16 \
        --contenders dense,flash_in_cache --reps 20 --json "$OUT/prefill_bf16.json" \
        > "$OUT/prefill_bf16.log" 2>&1
    ;;
  learner_mfu)
    timeout 150 python3 benchmarks/speed/learner.py --steps 3 --warmup 1 --no-forward \
        --json "$OUT/learner_mfu.json" > "$OUT/learner_mfu.log" 2>&1
    ;;
  gil)
    timeout 240 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
        --variants base,switch,workers,workers_switch --workers 4 --rollouts 3 \
        --label "GIL: switch interval, actor workers" --json "$OUT/rollout_profile_gil.json" \
        > "$OUT/rollout_profile_gil.log" 2>&1
    ;;
  gil20)
    timeout 360 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
        --variants base,switch,workers --workers 4 --rollouts 3 --horizon 20 \
        --label "GIL at 20 turns: switch interval, actor workers" \
        --json "$OUT/rollout_profile_gil20.json" > "$OUT/rollout_profile_gil20.log" 2>&1
    ;;
  trace)
    timeout 240 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
        --variants base --rollouts 3 --trace --label "device time by program" \
        --json "$OUT/rollout_profile_trace.json" > "$OUT/rollout_profile_trace.log" 2>&1
    ;;
  launch)
    timeout 110 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
        --variants base --rollouts 3 --label "decode loop as is" \
        --json "$OUT/rollout_profile_as_is.json" > "$OUT/rollout_profile_as_is.log" 2>&1
    BUFFERS=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL
    XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=$BUFFERS" \
        timeout 110 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
        --variants base --rollouts 3 --label "command buffers with WHILE and CONDITIONAL" \
        --json "$OUT/rollout_profile_command_buffers.json" \
        > "$OUT/rollout_profile_command_buffers.log" 2>&1
    ;;
  env)
    for horizon in 6 20; do
      for replicas in 1 4; do
        timeout 110 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
            --variants base --rollouts 3 --horizon $horizon --set env.replicas=$replicas \
            --label "horizon $horizon, $replicas BabyAI server(s)" \
            --json "$OUT/rollout_profile_h${horizon}_env${replicas}.json" \
            > "$OUT/rollout_profile_h${horizon}_env${replicas}.log" 2>&1
      done
    done
    ;;
  decode_loop)
    for temp in 0 1; do
      timeout 150 python3 benchmarks/speed/engine.py --shape smollm2-135m --decode-steps 8 \
          --temperature $temp --decode-loop while,fixed --skip naive,hf,reuse \
          --json "$OUT/engine_t${temp}.json" > "$OUT/engine_t${temp}.log" 2>&1
    done
    timeout 110 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
        --variants base --rollouts 3 --label "decode loop: while" \
        --json "$OUT/rollout_profile_while.json" > "$OUT/rollout_profile_while.log" 2>&1
    timeout 110 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
        --variants base --rollouts 3 --set "rollout.decode_loop='fixed'" \
        --label "decode loop: fixed" \
        --json "$OUT/rollout_profile_fixed.json" > "$OUT/rollout_profile_fixed.log" 2>&1
    ;;
  host)
    [ -n "$BASE" ] || { echo "host needs BASELINE_DIR ($USAGE)" >&2; exit 2; }
    for round in 1 2; do
      (cd "$BASE" && PYTHONPATH=$BASE:${PYTHONPATH:-} timeout 130 python3 \
          benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 --variants base \
          --rollouts 3 --horizon 20 --label "baseline, round $round" \
          --json "$OUT/rollout_profile_h20_baseline_$round.json" \
          > "$OUT/rollout_profile_h20_baseline_$round.log" 2>&1)
      timeout 130 python3 benchmarks/speed/rollout_profile.py --config $CFG --replicas 1 \
          --variants base --rollouts 3 --horizon 20 --label "this tree, round $round" \
          --json "$OUT/rollout_profile_h20_new_$round.json" \
          > "$OUT/rollout_profile_h20_new_$round.log" 2>&1
    done
    ;;
  overlap_step)
    for run in "20 0" "20 4" "6 4"; do
      read -r turns workers <<< "$run"
      timeout 240 python3 benchmarks/speed/rl_step.py --config $CFG --steps 6 \
          --variants packed,overlap --fresh-process --set "horizon.type='fixed'" \
          --set "horizon.turns=$turns" --set "rollout.actor_workers=$workers" \
          --label "horizon $turns, $workers actor workers" \
          --json "$OUT/rl_step_overlap_h${turns}_w$workers.json" \
          > "$OUT/rl_step_overlap_h${turns}_w$workers.log" 2>&1
    done
    ;;
  decode_call)
    E="benchmarks/speed/engine.py --shape smollm2-135m --batch 256 --skip naive,hf,reuse"
    timeout 120 python3 $E --decode-steps 16 --json "$OUT/engine_default_16.json" \
        > "$OUT/engine_default_16.log" 2>&1
    BW=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['bandwidth']
                    ['bandwidth_Bps'])" "$OUT/engine_default_16.json" 2> /dev/null)
    [ -n "$BW" ] || BW=measure
    for run in "default 64" "no_command_buffers 16" "no_command_buffers 64"; do
      read -r arm steps <<< "$run"
      flags=${XLA_FLAGS:-}
      [ "$arm" = default ] || flags="$flags --xla_gpu_enable_command_buffer="
      XLA_FLAGS="$flags" timeout 100 python3 $E --bandwidth "$BW" --decode-steps "$steps" \
          --json "$OUT/engine_${arm}_$steps.json" > "$OUT/engine_${arm}_$steps.log" 2>&1
    done
    DUMP=$(mktemp -d)
    XLA_FLAGS="${XLA_FLAGS:-} --xla_dump_to=$DUMP --xla_dump_hlo_as_text \
--xla_dump_hlo_module_re=.*decode.*" timeout 150 python3 $E --bandwidth "$BW" \
        --decode-steps 16 --profile "$OUT/trace" --json "$OUT/engine_traced_16.json" \
        > "$OUT/engine_traced_16.log" 2>&1
    mkdir -p "$OUT/hlo" && cp "$DUMP"/*after_optimizations.txt "$OUT/hlo/" 2> /dev/null
    rm -rf "$DUMP"
    ;;
  donation)
    timeout 120 python3 benchmarks/speed/donation_dispatch.py --json "$OUT/donation_dispatch.json" \
        > "$OUT/donation_dispatch.log" 2>&1
    ;;
  headline_workers)
    for workers in 0 4; do
      timeout 480 python3 launch/run.py --config $CFG --workdir "$OUT/headline_w$workers" \
          --config.train.max_seconds=240 --config.rollout.actor_workers=$workers \
          > "$OUT/headline_w$workers.log" 2>&1
    done
    ;;
  workers_step)
    for run in "20 0 1" "20 4 1" "20 0 2" "20 4 2" "6 0 1" "6 4 1"; do
      read -r turns workers round <<< "$run"
      timeout 120 python3 benchmarks/speed/rl_step.py --config $CFG --steps 6 --variants packed \
          --fresh-process --set "horizon.type='fixed'" --set "horizon.turns=$turns" \
          --set "rollout.actor_workers=$workers" \
          --label "horizon $turns, $workers actor workers, round $round" \
          --json "$OUT/rl_step_h${turns}_w${workers}_$round.json" \
          > "$OUT/rl_step_h${turns}_w${workers}_$round.log" 2>&1
    done
    ;;
  *) echo "unknown part $PART ($PARTS)" >&2
     exit 2 ;;
esac
for f in "$OUT"/*.log; do echo "== $f"; grep -E "steady|tok/s|GB/s|TB/s|roofline|^rollout|update|busy|by program" "$f" | head -12; tail -3 "$f"; done
