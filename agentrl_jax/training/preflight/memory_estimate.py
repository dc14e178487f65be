"""Device memory per GPU of an RL step, estimated from the config before anything starts.

:func:`memory_estimate` adds up what one GPU holds when the learner is sharded (FSDP) over
``g`` GPUs of one host and each GPU runs a whole engine replica: float32 master weights, AdamW
moments (or none, offloaded to host memory), the gradient accumulator, a reference policy, the
engine replica, its KV cache and merged decode weights, and the update's and weight sync's
transients; it returns a lower bound (what must be live whatever XLA does), a peak and a
verdict against the card's usable memory. :func:`parameter_count` counts a Llama / Qwen2
decoder's parameters from its shape.

``python -m agentrl_jax.training.preflight.memory_estimate --config experiments/babyai.py:paper_scale_7b
--gpus 1,2,4`` prints the table (``--check``: exit 3 when a count cannot fit; ``--json``).
An estimate, not a measurement: ``benchmarks/speed/rl_step.py`` records each GPU's measured peak
(docs/PERFORMANCE.md).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any, Mapping

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rollout.engine.resolution import resolve_engine_config
from agentrl_jax.rollout.engine.forward import XLA_GEMM
from agentrl_jax.training.runtime import services
from agentrl_jax.training.config.experiment import to_run_config
from agentrl_jax.training.config.sections import RunConfig
from agentrl_jax.training.config.rollout_section import engine_config_of_run

GIB = 1024 ** 3
#: the total memory of one H100 80GB as JAX reports it (GiB); nvidia-smi's 81559 MiB is 79.6
H100_TOTAL_GIB = 79.1
#: the share of it JAX may allocate: XLA_PYTHON_CLIENT_MEM_FRACTION, which
#: benchmarks/gpu/scaling_step.sh sets to 0.95 (the default 0.75 would leave 59 GiB of an H100)
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


#: the ModelConfig fields that make a decoder's shape (what ``parameter_count`` and the estimate read)
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim", "tie_word_embeddings", "attention_bias", "model_type")


def model_shape(config: RunConfig) -> dict[str, Any]:
    """The decoder shape of ``config.model``: its ``random_init`` when set, else the named model's
    (``model.name``: a known name, a HF directory's config.json or a GGUF file's metadata, read
    without loading a weight), as the ``SHAPE_FIELDS`` of its ``ModelConfig``."""
    if config.model.random_init:
        return dict(config.model.random_init)
    from agentrl_jax.models.pretrained import load_model_config

    cfg = load_model_config(config.model.name)
    return {name: getattr(cfg, name) for name in SHAPE_FIELDS}


def memory_estimate(num_gpus: int, config: RunConfig, usable_gib: float | None = None,
                    gpu_memory_gib: float = H100_TOTAL_GIB,
                    mem_fraction: float = DEFAULT_MEM_FRACTION) -> dict[str, Any]:
    """Device memory per GPU (GiB) of the run ``config`` (a ``RunConfig``; the decoder's shape is
    :func:`model_shape`'s: ``model.random_init``, else the named model's) on ``num_gpus`` GPUs of
    one host: the learner FSDP over all of them, one engine replica on each.

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
      (2026-11-27, ``results/scaling_s8/qwen7b_4gpu_h100/``) the micro-batch step asked
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
    if usable_gib is None:
        usable_gib = gpu_memory_gib * mem_fraction
    c = config
    shape = model_shape(c)
    n = parameter_count(shape)
    g = int(num_gpus)
    mcfg = ModelConfig(**shape)
    engine_dtype = c.rollout.engine_dtype or c.model.dtype
    eb = _BYTES[engine_dtype]
    lb = _BYTES[c.learner.dtype]
    slots = services.engine_slots(c, mcfg, engine_dtype, backend="gpu")
    replica_slots = math.ceil(slots / g)
    kv_per_token = 2 * mcfg.num_layers * mcfg.num_kv_heads * mcfg.head_dim * eb
    tensor_parallel = int(c.rollout.tensor_parallel)
    decode_gemm = resolve_engine_config(engine_config_of_run(c.rollout, c.seed), "gpu",
                                        tensor_parallel).decode_gemm
    qkv_width = (mcfg.num_heads + 2 * mcfg.num_kv_heads) * mcfg.head_dim
    merged_per_layer = (mcfg.hidden_size * (qkv_width + 2 * mcfg.intermediate_size)
                        + (qkv_width if mcfg.attention_bias else 0))
    rows = math.ceil(int(c.learner.micro_batch_size) / g)
    t = int(c.learner.pack_length or c.rollout.max_context)
    activations = rows * t * (mcfg.num_layers * mcfg.hidden_size * lb
                              + 3 * mcfg.intermediate_size * lb * 3)
    uses_reference = float(c.learner.kl_coef) > 0
    offloads = bool(c.learner.offload_optimizer_state)
    largest_leaf = max(shape["vocab_size"] * shape["hidden_size"],
                       shape["hidden_size"] * shape["intermediate_size"])
    parts = {
        "master": 4 * n / g,
        "adamw": 0.0 if offloads else 8 * n / g,
        "adamw_in_flight": 2 * 8 * largest_leaf / g if offloads else 0.0,
        "grad_accumulator": 4 * n / g,
        "reference": (_BYTES[c.learner.reference_dtype] * n / g
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
    releases_kv = bool(c.rollout.release_kv_during_update)
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


def config_for(spec: str, num_gpus: int) -> RunConfig:
    """The config of experiment ``spec`` (``path`` or ``path:variant``) for ``num_gpus`` GPUs:
    ``get_config(variant, num_gpus=num_gpus)`` when the experiment sizes itself by GPU count (as
    ``experiments/babyai.py:paper_scale_7b`` does: optimiser state offloaded on one GPU), else
    ``get_config(variant)``, as a ``RunConfig``; ``SystemExit`` with the problem when it does
    not load, ``ConfigError`` when a value is bad."""
    from agentrl_jax.training.config.command_line import load_experiment

    return to_run_config(load_experiment(spec, num_gpus=num_gpus))


def main(argv: list[str] | None = None) -> int:
    """Print the per-GPU memory table of an experiment (``--config FILE[:variant]``: its
    ``model.random_init`` shape or its named model's); ``--gpus N --check``: exit 3 when N GPUs
    cannot fit."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--config", required=True,
                   help="experiment file[:variant] (get_config())")
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
    rows = [memory_estimate(int(g), config_for(args.config, int(g)),
                            gpu_memory_gib=args.gpu_memory_gib, mem_fraction=args.mem_fraction)
            for g in args.gpus.split(",")]
    keys = list(rows[0]["parts_gib"])
    print(f"{args.config}: {rows[0]['parameters'] / 1e9:.2f} B parameters; GiB per GPU; "
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


__all__ = ["memory_estimate", "parameter_count", "GIB", "H100_TOTAL_GIB", "H100_USABLE_GIB",
           "DEFAULT_MEM_FRACTION"]


if __name__ == "__main__":
    raise SystemExit(main())
