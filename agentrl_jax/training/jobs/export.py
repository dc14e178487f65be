"""The trained policy as a Hugging Face directory: the one export that ``launch/sft.py`` (its
``model/``) and ``launch/export.py`` (any checkpoint of a run) write.

    python launch/export.py --workdir runs/babyai --out runs/babyai/hf [--step N]
        [--dtype bfloat16|float32] [--force]

The directory holds ``config.json``, ``model.safetensors`` (shards + index above 4 GiB),
``generation_config.json`` and the tokenizer's files with its chat template
(``models/safetensors_io.save_hf_directory``, the same writer as the SGLang disk sync):
``transformers.AutoModelForCausalLM``, our inference server (``--model DIR``), SGLang and
``--config.model.name=DIR`` load it. A policy restricted to its action tokens
(``model.output_tokens``) is written whole, with its token ids in ``config.json``'s
``agentrl_output_token_ids``: our loaders restore the restriction, other loaders sample from
the whole vocabulary unless told those ids.

From a checkpoint only the policy parameters are read (``checkpoints/<step>/params``, float32
master weights), not the optimiser state, on the host CPU; the model's shape and tokenizer come
from the run's ``config.json`` (its ``model`` section: a named / HF / GGUF model, or a
``random_init`` shape over a tokenizer).
"""

from __future__ import annotations

import json
import os
from typing import Any

from agentrl_jax.training.runtime.policy import checkpoint_steps

EXPORT_DTYPES = ("bfloat16", "float32")
CHECKPOINTS = "checkpoints"


class ExportError(ValueError):
    """Input that cannot be exported (one line, said before anything is read or written)."""


def export_policy(model: Any, tokenizer: Any, out_dir: str, dtype: str = "float32") -> str:
    """Write ``model`` (a ``CausalLM``) and ``tokenizer`` as a HF directory ``out_dir`` with
    parameters in ``dtype`` (``bfloat16`` or ``float32``); returns ``out_dir``. A collective
    when the parameters are sharded over several processes (``save_hf_directory``)."""
    from agentrl_jax.models.safetensors_io import save_hf_directory

    if dtype not in EXPORT_DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(EXPORT_DTYPES)} (got {dtype!r})")
    return save_hf_directory(model, out_dir, tokenizer, dtype=dtype)


def check_export(workdir: str, out_dir: str, step: int | None = None,
                 force: bool = False) -> int:
    """The checkpoint step to export from ``workdir`` (``step``, or the latest); raises
    :class:`ExportError` with one line when there is no such run, checkpoint or step, when the
    run's ``config.json`` is missing, or ``out_dir`` exists and is not an empty directory
    (unless ``force``). Reads nothing but directory listings and ``config.json``."""
    if not os.path.isdir(workdir):
        raise ExportError(f"no run directory {workdir}")
    if not os.path.isfile(os.path.join(workdir, "config.json")):
        raise ExportError(f"{workdir} has no config.json (not a run directory of launch/run.py "
                          "or launch/sft.py)")
    steps = checkpoint_steps(os.path.join(workdir, CHECKPOINTS))
    if not steps:
        raise ExportError(f"{workdir} has no finished checkpoint in {CHECKPOINTS}/")
    if step is not None and step not in steps:
        raise ExportError(f"{workdir} has no checkpoint of step {step} (it has "
                          f"{', '.join(map(str, steps))})")
    if os.path.exists(out_dir) and not force:
        if not os.path.isdir(out_dir):
            raise ExportError(f"--out {out_dir} exists and is not a directory")
        if os.listdir(out_dir):
            raise ExportError(f"--out {out_dir} exists and is not empty (--force writes over "
                              "its model files)")
    return steps[-1] if step is None else int(step)


def _run_model(workdir: str) -> tuple[Any, Any]:
    """(model config, tokenizer) of the run in ``workdir``, from its ``config.json``."""
    from agentrl_jax.models.pretrained import load_model_config, resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer
    from agentrl_jax.training.config.sections import ModelConfig as ModelSection
    from agentrl_jax.training.runtime.policy import random_model_config

    path = os.path.join(workdir, "config.json")
    try:
        with open(path) as f:
            values = json.load(f)
    except (OSError, ValueError) as error:
        raise ExportError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(values, dict) or not isinstance(values.get(ModelSection.PREFIX), dict):
        raise ExportError(f"{path} has no model section")
    section, problems = ModelSection.from_mapping(values[ModelSection.PREFIX])
    if problems:
        raise ExportError(f"{path}: {'; '.join(problems)}")
    model_path = resolve_model_path(section.name)
    tokenizer = load_tokenizer(model_path)
    if section.random_init:
        cfg = random_model_config(section.random_init, tokenizer, section.dtype)
    else:
        cfg = load_model_config(model_path, dtype=section.dtype)
    if section.output_tokens:  # a restricted policy: the export records its token ids
        try:
            cfg = cfg.restricted_to(tokenizer, section.output_tokens)
        except ValueError as error:
            raise ExportError(f"{path}: {error}") from None
    return cfg, tokenizer


def checkpoint_policy(workdir: str, step: int) -> tuple[Any, Any]:
    """(model, tokenizer): the policy of checkpoint ``step`` of ``workdir`` on one CPU device
    (its ``params`` item only)."""
    import jax
    from flax import nnx

    from agentrl_jax.learner.checkpoint import restore_item
    from agentrl_jax.models.llama import abstract_model

    cfg, tokenizer = _run_model(workdir)
    graphdef, abstract = nnx.split(abstract_model(cfg), nnx.Param)
    cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=cpu),
                          abstract)
    params = restore_item(os.path.join(workdir, CHECKPOINTS, str(step)), "params", target)
    return nnx.merge(graphdef, params), tokenizer


def export_checkpoint(workdir: str, out_dir: str, step: int | None = None,
                      dtype: str = "float32", force: bool = False) -> tuple[str, int]:
    """Export checkpoint ``step`` (None: the latest) of ``workdir`` to ``out_dir``; returns
    ``(out_dir, step)``. Input is checked first (:func:`check_export`)."""
    if dtype not in EXPORT_DTYPES:
        raise ExportError(f"--dtype must be one of {', '.join(EXPORT_DTYPES)} (got {dtype!r})")
    step = check_export(workdir, out_dir, step, force)
    model, tokenizer = checkpoint_policy(workdir, step)
    return export_policy(model, tokenizer, out_dir, dtype), step
