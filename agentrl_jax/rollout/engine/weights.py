"""The engine's served weights: the parameter state in the engine's shardings, the decode GEMMs'
merged copy of it, and the weight version, with an explicit swap between engine steps.

:class:`EngineWeights` owns that state. Preparing new weights (``prepare``: the cast to
``weights_dtype`` and the placement on the engine's devices) runs on any thread; ``swap``,
``release_merged`` and ``ensure_merged`` run on the engine thread between device calls (the
``Engine`` sends them there), so no decode call uses weights while they change.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rollout.engine.placement import to_state

# One device_put of weights at a time (see EngineWeights.prepare).
_PLACE_LOCK = threading.Lock()

#: the architecture fields a loaded checkpoint must share with the served model
ARCHITECTURE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "tie_word_embeddings", "attention_bias",
                     "qk_norm")


def nbytes(tree: Any) -> int:
    """The bytes of every array leaf of ``tree`` (0 for ``None``)."""
    return sum(int(x.nbytes) for x in jax.tree.leaves(tree))


def check_compatible(served: ModelConfig, loaded: ModelConfig) -> None:
    """Raise ``ValueError`` naming each of :data:`ARCHITECTURE_KEYS` where ``loaded`` differs
    from ``served``."""
    diff = {k: (getattr(served, k), getattr(loaded, k)) for k in ARCHITECTURE_KEYS
            if getattr(served, k) != getattr(loaded, k)}
    if diff:
        raise ValueError("checkpoint architecture differs from the served model: "
                         + ", ".join(f"{k}: {a} != {b}" for k, (a, b) in diff.items()))


def next_version(current: str, requested: str | None) -> str:
    """The version after a swap: ``requested`` when given, else ``current + 1`` for a numeric
    version and ``"1"`` otherwise."""
    if requested is not None:
        return str(requested)
    return str(int(current) + 1) if current.isdigit() else "1"


class EngineWeights:
    """The weights one engine serves.

    Owns: ``state`` (an ``nnx.State`` committed to the engine's shardings), ``leaves`` (its
    leaves as a tuple, what the compiled decode and prefill take), ``merged`` (the
    q/k/v and gate/up weights concatenated for the decode GEMMs, ``compiled.merge(state)``;
    ``None`` while the KV cache is released, and always ``None`` for ``decode_gemm="xla"``) and
    ``version`` (a string; ``"0"`` at start). ``merge``: the compiled merge function.
    """

    def __init__(self, params: Any, abstract_state: nnx.State, shardings: nnx.State,
                 model_config: ModelConfig, weights_dtype: str | None,
                 merge: Callable[[nnx.State], Any]):
        self._abstract_state = abstract_state
        self._shardings = shardings
        self._model_config = model_config
        self._weights_dtype = weights_dtype
        self._merge = merge
        self._treedef = jax.tree.structure(abstract_state)  # what the compiled calls rebuild
        self.state: nnx.State
        self.leaves: tuple[jax.Array, ...]
        self._serve(self.prepare(params))
        self.merged: Any = merge(self.state)
        self.version = "0"

    @property
    def abstract_state(self) -> nnx.State:
        """The served model's state structure (shapes and dtypes, no arrays)."""
        return self._abstract_state

    def prepare(self, params: Any) -> nnx.State:
        """``params`` (a CausalLM, nnx.State or pure dict) as a state of the served structure,
        cast to ``weights_dtype`` (floating leaves) and committed to the engine's shardings.
        Any thread; does not change the served weights."""
        state = to_state(params, self._abstract_state)
        if self._weights_dtype:
            dt = jnp.dtype(self._weights_dtype)
            state = jax.tree.map(
                lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dt
                else x, state)
        # Every state, the first one included, is committed to the engine's own shardings: the
        # compiled decode / prefill functions are keyed on their inputs' shardings, and weights
        # laid out otherwise (a learner's mesh, an uncommitted array) would recompile all of
        # them on the next call (docs/PERFORMANCE.md, "A whole RL step"). Arrays already laid
        # out so are not copied;
        # arrays on other devices (a learner sharded over every GPU) are transferred. One thread
        # at a time: replicas (threads) put the same arrays, and two concurrent device_puts of one
        # sharded array can fail in JAX ("safe_zip() argument 1 has length 8 but argument 0 ...").
        with _PLACE_LOCK:
            return jax.device_put(state, self._shardings)

    def swap(self, state: nnx.State, version: str | None = None) -> str:
        """(Engine thread, between steps.) Serve ``state`` (from ``prepare``) from now on;
        returns the new version (:func:`next_version`). The old merged weights are deleted
        before the new ones are built, so a swap holds one merged copy, not two."""
        self._serve(state)
        if self.merged is not None:
            for x in jax.tree.leaves(self.merged):
                x.delete()
            self.merged = self._merge(state)
        self.version = next_version(self.version, version)
        return self.version

    def _serve(self, state: nnx.State) -> None:
        """Make ``state`` and its leaves the served ones. The compiled calls rebuild the state
        from the leaves with the abstract state's structure, so another structure would put
        arrays in the wrong places: refused (``ValueError``)."""
        leaves, treedef = jax.tree.flatten(state)
        if treedef != self._treedef:
            raise ValueError("the weights' structure is not the served model's")
        self.state, self.leaves = state, tuple(leaves)

    def release_merged(self) -> int:
        """(Engine thread.) Delete the merged weights (with the KV cache); returns their bytes."""
        freed = nbytes(self.merged)
        for x in jax.tree.leaves(self.merged):
            x.delete()
        self.merged = None
        return freed

    def ensure_merged(self) -> int:
        """(Engine thread.) Build the merged weights if released; returns their bytes."""
        if self.merged is None:
            self.merged = self._merge(self.state)
        return nbytes(self.merged)

    def check_compatible(self, cfg: ModelConfig) -> None:
        """Refuse (``ValueError``) a checkpoint config of another architecture."""
        check_compatible(self._model_config, cfg)

    def load_checkpoint(self, path: str, cancel: threading.Event | None = None) -> Any:
        """The model of the safetensors directory ``path``, refused (``ValueError``) unless its
        config has the served architecture, checked before anything is built or read."""
        from agentrl_jax.models.safetensors_io import load_safetensors_model

        model, _ = load_safetensors_model(path, check_config=self.check_compatible,
                                          cancel=cancel)
        return model


__all__ = ["ARCHITECTURE_KEYS", "EngineWeights", "check_compatible", "next_version", "nbytes"]
