"""Convert a checkpoint (GGUF file or HF directory) into a HF safetensors directory.

    python -m agentrl_jax.models.convert SRC DST [--dtype float32|bfloat16]

SRC: a known name (``smollm2``), a ``.gguf`` file or a HF directory. DST gets config.json,
model.safetensors, generation_config.json and the tokenizer files; transformers and SGLang load it.
"""

from __future__ import annotations

import argparse
import sys
import time

from agentrl_jax.models.pretrained import load_pretrained
from agentrl_jax.models.safetensors_io import save_hf_directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    start = time.time()
    try:
        pretrained = load_pretrained(args.src)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    save_hf_directory(pretrained.model, args.dst, tokenizer=pretrained.tokenizer, dtype=args.dtype)
    print(f"wrote {args.dst} ({pretrained.config.num_parameters:,} parameters, {args.dtype}) "
          f"in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
