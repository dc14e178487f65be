"""How much GPU memory each job of a job list needs for its rollout engine's KV cache, against
the share ``jobs.sh`` gives its lane: run here, before a GPU session, to choose ``--per-gpu``.

    python benchmarks/gpu/lane_memory.py --jobs benchmarks/jobs/textcraft_shuffled_dev.txt \
        --gpu-gib 79.6 --per-gpu 4 --only '_s0$'

For every ``launch/run.py`` job (``NAME CAP LANE [after=..] [mem=F] [resume] COMMAND``, the
format of ``benchmarks/gpu/jobs.sh``): its config (``--config`` and every ``--config.KEY=VALUE``
override), the engine's decode slots as the trainer sizes them
(``training/runtime/services.engine_slots`` for a GPU), the model's attention shape
(``training/runtime/policy.policy_config``: no weights loaded) and the engine's KV bytes per device
(``rollout/engine/kv_memory.kv_bytes_per_device``: one replica on one GPU). The lane's share is
``mem=F`` of the job or ``0.9 / --per-gpu`` (as ``jobs.sh`` sets
``XLA_PYTHON_CLIENT_MEM_FRACTION``) of ``--gpu-gib``. A job whose cache alone exceeds its share
cannot start (the engine refuses it: ``KVCacheDoesNotFit``); the learner, the weights and the
engine's work buffers need room beside it, so ``room`` (the share left after the cache) should
be a few GiB. Exit 1 when a job does not fit.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shlex
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

#: the share of a GPU's memory jobs.sh divides among a GPU's lanes
LANES_SHARE = 0.9
GIB = 2 ** 30


def parse_job(line: str) -> dict[str, Any] | None:
    """A job line's name, its ``mem=`` share (or ``None``), its ``--config`` and overrides
    (``{dotted key: text}``); ``None`` for a comment, a blank line or a job that is not a
    ``launch/run.py`` run."""
    if not line.strip() or line.lstrip().startswith("#"):
        return None
    words = shlex.split(line)
    name, rest = words[0], words[3:]
    mem = None
    while rest and (rest[0].startswith(("after=", "mem=")) or rest[0] == "resume"):
        if rest[0].startswith("mem="):
            mem = float(rest[0][4:])
        rest = rest[1:]
    if "launch/run.py" not in " ".join(rest[:2]):
        return None
    spec, overrides = None, {}
    for i, word in enumerate(rest):
        if word == "--config" and i + 1 < len(rest):
            spec = rest[i + 1]
        elif word.startswith("--config="):
            spec = word.split("=", 1)[1]
        elif word.startswith("--config."):
            key, _, value = word[len("--config."):].partition("=")
            overrides[key] = value
    return {"name": name, "mem": mem, "spec": spec, "overrides": overrides}


def job_config(spec: str, overrides: dict[str, str]) -> Any:
    """The ``RunConfig`` of ``spec`` with ``overrides`` (``a.b=text``: a Python literal, or the
    text itself)."""
    from agentrl_jax.training.config.command_line import load_experiment
    from agentrl_jax.training.config.experiment import to_run_config

    c = load_experiment(spec)
    for key, text in overrides.items():
        *path, last = key.split(".")
        node = c
        for part in path:
            node = node[part]
        try:
            node[last] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            node[last] = text
    return to_run_config(c)


def kv_need(config: Any) -> dict[str, Any]:
    """The engine's slots, context and KV bytes per device for ``config`` on one GPU."""
    import jax

    from agentrl_jax.rollout.engine.kv_memory import kv_bytes_per_device
    from agentrl_jax.rollout.engine.placement import EnginePlacement
    from agentrl_jax.training.config.rollout_section import engine_config_of_run
    from agentrl_jax.training.runtime.policy import policy_config
    from agentrl_jax.training.runtime.services import engine_slots

    dtype = config.rollout.engine_dtype or config.model.dtype
    model_config = policy_config(config).replace(dtype=dtype)
    slots = engine_slots(config, model_config, dtype, backend="gpu")
    engine = engine_config_of_run(config.rollout, config.seed, max_batch=slots)
    placement = EnginePlacement(jax.devices()[:1])
    sharding = placement.cache_sharding(model_config.num_kv_heads, engine.kv_layout)
    return {"slots": slots, "context": engine.max_length, "dtype": dtype,
            "kv_bytes": kv_bytes_per_device(engine, model_config, sharding)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", required=True)
    p.add_argument("--gpu-gib", type=float, required=True,
                   help="one GPU's memory in GiB (nvidia-smi's MiB / 1024: H100 79.6, H200 140.4)")
    p.add_argument("--per-gpu", type=int, default=1)
    p.add_argument("--only", default=None, help="a regular expression on the job names")
    args = p.parse_args(argv)
    share_default = LANES_SHARE / args.per_gpu
    print("| job | slots x context (dtype) | KV cache | lane's share | room |\n|---|---|---|---|---|")
    bad = 0
    with open(args.jobs) as f:
        jobs = [j for j in map(parse_job, f) if j is not None
                and (args.only is None or re.search(args.only, j["name"]))]
    for job in jobs:
        need = kv_need(job_config(job["spec"], job["overrides"]))
        share = (job["mem"] or share_default) * args.gpu_gib
        room = share - need["kv_bytes"] / GIB
        bad += room < 0
        print(f"| {job['name']} | {need['slots']} x {need['context']} ({need['dtype']}) | "
              f"{need['kv_bytes'] / GIB:.1f} GiB | {share:.1f} GiB | {room:+.1f} GiB"
              + (" (does not fit) |" if room < 0 else " |"))
    if bad:
        print(f"{bad} job(s) do not fit: fewer lanes (--per-gpu), mem=F on the job, or a "
              "smaller rollout.max_batch / rollout.max_context", file=sys.stderr)
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main())
