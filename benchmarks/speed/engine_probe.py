"""Clocks on one embedded ``Engine``'s scheduler thread, for ``rollout_profile.py``: the wall
time inside each scheduler method, the time idle in ``Condition.wait``, the thread's CPU and its
garbage collections (:class:`EngineProbe`, installed as instance attributes on a live engine),
and one engine thread's seconds between two snapshots by part (:func:`engine_view`). No device
synchronisation is added: the engine's own counters already wait for each call's results.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any, Callable

_clock = time.perf_counter

ENGINE_METHODS = ("step", "admit", "run_prefill", "run_forks", "run_decode")  # Scheduler


class _TimedCondition:
    """A ``threading.Condition`` whose ``wait`` calls from ``owner`` are clocked (same lock:
    swapping it in for the engine's own is safe while other threads use the original)."""

    def __init__(self, cond: threading.Condition, owner: threading.Thread):
        self._cond, self._owner = cond, owner
        self.wait_s = 0.0
        self.since: float | None = None  # when the owner's current wait began

    def waited(self, now: float) -> float:
        """Seconds waited so far, the wait in progress up to ``now`` included."""
        return self.wait_s + (now - self.since if self.since is not None else 0.0)

    def __enter__(self):
        return self._cond.__enter__()

    def __exit__(self, *exc):
        return self._cond.__exit__(*exc)

    def wait(self, timeout: float | None = None) -> bool:
        if threading.current_thread() is not self._owner:
            return self._cond.wait(timeout)
        self.since = t0 = _clock()
        try:
            return self._cond.wait(timeout)
        finally:
            self.since = None
            self.wait_s += _clock() - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cond, name)


