"""Validate a whole experiment config before anything starts.

``config_problems(config)`` returns one line per bad key (``"learner.learning_rate: must be a
finite number > 0 (got -0.0001)"``); every key is checked, so a config with several mistakes
reports all of them at once. ``check_config`` raises ``ConfigError`` carrying those lines;
``launch/run.py`` and ``launch/eval.py`` call it first and exit with code 2 (no environment
server, model or device is touched: the checks read the config and the name registries only).

``run_problems(config, workdir)`` adds what depends on this host, still without starting
anything: the model source exists in the format its loader reads (``models/pretrained.py``,
nothing is loaded), the workdir can be created and written (a temporary file in it, or in its
nearest existing parent), and one step's batch fits this host's memory (which bounds
``train.tasks_per_step``). ``check_run`` raises ``ConfigError`` with all of those lines;
``launch/run.py`` calls it.

Names are checked against their registries, whose known names the message lists: advantage
estimators (``agentrl_jax.algorithms``), environment families (``environments.registry``),
loss aggregation modes, KL estimators, learning-rate schedules, action parsers, answer
formats and horizon schedules.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from typing import Any, Callable, Iterable

from agentrl_jax.rollout import sampling_limits as limits
from agentrl_jax.training.services import _as_list

#: exit code of ``launch/run.py`` / ``launch/eval.py`` for an invalid config (as for bad usage)
EXIT_BAD_CONFIG = 2

ROLLOUT_BACKENDS = ("embedded", "engine_servers", "sglang")
HORIZON_TYPES = ("scaling_inter", "fixed")
ENGINE_DTYPES = ("", "float32", "bfloat16")


class ConfigError(ValueError):
    """An invalid config; ``problems`` holds one line per bad key."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__(format_problems(self.problems))


def format_problems(problems: list[str]) -> str:
    """The message printed for an invalid config: a count, then one indented line per key."""
    n = len(problems)
    return f"invalid config ({n} problem{'s' if n != 1 else ''}):\n" + "\n".join(
        f"  {p}" for p in problems)


def _get(section: Any, key: str, default: Any = None) -> Any:
    try:
        return section.get(key, default)
    except AttributeError:
        return default


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)
            and math.isfinite(float(x)))


class _Checker:
    """Collects problems; each ``check_*`` method looks at one key."""

    def __init__(self, config: Any):
        self.config = config
        self.problems: list[str] = []

    def bad(self, key: str, message: str) -> None:
        self.problems.append(f"{key}: {message}")

    def section(self, name: str) -> Any:
        section = _get(self.config, name)
        if section is None:
            self.bad(name, "section missing")
        return section

    def value(self, section: Any, prefix: str, key: str, default: Any = None,
              required: bool = True) -> tuple[str, Any, bool]:
        """(full key, value, present)."""
        full = f"{prefix}.{key}" if prefix else key
        missing = object()
        value = _get(section, key, missing) if section is not None else missing
        if value is missing:
            if required and section is not None and default is None:
                self.bad(full, "missing")
            return full, default, False
        return full, value, True

    def int_at_least(self, section: Any, prefix: str, key: str, low: int,
                     default: int | None = None, required: bool = True) -> int | None:
        full, v, present = self.value(section, prefix, key, default, required)
        if not present:
            return v
        if not _is_int(v) or v < low:
            self.bad(full, f"must be an integer >= {low} (got {v!r})")
            return None
        return v

    def number(self, section: Any, prefix: str, key: str, ok: Callable[[float], bool],
               what: str, default: float | None = None, required: bool = True,
               allow_none: bool = False) -> float | None:
        full, v, present = self.value(section, prefix, key, default, required)
        if not present or (allow_none and v is None):
            return v
        if not _is_num(v) or not ok(float(v)):
            self.bad(full, f"must be a finite number {what} (got {v!r})")
            return None
        return float(v)

    def sampling(self, section: Any, limit: Any, required: bool = False) -> None:
        """``rollout.<name>`` within the range of the sampling parameter ``limit`` (a
        ``sampling_limits.Limit``: the same range the rollout server checks)."""
        full, v, present = self.value(section, "rollout", limit.name,
                                      None if required else limit.default, required)
        if present:
            problem = limit.problem(v)
            if problem is not None:
                self.bad(full, problem)

    def choice(self, section: Any, prefix: str, key: str, known: Iterable[str],
               normalize: Callable[[str], str] = lambda s: s, kind: str = "value",
               default: str | None = None, required: bool = True) -> str | None:
        full, v, present = self.value(section, prefix, key, default, required)
        if not present:
            return v
        known = sorted(set(known))
        if not isinstance(v, str) or normalize(v) not in {normalize(k) for k in known}:
            self.bad(full, f"unknown {kind} {v!r}; known: {', '.join(known)}")
            return None
        return v


