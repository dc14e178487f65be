"""Our SGLang client backend against a running SGLang-API server, and its HTTP throughput.

    python benchmarks/checks/sglang_server_check.py --url http://127.0.0.1:30000 --model-dir DIR \
        --json out.json                       # real SGLang (or our server) on a GPU
    python benchmarks/checks/sglang_server_check.py --url URL --skip throughput     # API checks only

The server must serve the HF directory ``--model-dir`` (``python -m sglang.launch_server
--model-path DIR``; ``python -m agentrl_jax.models.convert smollm2 DIR --dtype bfloat16``
writes one from our SmolLM2). Each check
drives ``agentrl_jax.rollout.backends.sglang.SGLangBackend`` (the backend ``rollout.backend=
'sglang'`` uses) and records what the server did, so a difference between what the client
expects and what the server does shows up as a failed check with the server's answer:

* ``generate``: greedy, ``max_new_tokens`` tokens with EOS ignored: that many output ids, one
  finite logprob <= 0 each, finish ``length``, ``prompt_tokens`` = the prompt's length;
* ``n_samples``: ``n=4`` at temperature 1: four samples of the asked length;
* ``stop_token``: greedy with ``stop_token_ids`` = the 4th greedy token: finish ``stop`` and
  the output a prefix of the greedy one that ends at that token (the stop token kept, as the
  trainer needs the sampled sequence);
* ``prefix_reuse``: turn 2 of a session (turn 1's prompt + 16 output + 32 new tokens) reports
  ``cached_tokens`` >= turn 1's prompt length; after ``flush_cache`` the same prompt reports 0;
* ``update_weights``: ``update_weights(path=DIR, version=...)`` (``/update_weights_from_disk``)
  succeeds, the next answer carries that ``weight_version`` and the greedy output is unchanged
  (the same weights were loaded);
* ``abort``: a long request aborted by ``rid`` after 0.5 s ends early with finish ``abort``;
* ``logprobs`` (with ``--model-dir``): the server's logprobs of its greedy tokens against our
  JAX model's teacher-forced log-softmax on the same weights in float32: max / mean absolute
  difference (a bfloat16 server: expect ~1e-2) and how many greedy tokens are our argmax.

``throughput``: ``--batch`` concurrent requests of ``--prompt-len`` random tokens, each
generating ``--new-tokens`` tokens (EOS ignored, greedy) through the backend's HTTP client:
generated tokens / wall s, after one short warm-up round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
import uuid
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_jax.rollout.contract import SamplingParams  # noqa: E402
from agentrl_jax.rollout.backends.sglang import SGLangBackend  # noqa: E402


def random_prompt(rng: np.random.Generator, length: int, vocab: int) -> list[int]:
    """``length`` token ids drawn from [100, vocab) (clear of special tokens)."""
    return rng.integers(100, vocab, size=length).tolist()


def greedy(max_new_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, **kw)


async def check_generate(b: SGLangBackend, prompt: list[int], new: int) -> dict[str, Any]:
    (r,) = await b.generate_n(prompt, greedy(new))
    ok = (len(r.output_ids) == new and len(r.output_logprobs) == new
          and all(math.isfinite(x) and x <= 1e-6 for x in r.output_logprobs)
          and r.finish_reason == "length" and r.prompt_tokens == len(prompt))
    return {"ok": ok, "output_ids": r.output_ids, "logprobs": r.output_logprobs,
            "finish_reason": r.finish_reason, "prompt_tokens": r.prompt_tokens,
            "latency_s": r.latency_s}


async def check_n_samples(b: SGLangBackend, prompt: list[int]) -> dict[str, Any]:
    rs = await b.generate_n(prompt, SamplingParams(max_new_tokens=8, temperature=1.0, n=4,
                                                   ignore_eos=True))
    lengths = [len(r.output_ids) for r in rs]
    return {"ok": len(rs) == 4 and lengths == [8] * 4, "lengths": lengths,
            "distinct_samples": len({tuple(r.output_ids) for r in rs})}


async def check_stop_token(b: SGLangBackend, prompt: list[int], reference: list[int]
                           ) -> dict[str, Any]:
    stop = reference[3]
    first = reference.index(stop)
    (r,) = await b.generate_n(prompt, SamplingParams(max_new_tokens=len(reference),
                                                     temperature=0.0, stop_token_ids=[stop]))
    ok = (r.finish_reason == "stop" and r.output_ids == reference[:first + 1])
    return {"ok": ok, "stop_token": stop, "finish_reason": r.finish_reason,
            "matched_stop": r.matched_stop, "output_ids": r.output_ids,
            "expected": reference[:first + 1]}


async def check_prefix_reuse(b: SGLangBackend, rng: np.random.Generator, vocab: int,
                             length: int) -> dict[str, Any]:
    session = uuid.uuid4().hex
    turn1 = random_prompt(rng, length, vocab)
    (r1,) = await b.generate_n(turn1, greedy(16), session_id=session)
    turn2 = turn1 + r1.output_ids + random_prompt(rng, 32, vocab)
    (r2,) = await b.generate_n(turn2, greedy(16), session_id=session)
    await b.flush_cache()
    (r3,) = await b.generate_n(turn2, greedy(16), session_id=session)
    ok = r2.cached_tokens >= len(turn1) and r3.cached_tokens == 0
    return {"ok": ok, "turn1_prompt": len(turn1), "turn1_cached": r1.cached_tokens,
            "turn2_prompt": len(turn2), "turn2_cached": r2.cached_tokens,
            "after_flush_cached": r3.cached_tokens}


async def check_update_weights(b: SGLangBackend, model_dir: str, prompt: list[int],
                               reference: list[int]) -> dict[str, Any]:
    version = f"check-{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    await b.update_weights(path=model_dir, version=version)
    seconds = time.perf_counter() - t0
    (r,) = await b.generate_n(prompt, greedy(len(reference)))
    return {"ok": r.weight_version == version and r.output_ids == reference,
            "seconds": seconds, "weight_version_reported": r.weight_version,
            "same_greedy_output": r.output_ids == reference}


async def check_abort(b: SGLangBackend, prompt: list[int], new: int) -> dict[str, Any]:
    rid = uuid.uuid4().hex
    task = asyncio.create_task(b.generate_n(prompt, greedy(new), rid=rid))
    await asyncio.sleep(0.5)
    await b.abort(rid)
    try:
        (r,) = await asyncio.wait_for(task, 60)
    except Exception as error:  # noqa: BLE001 -- what the client raised is the finding
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}
    return {"ok": r.finish_reason == "abort" and len(r.output_ids) < new,
            "finish_reason": r.finish_reason, "tokens_before_abort": len(r.output_ids)}


def check_logprobs(model_dir: str, prompt: list[int], output: list[int],
                   server_logprobs: list[float]) -> dict[str, Any]:
    """Teacher-forced float32 log-softmax of ``output`` after ``prompt`` on our JAX model."""
    import jax.numpy as jnp

    from agentrl_jax.models.safetensors_io import load_safetensors_model

    model, _ = load_safetensors_model(model_dir, dtype="float32", param_dtype="float32")
    ids = jnp.asarray([prompt + output], jnp.int32)
    logits = model(ids).logits
    z = np.asarray(logits, np.float64)[0]
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    start = len(prompt) - 1
    ours = np.asarray([logp[start + i, t] for i, t in enumerate(output)])
    argmax = np.asarray(logp[start:start + len(output)]).argmax(-1)
    diff = np.abs(ours - np.asarray(server_logprobs, np.float64))
    return {"ok": bool(diff.max() < 0.1), "max_abs_diff": float(diff.max()),
            "mean_abs_diff": float(diff.mean()),
            "greedy_tokens_our_argmax": int((argmax == np.asarray(output)).sum()),
            "tokens": len(output)}


async def throughput(b: SGLangBackend, rng: np.random.Generator, vocab: int, batch: int,
                     prompt_len: int, new_tokens: int) -> dict[str, Any]:
    prompts = [random_prompt(rng, prompt_len, vocab) for _ in range(batch)]
    await asyncio.gather(*[b.generate_n(p, greedy(16)) for p in prompts])  # warm-up
    await b.flush_cache()
    t0 = time.perf_counter()
    results = await asyncio.gather(*[b.generate_n(p, greedy(new_tokens)) for p in prompts])
    wall = time.perf_counter() - t0
    generated = sum(len(r.output_ids) for (r,) in results)
    return {"batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
            "generated_tokens": generated, "wall_s": wall, "tokens_per_s": generated / wall}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    b = SGLangBackend(args.url, timeout=600.0)
    await b.wait_healthy(timeout=args.wait_s)
    rng = np.random.default_rng(0)
    vocab = args.vocab
    skip = {s for s in args.skip.split(",") if s}
    out: dict[str, Any] = {"url": args.url, "model_dir": args.model_dir, "checks": {}}
    checks = out["checks"]

    async def guarded(name: str, coro) -> dict[str, Any] | None:
        if name in skip:
            coro.close()
            return None
        try:
            checks[name] = await coro
        except Exception as error:  # noqa: BLE001 -- a failing check is a finding
            checks[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        print(f"{name}: {'ok' if checks[name]['ok'] else 'FAILED'} "
              f"{ {k: v for k, v in checks[name].items() if k not in ('output_ids', 'logprobs')} }",
              flush=True)
        return checks[name]

    prompt = random_prompt(rng, args.check_prompt_len, vocab)
    gen = await guarded("generate", check_generate(b, prompt, 24))
    reference = (gen or {}).get("output_ids") or []
    await guarded("n_samples", check_n_samples(b, prompt))
    if reference:
        await guarded("stop_token", check_stop_token(b, prompt, reference))
    await guarded("prefix_reuse", check_prefix_reuse(b, rng, vocab, args.reuse_prompt_len))
    if args.model_dir and reference:
        await guarded("update_weights", check_update_weights(b, args.model_dir, prompt,
                                                             reference))
    await guarded("abort", check_abort(b, prompt, args.abort_new_tokens))
    if "throughput" not in skip:
        out["throughput"] = await throughput(b, rng, vocab, args.batch, args.prompt_len,
                                             args.new_tokens)
        print(f"throughput: {out['throughput']}", flush=True)
    await b.aclose()
    if args.model_dir and reference and "logprobs" not in skip:
        try:
            checks["logprobs"] = check_logprobs(args.model_dir, prompt, reference,
                                                gen["logprobs"])
        except Exception as error:  # noqa: BLE001
            checks["logprobs"] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        print(f"logprobs: {checks['logprobs']}", flush=True)
    out["all_ok"] = all(c["ok"] for c in checks.values())
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="the server's base URL")
    p.add_argument("--model-dir", default=None,
                   help="the HF directory the server serves (update_weights, logprobs)")
    p.add_argument("--vocab", type=int, default=49152, help="random prompt ids below this")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--check-prompt-len", type=int, default=64,
                   help="prompt length of the generate / n / stop / update / abort checks")
    p.add_argument("--reuse-prompt-len", type=int, default=512,
                   help="turn 1's prompt length in the prefix-reuse check")
    p.add_argument("--abort-new-tokens", type=int, default=900,
                   help="max_new_tokens of the request the abort check cuts short")
    p.add_argument("--skip", default="", help="comma list of check names / throughput")
    p.add_argument("--wait-s", type=float, default=300.0, help="wait this long for /health")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    out = asyncio.run(run(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print("all checks ok" if out["all_ok"] else "SOME CHECKS FAILED", flush=True)
    return out


if __name__ == "__main__":
    main()