class EngineProbe:
    """Clocks one embedded ``Engine``'s scheduler thread: wall time inside each scheduler
    method, time idle in ``Condition.wait`` and the thread's CPU time."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.seconds = {name: 0.0 for name in ENGINE_METHODS}
        self.decode_cpu_s = 0.0  # the engine thread's CPU seconds inside run_decode
        self.gc_s = 0.0  # garbage collections run by the engine thread (any method)
        self._gc_since: float | None = None
        gc.callbacks.append(self._gc)
        self.step_since: float | None = None  # when the step in progress began
        for name in ENGINE_METHODS:
            setattr(engine.scheduler, name, self._timed(name, getattr(engine.scheduler, name)))
        self.cond = _TimedCondition(engine.inbox.cv, engine.loop.thread)
        engine.inbox.cv = self.cond
        # the probe's idle seconds when the engine's wait for work in progress began (None: no
        # wait in progress); the engine adds that wait to its own idle clock only once it ends
        self.wait_base: float | None = None
        engine.inbox.wait_for_work = self._timed_wait_for_work(engine.inbox.wait_for_work)
        self._cpu_clock = time.pthread_getcpuclockid(engine.loop.thread.ident)

    def _timed_wait_for_work(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any) -> Any:
            if threading.current_thread() is self.engine.loop.thread:
                self.wait_base = self.cond.wait_s
            try:
                return fn(*args)
            finally:
                self.wait_base = None
        return timed

    def _timed(self, name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
        seconds = self.seconds

        def timed(*args: Any) -> Any:
            t0, cpu0 = _clock(), time.thread_time()
            if name == "step":
                self.step_since = t0
            try:
                return fn(*args)
            finally:
                seconds[name] += _clock() - t0
                if name == "step":
                    self.step_since = None
                elif name == "run_decode":
                    self.decode_cpu_s += time.thread_time() - cpu0
        return timed

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        """``gc.callbacks``: clocks the collections that the engine thread runs."""
        if threading.current_thread() is not self.engine.loop.thread:
            return
        if phase == "start":
            self._gc_since = _clock()
        elif self._gc_since is not None:
            self.gc_s += _clock() - self._gc_since
            self._gc_since = None

    def snapshot(self) -> dict[str, float]:
        s = self.engine.stats
        now = _clock()
        out = {f"{k}_s": v for k, v in self.seconds.items()}
        out["clock_s"] = now
        since = self.step_since  # a step in progress counts up to now (a snapshot's window)
        if since is not None:
            out["step_s"] += now - since
        idle = self.cond.waited(now)
        # what the engine's own clocks do not hold yet: the step in progress and the idle
        # seconds of the wait for work in progress (they count when each ends)
        base = self.wait_base
        out["open_s"] = ((now - since if since is not None else 0.0)
                         + (idle - base if base is not None else 0.0))
        out.update(idle_s=idle, cpu_s=time.clock_gettime(self._cpu_clock),
                   run_decode_cpu_s=self.decode_cpu_s, engine_gc_s=self.gc_s,
                   prefill_device_s=s.prefill_time_s, decode_device_s=s.decode_time_s,
                   prefill_wait_s=s.prefill_wait_time_s, decode_wait_s=s.decode_wait_time_s,
                   prefill_dispatch_s=s.prefill_dispatch_time_s,
                   decode_dispatch_s=s.decode_dispatch_time_s,
                   prefill_host_cpu_s=s.prefill_host_cpu_time_s,
                   decode_host_cpu_s=s.decode_host_cpu_time_s,
                   prefill_calls=s.prefill_calls, decode_calls=s.decode_calls,
                   decode_steps=s.decode_steps, decode_slot_steps=s.decode_slot_steps,
                   prefill_tokens=s.prefill_tokens, prompt_tokens=s.prompt_tokens,
                   cached_tokens=s.cached_tokens, generated_tokens=s.generated_tokens,
                   requests=s.requests, shared_prompts=s.shared_prompts,
                   engine_step_s=s.step_time_s, engine_idle_s=s.idle_time_s,
                   copy_calls=s.copy_calls, prefill_positions=s.prefill_positions,
                   prefill_rows=s.prefill_rows, prefill_rows_used=s.prefill_rows_used,
                   prefill_used_positions=s.prefill_used_positions,
                   prefill_row_tokens=s.prefill_row_tokens, prefill_kv_sum=s.prefill_kv_sum)
        return out


def engine_view(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """One engine thread's seconds between two snapshots (``wall_s``: the time between them,
    the rollout's wall up to two clock reads), by part; ``parts_s`` is the sum of the parts
    measured on their own (``Scheduler.step`` calls + idle waits); ``loop_other_s`` the rest
    (commands, locking)."""
    d = {k: after[k] - before[k] for k in after}
    wall = d["clock_s"]
    step = d["step_s"]
    device = d["prefill_device_s"] + d["decode_device_s"]
    out = {
        "wall_s": wall,
        "prefill_device_s": d["prefill_device_s"],
        "decode_device_s": d["decode_device_s"],
        # of the two windows above: the jitted call's dispatch (until it returned), the engine
        # thread's CPU time before the wait (the rest of that stretch it waited for the GIL),
        # and the time blocked on the device after the host work queued in them
        "prefill_dispatch_s": d["prefill_dispatch_s"],
        "decode_dispatch_s": d["decode_dispatch_s"],
        "prefill_host_cpu_s": d["prefill_host_cpu_s"],
        "decode_host_cpu_s": d["decode_host_cpu_s"],
        "prefill_wait_s": d["prefill_wait_s"],
        "decode_wait_s": d["decode_wait_s"],
        "host_admit_s": d["admit_s"],
        "host_prefill_rows_s": d["run_prefill_s"] - d["prefill_device_s"],
        "host_decode_results_s": d["run_decode_s"] - d["decode_device_s"],
        "host_other_s": step - d["admit_s"] - d["run_prefill_s"] - d["run_decode_s"],
        "idle_s": d["idle_s"],
    }
    out["host_s"] = step - device
    # the scheduler loop outside _step and the wait: commands (end_session, flushes), locking
    out["loop_other_s"] = wall - step - d["idle_s"]
    out["parts_s"] = step + d["idle_s"]
    out["cpu_s"] = d["cpu_s"]
    # of run_decode's wall: the engine thread's CPU (its device wait included, ~0 unless the
    # runtime spins) and its garbage collections (in any method): what is neither is waiting,
    # for the GIL or a lock
    out["run_decode_s"] = d["run_decode_s"]
    out["run_decode_cpu_s"] = d["run_decode_cpu_s"]
    out["engine_gc_s"] = d["engine_gc_s"]
    # the engine's own always-on clocks (EngineStats), to compare with the probe's: they hold
    # a step or a wait for work only once it ends, so they match ``parts_s - open_s`` (the
    # step or wait in progress at the second snapshot, less the one at the first)
    out["engine_step_s"] = d["engine_step_s"]
    out["engine_idle_s"] = d["engine_idle_s"]
    out["open_s"] = d["open_s"]
    for k in ("prefill_calls", "decode_calls", "decode_steps", "decode_slot_steps",
              "prefill_tokens", "prompt_tokens", "cached_tokens", "generated_tokens",
              "requests", "shared_prompts", "copy_calls", "prefill_positions", "prefill_rows",
              "prefill_rows_used", "prefill_used_positions", "prefill_row_tokens",
              "prefill_kv_sum"):
        out[k] = int(d[k])
    # where the prefill calls' padding is: empty rows, or the unused end of the rows used
    out["prefill_row_occupancy"] = (d["prefill_rows_used"] / d["prefill_rows"]
                                    if d["prefill_rows"] else None)
    out["prefill_used_row_fill"] = (d["prefill_row_tokens"] / d["prefill_used_positions"]
                                    if d["prefill_used_positions"] else None)
    out["busy_share"] = device / wall if wall else 0.0
    out["mean_decode_step_ms"] = (1e3 * d["decode_device_s"] / d["decode_steps"]
                                  if d["decode_steps"] else None)
    out["mean_active_slots"] = (d["decode_slot_steps"] / d["decode_steps"]
                                if d["decode_steps"] else None)
    return out
