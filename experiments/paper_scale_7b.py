"""A paper-scale RL step for sizing runs: a Qwen2.5-7B-shaped policy (random weights), GRPO,
BabyAI, 32 tasks x 8 samples, a fixed 13-turn horizon.

Timed with ``benchmarks/rl_step.py --config experiments/paper_scale_7b.py --variants packed``
(``benchmarks/scaling_step_gpu.sh`` runs it) on the GPUs of ``CUDA_VISIBLE_DEVICES``: the
learner shards over every visible GPU (``learner.mesh``: FSDP) and the embedded engine runs a
bf16 replica on each of them (``rollout.engine_replicas=0``). By the estimate below 1 and 2
H100 80GB cannot hold it and 4 can (with the KV cache freed during the update), and 2 (or
more) H200 141GB can (measured runs: below the table); 1 H200 can by the estimate only with
the AdamW moments in host memory (``learner.offload_optimizer_state``, which this config turns
on for 1 GPU; measured on one H200: below). Random weights: actions are rarely valid, rewards are 0 and every
episode runs 13 turns of up to 24 tokens; ``train.skip_flat_groups`` is off so that the update
runs (on zero advantages) and is timed.
Results: docs/PERFORMANCE.md.

Memory (:func:`memory_estimate`; ``python3 experiments/paper_scale_7b.py`` prints the table):
float32 master weights + AdamW + the float32 gradient accumulator are 16 bytes x 7.62 B
parameters = 113 GiB, sharded over the GPUs, plus on each GPU a whole 14.2 GiB bfloat16 engine
replica and its KV cache (256 slots x 2,048 tokens x 56 KiB = 28 GiB, split over the replicas).
The policy is created directly in the learner's sharding (``init_model(..., mesh=...)``) and
the engine's first weights are cast from those shards: no GPU ever holds the float32 model.
On 1 GPU (``CUDA_VISIBLE_DEVICES`` names one; :func:`get_config`) the AdamW moments, 8 bytes x
N = 56.7 GiB, stay in pinned host memory and visit the GPU one parameter leaf at a time during
the optimiser step (a host loop of per-leaf jitted calls, ``agentrl_jax/learner/offload.py``;
the config uses packed rows, ``pack_length`` 4096, whose ``apply`` this replaces): 2 x 8
bytes per parameter (122 GB) cross the host link each optimiser step, and the host needs
56.7 GiB of page-locked RAM.

GiB per GPU; the verdicts are for an H100 80GB (79.1 GiB total; JAX may use 75.1 at
``XLA_PYTHON_CLIENT_MEM_FRACTION=0.95``; at the default 0.75, 59.3: below the 4-GPU step's
estimated peak). The usable memory is ``--gpu-memory-gib`` (the card's total, GiB; default the
H100's 79.1) x ``--mem-fraction`` (0.95)::

    GPUs  master  AdamW      grads  engine  KV    merged  lower bound  peak   verdict
    1     28.4    56.7       28.4   14.2    28.0  7.9     135.2        164.3  does not fit
    1     28.4    0 (+8.1)   28.4   14.2    28.0  7.9      78.5        107.6  does not fit  (offloaded)
    2     14.2    28.4       14.2   14.2    14.0  7.9      78.7         96.3  does not fit
    4      7.1    14.2        7.1   14.2     7.0  7.9      50.4         62.4  fits

(``merged``: the decode GEMMs' concatenated q|k|v and gate|up weights a one-GPU replica keeps,
built and freed with the KV cache; the KV cache and they are released during the update:
``rollout.release_kv_during_update``; without it 4 GPUs are 57.5 / 77.3, "does not fit"). The
lower bounds of 1 and 2 GPUs are the rollout's live set (no gradients; KV cache and merged
weights) and exceed an H100's 75.1 whatever XLA does. The offloaded row is the config's for 1
GPU: AdamW 0 on the GPU, plus 8.1 GiB of moments assumed in flight during the optimiser step (twice the
moments of the 152064 x 3584 embedding: the largest leaf's, copied in and updated), which is
below the update's transients (36.6), so the peak is the forward / backward's: 164.3 - 56.7 =
107.6. An estimate: the per-leaf schedule's peak matched its estimate on a synthetic
1.9 B-parameter tree on an H100 (docs/LEARNER.md); the 7B step on one H200 peaked at 91.9 GiB
(below). H200 141GB
(``--gpu-memory-gib 140.4``: nvidia-smi's 143771 MiB, which ``benchmarks/scaling_step_gpu.sh``
passes; 133.4 GiB usable): 1 GPU fits only offloaded (107.6; 164.3 without), 2 and 4 fit
(peaks 96.3 and 62.4, below 90% of 133.4). Measured (2026-11-27, this config as it is on 2
and 4 GPUs, H200s; docs/PERFORMANCE.md, "session 9", which has the step times): 2 GPUs peak
86.4 GiB a GPU (estimate 96.3);
4 GPUs with JAX's memory capped at an H100's 75.1 GiB (``XLA_PYTHON_CLIENT_MEM_FRACTION=0.535``)
peak 54.7 GiB (estimate 62.4); 1 GPU (one H200, the moments offloaded, 2026-11-27, session 11):
peak 91.9 GiB (estimate 107.6: above an H100's 75.1).
Earlier: 4 H200s with a 110.5 GiB peak (before the remat fix), and 4 H100s out of
memory at the first update (before the KV release and the bf16 log-prob weights).

(lower bound: what must be live during an update or a rollout; peak adds the update's
transients -- the bf16 compute copy, a micro-batch's gradients, activations -- or, at a weight
sync, the new replica next to the old one and the one bf16 cast of the learner's shards.) An estimate, not
a measurement: benchmarks/rl_step.py records each GPU's measured peak.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Mapping

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.babyai_grpo_gpu import get_config as babyai_gpu_config  # noqa: E402

QWEN25_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584,
                 intermediate_size=18944, num_layers=28, num_heads=28, num_kv_heads=4,
                 head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 attention_bias=True, max_position_embeddings=32768)


def visible_gpu_count() -> int | None:
    """GPUs the run will use: the entries of ``CUDA_VISIBLE_DEVICES`` (how
    ``benchmarks/scaling_step_gpu.sh`` gives a run its GPUs), ``None`` when it is unset (then
    all of the machine's, a number this config does not know without starting JAX)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return len([d for d in visible.split(",") if d.strip()])


def get_config(num_gpus: int | None = None):
    """The experiment's config for ``num_gpus`` GPUs (default :func:`visible_gpu_count`).

    On one GPU the AdamW moments are kept in pinned host memory
    (``learner.offload_optimizer_state``; see :func:`memory_estimate`); with more, or an
    unknown count, they stay on the GPUs (``--set learner.offload_optimizer_state=True`` turns
    it on by hand)."""
    if num_gpus is None:
        num_gpus = visible_gpu_count()
    c = babyai_gpu_config()
    c.model.random_init = dict(QWEN25_7B)
    c.model.dtype = "bfloat16"
    c.rollout.engine_dtype = "bfloat16"
    c.rollout.max_context = 2048
    c.rollout.max_batch = 256
    c.rollout.max_concurrency = 256
    c.horizon.type = "fixed"
    c.horizon.turns = 13
    c.train.tasks_per_step = 32
    c.train.samples_per_task = 8
    c.train.skip_flat_groups = False
    c.train.max_seconds = 0.0
    c.train.eval_before = False
    c.train.eval_after = False
    # the engines' KV cache (7 GiB a GPU on 4 GPUs) is freed while the learner updates
    c.rollout.release_kv_during_update = True
    c.learner.dtype = "bfloat16"  # compute dtype; the master weights stay float32
    c.learner.pack_length = 4096
    c.learner.micro_batch_size = 4
    c.learner.logprob_batch_size = 8
    c.learner.mini_batches = 1
    # one GPU cannot hold the float32 master weights, gradients and AdamW moments (113 GiB)
    # next to the engine replica: the moments (57 GiB) go to pinned host memory
    c.learner.offload_optimizer_state = num_gpus == 1
    return c


GIB = 1024 ** 3
#: the total memory of one H100 80GB as JAX reports it (GiB); nvidia-smi's 81559 MiB is 79.6
H100_TOTAL_GIB = 79.1
#: the share of it JAX may allocate: XLA_PYTHON_CLIENT_MEM_FRACTION, which
#: benchmarks/scaling_step_gpu.sh sets to 0.95 (the default 0.75 would leave 59 GiB of an H100)
DEFAULT_MEM_FRACTION = 0.95
#: what JAX can allocate on one H100 80GB at that fraction (the default ``usable_gib``)
H100_USABLE_GIB = H100_TOTAL_GIB * DEFAULT_MEM_FRACTION
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def parameter_count(shape: Mapping[str, Any]) -> int:
    """Parameters of a Llama / Qwen2 decoder of ``shape`` (the ``QWEN25_7B`` keys):
    ``V*D`` embedding (+ ``D*V`` untied head) + ``D`` final norm + per layer: q/o ``D*H*Dh``
    each, k/v ``D*K*Dh`` each (+ biases ``(H + 2K)*Dh``), MLP ``3*D*F``, two norms ``2*D``."""
    v, d, f = shape["vocab_size"], shape["hidden_size"], shape["intermediate_size"]
    h, k, dh, n = shape["num_heads"], shape["num_kv_heads"], shape["head_dim"], shape["num_layers"]
    layer = 2 * d * h * dh + 2 * d * k * dh + 3 * d * f + 2 * d
    if shape.get("attention_bias"):
        layer += (h + 2 * k) * dh
    return v * d * (1 if shape.get("tie_word_embeddings") else 2) + d + n * layer


def memory_estimate(num_gpus: int, config: Any = None, usable_gib: float | None = None,
                    gpu_memory_gib: float = H100_TOTAL_GIB,
                    mem_fraction: float = DEFAULT_MEM_FRACTION) -> dict[str, Any]:
    """Device memory per GPU (GiB) of ``config`` (default: this experiment's config for
    ``num_gpus``, :func:`get_config`: optimiser state offloaded on 1 GPU) on ``num_gpus``
    GPUs of one host: the learner FSDP over all of them, one engine replica on each.

    The memory JAX may use on each GPU: ``usable_gib`` when given, else ``gpu_memory_gib``
    (the card's total, default an H100 80GB's) x ``mem_fraction``
    (``XLA_PYTHON_CLIENT_MEM_FRACTION``).

    With ``N`` parameters and ``g`` GPUs, per GPU:

    * ``master``: float32 parameters, ``4N/g``; ``adamw``: two float32 moments, ``8N/g``, or 0
      with ``learner.offload_optimizer_state`` (then ``8N/g`` of pinned host memory per GPU,
      ``host_adamw_gib``);
    * ``adamw_in_flight`` (offload only): the moments on the GPU while the optimiser step
      updates them leaf by leaf (``agentrl_jax/learner/offload.py``: one jitted call per
      leaf, so one leaf's moments at a time): assumed twice the moments of the largest leaf
      (the ``V x D`` embedding / LM head: the copy in and the updated moments before they go
      back), ``2 x 8 x V D / g``. An upper-bound assumption, not measured;
    * ``grad_accumulator``: the float32 gradient sum of a mini-batch, ``4N/g`` (update only);
    * ``reference``: a frozen reference policy when the config uses one (``kl_coef > 0``),
      ``bytes(reference_dtype) * N/g``; 0 here;
    * ``engine_weights``: the whole replica in ``rollout.engine_dtype``, ``bytes * N``;
    * ``kv_cache``: ``ceil(slots/g)`` rows of ``max_context`` tokens x ``2 L K Dh`` values;
    * ``engine_merged``: the decode GEMMs' concatenated weights that a one-GPU replica keeps
      beside its own (``rollout.decode_gemm`` ``auto`` -> ``merged_cublas``): every layer's
      q|k|v ``[D, (H + 2K) Dh]`` (+ bias) and gate|up ``[D, 2F]`` in the engine dtype; built and
      freed with the KV cache, so live exactly when it is (0 for ``xla`` GEMMs);
    * ``update_transients``: the compute-dtype weights of *every* layer, gathered,
      ``bytes(learner.dtype) x N``, a micro-batch's gradient shard in that dtype,
      ``bytes(learner.dtype) x N/g``, and activations (rough: the ``L`` saved layer inputs
      ``[rows, pack_length, D]`` and ~3 layers' worth of MLP activations ``[rows, pack_length,
      F]``, ``rows = ceil(micro_batch_size / g)``). Calibrated on a measurement: on 4 H100s
      (2026-11-27, ``docs/results/scaling_s8/qwen7b_4gpu_h100/``) the micro-batch step asked
      XLA for one 17.1 GiB scratch buffer, which a sharded compute copy (``2 x bytes x N/g``
      = 7.1 GiB with the activations' 2.1: this estimate's form until then) cannot explain and
      the gathered weights (14.2) + activations (2.1) nearly do -- as if XLA kept each layer's
      gathered weights from the forward pass to the backward; not confirmed on a GPU profile;
    * ``sync_transients``: at a weight sync, the new replica next to the old one plus the
      single cast of the learner's shards to the engine dtype, ``bytes * N (1 + 1/g)``.

    ``lower_bound`` = what must be live at once whatever XLA does: master + AdamW +
    accumulator + reference + engine weights + KV cache (+ merged weights) during an update; with
    ``rollout.release_kv_during_update`` the larger of that without the KV cache and the
    rollout's (the same without the accumulator, with the KV cache). ``peak`` = the larger of
    the update peak (update's live set + the larger of the update transients and, offloaded,
    the optimiser step's moments in flight) and the sync peak (no accumulator; + sync
    transients). ``verdict``: ``"does not fit"`` when the lower bound
    exceeds ``usable_gib`` (conclusive) or the peak does (estimated): skipped; ``"fits"`` when
    the peak is below 90% of it, else ``"tight"`` (try; may run out of memory).
    """
    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.rollout.engine.engine_config import EngineConfig
    from agentrl_jax.rollout.engine.forward import XLA_GEMM
    from agentrl_jax.training import services

    if usable_gib is None:
        usable_gib = gpu_memory_gib * mem_fraction
    c = config if config is not None else get_config(num_gpus=num_gpus)
    shape = dict(c.model.random_init)
    n = parameter_count(shape)
    g = int(num_gpus)
    mcfg = ModelConfig(**shape)
    engine_dtype = c.rollout.get("engine_dtype") or c.model.get("dtype", "float32")
    eb = _BYTES[engine_dtype]
    lb = _BYTES[c.learner.get("dtype", "float32")]
    slots = services.engine_slots(c, mcfg, engine_dtype, backend="gpu")
    replica_slots = math.ceil(slots / g)
    kv_per_token = 2 * mcfg.num_layers * mcfg.num_kv_heads * mcfg.head_dim * eb
    tensor_parallel = int(c.rollout.get("tensor_parallel", 1))
    decode_gemm = EngineConfig(decode_gemm=str(c.rollout.get("decode_gemm", "auto"))
                               ).resolved_decode_gemm("gpu", tensor_parallel)
    qkv_width = (mcfg.num_heads + 2 * mcfg.num_kv_heads) * mcfg.head_dim
    merged_per_layer = (mcfg.hidden_size * (qkv_width + 2 * mcfg.intermediate_size)
                        + (qkv_width if mcfg.attention_bias else 0))
    rows = math.ceil(int(c.learner.micro_batch_size) / g)
    t = int(c.learner.get("pack_length", 0) or c.rollout.max_context)
    activations = rows * t * (mcfg.num_layers * mcfg.hidden_size * lb
                              + 3 * mcfg.intermediate_size * lb * 3)
    uses_reference = float(c.learner.get("kl_coef", 0.0)) > 0
    offloads = bool(c.learner.get("offload_optimizer_state", False))
    largest_leaf = max(shape["vocab_size"] * shape["hidden_size"],
                       shape["hidden_size"] * shape["intermediate_size"])
    parts = {
        "master": 4 * n / g,
        "adamw": 0.0 if offloads else 8 * n / g,
        "adamw_in_flight": 2 * 8 * largest_leaf / g if offloads else 0.0,
        "grad_accumulator": 4 * n / g,
        "reference": (_BYTES[c.learner.get("reference_dtype", "float32")] * n / g
                      if uses_reference else 0.0),
        "engine_weights": eb * n,
        "kv_cache": replica_slots * int(c.rollout.max_context) * kv_per_token,
        "engine_merged": (0.0 if decode_gemm == XLA_GEMM
                          else eb * mcfg.num_layers * merged_per_layer),
        "update_transients": lb * n + lb * n / g + activations,
        "sync_transients": eb * n * (1 + 1 / g),
    }
    parts = {k: v / GIB for k, v in parts.items()}
    # rollout.release_kv_during_update: the KV cache is freed for the update and the weight
    # sync (the next rollout allocates it again), so it is live only while the grads are not
    # (the merged decode weights are built and freed with it)
    releases_kv = bool(c.rollout.get("release_kv_during_update", False))
    with_kv = parts["kv_cache"] + parts["engine_merged"]
    kv_in_update = 0.0 if releases_kv else with_kv
    held = sum(parts[k] for k in ("master", "adamw", "reference", "engine_weights"))
    update_live = held + parts["grad_accumulator"] + kv_in_update
    lower = max(update_live, held + with_kv)
    update_peak = update_live + max(parts["update_transients"], parts["adamw_in_flight"])
    sync_peak = held + kv_in_update + parts["sync_transients"]
    peak = max(update_peak, sync_peak)
    adamw_text = "0 (offloaded to host memory)" if offloads else f"{parts['adamw']:.1f}"
    reference_text = f" + reference {parts['reference']:.1f}" if uses_reference else ""
    kv_text = (f" + KV cache {parts['kv_cache']:.1f} + merged decode weights "
               f"{parts['engine_merged']:.1f}")
    if lower > usable_gib:
        verdict = "does not fit"
        if update_live >= lower:
            phase = (f"an update (master {parts['master']:.1f} + AdamW {adamw_text} + gradients "
                     f"{parts['grad_accumulator']:.1f} + engine replica "
                     f"{parts['engine_weights']:.1f}"
                     + (" (KV cache released)" if releases_kv else kv_text))
        else:
            phase = (f"a rollout (master {parts['master']:.1f} + AdamW {adamw_text} + engine "
                     f"replica {parts['engine_weights']:.1f}{kv_text}")
        reason = (f"{g} GPU(s): at least {lower:.1f} GiB must be live per GPU during "
                  f"{phase}{reference_text}) > {usable_gib:.1f} GiB usable")
    elif peak > usable_gib:
        verdict = "does not fit"
        reason = (f"{g} GPU(s): estimated peak {peak:.1f} GiB > {usable_gib:.1f} GiB usable "
                  f"(update transients {parts['update_transients']:.1f}: an estimate "
                  "calibrated on one measurement)")
    elif peak < 0.9 * usable_gib:
        verdict, reason = "fits", f"{g} GPU(s): estimated peak {peak:.1f} GiB of {usable_gib:.1f}"
    else:
        verdict = "tight"
        reason = (f"{g} GPU(s): estimated peak {peak:.1f} GiB, within 10% of (or above) "
                  f"{usable_gib:.1f} GiB usable: may run out of memory")
    return {"num_gpus": g, "parameters": n, "engine_slots_per_gpu": replica_slots,
            "uses_reference": uses_reference, "releases_kv_during_update": releases_kv,
            "offloads_optimizer_state": offloads,
            "host_adamw_gib": 8 * n / g / GIB if offloads else 0.0,
            "parts_gib": parts, "lower_bound_gib": lower,
            "update_peak_gib": update_peak, "sync_peak_gib": sync_peak, "peak_gib": peak,
            "gpu_memory_gib": gpu_memory_gib, "mem_fraction": usable_gib / gpu_memory_gib,
            "usable_gib": usable_gib, "verdict": verdict, "reason": reason}


def main(argv: list[str] | None = None) -> int:
    """Print the per-GPU memory table; ``--gpus N --check``: exit 3 when N GPUs cannot fit."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--gpus", default="1,2,4")
    p.add_argument("--check", action="store_true",
                   help="one GPU count: exit 3 if the estimate says it does not fit")
    p.add_argument("--gpu-memory-gib", type=float, default=H100_TOTAL_GIB,
                   help="the card's total memory as JAX / nvidia-smi report it, GiB (default "
                        f"{H100_TOTAL_GIB}: an H100 80GB; an H200 141GB: 140.4)")
    p.add_argument("--mem-fraction", type=float, default=DEFAULT_MEM_FRACTION,
                   help="the share of it JAX may use (XLA_PYTHON_CLIENT_MEM_FRACTION; "
                        f"default {DEFAULT_MEM_FRACTION})")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not args.gpu_memory_gib > 0:
        p.error("--gpu-memory-gib must be > 0")
    if not 0 < args.mem_fraction <= 1:
        p.error("--mem-fraction must be in (0, 1]")
    rows = [memory_estimate(int(g), gpu_memory_gib=args.gpu_memory_gib,
                            mem_fraction=args.mem_fraction) for g in args.gpus.split(",")]
    keys = list(rows[0]["parts_gib"])
    print(f"Qwen2.5-7B shape, {rows[0]['parameters'] / 1e9:.2f} B parameters; GiB per GPU; "
          f"usable {rows[0]['usable_gib']:.1f} GiB = card {args.gpu_memory_gib:.1f} GiB x "
          f"memory fraction {args.mem_fraction:g}")
    print("| GPUs | " + " | ".join(keys) + " | lower bound | peak | verdict |")
    print("|---" * (len(keys) + 4) + "|")
    for r in rows:
        print(f"| {r['num_gpus']} | " + " | ".join(f"{r['parts_gib'][k]:.1f}" for k in keys)
              + f" | {r['lower_bound_gib']:.1f} | {r['peak_gib']:.1f} | {r['verdict']} |")
    for r in rows:
        print(r["reason"])
        if r["offloads_optimizer_state"]:
            print(f"{r['num_gpus']} GPU(s): AdamW moments offloaded "
                  "(learner.offload_optimizer_state): "
                  f"{r['host_adamw_gib']:.1f} GiB of pinned host memory per GPU")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows if len(rows) > 1 else rows[0], f, indent=2)
    if args.check:
        return 3 if any(r["verdict"] == "does not fit" for r in rows) else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
