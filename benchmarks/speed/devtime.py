"""Device-side timing from a JAX profiler trace (what the accelerator itself spent).

Wall-clock timing of a small jitted function includes Python dispatch and the host sync of
``block_until_ready`` (tens of microseconds), which swamps kernels that run for a few
microseconds. :func:`device_time` runs the function under ``jax.profiler.trace``, reads the
Chrome-format trace it writes (``*.trace.json.gz``) and returns, per call:

* ``busy_ms``: the union of all kernel intervals on the device streams (device busy time,
  overlapping kernels counted once; with several devices, the union over all of them),
* ``span_ms``: first kernel start to last kernel end of one call (includes gaps between
  kernels, e.g. launch latency), median over calls,
* ``kernels``: the top kernels by total time (name, ms per call, launches per call) and
  ``categories_ms`` (matmul / attention / collective / copy / other); both are summed over
  devices (divide by the device count for per-device figures).

Returns ``None`` where the trace has no device streams (CPU backend).

:func:`program_times` splits a trace of a longer run (a whole rollout) by the XLA program each
kernel ran in (the device's ``XLA Modules`` line: ``jit_prefill``, ``jit_decode``, ...; else
the kernels' ``hlo_module`` argument): calls, the programs' spans on the device and the kernels'
busy time inside them. :func:`device_layout` lists a trace's device lines.

    from benchmarks.speed.devtime import device_time
    stats = device_time(lambda: f(x), calls=20)
"""

from __future__ import annotations

import bisect
import collections
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import tempfile
from collections.abc import Callable

import jax

#: thread names on a device process that are derived summaries, not kernel executions.
_SUMMARY_THREADS = ("XLA Modules", "XLA Ops", "Steps", "Framework", "Source", "TensorFlow")


def _load_trace(log_dir: str) -> list[dict]:
    paths = sorted(glob.glob(os.path.join(log_dir, "**", "*.trace.json.gz"), recursive=True))
    paths = [p for p in paths if "perfetto" not in os.path.basename(p)] or paths
    if not paths:
        return []
    with gzip.open(paths[-1], "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def kernel_events(events: list[dict]) -> list[dict]:
    """``X`` events on the device processes' stream threads (accelerator kernels/copies)."""
    proc_names, thread_names = _names(events)
    device_pids = {pid for pid, name in proc_names.items()
                   if "/device:" in name and "CPU" not in name}
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in device_pids:
            continue
        tname = thread_names.get((e["pid"], e.get("tid")), "")
        if any(tname.startswith(s) for s in _SUMMARY_THREADS):
            continue
        out.append(e)
    return out


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


_CATEGORIES = (
    ("collective", ("nccl", "all_reduce", "all-reduce", "allreduce", "reduce_scatter", "all_gather")),
    ("attention", ("cudnn", "fmha", "flash", "attention", "sdpa")),
    ("matmul", ("gemm", "xmma", "cutlass", "cublas", "nvjet", "sm90_", "sm80_", "matmul", "dot")),
    ("copy", ("memcpy", "memset", "copy")),
)


def kernel_category(name: str) -> str:
    """Coarse class of a kernel name: collective / attention / matmul / copy / other."""
    low = name.lower()
    for cat, keys in _CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def summarize(events: list[dict], calls: int, top: int = 8) -> dict | None:
    """Per-call device time statistics from the kernel events of ``calls`` calls."""
    ks = kernel_events(events)
    if not ks:
        return None
    intervals = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in ks]
    busy_us = _union_length(intervals) / calls
    # split calls by the largest gaps between consecutive kernels (calls run back to back with
    # a host sync between them, so the calls-1 largest gaps separate them)
    order = sorted(intervals)
    gaps = sorted(range(1, len(order)), key=lambda i: order[i][0] - order[i - 1][1],
                  reverse=True)[: calls - 1]
    cuts = [0, *sorted(gaps), len(order)]
    spans = [max(e for _, e in order[a:b]) - order[a][0] for a, b in zip(cuts, cuts[1:]) if b > a]
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for e in ks:
        by_name[e.get("name", "?")].append(float(e.get("dur", 0.0)))
    kernels = sorted(((n, sum(d) / calls / 1e3, len(d) / calls) for n, d in by_name.items()),
                     key=lambda x: -x[1])[:top]
    categories: dict[str, float] = collections.defaultdict(float)
    for e in ks:
        categories[kernel_category(e.get("name", ""))] += float(e.get("dur", 0.0)) / calls / 1e3
    return {"busy_ms": busy_us / 1e3, "span_ms": statistics.median(spans) / 1e3,
            "kernels_per_call": len(ks) / calls, "categories_ms": dict(categories),
            "kernels": [{"name": n[:120], "ms": ms, "launches": c} for n, ms, c in kernels]}


