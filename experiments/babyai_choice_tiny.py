"""The learning-path check on CPU: a tiny random model learns one BabyAI level by GRPO.

An untrained model never writes a valid action in free text, so here it picks among the
environment's valid actions: they are listed as lettered options after each observation
(``rollout.parser = "choice"``) and the first letter of the one-token reply names the action.
At the start the choice is random (about 15% success on BabyAI-GoToRedBallNoDists in 3 turns;
``go to red ball 1`` wins at once when the ball is in view, else turning finds it); RL has to
learn from the environment's reward which letter to give in which state. Used by
``tests/test_learning_path.py``; a few minutes on 2 CPU cores.

Sampling temperature 0.05 (sampler and learner alike). The random model's logits have a
standard deviation of ~0.16 (embeddings drawn with std 0.02, tied output layer, d = 64), so at
temperature 1 every reply is one of ~49k near-equally likely tokens and RL can only raise the
few it happened to sample: 15 steps at temperature 1 (seeds 1 and 2) left the share of invalid
turns at ~0.7 and the reward flat. At 0.05 the logits' spread is ~3.2, so each state's policy
sits on a handful of tokens whose first letters the updates can move.
"""

from agentrl_jax.training.config import base_config, use_fixed_horizon


def get_config():
    c = base_config()
    c.model.random_init = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                               num_kv_heads=2, head_dim=16)
    c.env.names = "babyai"
    c.env.task_filter = {"babyai": r"BabyAI-GoToRedBallNoDists-v0/seed=[0-9]+"}
    c.rollout.parser = "choice"
    c.agent.prompt_style = "choice"
    c.agent.response_prefix = "Action:"
    c.rollout.max_new_tokens = 1  # one token: its first letter is the choice
    c.rollout.temperature = 0.05  # the learner divides by it too (the ratio sees its log-probs)
    c.rollout.max_batch = 16
    c.rollout.max_concurrency = 16
    c.rollout.max_context = 1024  # a 3-turn episode is ~300-600 tokens
    c.rollout.decode_steps = 1
    use_fixed_horizon(c, 3)
    c.train.total_steps = 12
    c.train.tasks_per_step = 4
    c.train.samples_per_task = 4
    c.train.save_every = 1000
    c.train.eval_every = 0
    c.train.eval_before = False
    c.train.eval_after = False
    c.learner.learning_rate = 1e-3
    c.learner.kl_coef = 0.0
    c.learner.entropy_coef = 0.0
    # packed rows: the update's cost is the 49k-way output layer at every position, so padding
    # costs as much as content
    c.learner.pack_length = 1024
    c.learner.micro_batch_size = 4
    return c
