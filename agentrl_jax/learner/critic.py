"""PPO value model: a copy of the policy's decoder backbone plus a scalar ``value_head``.

Parameter paths: ``backbone/...`` (the policy's names, without ``lm_head``) and
``value_head/{kernel [D, 1], bias [1]}``; the sharding rules match them by regex search
(``value_head/kernel`` has its own rule), so the critic shards like the policy.

Value alignment follows the logprob convention (see ``logprobs.py``): ``values[b, t]`` is the
value of the state *before* token ``t`` is generated, i.e. ``value_head(hidden[b, t-1])``, and
``values[b, 0] = 0``. So GAE's ``delta_t = r_t + gamma * V_{t+1} - V_t`` reads every array at the
token's own index.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from agentrl_jax.learner.logprobs import model_hidden, shift_right
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import CausalLM


class ValueModel(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        # tie_word_embeddings=True: the backbone builds no lm_head (the critic never needs one).
        self.backbone = CausalLM(cfg.replace(tie_word_embeddings=True), rngs=rngs)
        # float32 head (a [D, 1] matmul costs nothing): values are not rounded to bf16
        self.value_head = nnx.Linear(cfg.hidden_size, 1, use_bias=True, dtype=jnp.float32,
                                     param_dtype=jnp.dtype(cfg.param_dtype),
                                     kernel_init=nnx.initializers.normal(0.02),
                                     bias_init=nnx.initializers.zeros_init(), rngs=rngs)

    def __call__(self, tokens: jax.Array, attention_mask: jax.Array | None = None,
                 use_attention_mask: bool = False) -> jax.Array:
        """Token-aligned ``values [B, T]`` float32 (``values[:, t] = V(tokens[:, :t])``)."""
        hidden = model_hidden(self.backbone, tokens, attention_mask, use_attention_mask)
        v = self.value_head(hidden)[..., 0].astype(jnp.float32)
        return shift_right(v)


def critic_from_policy(policy: CausalLM, seed: int = 0) -> ValueModel:
    """A ValueModel whose backbone starts as a copy of ``policy``'s weights (value head random).

    The copy is made with the same shardings as the policy's parameters.
    """
    critic = ValueModel(policy.cfg, rngs=nnx.Rngs(seed))
    pol = nnx.to_pure_dict(nnx.state(policy, nnx.Param))
    pol.pop("lm_head", None)
    backbone_state = nnx.state(critic.backbone, nnx.Param)
    nnx.replace_by_pure_dict(backbone_state, jax.tree.map(jnp.copy, pol))
    nnx.update(critic.backbone, backbone_state)
    return critic


def values_fn(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array,
              attention_mask: jax.Array | None, use_attention_mask: bool) -> jax.Array:
    return nnx.merge(graphdef, params)(tokens, attention_mask, use_attention_mask)


__all__ = ["ValueModel", "critic_from_policy", "values_fn"]
