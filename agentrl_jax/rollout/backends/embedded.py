"""The ``embedded`` rollout backend: the JAX engine inside this process (``rollout/engine/``).

One ``Engine`` on one device group, or ``EngineReplicas`` (one engine per group, sessions spread
over them) when the run has several groups.
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.rollout.contract import BackendBuild, RolloutBackend


class EmbeddedEngines:
    """Registry entry ``embedded``: builds the in-process engine(s); not a backend itself."""

    name = "embedded"
    uses_local_engine = True

    @classmethod
    def from_config(cls, **options: Any) -> RolloutBackend:
        """``Engine.from_config``: ``model`` (a name / path, ``Pretrained`` or ``CausalLM``) and
        ``EngineConfig`` fields as keywords."""
        from agentrl_jax.rollout.engine.engine import Engine

        return Engine.from_config(**options)

    @classmethod
    def from_run(cls, build: BackendBuild) -> RolloutBackend:
        """One ``Engine`` for one device group; ``EngineReplicas`` (tensor-parallel over each
        group's devices) for several."""
        groups = [list(g) for g in build.device_groups]
        if not groups or build.engine_config is None:
            raise ValueError("the embedded backend needs an engine config and device groups")
        if len(groups) == 1:
            from agentrl_jax.rollout.engine.engine import Engine

            return Engine(build.model, build.engine_config, tokenizer=build.tokenizer,
                          model_path=build.model_path, devices=groups[0])
        from agentrl_jax.rollout.engine.replicas import EngineReplicas

        return EngineReplicas(build.model, build.engine_config, tokenizer=build.tokenizer,
                              model_path=build.model_path, devices=[d for g in groups for d in g],
                              tensor_parallel=len(groups[0]))
