"""Where each second of a rollout goes: the real rollout of a training config, profiled.

    python benchmarks/speed/rollout_profile.py                       # GPU: BabyAI, SmolLM2, 1 replica
    python benchmarks/speed/rollout_profile.py --replicas 4 --json out.json     # 4 GPUs (strong scaling)
    python benchmarks/speed/rollout_profile.py --config experiments/smoke.py --rollouts 1   # CPU smoke

Builds what the trainer builds for a rollout (``training/runtime/services.py``: environment servers,
clients, the embedded engine on ``--replicas`` local devices, the actor pool behind the
trainer's turn counter), draws the first training step's tasks and plays ``--warmup`` rollouts
and then ``--rollouts`` measured ones (the engine's prefix cache is flushed between them, as a
weight sync does). Nothing is trained; the weights are the config's initial ones.

Three views of each measured rollout (wall ``W``):

* **engine thread** (per replica): device prefill and decode (the engine's own counters: the
  time from dispatching a call to its results being on the host, ``EngineStats``, and of it
  the jitted call's own dispatch, the engine thread's CPU time before the wait, and the time
  blocked on the device after the host work queued in that window), the engine's
  host work (admission, building prefill rows, handling decode results, finishing requests),
  idle (waiting for a request: ``Condition.wait``) and the rest of its loop (commands). These
  are measured independently; ``parts`` / ``W`` says how well they add up.
* **episode critical path** (mean over episodes, ``agent/loop_times.py``): waiting for a place
  in the pool, generation (of which the engine's own request latency; the rest is the hand-off
  from the engine thread and the event loop's delay), environment round trips, the episode's
  own host work.
* **CPU**: the CPU seconds of the event-loop thread, of each engine thread and of the child
  processes (environment servers) over the rollout: one process's threads share one GIL; and
  the event loop's CPU by callback (``agentrl_common/loop_clock.py``: the thread's CPU clock
  around each callback; ``event_loop_callbacks`` in the JSON, the top five printed).

With ``--trace`` each variant plays one more rollout, under ``jax.profiler.trace`` (kept out of
the medians: the tracer costs time), and its device time is split by XLA program
(``devtime.program_times``: calls, the programs' spans on the device and their kernels' busy
time; ``device_programs`` in the JSON): beside the engine's counters, how much of a prefill or
decode call's wall the device spends on it.

The engine's scheduler methods are wrapped (instance attributes,
``engine_probe.EngineProbe``) with clock reads; no device synchronisation is added (the
engine's counters already wait for each call's results).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_common.loop_clock import LoopCallbackClock  # noqa: E402
from benchmarks.speed.engine_probe import EngineProbe, engine_view  # noqa: E402

if TYPE_CHECKING:
    from agentrl_jax.training.config.sections import RunConfig

_clock = time.perf_counter
#: variants of the same rollout, run one after the other on the same engine(s): pool-level
#: config overrides and ``switch_interval`` (``sys.setswitchinterval`` during the rollout: how
#: long a thread holding the GIL keeps it while another thread waits for it; Python's 5 ms)
VARIANTS: dict[str, dict[str, Any]] = {
    # the episodes in this process (their critical path is measured only there), whatever the
    # config's rollout.actor_workers (experiments/babyai.py:grpo_gpu runs 4 since 2026-12-07)
    "base": {"rollout.actor_workers": 0},
    "noshare": {"engine.share_prompts": False},  # every prompt prefilled (the engine before)
    "share": {"engine.share_prompts": True, "engine.deliver_after_launch": False},
    # finished requests' results handed over after the next device launch (or when idle)
    "deliver_late": {"engine.share_prompts": True, "engine.deliver_after_launch": True},
    "switch": {"switch_interval": 0.0005},
    "workers": {"rollout.actor_workers": "WORKERS"},
    "workers_switch": {"rollout.actor_workers": "WORKERS", "switch_interval": 0.0005},
}
def format_programs(programs: dict[str, dict[str, float | None]], engines: list[dict[str, float]],
                    wall: float, layout: dict[str, dict[str, int]] | None = None) -> str:
    """The traced rollout's device time by program beside the engines' own counters (a call's
    wall from dispatch to its results on the host, summed over replicas), and the rollout's
    ``wall`` less the programs' spans (per device: the time it ran none of them). Without
    programs, the trace's device lines (``devtime.device_layout``) say what it held."""
    if not programs:
        lines = "; ".join(f"{proc}: " + ", ".join(f"{t} ({n})" for t, n in threads.items())
                          for proc, threads in (layout or {}).items())
        return ("device by program: none in the trace; its device lines: "
                + (lines or "none (no accelerator?)"))
    calls = {k: sum(e[f"{k}_calls"] for e in engines) for k in ("prefill", "decode")}
    walls = {k: sum(e[f"{k}_device_s"] for e in engines) for k in ("prefill", "decode")}
    spans = all(p["span_s"] is not None for p in programs.values())
    order = sorted(programs.items(), key=lambda kv: -(kv[1]["span_s"] or kv[1]["busy_s"]))
    if spans:
        parts = [f"{name} {p['calls']} calls, device span {p['span_s']:.3f} s, kernels busy "
                 f"{p['busy_s']:.3f} s" for name, p in order]
        idle = wall * len(engines) - sum(p["span_s"] for p in programs.values())
        rest = f"; no program running {idle:.3f} s of {wall:.3f} s x {len(engines)} device(s)"
    else:  # split by the kernels' hlo_module argument: no spans, no calls
        parts = [f"{name} {p['kernels']} kernels, busy {p['busy_s']:.3f} s" for name, p in order]
        rest = f"; (no module lines: kernels busy only) of {wall:.3f} s x {len(engines)} device(s)"
    return ("device by program (traced rollout): " + "; ".join(parts) + rest
            + " | engine counters: " + ", ".join(
                f"{k} {calls[k]} calls, {walls[k]:.3f} s dispatch to results"
                for k in ("prefill", "decode")))


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's live child processes."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            t = child.cpu_times()
            total += t.user + t.system
    return total


