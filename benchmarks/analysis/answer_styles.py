"""The answer formats (styles) of ``action_format.py`` (``--styles``) and the config that
measures each: the experiment of ``--experiment`` (else ``base_config()`` for ``--env``), sized
for the measurement, with the style's answer format. :data:`STYLES`:

* ``react``: ``agent.prompt_style="react"`` (Thought + Action lines), no response prefix,
  ``rollout.max_new_tokens=128``: the format for larger models;
* ``action``: ``agent.prompt_style="action"``, every turn opened with ``"Action:"``,
  ``rollout.max_new_tokens=24`` (``experiments/babyai.py:grpo_scaling_gpu10min``);
* ``action_line``: ``action`` whose turns also end at their first line break
  (``rollout.stop=("\\n",)``): the default of ``training/config/experiment.py::base_config``;
* ``recipe``: the experiment's own answer format, unchanged (``--experiment``'s ``grpo_gpu``: its
  family's GPU recipe);
* ``choice``: the environment's valid actions listed as lettered options after each observation
  (``agent.list_valid_actions`` 26 where the observation does not list them), a reply of at most
  2 tokens whose first letter names one (``rollout.parser="choice"``);
* ``choice_letters``: ``choice`` with the policy restricted to the 26 letters ``"a".."z"`` and
  EOS (``model.output_tokens``), one token per reply;
* ``choice_space_letters``: the same restricted to the space-prefixed tokens ``" a".." z"`` (the
  natural next token after ``"Action:"``);
* ``choice_options_only``: ``choice_space_letters`` with no action list in the observation text
  (``agent.actions_in_observation=False``: the options block is the only list);
* ``choice_option_limits``: ``choice_options_only`` with each turn restricted to the letters of
  its listed options (``agent.option_limits``): ``use_choice``, so ``choice_gpu``;
* ``choice_shuffled``: ``choice_option_limits`` with the options in a seeded permuted order
  (``agent.shuffle_options``): ``experiments/deepsearch.py:choice_shuffled_gpu`` and
  ``experiments/textcraft.py:choice_shuffled_gpu``.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from agentrl_jax.agent.parsing import CHOICE_LABELS
from agentrl_jax.training.config.experiment import base_config, to_run_config
from agentrl_jax.training.config.sections import RunConfig


@dataclasses.dataclass(frozen=True)
class AnswerStyle:
    """One answer format. ``prompt_style`` None keeps the experiment's answer format whole;
    ``stop`` None keeps the experiment's stop strings; ``list_actions``: ask the server to list
    the valid actions (``agent.list_valid_actions``, as many as there are option letters)."""

    prompt_style: str | None
    response_prefix: str = "Action:"
    max_new_tokens: int = 24
    stop: tuple[str, ...] | None = ()
    parser: str = "react"
    output_tokens: str | tuple[str, ...] = ""
    list_actions: bool = False
    actions_in_observation: bool = True  # False: the options block is the only action list
    option_limits: bool = False  # True: a turn samples only its listed options' letters
    shuffle_options: bool = False  # True: the options in a seeded permuted order


#: the option letters as space-prefixed tokens: " a", " b", ... (SmolLM2: one token each)
SPACE_LETTERS: tuple[str, ...] = tuple(" " + label for label in CHOICE_LABELS)

STYLES: dict[str, AnswerStyle] = {
    "react": AnswerStyle("react", "", 128, ()),
    "action": AnswerStyle("action", "Action:", 24, ()),
    "action_line": AnswerStyle("action", "Action:", 24, ("\n",)),
    "recipe": AnswerStyle(None),
    "choice": AnswerStyle("choice", "Action:", 2, None, "choice", list_actions=True),
    "choice_letters": AnswerStyle("choice", "Action:", 1, None, "choice",
                                  output_tokens=CHOICE_LABELS, list_actions=True),
    "choice_space_letters": AnswerStyle("choice", "Action:", 1, None, "choice",
                                        output_tokens=SPACE_LETTERS, list_actions=True),
    "choice_options_only": AnswerStyle("choice", "Action:", 1, None, "choice",
                                       output_tokens=SPACE_LETTERS, list_actions=True,
                                       actions_in_observation=False),
    "choice_option_limits": AnswerStyle("choice", "Action:", 1, None, "choice",
                                        output_tokens=SPACE_LETTERS, list_actions=True,
                                        actions_in_observation=False, option_limits=True),
    "choice_shuffled": AnswerStyle("choice", "Action:", 1, None, "choice",
                                   output_tokens=SPACE_LETTERS, list_actions=True,
                                   actions_in_observation=False, option_limits=True,
                                   shuffle_options=True),
}


def base_of(args: argparse.Namespace) -> Any:
    """The experiment's config (``--experiment``), else ``base_config()`` for ``--env``, sized
    for this measurement: ``--episodes`` in flight (at most ``--concurrency``), one server of
    each family (``--server_args`` replacing the experiment's), ``--history_turns`` replacing
    its history window when given."""
    if args.experiment:
        from agentrl_jax.training.config.command_line import load_experiment

        c = load_experiment(args.experiment)
    else:
        c = base_config()
        c.env.names = args.env
        c.rollout.max_context = args.max_context or 2048
    if args.max_context:
        c.rollout.max_context = args.max_context
        if c.learner.pack_length:  # a packed row holds a whole trajectory (the config's check)
            c.learner.pack_length = max(c.learner.pack_length, args.max_context)
    if args.history_turns is not None:
        c.agent.history_turns = args.history_turns
    c.model.name = args.model
    c.env.replicas = 1
    if args.server_args is not None:
        c.env.server_args = {name: args.server_args for name in str(c.env.names).split(",")}
    episodes = args.episodes * args.samples
    c.rollout.max_concurrency = min(episodes, args.concurrency or episodes)
    c.rollout.max_batch = episodes
    c.rollout.temperature = args.temperature
    return c


def style_config(args: argparse.Namespace, style: str) -> RunConfig:
    """The ``RunConfig`` that measures answer style ``style`` (:data:`STYLES`) with ``args``:
    :func:`base_of` with the style's answer format (a fresh config each: a copied ConfigDict
    would no longer take a tuple for ``model.output_tokens``)."""
    s = STYLES[style]
    c = base_of(args)
    if s.prompt_style is None:  # recipe: the experiment's answer format
        if args.max_new_tokens:
            c.rollout.max_new_tokens = args.max_new_tokens
        return to_run_config(c)
    c.rollout.max_new_tokens = args.max_new_tokens or s.max_new_tokens
    c.rollout.decode_steps = min(int(c.rollout.decode_steps), int(c.rollout.max_new_tokens))
    c.agent.prompt_style = s.prompt_style
    c.agent.response_prefix = s.response_prefix
    c.rollout.parser = s.parser
    if s.stop is not None:
        c.rollout.stop = s.stop
    c.model.output_tokens = s.output_tokens
    c.agent.list_valid_actions = len(CHOICE_LABELS) if s.list_actions else 0
    c.agent.actions_in_observation = s.actions_in_observation
    c.agent.option_limits = s.option_limits
    c.agent.shuffle_options = s.shuffle_options
    return to_run_config(c)


def whole_vocabulary_config(args: argparse.Namespace) -> RunConfig:
    """The config the model is loaded with: the experiment's over the whole vocabulary (no
    ``model.output_tokens``, hence no ``agent.option_limits``, which needs them); each style
    restricts the loaded model to its own output tokens."""
    c = base_of(args)
    c.model.output_tokens = ""
    c.agent.option_limits = False
    return to_run_config(c)
