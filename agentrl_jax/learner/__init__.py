"""The learner: policy (+ critic, + frozen reference) updates over a device mesh.

See ``docs/LEARNER.md``. Main entry points::

    from agentrl_jax.learner import Learner, LearnerConfig
    learner = Learner(model, LearnerConfig(learning_rate=1e-6, ...), checkpoint_dir="ckpt")
    metrics = learner.update(batch)          # a RolloutBatch (batch.py) or a dict of its arrays
    learner.save({"data_cursor": 17}); learner.restore_latest()
"""

from agentrl_jax.learner.batch import RolloutBatch, UpdateOptions
from agentrl_jax.learner.checkpoint import Checkpointer
from agentrl_jax.learner.config import LearnerConfig, bucket_length
from agentrl_jax.learner.critic import ValueModel, critic_from_policy
from agentrl_jax.learner.learner import Learner
from agentrl_jax.learner.logprobs import logprobs_from_hidden, token_logprobs
from agentrl_jax.learner.metrics import (MetricsWriter, Throughput, peak_flops_per_device,
                                         train_flops_per_token)
from agentrl_jax.learner.optim import make_optimizer, make_schedule
from agentrl_jax.learner.train_step import make_train_step

__all__ = ["RolloutBatch", "UpdateOptions", "Checkpointer", "LearnerConfig", "bucket_length", "ValueModel", "critic_from_policy",
           "Learner", "logprobs_from_hidden", "token_logprobs", "MetricsWriter", "Throughput",
           "peak_flops_per_device", "train_flops_per_token", "make_optimizer", "make_schedule",
           "make_train_step"]
