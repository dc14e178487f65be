"""Check that a config can run on this host, before anything starts.

The values of a config are checked by its typed sections (``training/config/sections.py``):
``config_problems(config)`` returns one line per unknown key, bad type or bad value
(``"learner.learning_rate: must be a finite number > 0 (got -0.0001)"``), all at once, and
``check_config`` raises ``ConfigError`` carrying those lines.

``run_problems(config, workdir)`` adds what depends on this host, still without starting
anything: the model source exists in the format its loader reads (``models/pretrained.py``,
nothing but the tokenizer and the model's config are loaded), ``rollout.max_context`` is within
the positions a pretrained model was trained on, the first prompt leaves room to generate
within ``rollout.max_context`` (``training/preflight/prompt_room.py``: a lower bound from the
tokenizer, the chat template, the answer format and ``agent.response_prefix``), the workdir can
be created and written (a temporary file in it, or in its nearest existing parent), and one
step's batch fits this host's memory (which bounds ``train.tasks_per_step``). ``check_run``
raises ``ConfigError`` with all of those lines; ``launch/run.py`` calls it and exits with code 2
(``EXIT_BAD_CONFIG``).
"""

from __future__ import annotations

import os
import tempfile

from agentrl_jax.training.config.experiment import (EXIT_BAD_CONFIG, ConfigError,  # noqa: F401
                                                    ConfigSource, config_problems,
                                                    format_problems, to_run_config)
from agentrl_jax.training.config.sections import SECTIONS, ModelConfig, RunConfig


def check_config(config: ConfigSource) -> RunConfig:
    """``config`` as a ``RunConfig``; raises ``ConfigError`` (all problems, one line each)."""
    return to_run_config(config)


# --------------------------------------------------------------------------- this host
#: bytes one token takes in a step's batch (``training/rl/batching.py``): ``tokens``,
#: ``attention_mask``, ``turn_ids`` (int32) and ``loss_mask``, ``rollout_logprobs`` (float32)
BATCH_BYTES_PER_TOKEN = 5 * 4


