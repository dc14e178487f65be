"""Host cost of one request's prompt from the caller's list to the engine's admission, a git
revision's code against today's, side by side in one process. No device, no JAX.

The path a turn's prompt takes (the actor pool hands the engine a list of Python ints: the
episode's whole context, thousands of tokens on a long episode):

* ``check_input_ids`` in ``Engine.submit`` (the caller's thread: the event loop);
* ``Request.ids()``, the int32 array prefill rows are cut from (the engine thread);
* the prompt's key for ``share_prompts`` (the engine thread, ``Scheduler.admit_one``, hashed
  into ``prompt_leaders``).

Old: ``check_input_ids`` of ``--old-rev`` (``git show REV:...``; in ``rollout/contract.py``
before 2026-12-06, when it returned a list), then ``np.asarray(list, np.int32)`` and
``hash(tuple(list))`` as that revision's ``Request.ids`` and ``Scheduler.admit_one`` computed
them. New: today's
``check_input_ids`` (an int32 array), ``Request.ids()`` and ``Request.prompt_key()``. Both take
the same lists of random token ids below SmolLM2's vocabulary.

    python benchmarks/speed/prompt_intake.py --old-rev 147dc4d --json out.json

Both threads hold the GIL for these microseconds, so on the rollout's GIL-bound process (docs/
PERFORMANCE.md) the saving is the process's, whichever thread it lands on.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
import types
from typing import Any, Callable

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from agentrl_jax.rollout.contract import SamplingParams  # noqa: E402
from agentrl_jax.rollout.engine.prompt_ids import check_input_ids  # noqa: E402
from agentrl_jax.rollout.engine.requests import Request  # noqa: E402

VOCAB = 49152  # SmolLM2's


def load_old_check(rev: str) -> Callable[..., Any]:
    """``check_input_ids`` as it is at git revision ``rev``: from ``rollout/engine/
    prompt_ids.py`` (since 2026-12-06), else ``rollout/contract.py`` (before), its module run
    in a private namespace (what it imports is today's)."""
    for path in ("agentrl_jax/rollout/engine/prompt_ids.py", "agentrl_jax/rollout/contract.py"):
        shown = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:{path}"],
                               capture_output=True, text=True)
        if shown.returncode == 0:
            break
    else:
        raise SystemExit(f"no check_input_ids at {rev}: {shown.stderr.strip()}")
    src = shown.stdout
    module = types.ModuleType(f"_old_{os.path.basename(path)[:-3]}_{rev}")
    module.__file__ = f"<{rev}:{path}>"
    sys.modules[module.__name__] = module
    exec(compile(src, module.__file__, "exec"), module.__dict__)  # noqa: S102 -- our own code
    return module.check_input_ids


def old_intake(check: Callable[..., Any], ids: list[int]) -> int:
    """The revision's path: its check (a list), the request, its int32 array (``ids()``
    converts a list as the revision's did) and the tuple key's hash."""
    req = Request("r", check(ids, VOCAB, None), SamplingParams(), None,
                  concurrent.futures.Future(), 0)
    req.ids()
    return hash(tuple(req.input_ids))


def new_intake(ids: list[int]) -> int:
    """Today's path: the check's int32 array, ``Request.ids()`` and ``prompt_key()``."""
    req = Request("r", check_input_ids(ids, VOCAB, None), SamplingParams(), None,
                  concurrent.futures.Future(), 0)
    req.ids()
    return hash(req.prompt_key())


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    """Mean wall microseconds of ``fn()`` over ``calls`` calls (after one warm-up call)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old-rev", default="main", help="git revision of the old path")
    p.add_argument("--lengths", default="256,1024,3072,6144", help="prompt lengths (tokens)")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    old_check = load_old_check(a.old_rev)
    rng = np.random.default_rng(0)
    rows = []
    print(f"# old = {a.old_rev}; {a.calls} calls x {a.repeats} repeats a length, medians")
    for length in [int(x) for x in a.lengths.split(",")]:
        ids = rng.integers(0, VOCAB, size=length).tolist()
        old_check(ids, VOCAB, None)  # the revision accepts them too
        old, new = [], []
        for _ in range(a.repeats):  # interleaved, so drift hits both alike
            old.append(per_call_us(lambda: old_intake(old_check, ids), a.calls))
            new.append(per_call_us(lambda: new_intake(ids), a.calls))
        row = {"tokens": length, "old_us": statistics.median(old),
               "new_us": statistics.median(new), "old_runs_us": old, "new_runs_us": new}
        row["ratio"] = row["old_us"] / row["new_us"]
        rows.append(row)
        print(f"{length:>6} tokens: old {row['old_us']:8.1f} us, new {row['new_us']:8.1f} us "
              f"({row['ratio']:.2f}x)")
    out = {"old_rev": a.old_rev, "calls": a.calls, "repeats": a.repeats,
           "cpu_count": os.cpu_count(), "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {a.json}")
    return out


if __name__ == "__main__":
    main()
