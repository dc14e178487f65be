"""The run config's ``rollout`` section: the backend, the engine's settings and sampling.

The engine's settings are defined once, in ``EngineConfig`` (``rollout/engine/engine_config.py``,
a typed section like this one). This section holds the ones a run sets, flat, under the keys
runs have always used (``--config.rollout.max_batch``, ``rollout.max_context`` in config.json):
each is declared with :func:`engine_setting`, which copies the ``EngineConfig`` field's default,
checks and help (a key of its own may only narrow a check), and :data:`ENGINE_KEYS` maps each
key to its field. :func:`engine_config_of_run` builds a run's ``EngineConfig`` from them, for
the embedded engine and for the engine servers' command lines alike; the engine settings no
key names keep ``EngineConfig``'s defaults. Holding them flat, not as a nested section, keeps
every existing config file and command line valid.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl_common.typed_sections import Section, setting
from agentrl_jax.rollout import sampling_limits as limits
from agentrl_jax.rollout.engine.engine_config import EngineConfig, kv_buckets_check

#: rollout key -> the ``EngineConfig`` field it sets (``engine_dtype`` sets two; the run's
#: top-level ``seed`` sets ``seed``)
ENGINE_KEYS: dict[str, tuple[str, ...]] = {
    "max_batch": ("max_batch",), "max_context": ("max_length",),
    "engine_dtype": ("dtype", "weights_dtype"), "decode_steps": ("decode_steps",),
    "decode_attention": ("decode_attention",), "prefill_attention": ("prefill_attention",),
    "decode_gemm": ("decode_gemm",), "prefill_kv_buckets": ("prefill_kv_buckets",),
    "share_prompts": ("share_prompts",), "prefill_tokens": ("prefill_tokens",),
    "deliver_after_launch": ("deliver_after_launch",), "decode_loop": ("decode_loop",)}
#: the run config's dtypes of the engine ("" the model's: a config file's spelling of None)
ENGINE_DTYPES = ("", "float32", "bfloat16")


def engine_setting(field: str, **narrower: Any) -> Any:
    """A section field declared by ``EngineConfig``'s field ``field``: its default and its
    metadata (checks, choices, help), with ``narrower`` replacing entries (a stricter bound,
    the name a check reports)."""
    source = next(f for f in dataclasses.fields(EngineConfig) if f.name == field)
    default = narrower.pop("default", source.default)
    return dataclasses.field(default=default, metadata={**source.metadata, **narrower})


def _limit(limit: limits.Limit):
    """A field check by a sampling parameter's range (the one the rollout server applies)."""
    return lambda value: limit.problem(value)


def _rollout_backends() -> list[str]:
    from agentrl_jax.rollout.contract import available_backends

    return available_backends()


def _parsers() -> list[str]:
    from agentrl_jax.agent.parsing import PARSERS

    return PARSERS.names()


def as_list(value: Any) -> list[str]:
    """A comma-separated string or a sequence as a list of non-empty names / URLs."""
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]




def _stop_problem(stop: Any) -> str | None:
    if stop is None:
        return None
    if not isinstance(stop, str) and not (isinstance(stop, (tuple, list)) and all(
            isinstance(s, str) for s in stop)):
        return f"must be a string or a sequence of strings (got {stop!r})"
    strings = [s for s in ([stop] if isinstance(stop, str) else stop) if s]
    return limits.stop_problem(strings) if strings else None