def device_time(fn: Callable[[], object], calls: int = 10, top: int = 8) -> dict | None:
    """Run ``fn()`` ``calls`` times under the profiler (each call synchronised) and return
    :func:`summarize`'s per-call device statistics, or ``None`` without device streams.
    ``fn`` should already be compiled (call it once before)."""
    log_dir = tempfile.mkdtemp(prefix="devtime_")
    try:
        jax.block_until_ready(fn())
        with jax.profiler.trace(log_dir):
            for _ in range(calls):
                jax.block_until_ready(fn())
        return summarize(_load_trace(log_dir), calls, top=top)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def _program_name(name: str) -> str:
    """An ``XLA Modules`` event's program name without its run id: ``jit_prefill(42)`` ->
    ``jit_prefill``."""
    return re.sub(r"\(\d+\)$", "", name.strip())


def _names(events: list[dict]) -> tuple[dict, dict]:
    """``({pid: process name}, {(pid, tid): thread name})`` from a trace's metadata events."""
    proc_names, thread_names = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            proc_names[e["pid"]] = e.get("args", {}).get("name", "")
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            thread_names[(e["pid"], e.get("tid"))] = e.get("args", {}).get("name", "")
    return proc_names, thread_names


def device_layout(events: list[dict]) -> dict[str, dict[str, int]]:
    """``{device process: {thread: X events}}``: which lines a trace's device processes have
    (what :func:`program_times` reads them by; a diagnosis when it finds no programs)."""
    proc_names, thread_names = _names(events)
    out: dict[str, dict[str, int]] = {}
    for e in events:
        name = proc_names.get(e.get("pid"), "")
        if e.get("ph") == "X" and "/device:" in name:
            thread = thread_names.get((e["pid"], e.get("tid")), str(e.get("tid")))
            lines = out.setdefault(name, {})
            lines[thread] = lines.get(thread, 0) + 1
    return out


def program_times(events: list[dict]) -> dict[str, dict[str, float | None]]:
    """Device time by XLA program: ``{name: {"calls", "span_s", "busy_s", "kernels"}}``,
    ``span_s`` the sum of the program's executions on the device (first kernel start to last
    kernel end, the ``XLA Modules`` events), ``busy_s`` the union of the kernel intervals that
    start inside them (gaps between kernels excluded), summed over devices. A trace without
    module events (some GPU traces) is split by each kernel's ``hlo_module`` argument instead:
    ``busy_s`` and ``kernels`` only, ``calls`` and ``span_s`` None. Empty without either."""
    proc_names, thread_names = _names(events)
    modules: dict[object, list[tuple[float, float, str]]] = collections.defaultdict(list)
    for e in events:
        if (e.get("ph") == "X" and "/device:" in proc_names.get(e.get("pid"), "")
                and thread_names.get((e["pid"], e.get("tid")), "").startswith("XLA Modules")):
            ts = float(e["ts"])
            modules[e["pid"]].append((ts, ts + float(e.get("dur", 0.0)),
                                      _program_name(e.get("name", "?"))))
    kernels: dict[object, list[tuple[float, float]]] = collections.defaultdict(list)
    by_arg: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for e in kernel_events(events):
        ts = float(e["ts"])
        kernels[e["pid"]].append((ts, ts + float(e.get("dur", 0.0))))
        module = (e.get("args") or {}).get("hlo_module")
        if module:
            by_arg[_program_name(str(module))].append((ts, ts + float(e.get("dur", 0.0))))
    out: dict[str, dict[str, float | None]] = {}
    for pid, spans in modules.items():
        ks = sorted(kernels.get(pid, []))
        starts = [s for s, _ in ks]
        for start, end, name in spans:
            entry = out.setdefault(name, {"calls": 0, "span_s": 0.0, "busy_s": 0.0,
                                          "kernels": 0})
            lo, hi = bisect.bisect_left(starts, start), bisect.bisect_right(starts, end)
            entry["calls"] += 1
            entry["span_s"] += (end - start) / 1e6
            entry["busy_s"] += _union_length(ks[lo:hi]) / 1e6
            entry["kernels"] += hi - lo
    if not out:
        for name, ks in by_arg.items():
            out[name] = {"calls": None, "span_s": None, "kernels": len(ks),
                         "busy_s": _union_length(sorted(ks)) / 1e6}
    return out


def trace_events(log_dir: str) -> list[dict]:
    """The events of the newest ``*.trace.json.gz`` under ``log_dir`` ([] when none)."""
    return _load_trace(log_dir)


def format_kernels(stats: dict | None, indent: str = "    ") -> str:
    if not stats:
        return f"{indent}(no device trace)"
    lines = [f"{indent}device busy {stats['busy_ms']:.4f} ms/call, span {stats['span_ms']:.4f} ms, "
             f"{stats['kernels_per_call']:.1f} kernels/call"]
    cats = sorted(stats.get("categories_ms", {}).items(), key=lambda kv: -kv[1])
    if cats:
        lines.append(indent + "by class: " + ", ".join(f"{c} {ms:.3f} ms" for c, ms in cats))
    for k in stats["kernels"]:
        lines.append(f"{indent}  {k['ms']:9.4f} ms  x{k['launches']:<5.1f} {k['name']}")
    return "\n".join(lines)
