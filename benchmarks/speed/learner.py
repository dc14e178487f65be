"""Learner throughput / MFU benchmark (policy update step: forward + backward + AdamW).

Default: a Qwen2.5-1.5B-shaped policy (random weights; vocab 151936, hidden 1536, FFN 8960,
28 layers, 12 heads / 2 KV heads, head_dim 128, tied embeddings, q/k/v bias) at sequence 4096,
bf16 compute with float32 master weights, remat, on one device. The timed step is exactly the
learner's jitted PPO/GRPO step (``Learner.train_minibatch``): chunked logprobs + entropy from the
hidden states, clipped policy loss, gradient accumulation over micro-batches, global-norm clip,
AdamW. A second row times the forward-only logprob pass (old / reference logprobs).

    python benchmarks/speed/learner.py                       # GPU: 1.5B, T=4096, 1 device, 4 x 1 micro
    python benchmarks/speed/learner.py --micro-batch 1 --grad-accum 4 --remat-policy dots
    python benchmarks/speed/learner.py --devices 2 --scaling-mesh data   # scaling: same per-device
                                                       # batch, 1 vs N devices
    python benchmarks/speed/learner.py --profile             # + device time by kernel class
    python benchmarks/speed/learner.py --small               # CPU smoke run (tiny model, T=256)
    python benchmarks/speed/learner.py --small --devices 4   # CPU scaling smoke run (virtual devices)
    ... --json out.json

MFU = 6 * N_matmul * tokens + causal attention FLOPs (6 * L * H * Dh * T per token), divided by
time x devices x peak (H100/H200 SXM: 989 TFLOP/s dense bf16); remat recomputation is not
counted (it is "model" FLOPs utilisation). See agentrl_jax/learner/metrics.py.

Choices that matter for MFU (see docs/LEARNER.md):
* cuDNN flash attention: ``attention_impl="cudnn"`` (``--attention auto`` picks it on GPU in
  bf16). ``jax.nn.dot_product_attention``'s default implementation is XLA's, which materialises
  [B, H, T, T] scores. The learner passes no attention mask (right-padded rows: the causal mask
  is exact for real tokens), which keeps the fused causal kernel usable.
* chunked logprobs: the [T, 151936] logits are computed ``--chunk`` positions at a time under
  ``jax.checkpoint`` (never the 2.5 GB/sequence f32 tensor).
* remat: per-layer ``nnx.remat``; ``--remat-policy dots`` saves matmul outputs
  (``dots_with_no_batch_dims_saveable``: no recomputed matmuls in the backward pass, more
  memory), ``full`` recomputes the whole layer (least memory, ~33% more FLOPs), ``none``.
* XLA GPU flags: the latency-hiding scheduler (overlaps FSDP all-gathers / reduce-scatters with
  compute); more via ``--xla-flags``.
* AdamW: optax's AdamW over the whole parameter tree inside the same jit; XLA fuses the
  element-wise update into a handful of kernels (no separate "fused Adam" needed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

QWEN25_15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                  num_heads=12, num_kv_heads=2, head_dim=128, model_type="qwen2",
                  tie_word_embeddings=True, attention_bias=True, rope_theta=1e6,
                  rms_norm_eps=1e-6, max_position_embeddings=32768)
SMALL = dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
             num_kv_heads=2, head_dim=32, model_type="qwen2", tie_word_embeddings=True,
             attention_bias=True)
REMAT_POLICIES = {"full": (True, None), "dots": (True, "dots_with_no_batch_dims_saveable"),
                  "none": (False, None)}
GPU_XLA_FLAGS = "--xla_gpu_enable_latency_hiding_scheduler=true"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="tiny model, T=256 (CPU smoke run)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default 4096; small 256)")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="sequences per micro-batch PER DEVICE (default 4; small 2)")
    p.add_argument("--grad-accum", type=int, default=None,
                   help="micro-batches per optimiser step (default 1; small 4)")
    p.add_argument("--remat-policy", choices=sorted(REMAT_POLICIES), default=None,
                   help="default none (1.5B, T=4096, 4 sequences fit without remat: 57 GB); "
                        "small dots")
    p.add_argument("--attention", choices=["auto", "cudnn", "xla"], default="auto")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                   help="compute dtype (default bfloat16; small float32 (bf16 is slow on CPU))")
    p.add_argument("--chunk", type=int, default=1024, help="logprob chunk (positions)")
    p.add_argument("--no-entropy", action="store_true", help="skip the entropy in the step")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 5; small 3)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps (compile + warm-up)")
    p.add_argument("--devices", type=int, default=0,
                   help="scaling mode: same per-device batch on 1 vs N devices")
    p.add_argument("--scaling-mesh", choices=["fsdp", "data"], default="fsdp",
                   help="axis spanning the N devices in scaling mode")
    p.add_argument("--no-forward", action="store_true", help="skip the logprob forward row")
    p.add_argument("--memory-analysis", action="store_true",
                   help="also compile the step ahead of time and print XLA's memory analysis "
                        "(argument / temp bytes; one extra compilation)")
    p.add_argument("--profile", action="store_true",
                   help="GPU: print the train step's device time by kernel class and top kernels "
                        "(from a profiler trace of 2 steps)")
    p.add_argument("--stack-dump-s", type=float, default=0.0,
                   help="print every thread's Python stack every N seconds (diagnose hangs)")
    p.add_argument("--xla-flags", default="", help="extra XLA_FLAGS")
    p.add_argument("--json", default=None, help="write results to this JSON file")
    return p.parse_args(argv)


def setup_env(args) -> None:
    """XLA flags must be set before JAX initialises its backends."""
    flags = [os.environ.get("XLA_FLAGS", ""), GPU_XLA_FLAGS, args.xla_flags]
    if args.devices > 1 and "xla_force_host_platform_device_count" not in flags[0]:
        flags.append(f"--xla_force_host_platform_device_count={args.devices}")  # CPU only
    os.environ["XLA_FLAGS"] = " ".join(f for f in flags if f).strip()
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    if args.small:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


def random_params(abstract, shardings, seed: int = 0, scale: float = 0.02):
    """Random weights for the benchmark, one small jitted init per distinct (shape, dtype,
    sharding), written straight into each parameter's sharding: ``N(0, scale^2)`` for matrices
    and biases, ones for norm scales (vectors named ``scale``/``weight`` of a norm).

    (Compiling the model's own initialiser for the whole 1.5B-parameter tree in one XLA
    program takes minutes on a GPU, against seconds for a 2-layer model: docs/PERFORMANCE.md.)
    """
    import zlib

    import jax
    import jax.numpy as jnp

    cache = {}

    def init(path, leaf, sharding):
        names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
        is_norm = any("norm" in n for n in names) and len(leaf.shape) == 1
        key = (tuple(leaf.shape), jnp.dtype(leaf.dtype).name, sharding, is_norm)
        if key not in cache:
            shape, dtype = leaf.shape, leaf.dtype
            if is_norm:
                cache[key] = jax.jit(lambda k: jnp.ones(shape, dtype), out_shardings=sharding)
            else:
                cache[key] = jax.jit(
                    lambda k: (scale * jax.random.normal(k, shape, jnp.float32)).astype(dtype),
                    out_shardings=sharding)
        # crc32, not hash(): str hashes are salted per process (PYTHONHASHSEED)
        salt = zlib.crc32("/".join(names).encode()) % (2**31)
        return cache[key](jax.random.fold_in(jax.random.key(seed), salt))

    return jax.tree_util.tree_map_with_path(init, abstract, shardings)


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_env(args)
    if args.stack_dump_s > 0:
        import faulthandler

        faulthandler.dump_traceback_later(args.stack_dump_s, repeat=True)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

    import jax
    import numpy as np
    from flax import nnx

    from agentrl_jax.learner import Learner, LearnerConfig
    from agentrl_jax.learner.metrics import (forward_flops_per_token, peak_flops_per_device,
                                             train_flops_per_token)
    from agentrl_jax.learner.train_step import minibatch_sharding
    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.models.llama import CausalLM
    from agentrl_jax.sharding.mesh import make_mesh
    from agentrl_jax.sharding.rules import batch_sharding, state_shardings

    seq = args.seq or (256 if args.small else 4096)
    micro = args.micro_batch or (2 if args.small else 4)
    if args.grad_accum is None:
        args.grad_accum = 4 if args.small else 1
    if args.remat_policy is None:
        args.remat_policy = "dots" if args.small else "none"
    steps = args.steps or (3 if args.small else 5)
    dtype = args.dtype or ("float32" if args.small else "bfloat16")
    platform = jax.devices()[0].platform
    attention = {"auto": "cudnn" if (platform == "gpu" and dtype == "bfloat16") else None,
                 "cudnn": "cudnn", "xla": None}[args.attention]
    remat, policy = REMAT_POLICIES[args.remat_policy]
    model_cfg = ModelConfig(**(SMALL if args.small else QWEN25_15B))
    kind = jax.devices()[0].device_kind
    peak = peak_flops_per_device(kind)

    def build(mesh, global_micro):
        cfg = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype=dtype, remat=remat,
                            remat_policy=policy,
                            attention_impl=attention, micro_batch_size=global_micro,
                            logprob_chunk_size=args.chunk, learning_rate=1e-6,
                            entropy_metric=not args.no_entropy, min_length_bucket=seq)
        # random init directly into the parameter shardings (no host copy of the model)
        abstract = nnx.eval_shape(lambda: CausalLM(model_cfg, nnx.Rngs(0)))
        graphdef, abs_params = nnx.split(abstract, nnx.Param)
        shardings = state_shardings(abs_params, mesh)
        params = random_params(abs_params, shardings)
        learner = Learner(nnx.merge(graphdef, params), cfg, mesh=mesh, copy_model=False)
        del params
        return learner

    def minibatch(global_micro, rng):
        shape = (args.grad_accum, global_micro, seq)
        lm = np.ones(shape, np.float32)
        lm[..., : seq // 8] = 0  # a prompt
        return {"tokens": rng.integers(0, model_cfg.vocab_size, shape).astype(np.int32),
                "attention_mask": np.ones(shape, np.int32), "loss_mask": lm,
                "old_logprobs": np.full(shape, -8.0, np.float32) * lm,
                "advantages": rng.standard_normal(shape).astype(np.float32) * lm}

    used_devices: set[int] = set()

    def run(n_devices: int) -> dict:
        devices = jax.devices()[:n_devices]
        axes = {"data": 1, "fsdp": 1, "tensor": 1}
        axes["data" if args.scaling_mesh == "data" else "fsdp"] = n_devices
        mesh = make_mesh(devices=devices, **axes)
        global_micro = micro * n_devices
        t_build = time.perf_counter()
        print(f"[{n_devices} device(s)] building the policy + optimiser state ...", flush=True)
        learner = build(mesh, global_micro)
        print(f"[{n_devices} device(s)] built in {time.perf_counter() - t_build:.1f} s", flush=True)
        rng = np.random.default_rng(0)
        mb = minibatch(global_micro, rng)
        sh = minibatch_sharding(mesh)
        mb = {k: jax.device_put(v, sh) for k, v in mb.items()}
        memory = None
        if args.memory_analysis:
            step_fn = learner.train_step(tuple(sorted(mb)), True, False)
            ma = step_fn.lower(learner.params, learner.opt_state, None, None,
                               mb).compile().memory_analysis()
            if ma is not None:
                memory = {k: getattr(ma, k) / 2**30 for k in (
                    "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                    "temp_size_in_bytes") if hasattr(ma, k)}
                print(f"[{n_devices} device(s)] XLA memory analysis (GiB): "
                      + ", ".join(f"{k.replace('_size_in_bytes', '')} {v:.2f}"
                                  for k, v in memory.items()), flush=True)
        print(f"[{n_devices} device(s)] mesh {dict(mesh.shape)}: compiling the train step ...",
              flush=True)
        t0 = time.perf_counter()
        jax.block_until_ready(learner.train_minibatch(mb))
        compile_s = time.perf_counter() - t0
        print(f"[{n_devices} device(s)] first step (compile + run) {compile_s:.1f} s", flush=True)
        for _ in range(max(args.warmup - 1, 0)):
            jax.block_until_ready(learner.train_minibatch(mb))
        t0 = time.perf_counter()
        for _ in range(steps):
            metrics = learner.train_minibatch(mb)
        jax.block_until_ready((metrics, learner.params))
        step_s = (time.perf_counter() - t0) / steps
        tokens = args.grad_accum * global_micro * seq
        flops = train_flops_per_token(model_cfg, seq) * tokens
        row = {"mode": "train", "devices": n_devices, "mesh": dict(mesh.shape),
               "tokens_per_step": tokens, "step_s": step_s, "compile_s": compile_s,
               "tokens_per_s": tokens / step_s,
               "tflops_per_s_per_device": flops / step_s / n_devices / 1e12,
               "mfu": (flops / step_s / n_devices / peak) if peak else None,
               "loss": float(metrics["actor/pg_loss"]),
               "grad_norm": float(metrics["actor/grad_norm"]), "xla_memory_gb": memory}
        print(f"[{n_devices} device(s)] step {step_s:.4f} s, {tokens / step_s:.0f} tokens/s, "
              f"MFU {100 * row['mfu']:.1f}%" if row["mfu"] else f"step {step_s:.4f} s", flush=True)
        if args.profile:
            from benchmarks.speed.devtime import device_time, format_kernels

            dt = device_time(lambda lr=learner: lr.train_minibatch(mb), calls=2, top=25)
            row["device_profile"] = dt
            print(f"[{n_devices} device(s)] train step device profile:\n{format_kernels(dt)}",
                  flush=True)
        out = [row]
        # memory_stats' peak is the process's: a device an earlier row ran on carries that
        # row's peak, so read the devices only this row used where there are any
        fresh = [d for d in devices if d.id not in used_devices]
        used_devices.update(d.id for d in devices)
        try:
            peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use", 0) for d in
                     (fresh or devices)]
            row["peak_memory_gb"] = max(peaks) / 2**30 or None
            row["peak_memory_from"] = ("devices only this row used" if fresh else
                                       "process peak of devices earlier rows used too")
        except Exception:
            row["peak_memory_gb"] = None
        if not args.no_forward:
            fn = learner.logprob_fn(str(jax.tree.leaves(learner.params)[0].dtype))
            bs = batch_sharding(mesh, 2)
            tok = jax.device_put(np.asarray(mb["tokens"][0]), bs)
            am = jax.device_put(np.asarray(mb["attention_mask"][0]), bs)
            jax.block_until_ready(fn(learner.params, tok, am))
            t0 = time.perf_counter()
            for _ in range(steps):
                res = fn(learner.params, tok, am)
            jax.block_until_ready(res)
            fs = (time.perf_counter() - t0) / steps
            ftok = global_micro * seq
            fflops = forward_flops_per_token(model_cfg, seq) * ftok
            out.append({"mode": "logprob_fwd", "devices": n_devices, "mesh": dict(mesh.shape),
                        "tokens_per_step": ftok, "step_s": fs, "tokens_per_s": ftok / fs,
                        "tflops_per_s_per_device": fflops / fs / n_devices / 1e12,
                        "mfu": (fflops / fs / n_devices / peak) if peak else None})
        del learner
        return out

    results = {"device_kind": kind, "platform": platform, "peak_flops_per_device": peak,
               "model": "small" if args.small else "qwen2.5-1.5b-shaped",
               "num_parameters": model_cfg.num_parameters, "seq": seq,
               "micro_batch_per_device": micro, "grad_accum": args.grad_accum, "dtype": dtype,
               "remat_policy": args.remat_policy, "attention_impl": attention or "xla",
               "logprob_chunk": args.chunk, "entropy": not args.no_entropy,
               "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax": jax.__version__, "rows": []}
    results["rows"] += run(1)
    if args.devices > 1:
        if len(jax.devices()) < args.devices:
            raise SystemExit(f"--devices {args.devices}: only {len(jax.devices())} devices")
        results["rows"] += run(args.devices)
        one = [r for r in results["rows"] if r["mode"] == "train" and r["devices"] == 1][0]
        many = [r for r in results["rows"] if r["mode"] == "train" and r["devices"] > 1][0]
        results["scaling_efficiency"] = many["tokens_per_s"] / (args.devices * one["tokens_per_s"])

    print(f"device: {kind} ({platform}), peak {peak / 1e12 if peak else 'unknown'} TFLOP/s/device")
    print(f"model: {results['model']} ({model_cfg.num_parameters / 1e9:.3f} B params), T={seq}, "
          f"micro-batch {micro}/device x {args.grad_accum} accum, {dtype}, remat "
          f"{args.remat_policy}, attention {results['attention_impl']}")
    header = (f"{'mode':<12}{'dev':>4}{'tokens/step':>12}{'step s':>10}{'tokens/s':>12}"
              f"{'TFLOP/s/dev':>13}{'MFU':>8}{'compile s':>11}{'peak GB':>9}")
    print(header)
    print("-" * len(header))
    for r in results["rows"]:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
        comp = f"{r['compile_s']:.1f}" if "compile_s" in r else ""
        mem = f"{r['peak_memory_gb']:.1f}" if r.get("peak_memory_gb") else ""
        print(f"{r['mode']:<12}{r['devices']:>4}{r['tokens_per_step']:>12}{r['step_s']:>10.4f}"
              f"{r['tokens_per_s']:>12.1f}{r['tflops_per_s_per_device']:>13.3f}{mfu:>8}"
              f"{comp:>11}{mem:>9}")
    if "scaling_efficiency" in results:
        print(f"scaling efficiency 1 -> {args.devices} devices ({args.scaling_mesh}): "
              f"{100 * results['scaling_efficiency']:.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
