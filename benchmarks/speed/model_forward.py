"""Forward pass of a random model of a published shape: bf16 vs f32 agreement and throughput.

    python benchmarks/speed/model_forward.py --shape qwen2.5-1.5b --batch 8 --seq 2048

Reports the bf16 forward's tokens/s (median of repeats after a compile) and how far bf16 logits
are from the f32 logits of the same weights (max |diff| relative to the f32 logit scale, and the
top-1 agreement), side by side in one process.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import init_model

SHAPES = {
    "qwen2.5-1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536,
                         intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2,
                         head_dim=128, tie_word_embeddings=True, attention_bias=True,
                         rope_theta=1e6, rms_norm_eps=1e-6),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                         tie_word_embeddings=True, rope_theta=1e5, rms_norm_eps=1e-5),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                 num_heads=4, num_kv_heads=2, head_dim=16),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cfg32 = ModelConfig(**SHAPES[args.shape])
    model = init_model(cfg32, seed=0)
    state = nnx.split(model)[1]
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg32.vocab_size,
                                                           (args.batch, args.seq)), jnp.int32)
    results = {"shape": args.shape, "batch": args.batch, "seq": args.seq,
               "device": jax.devices()[0].device_kind, "params": cfg32.num_parameters}
    logits = {}
    for dtype in ("float32", "bfloat16"):
        gd = nnx.split(nnx.eval_shape(lambda: init_model(cfg32.replace(dtype=dtype))))[0]

        @jax.jit
        def forward(st, x, gd=gd):
            return nnx.merge(gd, st)(x).logits

        out = forward(state, tokens).block_until_ready()
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            forward(state, tokens).block_until_ready()
            times.append(time.perf_counter() - t0)
        median = float(np.median(times))
        results[dtype] = {"median_s": median, "tokens_per_s": args.batch * args.seq / median,
                          "finite": bool(jnp.isfinite(out).all())}
        logits[dtype] = np.asarray(out[:, -256:], np.float32)
    diff = np.abs(logits["bfloat16"] - logits["float32"])
    scale = np.abs(logits["float32"]).max()
    results["bf16_vs_f32"] = {
        "max_abs_diff": float(diff.max()), "max_abs_logit": float(scale),
        "relative_max_diff": float(diff.max() / scale),
        "top1_agreement": float((logits["bfloat16"].argmax(-1)
                                 == logits["float32"].argmax(-1)).mean())}
    results["bf16_speedup_vs_f32"] = results["float32"]["median_s"] / results["bfloat16"]["median_s"]
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
