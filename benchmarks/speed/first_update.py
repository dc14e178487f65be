"""A run's first learner update, split into XLA compiling and the rest, and a second update.

Loads SmolLM2-135M-Instruct (the model the README's CPU taste run trains), builds a learner
with the taste run's learner settings (padded rows, micro-batches of 8, KL and entropy terms,
float32) and runs two updates of 4 random rows of up to ``--length`` tokens. Reported: the
first update's wall time and the seconds JAX's monitoring events attribute to XLA compiles
(per program), then the second update's wall time.

    python3 benchmarks/speed/first_update.py [--no-remat] [--length 1000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=1000, help="longest row (tokens)")
    p.add_argument("--no-remat", action="store_true", help="learner.remat = False")
    args = p.parse_args(argv)

    from jax._src import monitoring

    from agentrl_jax.learner import Learner, LearnerConfig, UpdateOptions
    from agentrl_jax.models.pretrained import load_model
    from learner_helpers import random_batch

    compiles: dict[str, float] = {}

    def listen(event, seconds, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            name = kw.get("fun_name", "")
            compiles[name] = compiles.get(name, 0.0) + seconds
    monitoring.register_event_duration_secs_listener(listen)
    model = load_model("smollm2")
    model = model[0] if isinstance(model, tuple) else model
    cfg = LearnerConfig(learning_rate=1e-6, micro_batch_size=8, min_length_bucket=128,
                        kl_coef=1e-3, entropy_coef=1e-3, advantage_estimator="grpo",
                        dtype="float32", remat=not args.no_remat)
    learner = Learner(model, cfg)
    vocab = model.cfg.vocab_size
    for n in (1, 2):
        batch = random_batch(n, 4, args.length, vocab, group_size=2, prompt=300,
                             longest_first=True)
        t0 = time.perf_counter()
        learner.update(batch, UpdateOptions(log=False))
        print(f"update {n}: {time.perf_counter() - t0:.1f} s")
        if n == 1:
            top = sorted(compiles.items(), key=lambda kv: -kv[1])
            print(f"  XLA compiles {sum(compiles.values()):.1f} s: "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in top[:4]))


if __name__ == "__main__":
    main()