def config_problems(config: Any) -> list[str]:
    """Every problem of ``config`` (an ``ml_collections.ConfigDict`` or nested mapping of the
    layout of ``training/config.py``), one line per key; [] when it is valid."""
    c = _Checker(config)
    if not _is_int(_get(config, "seed", 0)):
        c.bad("seed", f"must be an integer (got {_get(config, 'seed')!r})")
    c.number(config, "", "progress_seconds", lambda x: x >= 0, ">= 0", default=30.0,
             required=False)
    _check_model(c)
    _check_env(c)
    max_context = _check_rollout(c)
    _check_agent(c)
    _check_horizon(c)
    _check_train(c)
    _check_learner(c, max_context)
    return c.problems


def check_config(config: Any) -> None:
    """Raise ``ConfigError`` (all problems, one line each) unless ``config`` is valid."""
    problems = config_problems(config)
    if problems:
        raise ConfigError(problems)


# --------------------------------------------------------------------------- this host
#: bytes one token takes in a step's batch (``training/batching.py``): ``tokens``,
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


def run_problems(config: Any, workdir: str, processes: int = 1,
                 memory: int | None = None) -> list[str]:
    """``config_problems(config)`` and the problems of running it here (module docstring):
    the model source, ``workdir`` (the ``--workdir`` of ``launch/run.py``) and the batch
    memory that bounds ``train.tasks_per_step`` (``processes`` JAX processes share a step;
    ``memory``: bytes per process, default this host's). Nothing is loaded or started, and
    nothing is left on disk."""
    problems = config_problems(config)
    bad_keys = {p.split(":", 1)[0] for p in problems}
    model = _get(config, "model")
    name = _get(model, "name")
    if isinstance(name, str) and name.strip() and "model.name" not in bad_keys:
        from agentrl_jax.models.pretrained import check_model_source

        try:
            check_model_source(name, weights=not _get(model, "random_init"))
        except (OSError, ValueError) as e:
            problems.append(f"model.name: {e}")
    problem = workdir_problem(workdir)
    if problem:
        problems.append(f"--workdir: {problem}")
    train, rollout = _get(config, "train"), _get(config, "rollout")
    tasks, samples = _get(train, "tasks_per_step"), _get(train, "samples_per_task")
    context = _get(rollout, "max_context")
    memory = host_memory_bytes() if memory is None else memory
    if (memory and all(_is_int(v) and v >= 1 for v in (tasks, samples, context))
            and not bad_keys & {"train.tasks_per_step", "train.samples_per_task",
                                "rollout.max_context"}):
        limit = max_tasks_per_step(samples, context, memory, processes)
        if tasks > limit:
            problems.append(
                f"train.tasks_per_step: at most {limit} on this host (got {tasks}): one step's "
                f"batch holds tasks_per_step x train.samples_per_task={samples} rows of up to "
                f"rollout.max_context={context} tokens, {BATCH_BYTES_PER_TOKEN} bytes each, in "
                f"{memory / 2 ** 30:.1f} GiB of memory"
                + (f" on each of {processes} processes" if processes > 1 else ""))
    return problems


def check_run(config: Any, workdir: str, processes: int = 1) -> None:
    """Raise ``ConfigError`` (one line per problem) unless ``config`` can run here in
    ``workdir`` (``run_problems``)."""
    problems = run_problems(config, workdir, processes)
    if problems:
        raise ConfigError(problems)