def host_memory_bytes() -> int | None:
    """This host's physical memory in bytes (None where the platform does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def max_tasks_per_step(samples_per_task: int, max_context: int, memory: int,
                       processes: int = 1) -> int:
    """The most tasks per step whose batch fits in ``memory`` bytes on each process.

    A step rolls out ``tasks x samples_per_task`` episodes; each of ``processes`` processes
    assembles the rows of its share of the tasks into one batch padded to its longest row, up
    to ``max_context`` tokens of ``BATCH_BYTES_PER_TOKEN`` bytes (one episode that reaches the
    context limit pads every row to it):
    ``ceil(tasks / processes) * samples_per_task * max_context * BATCH_BYTES_PER_TOKEN <=
    memory``."""
    per_task = samples_per_task * max_context * BATCH_BYTES_PER_TOKEN
    return processes * (memory // per_task)


def workdir_problem(workdir: str) -> str | None:
    """Why the trainer could not create ``workdir`` (with its parents) and write in it, else
    None. Nothing is left behind: the probe is a temporary file in ``workdir`` or, when it does
    not exist yet, in its nearest existing parent."""
    path = os.path.abspath(workdir)
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "a file" if os.path.exists(existing) else "a broken link"
        return (f"{path} is {what}, not a directory" if existing == path else
                f"cannot create {path}: {existing} is {what}, not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".agentrl-write-check-"):
            pass
    except OSError as e:
        where = path if existing == path else f"{existing} (to create {path})"
        return f"cannot write in {where}: {e.strerror or e}"
    return None


def run_problems(config: ConfigSource, workdir: str, processes: int = 1,
                 memory: int | None = None) -> list[str]:
    """``config_problems(config)`` and the problems of running it here (module docstring):
    the model source, ``workdir`` (the ``--workdir`` of ``launch/run.py``) and the batch
    memory that bounds ``train.tasks_per_step`` (``processes`` JAX processes share a step;
    ``memory``: bytes per process, default this host's). Nothing is loaded or started, and
    nothing is left on disk. A host check runs when the sections it reads are valid."""
    mapping = config.to_dict() if hasattr(config, "to_dict") else config
    if isinstance(config, RunConfig):
        sections, problems = {k: getattr(config, k) for k in SECTIONS}, []
    else:
        _, sections, problems = RunConfig.build_sections(mapping)
        problems = problems or config_problems(config)  # the checks spanning sections
    model, train, rollout = (sections.get(k) for k in ("model", "train", "rollout"))
    env, agent = sections.get("env"), sections.get("agent")
    if model is not None and model.name.strip():
        from agentrl_jax.models.pretrained import check_model_source

        try:
            check_model_source(model.name, weights=not model.random_init)
        except (OSError, ValueError) as e:
            problems.append(f"model.name: {e}")
        else:
            problems.extend(output_token_problems(model))
            if rollout is not None:
                problems.extend(context_position_problems(model, rollout.max_context))
            if None not in (env, agent, rollout):
                from agentrl_jax.training.preflight.prompt_room import run_prompt_problems

                problems.extend(run_prompt_problems(model, env, agent, rollout))
    workdir_line = workdir_problem(workdir)
    if workdir_line:
        problems.append(f"--workdir: {workdir_line}")
    if train is None or rollout is None:
        return problems
    tasks, samples = train.tasks_per_step, train.samples_per_task
    context = rollout.max_context
    memory = host_memory_bytes() if memory is None else memory
    if memory:
        limit = max_tasks_per_step(samples, context, memory, processes)
        if tasks > limit:
            problems.append(
                f"train.tasks_per_step: at most {limit} on this host (got {tasks}): one step's "
                f"batch holds tasks_per_step x train.samples_per_task={samples} rows of up to "
                f"rollout.max_context={context} tokens, {BATCH_BYTES_PER_TOKEN} bytes each, in "
                f"{memory / 2 ** 30:.1f} GiB of memory"
                + (f" on each of {processes} processes" if processes > 1 else ""))
    return problems


def output_token_problems(model: ModelConfig) -> list[str]:
    """``model.output_tokens`` (a valid ``model`` section whose source exists) against its
    tokenizer: each entry must be exactly one token, no two the same (one line, or none)."""
    if not model.output_tokens:
        return []
    from agentrl_jax.models.output_tokens import resolve_output_tokens
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    try:
        resolve_output_tokens(load_tokenizer(resolve_model_path(model.name)),
                              model.output_tokens)
    except ValueError as e:
        return [str(e)]
    return []


def context_position_problems(model: ModelConfig, max_context: int) -> list[str]:
    """``rollout.max_context`` against the positions a pretrained ``model`` section's checkpoint
    was trained on (its ``max_position_embeddings``, read without loading a weight): one line
    when the context is longer (RoPE positions past them were never seen in training, and the
    engine would only warn), none for a random model (``model.random_init``: no trained
    positions) or a source the model check refuses."""
    if model.random_init:
        return []
    from agentrl_jax.models.pretrained import load_model_config

    try:
        limit = load_model_config(model.name).max_position_embeddings
    except Exception:  # noqa: BLE001  (the model check says what is wrong with the source)
        return []
    if max_context <= limit:
        return []
    return [f"rollout.max_context: {max_context} tokens exceed the {limit} positions "
            f"{model.name} was trained on (its max_position_embeddings); set "
            f"rollout.max_context <= {limit}"]


def check_run(config: ConfigSource, workdir: str, processes: int = 1) -> RunConfig:
    """``config`` as a ``RunConfig``; raises ``ConfigError`` (one line per problem) unless it
    can run here in ``workdir`` (``run_problems``)."""
    problems = run_problems(config, workdir, processes)
    if problems:
        raise ConfigError(problems)
    return to_run_config(config)


# --------------------------------------------------------------------------- other commands
def checkpoint_problem(checkpoint_dir: str, step: int | None = None) -> str | None:
    """Why ``checkpoint_dir`` (``launch/eval.py --checkpoint``) holds no checkpoint to restore
    at ``step`` (None: the latest), or None when it does. Reads the folder only: nothing is
    created (orbax would create a missing folder, empty)."""
    from agentrl_jax.training.runtime.policy import checkpoint_steps

    path = os.path.abspath(checkpoint_dir)
    if not os.path.exists(path):
        hint = ""
        if os.path.isdir(os.path.dirname(path)):
            hint = f" (found in {os.path.dirname(path)}: " + (
                ", ".join(sorted(os.listdir(os.path.dirname(path)))[:8]) or "nothing") + ")"
        return f"{path} does not exist{hint}"
    if not os.path.isdir(path):
        return f"{path} is a file, not a checkpoint directory"
    steps = checkpoint_steps(path)
    if not steps:
        nested = os.path.join(path, "checkpoints")
        if checkpoint_steps(nested):
            return f"{path} holds no checkpoint, but {nested} does: pass that"
        return f"{path} holds no finished checkpoint (no step folder in it)"
    if step is not None and step not in steps:
        return f"no checkpoint of step {step} in {path} (steps: " + ", ".join(
            map(str, steps)) + ")"
    return None


def eval_problems(config: RunConfig, checkpoint_dir: str | None, step: int | None,
                  output: str | None) -> list[str]:
    """What keeps ``launch/eval.py`` from running, one line each, before anything starts: the
    model source, the checkpoint (``checkpoint_problem``), ``--step`` without ``--checkpoint``,
    and an ``--output`` file that cannot be written."""
    problems = []
    model = config.model
    from agentrl_jax.models.pretrained import check_model_source

    try:
        check_model_source(model.name, weights=not model.random_init)
    except (OSError, ValueError) as e:
        problems.append(f"model.name: {e}")
    else:
        problems.extend(output_token_problems(model))
    if checkpoint_dir is not None:
        line = checkpoint_problem(checkpoint_dir, step)
        if line:
            problems.append(f"--checkpoint: {line}")
    elif step is not None:
        problems.append("--step: needs --checkpoint (the base model has no steps)")
    if output:
        if os.path.isdir(output):
            problems.append(f"--output: {os.path.abspath(output)} is a directory; it names the "
                            "result's JSON file")
        else:
            line = workdir_problem(os.path.dirname(os.path.abspath(output)))
            if line:
                problems.append(f"--output: {line}")
    return problems