@dataclasses.dataclass(frozen=True)
class RolloutConfig(Section):
    """How episodes are generated: the backend, its engine and the sampling parameters."""

    PREFIX = "rollout"
    # embedded | engine_servers (a process per replica) | sglang
    backend: str = setting("embedded", choices=_rollout_backends, kind="rollout backend")
    urls: str | tuple[str, ...] = setting("")  # sglang servers, comma-separated
    api_key: str = setting("")  # sglang servers' --api-key ("": $AGENTRL_ROLLOUT_API_KEY)
    max_batch: int = engine_setting("max_batch")  # engine slots
    # tokens per episode (prompt + all turns): the engine's max_length
    max_context: int = engine_setting("max_length", ge=16)
    # per turn: one action line (react needs ~128, use_react)
    max_new_tokens: int = setting(24, check=_limit(limits.MAX_NEW_TOKENS))
    stop: str | tuple[str, ...] = setting(("\n",), check=_stop_problem)  # strings ending a turn
    temperature: float = setting(1.0, check=_limit(limits.TEMPERATURE))
    top_p: float = setting(1.0, check=_limit(limits.TOP_P))
    top_k: int = setting(-1, check=_limit(limits.TOP_K))
    max_concurrency: int = setting(64, ge=1)  # episodes in flight
    # "": the model's dtype (EngineConfig.dtype and weights_dtype)
    engine_dtype: str = engine_setting("dtype", default="", choices=ENGINE_DTYPES)
    decode_steps: int = engine_setting("decode_steps")
    # embedded engine placement: one replica per group of `tensor_parallel` local devices
    # (0 = every group: all local accelerators decode, one engine on CPU; N = the first N)
    engine_replicas: int = setting(0, ge=0)
    tensor_parallel: int = setting(1, ge=1)
    # auto (ragged_fused on GPU) | ragged_fused | ragged | dense
    decode_attention: str = engine_setting("decode_attention")
    # prefill attention: auto (flash_in_cache on GPU, dense elsewhere) | flash_in_cache (a flash
    # kernel reading only the keys each query block sees, rows in place, packed calls) | flash
    # (the kernel on a gathered copy of the rows) | dense (XLA einsums over the whole KV
    # length; EngineConfig.prefill_attention)
    prefill_attention: str = engine_setting("prefill_attention", kind="prefill attention")
    # decode GEMMs: auto (merged q/k/v and gate/up on cuBLAS for a one-GPU engine) | xla |
    # merged | merged_cublas (EngineConfig.decode_gemm)
    decode_gemm: str = engine_setting("decode_gemm")
    # free the engines' KV cache during each learner update (allocated again after the weight
    # sync; cached prefixes go): the update gets that memory on shared devices. Only without
    # overlap (train.max_staleness = 0); engine servers and SGLang get /release_memory_occupation
    # (SGLang frees memory only with --enable-memory-saver)
    release_kv_during_update: bool = setting(False)
    # prefill attends over a KV-length bucket of each row: "auto" (powers of two from 512; on
    # CPU the engine keeps the whole row), "" (off: the whole row) or a comma list of lengths;
    # more prefill shapes to compile (docs/PERFORMANCE.md, "Prefill KV buckets by default")
    prefill_kv_buckets: str | tuple[int, ...] = engine_setting(
        "prefill_kv_buckets", check=kv_buckets_check("rollout.prefill_kv_buckets"))
    # tokens per prefill call: "auto" (the platform's: EngineConfig.prefill_tokens) or a number;
    # larger calls mean fewer launches for the same prompt tokens, and more to compile
    prefill_tokens: int | str = engine_setting("prefill_tokens")
    #: a prompt equal to one being prefilled copies that prefill's KV row instead of computing
    #: it again (EngineConfig.share_prompts): the samples of a group share their first prompt
    share_prompts: bool = engine_setting("share_prompts")
    #: finished requests' results handed over after the next decode call is launched, so the
    #: host's bookkeeping overlaps the device (EngineConfig.deliver_after_launch)
    deliver_after_launch: bool = engine_setting("deliver_after_launch")
    #: the decode call's loop: "while" (stops when nothing decodes) or "fixed" (decode_steps
    #: steps a call, the trip count known to XLA; EngineConfig.decode_loop)
    decode_loop: str = engine_setting("decode_loop")
    parser: str = setting("react", choices=_parsers, kind="action parser")
    # episodes in N spawned worker processes (0: in the trainer's process; docs/ROLLOUT.md);
    # with an HTTP backend (engine_servers, sglang) the workers post to the servers themselves
    # unless actor_workers_direct is False (then every request is relayed by the trainer)
    actor_workers: int = setting(0, ge=0)
    actor_workers_direct: bool = setting(True)

    @property
    def url_list(self) -> list[str]:
        return as_list(self.urls)

    def _extra_problems(self, prefix: str, bad: set[str]) -> list[str]:
        out = []
        if "backend" not in bad and self.backend == "sglang" and not self.url_list:
            out.append(f"{prefix}.urls: rollout.backend='sglang' needs server URLs "
                       "(comma-separated)")
        if not bad & {"max_context", "max_new_tokens"} and self.max_new_tokens >= self.max_context:
            out.append(f"{prefix}.max_new_tokens: must be < rollout.max_context="
                       f"{self.max_context} (got {self.max_new_tokens})")
        return out


def engine_config_of_run(rollout: RolloutConfig, seed: int = 0,
                         max_batch: int | None = None) -> EngineConfig:
    """The ``EngineConfig`` of a run's ``rollout`` section (:data:`ENGINE_KEYS`) and top-level
    ``seed``; ``max_batch``: the slots of one replica when the run sizes them
    (``training.runtime.services.engine_slots``; default ``rollout.max_batch``). ``"auto"``
    values stay: the engine resolves them for its devices."""
    values: dict[str, Any] = {"seed": seed}
    for key, fields in ENGINE_KEYS.items():
        for field in fields:
            values[field] = getattr(rollout, key)
    if max_batch is not None:
        values["max_batch"] = max_batch
    return EngineConfig(**values)


__all__ = ["ENGINE_KEYS", "RolloutConfig", "as_list", "engine_config_of_run", "engine_setting"]
