"""The policy of a run: loading it (pretrained or random), the learner over it, the checkpoints
a workdir holds, and the learner's weights as a rollout backend takes them (``LearnerWeights``,
passed to ``backend.sync_weights``)."""

from __future__ import annotations

import os
from typing import Any

from agentrl_jax.training.runtime import distributed, services
from agentrl_jax.training.config.sections import RunConfig


def load_policy(config: RunConfig, mesh: Any = None):
    """(model, tokenizer, path) from ``config.model``: a pretrained checkpoint, or a random
    model of ``config.model.random_init`` shape that uses the named checkpoint's tokenizer.

    ``mesh``: create every parameter directly in the learner's sharding over this mesh
    (``agentrl_jax.sharding.rules.DEFAULT_RULES``), random or loaded, so that no device ever
    holds the whole model (the Learner built on the same mesh adopts the arrays as they are).
    ``None``: whole on the default device.

    With ``model.output_tokens`` the policy is restricted to those tokens
    (:func:`restrict_policy`): the learner and the engine built from it both apply it."""
    model, tokenizer, path = _load_weights(config, mesh)
    if config.model.output_tokens:
        restrict_policy(model, tokenizer, config.model.output_tokens)
    return model, tokenizer, path


def restrict_policy(model: Any, tokenizer: Any, output_tokens: Any) -> None:
    """Restrict ``model`` (in place: its static config) to the tokens of ``output_tokens``
    (``model.output_tokens``) and its EOS tokens: ``ModelConfig.output_token_ids``, which every
    LM head built from the model applies (``models/output_tokens.py``). ``ValueError`` when an
    entry is not one token of ``tokenizer``."""
    model.cfg = model.cfg.restricted_to(tokenizer, output_tokens)


def _load_weights(config: RunConfig, mesh: Any):
    """(model, tokenizer, path) of ``config.model`` before any restriction (``load_policy``)."""
    from agentrl_jax.models.pretrained import load_pretrained, resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    mc = config.model
    random_init = mc.random_init
    if random_init:
        from agentrl_jax.models.llama import init_model

        tokenizer = load_tokenizer(resolve_model_path(mc.name))
        cfg = random_model_config(random_init, tokenizer, mc.dtype)
        model = init_model(cfg, seed=int(config.seed), mesh=mesh)
        return model, tokenizer, None
    shard = None
    if mesh is not None:
        from agentrl_jax.sharding.rules import sharding_fn
        shard = sharding_fn(mesh)
    pretrained = load_pretrained(mc.name, sharding_fn=shard, dtype=mc.dtype)
    return pretrained.model, pretrained.tokenizer, pretrained.path


def random_model_config(shape: Any, tokenizer: Any, dtype: str) -> Any:
    """The ``ModelConfig`` of a ``model.random_init`` policy: ``shape``'s sizes over the
    tokenizer's vocabulary and special tokens (unless the shape names its own, larger
    vocabulary: ids past the tokenizer decode to nothing, as for a benchmark of a bigger
    model's shape)."""
    from agentrl_jax.models.config import ModelConfig

    return ModelConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, dtype=dtype,
                       **{"vocab_size": len(tokenizer), **dict(shape)})


def policy_config(config: RunConfig) -> Any:
    """The ``ModelConfig`` of the policy :func:`load_policy` would load for ``config``, read
    without any weight (the checkpoint's config.json or GGUF header, or the random shape over
    the tokenizer; restricted to ``model.output_tokens`` as ``load_policy`` restricts it)."""
    from agentrl_jax.models.pretrained import load_model_config, resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    mc = config.model
    tokenizer = (load_tokenizer(resolve_model_path(mc.name))
                 if mc.random_init or mc.output_tokens else None)
    if mc.random_init:
        cfg = random_model_config(mc.random_init, tokenizer, mc.dtype)
    else:
        cfg = load_model_config(mc.name, dtype=mc.dtype)
    if mc.output_tokens:
        cfg = cfg.restricted_to(tokenizer, mc.output_tokens)
    return cfg


def abstract_learner(config: RunConfig) -> Any:
    """The one-process ``Learner`` :func:`load_learner` would build, before its weights
    (``learner.shapes.AbstractLearner``: shapes, dtypes and shardings only)."""
    from agentrl_jax.learner.shapes import AbstractLearner
    from agentrl_jax.sharding.mesh import mesh_from_config

    settings = services.learner_settings(config)
    return AbstractLearner(policy_config(config), settings, mesh_from_config(settings.mesh))


