"""Host (CPU) time only of the engine thread's decode-result path -- what
``benchmarks/speed/rollout_profile.py`` reports as "host: decode results, stops, finishing":
``Scheduler.run_decode`` minus its device call (recording the ``[steps, slots]`` block, stop
ids, token budgets, stop strings, finishing sequences into ``GenerateResult`` s, handing them
over). Old (``main``'s code, or any git revision: ``--old-rev``) and new side by side in one
process, on the same synthetic decode results. No device, no JAX call.

The device call is a stub with the jitted decode's semantics (``compiled.py``): each active
slot emits the next token of its request's planned response until a stop id or its token
budget ends it. Responses (SmolLM2's tokenizer when installed, else the byte-level test one):
BabyAI-like action lines ending in ``"\\n"`` (the rollout's stop string; some end a line in
the middle of a decode call, some in the next one), some that end with EOS, some that run out
of ``max_new_tokens``; every request has ``stop=["\\n"]`` and a session (prefix cache on), as
the rollout's do. Each call every free slot takes a new request first (not timed).

Three settings (the first two as ``benchmarks/contenders/scheduler_host.py``):

* ``alone``: nothing else runs in the process;
* ``busy``: another Python thread spins (always wants the GIL) while the calls run;
* ``loop``: the results go to an asyncio event loop in another thread (``asyncio.wrap_future``,
  as ``Engine.generate_n``), which spends ``--work-ms`` of Python per result (an episode's
  parse / tokenise / environment call): each hand-off wakes a thread that wants the GIL.

    python3 benchmarks/speed/decode_host.py                        # ~1 minute on 2 cores
    python3 benchmarks/speed/decode_host.py --calls 200 --json out.json

Host work is CPU work, so the ratio measured here carries over to the GPU machine's engine
thread (the absolute times depend on the CPU and on what else holds the GIL there).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import types
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from agentrl_jax.rollout.contract import SamplingParams  # noqa: E402
from benchmarks.contenders.scheduler_host import Busy  # noqa: E402
from agentrl_jax.rollout.engine.compiled import ACT, CNT, EngineFunctions, REM, STOP  # noqa: E402
from agentrl_jax.rollout.engine.engine_config import EngineConfig  # noqa: E402
from agentrl_jax.rollout.engine.inbox import EngineInbox  # noqa: E402

#: the engine modules the decode-result path runs through (loaded from the old revision as a
#: set, each importing the others' old versions)
PATH_MODULES = ("requests", "slots", "stop_strings", "slot_buffers", "scheduler")
ENGINE_PKG = "agentrl_jax.rollout.engine"

SETTINGS = ("alone", "busy", "loop")
ACTIONS = ("go forward", "turn left", "turn right", "pick up the key", "toggle the door",
           "go to the red ball", "drop the box", "Thought: the door is locked, I need the key")


def load_old_scheduler(rev: str) -> type:
    """``Scheduler`` as it is at git revision ``rev``: ``PATH_MODULES`` loaded from ``git
    show rev:...`` into private modules that import each other (the rest is today's)."""
    names = {m: f"_old_{rev.replace('/', '_')}_{m}" for m in PATH_MODULES}
    for m in PATH_MODULES:
        path = f"{rev}:agentrl_jax/rollout/engine/{m}.py"
        src = subprocess.run(["git", "-C", ROOT, "show", path], check=True,
                             capture_output=True, text=True).stdout
        for other, private in names.items():
            src = src.replace(f"{ENGINE_PKG}.{other} import", f"{private} import")
        module = types.ModuleType(names[m])
        module.__file__ = f"<{rev}:{m}.py>"
        sys.modules[names[m]] = module
        exec(compile(src, module.__file__, "exec"), module.__dict__)  # noqa: S102 -- our own code
    return sys.modules[names["scheduler"]].Scheduler


def load_tokenizer() -> Any:
    """SmolLM2's tokenizer when its package is installed, else the byte-level test one."""
    try:
        from agentrl_jax.models.pretrained import resolve_model_path
        from agentrl_jax.models.tokenizer import load_tokenizer as load
        return load(resolve_model_path("smollm2"))
    except Exception:  # noqa: BLE001 -- the fallback is named in the report
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from rollout_helpers import TINY, byte_tokenizer
        return byte_tokenizer(TINY.vocab_size)


class Workload:
    """Planned responses: ``plan(rng)`` -> the token ids a request's slot will emit."""

    def __init__(self, tokenizer: Any, max_new_tokens: int):
        self.tokenizer = tokenizer
        self.eos = int(tokenizer.eos_token_id)
        self.max_new_tokens = max_new_tokens
        self.lines = [tokenizer.encode(a + "\n", add_special_tokens=False) for a in ACTIONS]
        self.words = tokenizer.encode(" ".join(ACTIONS) * 4, add_special_tokens=False)

    def plan(self, rng: np.random.Generator) -> list[int]:
        u = rng.random()
        lead = self.words[:int(rng.integers(0, 12))]
        line = self.lines[int(rng.integers(len(self.lines)))]
        if u < 0.6:  # a line that ends with the stop string (then more text, dropped)
            return lead + line + self.words[:8]
        if u < 0.8:  # EOS (a stop id)
            return lead + line[:-1] + [self.eos]
        return self.words[:self.max_new_tokens + 4]  # runs out of max_new_tokens


class Pending:
    """A device output as ``jax.device_get`` sees it: ready ``ready`` (``perf_counter``); the
    host copy waits (``time.sleep``: the GIL is free meanwhile, as in a real device wait)."""

    def __init__(self, value: Any, ready: float):
        self.value, self.ready = value, ready

    def copy_to_host_async(self) -> None:
        pass

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        time.sleep(max(0.0, self.ready - time.perf_counter()))
        return np.asarray(self.value, dtype)


class Harness:
    """A real ``Scheduler`` (``scheduler_cls``) and ``EngineInbox`` with a stub device: every
    call fills the free slots with new decoding requests, then runs ``run_decode``."""

    def __init__(self, scheduler_cls: type, tokenizer: Any, workload: Workload, seed: int,
                 max_batch: int = 256, decode_steps: int = 8, max_length: int = 3072,
                 prompt_len: tuple[int, int] = (600, 2600),
                 loop: asyncio.AbstractEventLoop | None = None, work_s: float = 0.0,
                 device_ms: float = 0.0, running: int | None = None,
                 deliver_after_launch: bool = False):
        self.rng = np.random.default_rng(seed)
        self.workload, self.loop, self.work_s = workload, loop, work_s
        self.prompt_len, self.device_ms = prompt_len, device_ms
        self.running = max_batch if running is None else running
        self.config = EngineConfig(max_batch=max_batch, max_length=max_length,
                                   decode_steps=decode_steps, max_stop_ids=2,
                                   deliver_after_launch=deliver_after_launch)
        self.inbox = EngineInbox(max_queue=1 << 20)
        functions = EngineFunctions(decode=self._decode, prefill=None, copy_rows=None,
                                    merge=None)
        weights = types.SimpleNamespace(state=None, leaves=None, merged=None, version="0")
        kv = types.SimpleNamespace(cache=None, released=False)
        self.classes = sys.modules[scheduler_cls.__module__]  # its Request, Seq, EngineStats
        self.scheduler = scheduler_cls(self.config, functions, weights, kv, self.inbox,
                                       self.classes.EngineStats(), tokenizer, len(tokenizer),
                                       False)
        self.planned: dict[int, np.ndarray] = {}  # slot -> its response's ids
        self.results: list[tuple[str, list]] = []
        self.device_s = 0.0
        self.count = 0

    # ----------------------------------------------------------------------- the stub device
    def _decode(self, weights: Any, cache: Any, ints: np.ndarray, floats: np.ndarray,
                num_steps: Any, exit_on_finish: Any, mode: Any):
        t0 = time.perf_counter()
        K, B = int(num_steps), ints.shape[0]
        toks = np.zeros((K, B), np.int32)
        valid = np.zeros((K, B), np.bool_)
        active = ints[:, ACT] > 0
        remaining, counter = ints[:, REM].copy(), ints[:, CNT].copy()
        stop_ids = ints[:, STOP:]
        steps = 0
        for i in range(K):
            if not active.any():
                break
            rows = np.flatnonzero(active)
            tok = np.array([self.planned[s][min(counter[s], len(self.planned[s]) - 1)]
                            for s in rows.tolist()], np.int32)
            toks[i, rows], valid[i, rows] = tok, True
            remaining[rows] -= 1
            counter[rows] += 1
            done = (stop_ids[rows] == tok[:, None]).any(axis=1) | (remaining[rows] <= 0)
            active[rows[done]] = False
            steps = i + 1
        lps = -np.abs(np.sin(toks.astype(np.float32) + 0.5))  # any deterministic values
        now = time.perf_counter()
        self.device_s += now - t0
        ready = now + self.device_ms / 1e3  # the outputs are ready once the "device" is done
        return cache, tuple(Pending(x, ready) for x in (toks, lps, lps * 0.5, valid)), \
            Pending(np.int32(steps), ready)

    # -------------------------------------------------------------------------- requests
    def fill(self) -> None:
        """Free slots take new requests, prefilled and decoding, up to ``running`` of them."""
        s = self.scheduler
        while s.slots.available and len(s.slot_seq) < self.running:
            i = self.count
            self.count += 1
            L = int(self.rng.integers(*self.prompt_len))
            sampling = SamplingParams(max_new_tokens=24, stop=["\n"], temperature=1.0)
            future: concurrent.futures.Future = concurrent.futures.Future()
            req = self.classes.Request(f"r{i}", self.rng.integers(0, 40000, L).tolist(), sampling,
                          f"session{i}", future, seed=i)
            req.seqs = [self.classes.Seq(req, 0, [self.workload.eos])]
            self.inbox.submit(req)
            self.inbox.dequeued()
            self.watch(req)
            seq = req.seqs[0]
            slot, _ = s.slots.acquire_for_session(None, req.ids(), L - 1)
            s.bind(seq, slot)
            seq.cursor = seq.kv_len = L - 1
            self.planned[slot] = np.asarray(self.workload.plan(self.rng), np.int32)
            s.prefill_done(seq)

    def watch(self, req: Any) -> None:
        if self.loop is None:
            req.future.add_done_callback(lambda f, rid=req.rid: self.results.append(
                (rid, f.result())))
            return

        async def consume(future=req.future, rid=req.rid):
            result = await asyncio.wrap_future(future)
            self.results.append((rid, result))
            end = time.perf_counter() + self.work_s  # the episode's Python work
            while time.perf_counter() < end:
                pass
        asyncio.run_coroutine_threadsafe(consume(), self.loop)

    def call(self) -> float:
        """One decode call: fill (untimed), ``run_decode``; returns its host seconds as
        ``rollout_profile.py`` counts them: ``run_decode``'s wall less the engine's own decode
        clock (launch to results on the host, the "device" time)."""
        self.fill()
        stats = self.scheduler.stats
        device0 = stats.decode_time_s
        t0 = time.perf_counter()
        self.scheduler.run_decode()
        return time.perf_counter() - t0 - (stats.decode_time_s - device0)


def run(scheduler_cls: type, tokenizer: Any, workload: Workload, calls: int, seed: int,
        setting: str, work_ms: float, **kw: Any) -> dict[str, Any]:
    """``calls`` decode calls (after 3 warm-up calls) of a fresh harness -> median / mean host
    ms a call, finished requests and generated tokens a call."""
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    loop = thread = None
    busy = Busy() if setting == "busy" else contextlib.nullcontext()
    if setting == "loop":
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
    h = Harness(scheduler_cls, tokenizer, workload, seed, loop=loop, work_s=work_ms / 1e3, **kw)
    for _ in range(3):  # warm-up (the stop mask is built on the first activation)
        h.call()
    with busy:
        times = [h.call() for _ in range(calls)]
    h.scheduler.deliver()
    if loop is not None:
        def stop() -> None:
            for task in asyncio.all_tasks(loop):  # the requests still decoding
                task.cancel()
            loop.call_soon(loop.stop)
        time.sleep(0.1)
        loop.call_soon_threadsafe(stop)
        thread.join(5)
    st = h.scheduler.stats
    return {"ms_per_call": 1e3 * statistics.median(times), "mean_ms": 1e3 * statistics.mean(times),
            "finished_per_call": len(h.results) / (calls + 3),
            "tokens_per_call": st.generated_tokens / st.decode_calls}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3, help="old / new alternated, best median")
    p.add_argument("--old-rev", default="main", help="git revision of the old path")
    p.add_argument("--settings", default="alone,busy,loop")
    p.add_argument("--work-ms", type=float, default=0.3, help="the loop's Python per result")
    p.add_argument("--device-ms", type=float, default=28.0, help="a decode call's device time")
    p.add_argument("--slots", type=int, default=256)
    p.add_argument("--running", type=int, default=None,
                   help="requests decoding at once (default: every slot)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--deliver-after-launch", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    from agentrl_jax.rollout.engine.scheduler import Scheduler
    old = load_old_scheduler(a.old_rev)
    tokenizer = load_tokenizer()
    workload = Workload(tokenizer, 24)
    out: dict[str, Any] = {"args": vars(a), "tokenizer": type(tokenizer).__name__}
    print(f"# {a.slots} slots ({a.running or a.slots} running) x {a.steps} steps, {a.calls} "
          f"calls x {a.repeats}, tokenizer {out['tokenizer']} ({len(tokenizer)} tokens); "
          f"old = {a.old_rev}; deliver_after_launch={a.deliver_after_launch}")
    print("| setting | old ms/call | new ms/call | old / new | finished a call | tokens a call |")
    print("|---|---|---|---|---|---|")
    kw = dict(max_batch=a.slots, decode_steps=a.steps, device_ms=a.device_ms,
              running=a.running, deliver_after_launch=a.deliver_after_launch)
    for setting in a.settings.split(","):
        res: dict[str, list] = {"old": [], "new": []}
        for _ in range(a.repeats):
            for name, cls in (("old", old), ("new", Scheduler)):
                res[name].append(run(cls, tokenizer, workload, a.calls, a.seed, setting,
                                     a.work_ms, **kw))
        best = {k: min(v, key=lambda r: r["ms_per_call"]) for k, v in res.items()}
        ratio = best["old"]["ms_per_call"] / best["new"]["ms_per_call"]
        out[setting] = {"old": res["old"], "new": res["new"], "ratio": ratio}
        print(f"| {setting} | {best['old']['ms_per_call']:.3f} | {best['new']['ms_per_call']:.3f}"
              f" | {ratio:.2f}x | {best['new']['finished_per_call']:.1f} | "
              f"{best['new']['tokens_per_call']:.0f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
