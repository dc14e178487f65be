"""Where a learner update's time goes: wall clock against device busy time, by kernel class.

    python benchmarks/speed/update_profile.py --config experiments/babyai.py:grpo_gpu \
        --variants pallas,chunked,xla --json out.json

Builds the learner exactly as the trainer does for ``--config`` (``services.learner_settings``:
dtype, remat, packing, micro- and mini-batches, losses), on a randomly initialised model of the
SmolLM2-135M shape (``--shape``; no checkpoint needed), and runs ``Learner.update`` on one
synthetic GRPO batch (``benchmarks/update_pipeline.synthetic_batch``: ``--rows`` trajectories of up
to ``--length`` tokens, turns alternating between trained and observation spans). Per variant
(``learner.attention_impl``: ``pallas``, ``pallas_segments`` (block skipping), ``chunked``, ``xla``
= XLA's own attention, ``cudnn``) it reports the median wall time of ``--repeats`` updates after
one untimed (compiling) update, then one update under the JAX profiler (``benchmarks/speed/devtime.py``):
the device's busy time, the span from first to last kernel, the time by kernel class and the top
kernels. ``--lm-head full,scored`` runs every variant with the LM head at every position
(``learner.scored_lm_head=False``, the reference) and only at the scored tokens (the default),
side by side in this process, and reports the log-prob pass and optimiser steps apart
(``perf/forward_time_s``) and the ratio of the two update times. Wall time far above busy time means the host (dispatch, transfers, Python) holds the
update back; busy time close to wall time means the kernels do. Nothing is trained for real: the
numbers are time, not learning.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

#: --variants name -> learner.attention_impl
ATTENTION = {"pallas": "pallas", "pallas_segments": "pallas_segments", "chunked": "chunked",
             "xla": "xla", "cudnn": "cudnn"}
#: --lm-head name -> learner.scored_lm_head
LM_HEAD = {"full": False, "scored": True}


def _span(text: str) -> tuple[int, int]:
    lo, hi = (int(x) for x in text.split(","))
    if not 1 <= lo < hi:
        raise argparse.ArgumentTypeError(f"want lo,hi with 1 <= lo < hi (got {text!r})")
    return lo, hi


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="experiments/babyai.py:grpo_gpu")
    p.add_argument("--variants", default="pallas,chunked",
                   help=f"comma list of {sorted(ATTENTION)} (learner.attention_impl)")
    p.add_argument("--shape", default="smollm2-135m", help="model shape of "
                   "benchmarks/update_pipeline.SHAPES (tiny: a CPU smoke run)")
    p.add_argument("--rows", type=int, default=48, help="trajectories in the update")
    p.add_argument("--group", type=int, default=8, help="samples per task (GRPO group)")
    p.add_argument("--length", type=int, default=1536, help="longest trajectory (tokens)")
    p.add_argument("--min-frac", type=float, default=0.3, help="shortest / longest length")
    p.add_argument("--lm-head", default="scored",
                   help="comma list of full,scored (learner.scored_lm_head False / True)")
    p.add_argument("--action-tokens", type=_span, default=(8, 48),
                   help="lo,hi: tokens of a trained turn span (BabyAI's action format: 6,10)")
    p.add_argument("--observation-tokens", type=_span, default=(32, 160),
                   help="lo,hi: tokens of an observation span between trained ones")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-profile", action="store_true", help="wall times only")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in ATTENTION]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {sorted(ATTENTION)}")
    heads = args.lm_head.split(",")
    if not heads or not set(heads) <= set(LM_HEAD):
        p.error(f"--lm-head: a comma list of {sorted(LM_HEAD)} (got {args.lm_head!r})")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    import jax

    from agentrl_jax.learner import Learner
    from agentrl_jax.learner.batch import UpdateOptions
    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.models.llama import init_model
    from agentrl_jax.training.config.command_line import load_config_file
    from agentrl_jax.training.config.experiment import to_run_config
    from agentrl_jax.training.runtime.services import learner_settings
    from devtime import device_time, format_kernels
    from benchmarks.contenders.update_pipeline import SHAPES, synthetic_batch

    config, problem = load_config_file(args.config)
    if problem:
        raise SystemExit(problem)
    base = learner_settings(to_run_config(config))
    model = init_model(ModelConfig(**SHAPES[args.shape]), seed=0)
    batch = synthetic_batch(args, model.cfg.vocab_size)
    real = int(batch["attention_mask"].sum())
    trained = int(batch["loss_mask"].sum())
    device = jax.devices()[0]
    print(f"device {device.device_kind}; {args.rows} trajectories, {real} real tokens "
          f"({trained} trained); learner {base.dtype}, remat {base.remat}, pack_length "
          f"{base.pack_length}, micro-batch {base.micro_batch_size}, mini-batches "
          f"{base.mini_batches}", flush=True)
    opts = UpdateOptions(log=False)
    out = {"config": args.config, "device": str(device.device_kind), "rows": args.rows,
           "real_tokens": real, "trained_tokens": trained, "variants": {}}
    runs = [(attn, head) for attn in args.variants.split(",") for head in args.lm_head.split(",")]
    for attn, head in runs:
        name = attn if len(args.lm_head.split(",")) == 1 else f"{attn}/{head}"
        cfg = dataclasses.replace(base, attention_impl=ATTENTION[attn],
                                  scored_lm_head=LM_HEAD[head])
        learner = Learner(model, cfg)
        t0 = time.perf_counter()
        try:
            learner.update(batch, opts)
            jax.block_until_ready(learner.params)
        except Exception as e:  # noqa: BLE001 - a variant this device cannot run: say so, go on
            print(f"[{name}] FAILED: {type(e).__name__}: {str(e)[:500]}", flush=True)
            out["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
            continue
        first = time.perf_counter() - t0
        times, forward = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            metrics = learner.update(batch, opts)
            jax.block_until_ready(learner.params)
            times.append(time.perf_counter() - t0)
            forward.append(metrics["perf/forward_time_s"])
        row = {"first_s": first, "median_s": statistics.median(times), "times_s": times,
               "logprob_pass_median_s": statistics.median(forward),
               "real_tokens_per_s": real / statistics.median(times),
               "scored_lm_head": LM_HEAD[head],
               "scored_capacity_per_row": learner.scored_capacity.current(
                   cfg.pack_length or args.length)}
        print(f"[{name}] update {row['median_s']:.3f} s median of {args.repeats} (log-prob pass "
              f"{row['logprob_pass_median_s']:.3f} s; {row['real_tokens_per_s']:,.0f} real "
              f"tok/s); first {first:.1f} s", flush=True)
        full = out["variants"].get(f"{attn}/full", {})
        if head == "scored" and "median_s" in full:
            row["update_ratio_vs_full"] = row["median_s"] / full["median_s"]
            print(f"[{name}] update time {row['update_ratio_vs_full']:.2f}x the full head's",
                  flush=True)
        if not args.no_profile:
            def one_update(lr=learner):
                lr.update(batch, opts)
                return lr.params
            dt = device_time(one_update, calls=1, top=15)
            row["device_profile"] = dt
            if dt:
                print(f"[{name}] device busy {dt['busy_ms']:.0f} ms, span {dt['span_ms']:.0f} ms "
                      f"of a {1000 * row['median_s']:.0f} ms update\n{format_kernels(dt)}",
                      flush=True)
        out["variants"][name] = row
        del learner
        if args.json:  # after every variant: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