def load_learner(config: RunConfig, checkpoint_dir: str | None = None, max_to_keep: int = 3,
                 multi_process: bool = False) -> tuple[Any, Any, Any, str | None]:
    """(learner, model, tokenizer, model_path): the policy of ``config.model`` and the
    ``Learner`` over it, as the trainer builds them.

    In one process the policy is created (random) or loaded (pretrained) directly in the
    learner's parameter shardings over ``config.learner.mesh``, and the learner adopts those
    arrays (``copy_model=False``): no device holds the whole float32 model at any time, and
    there is one copy of the parameters, not two. ``model`` then shares the learner's
    arrays; it is the embedded engine's first weights (which the engine casts to its dtype and
    places on its own devices), so it must not be used after the first update, which donates
    them. With ``train.max_staleness >= 1`` a rollout runs during the first update: the learner
    copies the parameters then (``copy_model=True``) so that ``model`` stays valid for the
    engine. With several processes the policy is loaded whole on each process (its engine
    takes it from there) and the learner copies it into its global sharding, as before.
    """
    from agentrl_jax.learner.learner import Learner
    from agentrl_jax.sharding.mesh import mesh_from_config

    settings = services.learner_settings(config)
    mesh = None if multi_process else mesh_from_config(settings.mesh)
    model, tokenizer, model_path = load_policy(config, mesh=mesh)
    overlap = config.train.max_staleness >= 1
    learner = Learner(model, settings, mesh=mesh, checkpoint_dir=checkpoint_dir,
                      max_to_keep=max_to_keep, copy_model=mesh is None or overlap)
    return learner, model, tokenizer, model_path


def checkpoint_steps(checkpoint_dir: str) -> list[int]:
    """Steps of the finished checkpoints in ``checkpoint_dir`` (orbax names each by its step;
    unfinished ones carry a temporary suffix), without starting orbax."""
    try:
        names = os.listdir(checkpoint_dir)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit()
                  and os.path.isdir(os.path.join(checkpoint_dir, n)))


def engine_policy(learner: Any, overlap: bool) -> Any:
    """The restored policy for a new embedded engine (a resumed run).

    ``learner.policy_model()`` holds the learner's own parameter arrays, and an engine built
    from it keeps them as they are (same shardings: no copy). The learner's update donates
    those buffers, so with ``overlap`` (``train.max_staleness >= 1``: a rollout decodes while
    the first update runs) the engine's weights would be deleted under it ("Array has been
    deleted", every episode an engine_error; tests/test_resume_donation.py). Then the engine
    gets a copy; otherwise (the update never runs during a rollout, and the weight sync
    replaces the engine's weights before the next one) the arrays themselves.
    """
    policy = learner.policy_model()
    if not overlap:
        return policy
    import jax
    import jax.numpy as jnp
    from flax import nnx

    return nnx.merge(learner.graphdef, jax.tree.map(jnp.copy, learner.params))


class LearnerWeights:
    """The learner's current weights in the forms a rollout backend loads
    (``RolloutBackend.sync_weights``): the parameter arrays for an engine in this process, the
    policy model for servers that load an export.

    ``copy``: the arrays are fresh buffers (a rollout runs during the next update, which
    donates the learner's). With several processes every host gets the full parameters on its
    own devices (gathered on device: a collective that every process must call), and
    :meth:`synced` is a barrier."""

    def __init__(self, learner: Any, copy: bool = False, multi_process: bool = False,
                 is_main: bool = True):
        self.learner, self.copy = learner, copy
        self.multi_process, self.is_main = multi_process, is_main

    def arrays(self) -> Any:
        """The parameter arrays (an nnx state) for an engine on this host's devices."""
        if self.multi_process:
            return distributed.local_replica(self.learner.params)
        params = self.learner.params
        if self.copy:
            import jax
            import jax.numpy as jnp

            params = jax.tree.map(jnp.copy, params)
        return params

    def policy(self) -> Any:
        """The policy model (servers load an export of it)."""
        if self.multi_process:
            return distributed.local_policy(self.learner)
        return self.learner.policy_model()

    def synced(self, version: int) -> None:
        """Every process has loaded ``version`` (a barrier with several processes)."""
        if self.multi_process:
            distributed.barrier(f"sync_weights:{version}")
