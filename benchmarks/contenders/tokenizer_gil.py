"""Encoding an observation on the event loop: ``encode`` (holds the GIL) vs ``encode_batch`` of
one text (releases it), alone and beside a thread that wants the GIL.

The trainer's event loop shares its process's GIL with the engine thread (docs/PERFORMANCE.md,
"The agent loop, profiled"), so a tokenizer call that released the GIL would let the engine run
meanwhile. Whether that pays depends on what getting the GIL back costs: CPython hands it back
to a waiting thread only after its switch interval (5 ms) when another thread holds it.

For each contender, ``--texts`` BabyAI-like observations (~70 tokens each, each distinct, so
the tokenizer's own word cache is warm but no text repeats) are encoded one call at a time
with the real SmolLM2 tokenizer: wall and CPU time per call on this thread, and, beside a
thread that spins in Python the whole time (``busy``), how many loop iterations that thread
got per second (its share of the GIL). ``alone`` has no second thread. The ids of both
contenders are asserted equal.

    python benchmarks/contenders/tokenizer_gil.py [--texts 2000] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

OBSERVATION = ("You see a wall {a} steps forward, a red ball {b} steps left and 1 step forward, "
               "a grey key 1 step right.\nYour mission: go to the red ball.\nAvailable actions: "
               "turn left, turn right, move forward, go to red ball 1, pick up grey key 1, check "
               "available actions")


def contenders(backend: Any) -> dict[str, Callable[[str], list[int]]]:
    return {
        "encode": lambda text: backend.encode(text, add_special_tokens=False).ids,
        "encode_batch_of_one": lambda text: backend.encode_batch(
            [text], add_special_tokens=False)[0].ids,
    }


class Spinner:
    """A thread that counts loop iterations in Python until stopped (it always wants the GIL)."""

    def __init__(self) -> None:
        self.count = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop:
            n += 1
        self.count = n

    def __enter__(self) -> Spinner:
        self._thread.start()
        time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop = True
        self._thread.join()


def time_calls(encode: Callable[[str], list[int]], texts: list[str], busy: bool) -> dict:
    """Encode every text once; per-call wall and CPU microseconds (and the spinner's rate)."""
    spinner = Spinner() if busy else None
    with spinner if spinner is not None else contextlib.nullcontext():
        t0, c0 = time.perf_counter(), time.thread_time()
        for text in texts:
            encode(text)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    out = {"wall_us_per_call": 1e6 * wall / len(texts), "cpu_us_per_call": 1e6 * cpu / len(texts)}
    if spinner is not None:
        out["busy_thread_m_iter_per_s"] = spinner.count / wall / 1e6
    return out


def spinner_alone(seconds: float = 0.5, rounds: int = 3) -> float:
    """The spinner's rate with nothing else wanting the GIL (millions of iterations / s, the
    median of ``rounds``; from its start to its stop)."""
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        with Spinner() as spinner:
            time.sleep(seconds)
        rates.append(spinner.count / (time.perf_counter() - t0) / 1e6)
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--texts", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    backend = load_tokenizer(resolve_model_path("smollm2")).backend_tokenizer
    texts = [OBSERVATION.format(a=i % 9, b=(i // 9) % 9) + f"\nstep {i}" for i in range(args.texts)]
    calls = contenders(backend)
    reference = [calls["encode"](t) for t in texts[:200]]
    for name, encode in calls.items():
        assert [encode(t) for t in texts[:200]] == reference, name
    rows: dict[str, dict[str, list[dict]]] = {name: {"alone": [], "busy": []} for name in calls}
    for _ in range(args.rounds):  # alternating rounds: the box's other load drifts
        for name, encode in calls.items():
            for mode in ("alone", "busy"):
                rows[name][mode].append(time_calls(encode, texts, busy=mode == "busy"))
    report = {"settings": vars(args), "nproc": os.cpu_count(),
              "tokens_per_text": len(reference[0]), "spinner_alone_m_iter_per_s": spinner_alone(),
              "runs": rows, "medians": {}}
    print(f"{args.texts} texts of ~{report['tokens_per_text']} tokens, {args.rounds} rounds, "
          f"medians; a spinning thread alone runs "
          f"{report['spinner_alone_m_iter_per_s']:.1f} M iterations/s\n")
    print("| contender | mode | wall us / call | CPU us / call | spinner M it/s |")
    print("|---|---|---|---|---|")
    for name in calls:
        for mode in ("alone", "busy"):
            runs = rows[name][mode]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            report["medians"][f"{name}/{mode}"] = med
            spin = med.get("busy_thread_m_iter_per_s")
            print(f"| {name} | {mode} | {med['wall_us_per_call']:.1f} | "
                  f"{med['cpu_us_per_call']:.1f} | {'-' if spin is None else f'{spin:.1f}'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