def load_config(path: str, overrides: list[str]) -> RunConfig:
    """The ``RunConfig`` of experiment ``path`` with ``overrides`` (``section.key=value``)."""
    import ast

    from agentrl_jax.training.config.command_line import load_experiment
    from agentrl_jax.training.config.experiment import to_run_config

    c = load_experiment(path)  # path or path:variant
    for item in overrides:
        key, _, value = item.partition("=")
        section, name = key.split(".")
        try:
            c[section][name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            c[section][name] = value  # a bare string
    return to_run_config(c)


async def profile(config: RunConfig, warmup: int, rollouts: int, horizon: int | None,
                  say: Callable[[str], None] = print, variants: tuple[str, ...] = ("base",),
                  workers: int = 4, trace: bool = False) -> dict[str, Any]:
    """Build the trainer's rollout from ``config`` and, for each of ``variants``
    (:data:`VARIANTS`), profile ``rollouts`` rollouts after ``warmup`` ones; returns the report
    (``variants[name]["rollouts"]``: one entry per measured rollout, ``["summary"]``)."""
    import jax

    from agentrl_jax.rollout.engine.engine import Engine
    from agentrl_jax.training.runtime import services
    from agentrl_jax.training.outputs.progress import TurnCounter
    from agentrl_jax.training.rl.task_sampler import TaskSampler
    from agentrl_jax.training.runtime.policy import load_policy

    t0 = _clock()
    model, tokenizer, model_path = load_policy(config)
    if horizon is None:
        horizon = int(config.horizon.phases[0] if config.horizon.type == "scaling_inter"
                      else config.horizon.turns)
    report: dict[str, Any] = {"horizon": horizon}
    async with rollout_services(config, model, tokenizer, model_path) as (clients, backend):
        engines = [backend] if isinstance(backend, Engine) else list(
            getattr(backend, "replicas", []))
        if not engines:
            raise SystemExit("the profile needs the embedded engine (rollout.backend="
                             "'embedded')")
        probes = [EngineProbe(e) for e in engines]
        eos_ids = model.cfg.eos_token_ids
        del model
        train_tasks = await services.task_refs(clients, "train")
        sampler = TaskSampler(train_tasks, seed=int(config.seed))
        tasks = sampler.next(int(config.train.tasks_per_step))
        samples = int(config.train.samples_per_task)
        devices = jax.local_devices()
        report.update(device=f"{devices[0].platform}:{devices[0].device_kind}",
                      replicas=len(engines), episodes=len(tasks) * samples,
                      slots_per_replica=engines[0].config.max_batch,
                      setup_s=_clock() - t0)
        say(f"# {report['episodes']} episodes, horizon {horizon}, {len(engines)} engine "
            f"replica(s) of {report['slots_per_replica']} slots on {report['device']}; "
            f"set up in {report['setup_s']:.1f} s")
        report["variants"] = {}
        for variant in variants:
            settings = dict(VARIANTS[variant])
            switch = settings.pop("switch_interval", None)
            for key in [k for k in settings if k.startswith("engine.")]:
                value = settings.pop(key)  # set on the live engines (idle between rollouts)
                for e in engines:
                    e.config = dataclasses.replace(e.config, **{key[len("engine."):]: value})
            vconfig = config
            for key, value in settings.items():
                section, name = key.split(".")
                value = workers if value == "WORKERS" else value
                vconfig = vconfig.replace(**{section: getattr(vconfig, section).replace(
                    **{name: value})})
            pool = services.make_actor_pool(vconfig, TurnCounter(backend), clients,
                                            tokenizer, eos_ids)
            say(f"## variant {variant}: {VARIANTS[variant] or 'the config as given'}")
            old_switch = sys.getswitchinterval()
            if switch is not None:
                sys.setswitchinterval(switch)
            try:
                runs = await _rollouts(pool, backend, probes, tasks, samples, horizon,
                                       warmup, rollouts, int(config.seed), say, trace)
            finally:
                sys.setswitchinterval(old_switch)
                pool.close()
            report["variants"][variant] = {
                "settings": VARIANTS[variant], "rollouts": runs,
                "summary": summarize_runs(measured) if (measured := [
                    r for r in runs if not r["traced"]]) else {}}
    return report


@contextlib.asynccontextmanager
async def rollout_services(config: RunConfig, model: Any, tokenizer: Any,
                           model_path: str | None) -> AsyncIterator[tuple[dict[str, Any], Any]]:
    """The trainer's environment servers, their clients and the rollout backend for ``config``
    (``training/runtime/services.py``, in the trainer's order); yields ``(clients, backend)`` and
    closes all three on exit."""
    from agentrl_jax.training.runtime import services

    with contextlib.ExitStack() as stack:
        urls = services.start_env_services(config, stack)
        async with contextlib.AsyncExitStack() as astack:
            clients = services.make_env_clients(urls, config, astack)
            backend = services.make_backend(config, model, tokenizer, model_path)
            astack.push_async_callback(services.close_backend, backend)
            yield clients, backend


async def _rollouts(pool: Any, backend: Any, probes: list[EngineProbe], tasks: list,
                    samples: int, horizon: int, warmup: int, rollouts: int, seed: int,
                    say: Callable[[str], None], trace: bool = False) -> list[dict[str, Any]]:
    """``warmup`` + ``rollouts`` rollouts of ``tasks`` (and with ``trace`` one more under the
    profiler, marked ``"traced"``); the measured ones' views."""
    runs = []
    for i in range(warmup + rollouts + int(trace)):
        traced = trace and i == warmup + rollouts
        trace_dir = tempfile.mkdtemp(prefix="rollout_trace_") if traced else None
        turns0 = pool.backend.turns  # the TurnCounter (episodes in worker processes too)
        main_cpu, child_cpu = time.thread_time(), children_cpu_s()
        await backend.flush_cache()  # as a weight sync does
        before = [p.snapshot() for p in probes]
        start = _clock()
        with contextlib.ExitStack() as tracing:
            if trace_dir is not None:
                import jax
                tracing.enter_context(jax.profiler.trace(trace_dir))
            with LoopCallbackClock() as callbacks:
                _, stats = await pool.collect(
                    tasks, samples, horizon, policy_version=i, seed=seed + i)
            wall = _clock() - start
        after = [p.snapshot() for p in probes]
        main_cpu, child_cpu = time.thread_time() - main_cpu, children_cpu_s() - child_cpu
        loop = pool.loop_times
        run = {"wall_s": wall, "episodes": stats.episodes, "dropped": stats.dropped,
               "turns": pool.backend.turns - turns0,
               "generated_tokens": stats.generated_tokens,
               "tokens_per_s": stats.generated_tokens / wall,
               "turns_per_s": (pool.backend.turns - turns0) / wall, "mean_reward": stats.mean_reward,
               "statuses": stats.statuses,
               "engines": [engine_view(b, a) for b, a in zip(before, after)],
               "episode": episode_view(loop),
               "cpu": {"event_loop_s": main_cpu,
                       "engine_threads_s": sum(p["cpu_s"] - b["cpu_s"]
                                               for p, b in zip(after, before)),
                       "child_processes_s": child_cpu},
               "event_loop_callbacks": callbacks.top(8)}
        if trace_dir is not None:
            from benchmarks.speed.devtime import device_layout, program_times, trace_events

            try:
                events = trace_events(trace_dir)
                run["device_programs"] = program_times(events)
                run["device_layout"] = device_layout(events)
            finally:
                shutil.rmtree(trace_dir, ignore_errors=True)
            say(format_programs(run["device_programs"], run["engines"], wall,
                                run["device_layout"]))
        label = "warm-up" if i < warmup else "traced" if traced else "measured"
        run["traced"] = traced
        say(f"rollout {i + 1} ({label}): {wall:.2f} s, {run['turns']} turns, "
            f"{run['generated_tokens']} generated tokens, "
            f"{run['tokens_per_s']:,.0f} tok/s")
        if i >= warmup:
            runs.append(run)
            say("event loop CPU by callback: " + ", ".join(
                f"{c['name']} {c['cpu_s']:.3f} s / {c['calls']}"
                for c in run["event_loop_callbacks"][:5]))
    return runs


def episode_view(loop: Any) -> dict[str, float]:
    """The mean episode's seconds by kind of work (``LoopTimes`` summed over the episodes)."""
    n = max(loop.episodes, 1)
    out = {k: v / n for k, v in loop.as_dict().items()
           if k.endswith("_s")}
    out["handoff_s"] = out["gen_s"] - out["engine_s"]
    out["turns"] = loop.turns / n
    out["env_calls"] = loop.env_calls / n
    out["per_turn_ms"] = {k: 1e3 * getattr(loop, k) / max(loop.turns, 1)
                          for k in ("gen_s", "engine_s", "env_s", "host_s")}
    out["per_env_call_ms"] = 1e3 * loop.env_s / max(loop.env_calls, 1)
    return out


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the measured rollouts; engine parts averaged over the replicas."""
    def med(values):
        return statistics.median(values)

    out = {k: med([r[k] for r in runs]) for k in ("wall_s", "tokens_per_s", "turns_per_s",
                                                  "generated_tokens", "turns")}
    keys = [k for k, v in runs[0]["engines"][0].items() if isinstance(v, (int, float))]
    out["engine"] = {k: med([statistics.fmean(e[k] for e in r["engines"]) for r in runs])
                     for k in keys}
    out["episode"] = {k: med([r["episode"][k] for r in runs])
                      for k, v in runs[0]["episode"].items() if isinstance(v, (int, float))}
    out["cpu"] = {k: med([r["cpu"][k] for r in runs]) for k in runs[0]["cpu"]}
    return out


def format_table(summary: dict[str, Any], replicas: int) -> str:
    w = summary["wall_s"]
    e, ep, cpu = summary["engine"], summary["episode"], summary["cpu"]

    def row(name: str, s: float, base: float) -> str:
        share = f"{100 * s / base:.1f}%" if base else "-"
        return f"| {name} | {s:.3f} | {share} |"

    lines = [f"rollout wall {w:.3f} s, {summary['tokens_per_s']:,.0f} generated tok/s, "
             f"{summary['turns_per_s']:,.0f} turns/s (medians)", "",
             f"engine thread (mean of {replicas} replica(s)) | s | of wall", "|---|---|---|",
             row("device: prefill", e["prefill_device_s"], w),
             row("  of it dispatching the call", e["prefill_dispatch_s"], w),
             row("  of it on a CPU before the wait", e["prefill_host_cpu_s"], w),
             row("  of it blocked on the device", e["prefill_wait_s"], w),
             row("device: decode", e["decode_device_s"], w),
             row("  of it dispatching the call", e["decode_dispatch_s"], w),
             row("  of it on a CPU before the wait", e["decode_host_cpu_s"], w),
             row("  of it blocked on the device", e["decode_wait_s"], w),
             row("host: admission", e["host_admit_s"], w),
             row("host: prefill rows", e["host_prefill_rows_s"], w),
             row("host: decode results, stops, finishing", e["host_decode_results_s"], w),
             row("host: other (forks)", e["host_other_s"], w),
             row("idle (no work queued)", e["idle_s"], w),
             row("loop: commands", e["loop_other_s"], w),
             row("measured parts (sum)", e["parts_s"], w), "",
             f"run_decode: {e.get('run_decode_s', 0):.3f} s wall, "
             f"{e.get('run_decode_cpu_s', 0):.3f} s CPU of the engine thread; its garbage "
             f"collections {e.get('engine_gc_s', 0):.3f} s (all methods)", "",
             f"decode: {e['decode_calls']:.0f} calls, {e['decode_steps']:.0f} steps, "
             f"{e['mean_decode_step_ms'] or 0:.2f} ms a step, "
             f"{e['mean_active_slots'] or 0:.1f} active slots a step; prefill: "
             f"{e['prefill_calls']:.0f} calls, {e['prefill_tokens']:.0f} tokens, "
             f"{e['prefill_row_tokens']:.0f} of {e['prefill_positions']:.0f} positions real "
             f"(rows used {e.get('prefill_row_occupancy') or 0:.0%}, filled "
             f"{e.get('prefill_used_row_fill') or 0:.0%}), mean KV "
             f"{e['prefill_kv_sum'] / max(e['prefill_calls'], 1):.0f}; "
             f"{e['shared_prompts']:.0f} prompts shared ({e['copy_calls']:.0f} row-copy calls)",
             "",
             f"mean episode ({ep['turns']:.2f} turns) | s | of its wall", "|---|---|---|"]
    ew = ep["wall_s"]  # 0 when the episodes ran in worker processes (their clocks stay there)
    lines += [row("waiting for a place in the pool", ep["gate_s"], ew),
              row("generation: engine (request latency)", ep["engine_s"], ew),
              row("generation: hand-off + event-loop wait", ep["handoff_s"], ew),
              row("environment round trips", ep["env_s"], ew),
              row("host: template, tokenise, detokenise, parse", ep["host_s"], ew),
              row("measured parts (sum)", ep["accounted_s"], ew), "",
              f"CPU over the rollout: event loop {cpu['event_loop_s']:.2f} s, engine threads "
              f"{cpu['engine_threads_s']:.2f} s, child processes (environment servers) "
              f"{cpu['child_processes_s']:.2f} s"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="experiments/babyai.py:grpo_gpu")
    p.add_argument("--replicas", type=int, default=1,
                   help="engine replicas (rollout.engine_replicas; one per local device)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rollouts", type=int, default=3)
    p.add_argument("--horizon", type=int, default=None,
                   help="turns per episode (default: the config's first horizon phase)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--variants", default="base",
                   help=f"comma list of {sorted(VARIANTS)}, run in turn on the same engine(s)")
    p.add_argument("--workers", type=int, default=4,
                   help="actor worker processes of the *workers* variants")
    p.add_argument("--trace", action="store_true",
                   help="one more rollout a variant under the profiler: device time by program")
    p.add_argument("--label", default="")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    config = load_config(args.config, [*args.set, f"rollout.engine_replicas={args.replicas}"])
    variants = tuple(v for v in args.variants.split(",") if v)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    report = asyncio.run(profile(config, args.warmup, args.rollouts, args.horizon,
                                 variants=variants, workers=args.workers, trace=args.trace))
    report.update(config=args.config, overrides=args.set, label=args.label,
                  date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    for name, v in report["variants"].items():
        if v["summary"]:
            print(f"\n### {name} ({report['replicas']} replica(s))")
            print(format_table(v["summary"], report["replicas"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
