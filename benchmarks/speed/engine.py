"""Rollout-engine throughput: our embedded engine vs a naive JAX loop vs HF ``generate``.

    python benchmarks/speed/engine.py --shape smollm2-135m --batch 256            # on a GPU
    python benchmarks/speed/engine.py --shape qwen2.5-1.5b --batch 256 --json out.json
    python benchmarks/speed/engine.py --small                                     # CPU smoke run

Every contender generates ``--new-tokens`` tokens (EOS ignored) for ``--batch`` random prompts
of ``--prompt-len`` tokens with the same random-weight model shape (bf16 by default):

* ``engine``: ``agentrl_jax.rollout.engine.engine.Engine`` (continuous batching, chunked prefill,
  ``--decode-steps`` fused decode steps per jitted call, donated KV cache). Wall time from
  submitting all requests to the last result (prefill included).
* ``naive_jax``: one jitted prefill, then a Python loop calling a jitted single-step decode with
  a KV cache (cache donated) once per token and fetching the sampled tokens to the host every
  step (as a loop that checks EOS must) -- the usual hand-written JAX sampler.
* ``hf``: ``transformers`` ``model.generate`` (PyTorch, static batch, ``min_new_tokens`` =
  ``max_new_tokens``) on the same GPU; skipped with a note when torch/CUDA is missing (except
  with ``--small``, where it runs on the CPU).

Reported: tokens/s (generated tokens / wall s), the ratio vs HF, the engine's mean decode-step
time vs the memory-bandwidth roofline (bytes of weights + KV cache read per step /
``--bandwidth``: ``measure`` (the default) times a device-to-device copy of ``--copy-bytes`` in
the same process, in JAX and in PyTorch, and uses bytes read + written / time
(``benchmarks/speed/copy_bandwidth.py``); or a number in B/s), and the prefill
tokens saved by prefix reuse
over a simulated multi-turn conversation (``--turns`` turns, each appending ``--obs-tokens``
observation tokens and generating ``--turn-tokens`` tokens, ``--sessions`` sessions at once).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from typing import Any

import numpy as np

# JAX and PyTorch share the GPU in this process: do not let XLA grab 75% of it up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.speed.copy_bandwidth import (  # noqa: E402
    add_bandwidth_arguments, describe_bandwidth, resolve_bandwidth)

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576,
                         intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
                         head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, max_position_embeddings=8192),
    "qwen2.5-1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536,
                         intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2,
                         head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, attention_bias=True,
                         max_position_embeddings=32768),
    "tiny": dict(model_type="llama", vocab_size=2048, hidden_size=128, intermediate_size=256,
                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                 tie_word_embeddings=True, max_position_embeddings=4096),
}


def model_config(shape: str, dtype: str):
    from agentrl_jax.models.config import ModelConfig

    return ModelConfig(**SHAPES[shape], dtype=dtype, param_dtype=dtype, eos_token_id=2,
                       bos_token_id=1, pad_token_id=2)


def prompts(rng: np.random.Generator, batch: int, length: int, vocab: int) -> list[list[int]]:
    return [rng.integers(3, vocab, size=length).tolist() for _ in range(batch)]


def dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


# --------------------------------------------------------------------------------- engine
def bench_engine(model, cfg, args, batch_prompts, decode_attention: str = "auto",
                 decode_gemm: str = "xla", decode_loop: str = "while") -> dict[str, Any]:
    import jax

    from agentrl_jax.rollout.contract import SamplingParams
    from agentrl_jax.rollout.engine.engine import Engine, EngineConfig

    max_length = args.max_length or (args.prompt_len + args.new_tokens)
    chunk = 1 << (args.prompt_len - 1).bit_length()
    config = EngineConfig(max_batch=args.batch, max_length=max_length, dtype=args.dtype,
                          decode_steps=args.decode_steps, prefill_chunks=(chunk,),
                          prefill_tokens=max(chunk, args.prefill_tokens),
                          kv_layout=args.kv_layout, decode_attention=decode_attention,
                          decode_gemm=decode_gemm, decode_loop=decode_loop,
                          prefill_kv_buckets=())  # the whole row
    t0 = time.perf_counter()
    engine = Engine(model, config)
    compile_s = time.perf_counter() - t0
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=args.temperature,
                              ignore_eos=True)
    try:
        # Warm-up round (fills caches, first-call overheads), then the timed round.
        warm = SamplingParams(max_new_tokens=min(8, args.new_tokens),
                              temperature=args.temperature, ignore_eos=True)
        for f in [engine.submit(p, warm) for p in batch_prompts]:
            f.result()
        before = engine.stats.as_dict()
        profile_dir = getattr(args, "profile", None)
        trace_dir = (os.path.join(profile_dir, f"{decode_attention}_{decode_gemm}_{decode_loop}")
                     if profile_dir else None)
        trace = jax.profiler.trace(trace_dir) if trace_dir else contextlib.nullcontext()
        with trace:  # --profile: an XLA device trace of the timed round (xprof / TensorBoard)
            t0 = time.perf_counter()
            engine.pause("in_place")  # admit the whole batch at once (not one by one)
            futures = [engine.submit(p, sampling) for p in batch_prompts]
            engine.resume()
            results = [f.result()[0] for f in futures]
            wall = time.perf_counter() - t0
        after = engine.stats.as_dict()
    finally:
        engine.close()
    generated = sum(len(r.output_ids) for r in results)
    assert generated == args.batch * args.new_tokens, generated
    steps = after["decode_steps"] - before["decode_steps"]
    decode_s = after["decode_time_s"] - before["decode_time_s"]
    slot_steps = after["decode_slot_steps"] - before["decode_slot_steps"]
    result = {"tokens_per_s": generated / wall, "wall_s": wall, "generated_tokens": generated,
            "decode_attention": engine.decode_attention, "decode_gemm": engine.decode_gemm,
            "decode_loop": decode_loop, "compile_s": compile_s, "decode_steps": steps,
            "decode_calls": after["decode_calls"] - before["decode_calls"],
            "decode_step_ms": 1e3 * decode_s / max(steps, 1),
            "decode_time_s": decode_s,
            "prefill_time_s": after["prefill_time_s"] - before["prefill_time_s"],
            "mean_active_slots": slot_steps / max(steps, 1),
            "max_length": max_length}
    if trace_dir:  # the timed round's device time by XLA program, as rollout_profile.py --trace
        from benchmarks.speed.devtime import device_layout, program_times, trace_events

        events = trace_events(trace_dir)
        result["device_programs"] = program_times(events)
        result["device_layout"] = device_layout(events)
    return result


# ------------------------------------------------------------------------------ naive JAX
def bench_naive(model, cfg, args, batch_prompts) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from agentrl_jax.models.llama import KVCache

    graphdef, state = nnx.split(model)
    max_length = args.prompt_len + args.new_tokens

    @jax.jit
    def prefill(state, cache, ids):
        m = nnx.merge(graphdef, state)
        out = m(ids, None, cache, compute_logits=False)
        return jnp.argmax(m.logits(out.hidden[:, -1]), -1).astype(jnp.int32), out.cache

    def step(state, cache, tok, pos):
        m = nnx.merge(graphdef, state)
        out = m(tok[:, None], jnp.broadcast_to(pos, tok.shape)[:, None], cache,
                compute_logits=False)
        return jnp.argmax(m.logits(out.hidden[:, 0]), -1).astype(jnp.int32), out.cache

    step = jax.jit(step, donate_argnums=(1,))
    ids = jnp.asarray(np.asarray(batch_prompts, np.int32))

    def run(new_tokens: int) -> tuple[float, int]:
        cache = KVCache.zeros(cfg, args.batch, max_length)
        t0 = time.perf_counter()
        tok, cache = prefill(state, cache, ids)
        produced = [np.asarray(tok)]
        for i in range(new_tokens - 1):
            tok, cache = step(state, cache, tok, jnp.int32(args.prompt_len + i))
            produced.append(np.asarray(tok))  # host sync every token
        return time.perf_counter() - t0, len(produced) * args.batch

    t0 = time.perf_counter()
    run(2)
    compile_s = time.perf_counter() - t0
    wall, generated = run(args.new_tokens)
    return {"tokens_per_s": generated / wall, "wall_s": wall, "generated_tokens": generated,
            "compile_s": compile_s, "decode_step_ms": 1e3 * wall / args.new_tokens}


# ------------------------------------------------------------------------------------- HF
def bench_hf(cfg, args, batch_prompts) -> dict[str, Any]:
    try:
        import torch
        import transformers
    except ImportError as e:
        return {"skipped": f"torch/transformers not installed ({e})"}
    cuda = torch.cuda.is_available()
    if not cuda and not args.small:
        return {"skipped": "no CUDA device for torch (HF generate on CPU is only run with "
                           "--small)"}
    device = "cuda" if cuda else "cpu"
    torch_dtype = torch.bfloat16 if (args.dtype == "bfloat16" and cuda) else torch.float32
    hf_cfg = cfg.to_hf_dict()
    hf_cfg.pop("torch_dtype", None)
    config = transformers.AutoConfig.for_model(**hf_cfg)
    torch.manual_seed(0)
    with torch.device(device):  # initialise the random weights directly on the device
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model = model.to(device).eval()
    ids = torch.tensor(batch_prompts, dtype=torch.long, device=device)
    mask = torch.ones_like(ids)

    def run(new_tokens: int) -> tuple[float, int]:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=args.temperature > 0,
                                 temperature=args.temperature if args.temperature > 0 else None,
                                 top_p=None, top_k=None, pad_token_id=cfg.pad_token_id)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0, (out.shape[1] - ids.shape[1]) * ids.shape[0]

    run(4)
    wall, generated = run(args.new_tokens)
    return {"tokens_per_s": generated / wall, "wall_s": wall, "generated_tokens": generated,
            "device": device, "torch_dtype": str(torch_dtype),
            "torch_version": torch.__version__}


# ----------------------------------------------------------------------------- roofline
def roofline(cfg, args, engine_result: dict[str, Any]) -> dict[str, Any]:
    b = dtype_bytes(args.dtype)
    weight_bytes = cfg.num_parameters * b
    per_token_kv = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * b
    avg_ctx = args.prompt_len + args.new_tokens / 2
    kv_ideal = args.batch * avg_ctx * per_token_kv  # only the valid context of each sequence
    kv_alloc = args.batch * engine_result["max_length"] * per_token_kv  # what our dense
    # attention reads: every slot's full max_length row
    t_ideal = (weight_bytes + kv_ideal) / args.bandwidth
    t_alloc = (weight_bytes + kv_alloc) / args.bandwidth
    step = engine_result["decode_step_ms"] / 1e3
    return {"weight_bytes": weight_bytes, "kv_bytes_per_step_ideal": kv_ideal,
            "kv_bytes_per_step_allocated": kv_alloc, "bandwidth_Bps": args.bandwidth,
            "roofline_step_ms": 1e3 * t_ideal, "roofline_step_ms_allocated": 1e3 * t_alloc,
            "measured_step_ms": 1e3 * step, "ratio_to_roofline": step / t_ideal,
            "ratio_to_roofline_allocated": step / t_alloc,
            "roofline_tokens_per_s": args.batch / t_ideal}


# ------------------------------------------------------------------------ prefix reuse
def bench_prefix_reuse(model, cfg, args) -> dict[str, Any]:
    import asyncio

    from agentrl_jax.rollout.contract import SamplingParams
    from agentrl_jax.rollout.engine.engine import Engine, EngineConfig

    sessions, turns = args.sessions, args.turns
    max_length = args.prompt_len + turns * (args.obs_tokens + args.turn_tokens) + 8
    chunk = 1 << (args.obs_tokens - 1).bit_length()
    config = EngineConfig(max_batch=sessions, max_length=max_length, dtype=args.dtype,
                          decode_steps=args.decode_steps, kv_layout=args.kv_layout,
                          prefill_chunks=(chunk, 1 << (args.prompt_len - 1).bit_length(), 512),
                          prefill_tokens=max(2048, chunk), prefill_kv_buckets=())  # whole row
    engine = Engine(model, config)
    sampling = SamplingParams(max_new_tokens=args.turn_tokens, temperature=args.temperature,
                              ignore_eos=True)

    async def conversation(i: int, reuse: bool, rng: np.random.Generator) -> tuple[int, int]:
        history = rng.integers(3, cfg.vocab_size, size=args.prompt_len).tolist()
        prompt_tokens = cached = 0
        for _ in range(turns):
            res = await engine.generate(history, sampling,
                                        session_id=f"conv-{i}" if reuse else None)
            prompt_tokens += res.prompt_tokens
            cached += res.cached_tokens
            history = history + res.output_ids + rng.integers(
                3, cfg.vocab_size, size=args.obs_tokens).tolist()
        return prompt_tokens, cached

    async def run(reuse: bool) -> dict[str, Any]:
        engine.flush_cache_sync()
        before = engine.stats.prefill_tokens
        t0 = time.perf_counter()
        out = await asyncio.gather(*[conversation(i, reuse, np.random.default_rng(i))
                                     for i in range(sessions)])
        wall = time.perf_counter() - t0
        prompt_tokens = sum(p for p, _ in out)
        cached = sum(c for _, c in out)
        return {"wall_s": wall, "prompt_tokens": prompt_tokens, "cached_tokens": cached,
                "prefilled_tokens": engine.stats.prefill_tokens - before}

    try:
        asyncio.run(run(True))  # warm-up (compiles every prefill bucket used)
        with_reuse = asyncio.run(run(True))
        without = asyncio.run(run(False))
    finally:
        engine.close()
    return {"sessions": sessions, "turns": turns, "obs_tokens": args.obs_tokens,
            "turn_tokens": args.turn_tokens, "with_reuse": with_reuse, "without_reuse": without,
            "prefill_tokens_saved": without["prefilled_tokens"] - with_reuse["prefilled_tokens"],
            "prefill_saved_fraction": 1 - with_reuse["prefilled_tokens"] / max(
                1, without["prefilled_tokens"]),
            "speedup": without["wall_s"] / with_reuse["wall_s"]}


# --------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default=None,
                   help="model shape (default smollm2-135m; tiny with --small)")
    p.add_argument("--small", action="store_true",
                   help="CPU smoke run: tiny shape, batch 16, prompt 32, 64 new tokens")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--prompt-len", type=int, default=None)
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default), or 1")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--kv-layout", choices=["bksd", "bskd"], default="bksd",
                   help="engine KV cache: head-major (default) or the model's own layout")
    p.add_argument("--prefill-tokens", type=int, default=8192)
    p.add_argument("--decode-attention", default="auto",
                   help="comma list of the engine's decode attentions to run side by side: "
                        "auto, ragged, dense (e.g. dense,ragged)")
    p.add_argument("--decode-gemm", default="auto",
                   help="comma list of the engine's decode GEMM variants (EngineConfig."
                        "decode_gemm): auto, xla, merged, merged_cublas; every one is run with "
                        "every --decode-attention")
    p.add_argument("--decode-loop", default="while",
                   help="comma list of the decode call's loops (EngineConfig.decode_loop): "
                        "while, fixed; every one is run with every attention and GEMM")
    p.add_argument("--max-length", type=int, default=0,
                   help="KV-cache row length (default prompt + new tokens); an RL engine "
                        "allocates the whole episode context, e.g. 4096")
    add_bandwidth_arguments(p, default_copy_bytes=4e9)  # --small copies 1e8
    p.add_argument("--sessions", type=int, default=None)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--obs-tokens", type=int, default=50)
    p.add_argument("--turn-tokens", type=int, default=30)
    p.add_argument("--skip", default="", help="comma list of: engine,naive,hf,reuse")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--profile", default=None,
                   help="write a jax.profiler device trace of each engine variant's timed "
                        "round under this directory (read it with xprof / TensorBoard); the "
                        "report gains its device time by XLA program (devtime.program_times)")
    args = p.parse_args(argv)
    small = args.small
    args.shape = args.shape or ("tiny" if small else "smollm2-135m")
    args.batch = args.batch or (16 if small else 256)
    args.prompt_len = args.prompt_len or (32 if small else 128)
    args.new_tokens = args.new_tokens or (64 if small else 256)
    args.sessions = args.sessions or (4 if small else 32)
    skip = {s for s in args.skip.split(",") if s}

    import jax

    args.bandwidth, bandwidth_note = resolve_bandwidth(
        args.bandwidth, args.copy_bytes or (1e8 if small else 4e9))
    print(describe_bandwidth(bandwidth_note), flush=True)

    from agentrl_jax.models.llama import init_model

    cfg = model_config(args.shape, args.dtype)
    t0 = time.perf_counter()
    model = init_model(cfg, seed=0)
    device = jax.devices()[0]
    report: dict[str, Any] = {
        "shape": args.shape, "config": {k: getattr(args, k) for k in (
            "batch", "prompt_len", "new_tokens", "temperature", "dtype", "decode_steps",
            "prefill_tokens", "bandwidth", "kv_layout", "decode_attention", "decode_gemm",
            "decode_loop", "max_length")},
        "num_parameters": cfg.num_parameters, "device": f"{device.platform}:{device.device_kind}",
        "jax_version": jax.__version__, "host": platform.node(), "bandwidth": bandwidth_note,
        "init_s": time.perf_counter() - t0}
    batch_prompts = prompts(np.random.default_rng(0), args.batch, args.prompt_len,
                            cfg.vocab_size)
    print(f"# {args.shape}: {cfg.num_parameters / 1e6:.1f}M params, {args.dtype}, batch "
          f"{args.batch}, prompt {args.prompt_len}, new {args.new_tokens}, on "
          f"{report['device']}", flush=True)
    if "engine" not in skip:
        variants = [(a, g, loop) for a in args.decode_attention.split(",")
                    for g in args.decode_gemm.split(",") for loop in args.decode_loop.split(",")]
        for i, (attention, gemm, loop) in enumerate(variants):
            variant = "_".join([attention] + [x for x in (gemm, loop) if x not in ("auto",
                                                                                   "while")])
            key = "engine" if i == 0 else f"engine_{variant}"
            report[key] = bench_engine(model, cfg, args, batch_prompts, attention, gemm, loop)
            report["roofline" if i == 0 else f"roofline_{variant}"] = roofline(
                cfg, args, report[key])
            print(f"engine ({report[key]['decode_attention']} decode attention, "
                  f"{report[key]['decode_gemm']} GEMMs, {loop} loop) done: "
                  f"{report[key]['tokens_per_s']:.0f} tok/s, decode step "
                  f"{report[key]['decode_step_ms']:.3f} ms "
                  f"({report['roofline' if i == 0 else f'roofline_{variant}']['ratio_to_roofline']:.2f}x "
                  f"roofline)", flush=True)
    if "naive" not in skip:
        report["naive_jax"] = bench_naive(model, cfg, args, batch_prompts)
        print(f"naive done: {report['naive_jax']['tokens_per_s']:.0f} tok/s", flush=True)
    if "hf" not in skip:
        report["hf"] = bench_hf(cfg, args, batch_prompts)
        print("hf done", flush=True)
    if "reuse" not in skip:
        report["prefix_reuse"] = bench_prefix_reuse(model, cfg, args)
        print("prefix reuse done", flush=True)
    print_table(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    return report


def print_table(r: dict[str, Any]) -> None:
    hf = r.get("hf", {})
    hf_tps = hf.get("tokens_per_s")
    print()
    print(f"| {'contender':<10} | {'tokens/s':>10} | {'vs HF':>7} | {'wall s':>8} | "
          f"{'step ms':>8} | notes")
    print(f"|{'-' * 12}|{'-' * 12}|{'-' * 9}|{'-' * 10}|{'-' * 10}|------")
    for name, key in (("engine", "engine"), ("naive JAX", "naive_jax"), ("HF", "hf")):
        res = r.get(key)
        if res is None:
            continue
        if "skipped" in res:
            print(f"| {name:<10} | {'-':>10} | {'-':>7} | {'-':>8} | {'-':>8} | "
                  f"skipped: {res['skipped']}")
            continue
        ratio = f"{res['tokens_per_s'] / hf_tps:.2f}x" if hf_tps else "-"
        step = res.get("decode_step_ms")
        step = "-" if step is None else f"{step:.3f}"
        note = ""
        if key == "engine":
            note = (f"compile {res['compile_s']:.1f}s, {res['decode_calls']} decode calls, "
                    f"mean active slots {res['mean_active_slots']:.1f}")
            note += "".join(f"; {name}: {p['calls']} calls, device span "
                            f"{1e3 * p['span_s']:.3f} ms, kernels busy {1e3 * p['busy_s']:.3f} ms"
                            for name, p in res.get("device_programs", {}).items()
                            if p["span_s"] is not None)
        elif key == "hf":
            note = f"{res['device']} {res['torch_dtype']}"
        print(f"| {name:<10} | {res['tokens_per_s']:>10.0f} | {ratio:>7} | {res['wall_s']:>8.2f}"
              f" | {step:>8} | {note}")
    roof = r.get("roofline")
    if roof:
        print(f"\ndecode step {roof['measured_step_ms']:.3f} ms vs roofline "
              f"{roof['roofline_step_ms']:.3f} ms (weights {roof['weight_bytes'] / 1e9:.2f} GB + "
              f"KV {roof['kv_bytes_per_step_ideal'] / 1e9:.2f} GB valid context at "
              f"{roof['bandwidth_Bps'] / 1e12:.1f} TB/s): {roof['ratio_to_roofline']:.2f}x; "
              f"vs the allocated-KV roofline {roof['roofline_step_ms_allocated']:.3f} ms: "
              f"{roof['ratio_to_roofline_allocated']:.2f}x")
        if not r["device"].startswith("gpu") and not r["device"].startswith("cuda"):
            print("(the roofline uses the bandwidth measured or given here; on a CPU it says little)")
    pr = r.get("prefix_reuse")
    if pr:
        w, wo = pr["with_reuse"], pr["without_reuse"]
        print(f"\nprefix reuse, {pr['sessions']} sessions x {pr['turns']} turns "
              f"(+{pr['obs_tokens']} obs, {pr['turn_tokens']} generated per turn): prefilled "
              f"{w['prefilled_tokens']} tokens with reuse vs {wo['prefilled_tokens']} without "
              f"(saved {pr['prefill_tokens_saved']}, {100 * pr['prefill_saved_fraction']:.1f}%); "
              f"cached_tokens reported {w['cached_tokens']} of {w['prompt_tokens']} prompt "
              f"tokens; wall {w['wall_s']:.2f}s vs {wo['wall_s']:.2f}s "
              f"({pr['speedup']:.2f}x)")


if __name__ == "__main__":
    main()