# --------------------------------------------------------------------------- sections
def _check_model(c: _Checker) -> None:
    m = c.section("model")
    if m is None:
        return
    name = _get(m, "name")
    if not isinstance(name, str) or not name.strip():
        c.bad("model.name", f"must be a model name, HF directory or .gguf path (got {name!r})")
    c.choice(m, "model", "dtype", ("float32", "bfloat16"), kind="dtype", default="float32",
             required=False)
    random_init = _get(m, "random_init")
    if random_init:
        import dataclasses

        from agentrl_jax.models.config import ModelConfig

        fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
        for key, value in dict(random_init).items():
            field = fields.get(key)
            kind = None if field is None else str(field.type)  # "int", "bool", "float", ...
            where = f"model.random_init.{key}"
            if field is None:
                c.bad(where, "is not a ModelConfig field (known: " + ", ".join(sorted(fields))
                      + ")")
            elif kind == "bool" and not isinstance(value, bool):
                c.bad(where, f"must be true or false (got {value!r})")
            elif kind == "int" and (not _is_int(value) or value < 1):
                c.bad(where, f"must be an integer >= 1 (got {value!r})")
            elif kind == "float" and (not _is_num(value) or value <= 0):
                c.bad(where, f"must be a number > 0 (got {value!r})")
            elif kind == "str" and not isinstance(value, str):
                c.bad(where, f"must be a string (got {value!r})")


