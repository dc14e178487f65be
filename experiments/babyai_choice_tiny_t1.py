"""Work in progress (issue 47 item 6): ``experiments/babyai_choice_tiny.py`` at sampling
temperature 1 (sampler and learner), with the 26 letters given a logit head start of 9 nats by
the random model's initialisation (``model.prior_letters`` / ``model.prior_logit``;
``agentrl_jax/models/token_prior.py``). Sampling stays honest: every token of the 49k
vocabulary can still be sampled; the untrained policy puts ~80-90% of its mass on the letters,
at random among them (as a pretrained model picks letters), and RL has to learn which letter
names a useful option in which state.

Measured once on the shared 2-core box (seed 0, 20 steps, 4 tasks x 4, learning rate 5e-3):
mean reward of steps 1-5 0.05 -> steps 16-20 0.12, invalid turns 0.83 -> 0.67: a rise within
one seed's per-step noise (0.00 to 0.41 between neighbouring steps). With learning rate 1e-2 and
8 tasks x 4 (seed 0, 15 steps): 0.11 -> 0.17 (steps 1-5 -> 11-15). Neither is yet the learning
test (3 seeds and a margin above their noise are still to measure); ``tests/test_learning_path.py`` still runs the temperature-0.05 config.
"""

from experiments.babyai_choice_tiny import get_config as choice_tiny_config


def get_config():
    c = choice_tiny_config()
    c.model.prior_letters = "abcdefghijklmnopqrstuvwxyz"
    c.model.prior_logit = 9.0
    c.rollout.temperature = 1.0
    c.learner.learning_rate = 5e-3
    c.train.total_steps = 20
    return c
