"""Chat with a model from the command line.

    python -m agentrl_jax.models.generate --model smollm2 --prompt "What is the capital of France?"

``--model`` takes a known name (``smollm2``), a HF directory or a ``.gguf`` path. Greedy by
default (``--temperature 0``). Uses the model's own chat template and a KV cache.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentrl_jax.models.llama import KVCache
from agentrl_jax.models.pretrained import load_pretrained
from agentrl_jax.models.tokenizer import encode_chat


def generate_ids(model, prompt: list[int], max_new_tokens: int, eos_ids: tuple[int, ...],
                 temperature: float = 0.0, seed: int = 0) -> list[int]:
    """Sample up to ``max_new_tokens`` after ``prompt`` with a KV cache (batch 1)."""
    max_length = len(prompt) + max_new_tokens
    cache = KVCache.zeros(model.cfg, 1, max_length)

    @nnx.jit
    def step(m, tokens, positions, cache):
        out = m(tokens, positions=positions, cache=cache)
        return out.logits[:, -1], out.cache

    logits, cache = step(model, jnp.asarray([prompt]), jnp.arange(len(prompt))[None], cache)
    key = jax.random.PRNGKey(seed)
    out: list[int] = []
    for i in range(max_new_tokens):
        if temperature > 0:
            key, sub = jax.random.split(key)
            token = int(jax.random.categorical(sub, logits[0] / temperature))
        else:
            token = int(np.argmax(np.asarray(logits[0])))
        out.append(token)
        if token in eos_ids:
            break
        position = len(prompt) + i
        logits, cache = step(model, jnp.asarray([[token]]), jnp.asarray([[position]]), cache)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--system", default=None, help="system prompt (default: the template's)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    start = time.time()
    try:
        pretrained = load_pretrained(args.model, dtype=args.dtype)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    messages = ([{"role": "system", "content": args.system}] if args.system else [])
    messages.append({"role": "user", "content": args.prompt})
    prompt = encode_chat(pretrained.tokenizer, messages)
    loaded = time.time()
    ids = generate_ids(pretrained.model, prompt, args.max_new_tokens,
                       pretrained.config.eos_token_ids, args.temperature, args.seed)
    print(pretrained.tokenizer.decode(ids, skip_special_tokens=True).strip())
    print(f"[{len(ids)} tokens in {time.time() - loaded:.1f} s; load {loaded - start:.1f} s]",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