def _check_env(c: _Checker) -> None:
    from environments.registry import family_names

    e = c.section("env")
    if e is None:
        return
    names = _as_list(_get(e, "names"))
    known = family_names()
    if not names:
        c.bad("env.names", f"lists no environment; known: {', '.join(known)}")
    for name in names:
        if name not in known:
            c.bad("env.names", f"unknown environment family {name!r}; known: "
                               f"{', '.join(known)}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        c.bad("env.names", f"lists {', '.join(map(repr, repeated))} more than once (got "
                           f"{','.join(names)!r})")
    for key in dict(_get(e, "urls", {}) or {}):
        if key not in names:
            c.bad(f"env.urls.{key}", f"names no environment of env.names ({', '.join(names)})")
    for key, pattern in dict(_get(e, "task_filter", {}) or {}).items():
        if key not in names:
            c.bad(f"env.task_filter.{key}", f"names no environment of env.names ({', '.join(names)})")
        elif not isinstance(pattern, str):
            c.bad(f"env.task_filter.{key}", f"must be a regular expression string (got {pattern!r})")
        else:
            try:
                re.compile(pattern)
            except re.error as error:
                c.bad(f"env.task_filter.{key}", f"is not a regular expression: {error} (got {pattern!r})")
    c.int_at_least(e, "env", "replicas", 1, default=1, required=False)
    c.number(e, "env", "timeout", lambda x: x > 0, "> 0", default=120.0, required=False)
    c.int_at_least(e, "env", "max_restarts", 0, default=3, required=False)


def _check_rollout(c: _Checker) -> int | None:
    r = c.section("rollout")
    if r is None:
        return None
    from agentrl_jax.agent.parsing import PARSERS

    backend = c.choice(r, "rollout", "backend", ROLLOUT_BACKENDS, kind="rollout backend")
    if backend == "sglang" and not _as_list(_get(r, "urls")):
        c.bad("rollout.urls", "rollout.backend='sglang' needs server URLs (comma-separated)")
    c.int_at_least(r, "rollout", "max_batch", 1)
    max_context = c.int_at_least(r, "rollout", "max_context", 16)
    max_new = c.int_at_least(r, "rollout", "max_new_tokens", 1)
    if max_context is not None and max_new is not None and max_new >= max_context:
        c.bad("rollout.max_new_tokens", f"must be < rollout.max_context={max_context} "
                                        f"(got {max_new})")
    elif max_new is not None:
        c.sampling(r, limits.MAX_NEW_TOKENS)
    # the sampling ranges the rollout server and every backend apply (sampling_limits.py)
    c.sampling(r, limits.TEMPERATURE, required=True)
    c.sampling(r, limits.TOP_P, required=True)
    c.sampling(r, limits.TOP_K)
    c.int_at_least(r, "rollout", "max_concurrency", 1)
    c.int_at_least(r, "rollout", "decode_steps", 1, default=16, required=False)
    _, kv_buckets, present = c.value(r, "rollout", "prefill_kv_buckets", "", required=False)
    if present:
        from agentrl_jax.training.services import prefill_kv_buckets

        try:
            prefill_kv_buckets(kv_buckets)
        except (ValueError, TypeError) as e:
            c.bad("rollout.prefill_kv_buckets", str(e))
    c.choice(r, "rollout", "engine_dtype", ENGINE_DTYPES, kind="dtype", default="",
             required=False)
    c.choice(r, "rollout", "parser", PARSERS, kind="action parser", default="react",
             required=False)
    full, stop, present = c.value(r, "rollout", "stop", (), required=False)
    if present and stop is not None and not isinstance(stop, str) and not all(
            isinstance(s, str) for s in stop):
        c.bad(full, f"must be a string or a sequence of strings (got {stop!r})")
    elif present and stop:
        problem = limits.stop_problem([s for s in ([stop] if isinstance(stop, str) else stop)
                                       if s])  # empty strings are dropped (stop_strings)
        if problem is not None:
            c.bad(full, problem)
    api_key = _get(r, "api_key")
    if api_key is not None and not isinstance(api_key, str):
        c.bad("rollout.api_key", f"must be a string (got {type(api_key).__name__})")
    return max_context


def _check_agent(c: _Checker) -> None:
    a = _get(c.config, "agent")
    if a is None:
        return
    from agentrl_jax.agent.prompts import ANSWER_FORMATS

    c.choice(a, "agent", "prompt_style", ANSWER_FORMATS, kind="answer format",
             default="react", required=False)
    prefix = _get(a, "response_prefix", "")
    if not isinstance(prefix, str):
        c.bad("agent.response_prefix", f"must be a string (got {prefix!r})")
    from environments.core.base import MAX_LISTED_ACTIONS

    listed = _get(a, "list_valid_actions", 0)
    if isinstance(listed, bool) or not isinstance(listed, int) or not 0 <= listed <= MAX_LISTED_ACTIONS:
        c.bad("agent.list_valid_actions",
              f"must be an integer in 0..{MAX_LISTED_ACTIONS} (got {listed!r})")


def _check_horizon(c: _Checker) -> None:
    h = c.section("horizon")
    if h is None:
        return
    kind = c.choice(h, "horizon", "type", HORIZON_TYPES, kind="horizon schedule",
                    default="scaling_inter", required=False)
    if kind == "fixed":
        c.int_at_least(h, "horizon", "turns", 1)
    elif kind == "scaling_inter":
        phases = _get(h, "phases")
        try:
            phase_list = list(phases)
        except TypeError:
            phase_list = None
        if not phase_list or not all(_is_int(p) and p >= 1 for p in phase_list):
            c.bad("horizon.phases", f"must be a non-empty sequence of integers >= 1 "
                                    f"(got {phases!r})")
        c.int_at_least(h, "horizon", "steps_per_phase", 1, default=100, required=False)


def _check_train(c: _Checker) -> None:
    t = c.section("train")
    if t is None:
        return
    c.int_at_least(t, "train", "total_steps", 0)
    c.int_at_least(t, "train", "tasks_per_step", 1)
    c.int_at_least(t, "train", "samples_per_task", 1)
    c.int_at_least(t, "train", "save_every", 1, default=1, required=False)
    c.int_at_least(t, "train", "keep_checkpoints", 1, default=3, required=False)
    c.int_at_least(t, "train", "eval_every", 0, default=0, required=False)
    staleness = c.int_at_least(t, "train", "max_staleness", 0, default=0, required=False)
    r = _get(c.config, "rollout")
    release = _get(r, "release_kv_during_update", False) if r is not None else False
    if not isinstance(release, bool):
        c.bad("rollout.release_kv_during_update", f"must be True or False (got {release!r})")
    elif release and staleness:
        c.bad("rollout.release_kv_during_update", "needs train.max_staleness = 0 (with "
              f"{staleness} the next rollout decodes during the update)")
    c.number(t, "train", "max_seconds", lambda x: x >= 0, ">= 0 (0: no limit)", default=0.0,
             required=False)
    c.int_at_least(t, "train", "eval_tasks", 0, default=0, required=False)
    c.int_at_least(t, "train", "eval_samples", 1, default=1, required=False)
    c.int_at_least(t, "train", "eval_horizon", 1, default=20, required=False)
    c.number(t, "train", "max_env_error_rate", lambda x: 0 <= x <= 1, "in [0, 1]",
             default=0.5, required=False)
    c.int_at_least(t, "train", "env_error_window", 1, default=10, required=False)
    c.number(t, "train", "eval_min_scored", lambda x: 0 <= x <= 1, "in [0, 1]",
             default=0.9, required=False)
    c.int_at_least(t, "train", "max_failed_steps", 0, default=3, required=False)


def _check_learner(c: _Checker, max_context: int | None) -> None:
    lr = c.section("learner")
    if lr is None:
        return
    from agentrl_jax.algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS
    from agentrl_jax.algorithms.registry import normalize_name
    from agentrl_jax.learner.config import DTYPES, SCHEDULES, LearnerConfig

    values = lr.to_dict() if hasattr(lr, "to_dict") else dict(lr)
    known_keys = {f for f in LearnerConfig.__dataclass_fields__}
    for key in sorted(set(values) - known_keys):
        c.bad(f"learner.{key}", "unknown learner key (see agentrl_jax/learner/config.py)")
    positive = lambda x: x > 0  # noqa: E731
    c.number(lr, "learner", "learning_rate", positive, "> 0")
    c.number(lr, "learner", "critic_learning_rate", positive, "> 0", required=False)
    c.choice(lr, "learner", "advantage_estimator", ADVANTAGE_ESTIMATORS, normalize_name,
             kind="advantage estimator")
    c.choice(lr, "learner", "loss_agg_mode", LOSS_AGGREGATIONS, normalize_name,
             kind="loss aggregation mode", required=False)
    c.choice(lr, "learner", "kl_estimator", KL_ESTIMATORS, normalize_name,
             kind="KL estimator", required=False)
    c.choice(lr, "learner", "lr_schedule", SCHEDULES, kind="learning-rate schedule",
             required=False)
    c.choice(lr, "learner", "ratio_source", ("rollout", "recompute"), kind="ratio source",
             required=False)
    c.choice(lr, "learner", "dtype", DTYPES, kind="dtype", required=False)
    c.choice(lr, "learner", "reference_dtype", DTYPES, kind="dtype", required=False)
    nonneg = lambda x: x >= 0  # noqa: E731
    for key in ("kl_coef", "entropy_coef", "weight_decay", "clip_ratio_low", "clip_ratio_high",
                "min_lr_ratio", "value_coef"):
        c.number(lr, "learner", key, nonneg, ">= 0", required=False)
    c.number(lr, "learner", "grad_clip", nonneg, ">= 0 (0: off)", required=False,
             allow_none=True)
    c.number(lr, "learner", "temperature", positive, "> 0", required=False)
    for key in ("gamma", "lam"):
        c.number(lr, "learner", key, lambda x: 0 <= x <= 1, "in [0, 1]", required=False)
    micro = c.int_at_least(lr, "learner", "micro_batch_size", 1)
    c.int_at_least(lr, "learner", "mini_batches", 1, required=False)
    c.int_at_least(lr, "learner", "epochs", 1, required=False)
    c.int_at_least(lr, "learner", "warmup_steps", 0, required=False)
    c.int_at_least(lr, "learner", "min_length_bucket", 1, required=False)
    pack = c.int_at_least(lr, "learner", "pack_length", 0, required=False)
    offload = _get(lr, "offload_optimizer_state", False)
    if not isinstance(offload, bool):
        c.bad("learner.offload_optimizer_state", f"must be True or False (got {offload!r})")
    if pack and max_context is not None and pack < max_context:
        c.bad("learner.pack_length", f"must be 0 (off) or >= rollout.max_context={max_context} "
                                     f"(a packed row holds a whole trajectory; got {pack})")
    mesh = _get(lr, "mesh")
    if mesh is not None:
        dims = dict(mesh)
        unknown = sorted(set(dims) - {"data", "fsdp", "tensor"})
        if unknown:
            c.bad("learner.mesh", f"unknown axes {unknown}; known: data, fsdp, tensor")
        if not all(_is_int(v) and (v >= 1 or v == -1) for v in dims.values()):
            c.bad("learner.mesh", f"sizes must be integers >= 1 or -1 (got {dims})")
        elif sum(v == -1 for v in dims.values()) > 1:
            c.bad("learner.mesh", f"at most one axis may be -1 (got {dims})")
        elif micro is not None and all(v >= 1 for v in dims.values()):
            shards = int(dims.get("data", 1)) * int(dims.get("fsdp", 1))
            if micro % shards:
                c.bad("learner.micro_batch_size", f"must be a multiple of the mesh's data x "
                                                  f"fsdp size {shards} (got {micro})")
