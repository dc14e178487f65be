"""Export a run's trained policy as a Hugging Face directory (transformers, SGLang, vLLM and our
inference server load it).

    python launch/export.py --workdir runs/babyai --out runs/babyai/hf            # latest step
    python launch/export.py --workdir runs/babyai --out hf_300 --step 300 --dtype bfloat16

Reads only the checkpoint's policy parameters (not the optimiser state), on the CPU; writes
config.json, model.safetensors, generation_config.json and the tokenizer with its chat template
(``agentrl_jax/training/jobs/export.py``, the same export as ``launch/sft.py``'s ``model/``). Bad
input (no such workdir, no checkpoint, unknown step, a non-empty ``--out`` without ``--force``)
is refused in one line with exit code 2 before anything is read or written.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXIT_BAD_INPUT = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="the run directory (launch/run.py or "
                        "launch/sft.py --workdir)")
    parser.add_argument("--out", required=True, help="the HF directory to write")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="parameter dtype of the export (default float32: the master weights)")
    parser.add_argument("--force", action="store_true", help="write into a non-empty --out")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the export runs on the host, never a GPU
    from agentrl_jax.training.jobs.export import ExportError, check_export, export_checkpoint

    try:
        step = check_export(args.workdir, args.out, args.step, args.force)
    except ExportError as error:
        print(f"export: {error}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    print(f"exporting step {step} of {args.workdir} ({args.dtype}) to {args.out} ...", flush=True)
    try:
        out, step = export_checkpoint(args.workdir, args.out, step, args.dtype, force=True)
    except ExportError as error:  # the run's config.json names no loadable model
        print(f"export: {error}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    print(f"exported step {step}: {os.path.abspath(out)} (load it with "
          f"transformers.AutoModelForCausalLM.from_pretrained, or --config.model.name={out})",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
