"""Deep search's evidence reward (``DeepSearchEnvironment(evidence_reward=e)``): a scripted
episode over a hand-made corpus gets exactly the hand-computed per-step rewards while the task
score stays the exact match; with ``e = 0`` the rewards are today's; the option is checked on
every path that sets it; the bonus reaches the trainer's return (``Trajectory.reward``) but the
evaluation's Avg@k / Pass@k score the task reward (``eval_metrics.task_reward``)."""

from __future__ import annotations

import argparse
import asyncio
import math

import pytest

from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.episode import Episode
from agentrl_jax.agent.parsing import get_parser
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.training.evaluation import eval_metrics
from agentrl_jax.training.evaluation.held_out import score_trajectories
from agentrl_jax.training.runtime.distributed import global_records
from environments.core.base import SHAPING_KEY
from environments.deepsearch import family
from environments.deepsearch.corpus import Passage
from environments.deepsearch.env import DeepSearchEnvironment, evidence_bonus
from environments.deepsearch.qa import QAItem
from tests.fake_backends import ScriptedBackend

ZORBIA = Passage("z", "Zorbia", "Zorbia is a mountain realm of the far north.")
QUILLTON = Passage("q", "Quillton", "Quillton is a city. It was founded in 1311.")
VELL = Passage("v", "Vell", "The Vell is a river of the far north.")
AMBREL = Passage("a", "Ambrel", "Ambrel was a weaver who travelled widely.")

HOP = QAItem("hop-x", "Consider the first city named in the article on the mountain realm. "
             "It was founded in which year?", ("1311",), "train", "Quillton", "hop",
             ("Zorbia", "Quillton"))
FACT = QAItem("fact-x", "Which realm of the far north is mountainous?", ("Zorbia",), "train",
              "Zorbia", "fact", ("Zorbia",))
LOOKUP = QAItem("wiki-x", "What is a mountain realm of the far north?", ("Zorbia",), "train")

#: what each scripted query returns (top k = 2), by hand
RESULTS = {"weaver": [AMBREL, VELL], "realm": [ZORBIA, VELL], "realm again": [ZORBIA],
           "city": [QUILLTON, ZORBIA], "both": [QUILLTON, ZORBIA], "nothing": []}

#: the scripted episode: a search that misses, one that hits article 1, one that hits it again,
#: one that hits article 2 (and article 1 again), a wrong answer
SCRIPT = ["<search>weaver</search>", "<search>realm</search>", "<search>realm again</search>",
          "<search>city</search>", "<answer>1200</answer>"]


class _Retriever:
    def search(self, query: str, k: int = 3) -> list[tuple[Passage, float]]:
        return [(p, 1.0) for p in RESULTS[query][:k]]


class _Backend:
    def __init__(self, item: QAItem):
        self.item, self.retriever = item, _Retriever()

    def question(self, task_id: str) -> QAItem:
        return self.item


def _env(item: QAItem, evidence_reward: float = 0.0, max_steps: int = 30,
         articles: str = "path") -> DeepSearchEnvironment:
    return DeepSearchEnvironment(k=2, max_steps=max_steps, backend_getter=lambda: _Backend(item),
                                 evidence_reward=evidence_reward, evidence_articles=articles)


def _play(env: DeepSearchEnvironment, actions: list[str]) -> list:
    env.reset("task")
    return [env.step(a) for a in actions]


def test_scripted_episode_gets_the_hand_computed_rewards_and_task_score_0():
    steps = _play(_env(HOP, 0.3), SCRIPT)
    # two path articles: 0.3 / 2 = 0.15 for each, on the step that first returns it
    assert [s.reward for s in steps] == [0.0, 0.15, 0.0, 0.15, 0.0]
    assert [s.info.get(SHAPING_KEY) for s in steps] == [None, 0.15, None, 0.15, None]
    assert [s.info["evidence"] for s in steps] == [
        [], ["Zorbia"], ["Zorbia"], ["Zorbia", "Quillton"], ["Zorbia", "Quillton"]]
    assert sum(s.reward for s in steps) == pytest.approx(0.3)
    last = steps[-1]
    assert last.done and last.info["score"] == 0.0 and last.info["em"] == 0.0
    assert last.info["success"] is False
    # the same search path answered correctly: the task reward 1 on top of the bonus
    right = _play(_env(HOP, 0.3), SCRIPT[:-1] + ["<answer>1311</answer>"])
    assert [s.reward for s in right] == [0.0, 0.15, 0.0, 0.15, 1.0]
    assert right[-1].info["score"] == 1.0 and right[-1].info["success"] is True


def test_without_the_option_the_rewards_are_todays():
    for item in (HOP, FACT, LOOKUP):
        for answer, em in (("<answer>1200</answer>", 0.0), ("<answer>1311</answer>", 1.0)):
            steps = _play(_env(item), SCRIPT[:-1] + [answer])
            golden_em = em if item is HOP else 0.0
            # today's rule: searches give 0, the answer its exact match
            assert [s.reward for s in steps] == [0.0, 0.0, 0.0, 0.0, golden_em]
            assert all(SHAPING_KEY not in s.info for s in steps)
            assert steps[-1].info["score"] == golden_em


def test_one_article_paths_both_at_once_no_path_and_truncation():
    # a paraphrased fact: its one article is worth the whole 0.3, once
    steps = _play(_env(FACT, 0.3), ["<search>realm</search>", "<search>realm again</search>",
                                    "<answer>Zorbia</answer>"])
    assert [s.reward for s in steps] == [0.3, 0.0, 1.0]
    # both articles of a two-hop path in one search: 2 x 0.15 in that step
    both = _play(_env(HOP, 0.3), ["<search>both</search>", "<search>city</search>"])
    assert [s.reward for s in both] == [pytest.approx(0.3), 0.0]
    assert both[0].info["evidence"] == ["Quillton", "Zorbia"]
    # a question without a path (the lookup set, user files) gets no bonus
    assert [s.reward for s in _play(_env(LOOKUP, 0.3), ["<search>realm</search>"])] == [0.0]
    # the step limit reached on a search that finds evidence: the bonus, task score 0
    cut = _play(_env(HOP, 0.3, max_steps=2), ["<search>nothing</search>", "<search>realm</search>"])
    assert cut[-1].truncated and cut[-1].reward == 0.15 and cut[-1].info["score"] == 0.0
    # an invalid action is an ordinary 0 step that still reports the evidence so far
    env = _env(HOP, 0.3)
    env.reset("task")
    env.step("<search>realm</search>")
    bad = env.step("hello")
    assert bad.reward == 0.0 and bad.info["invalid_action"] and bad.info["evidence"] == ["Zorbia"]
    assert evidence_bonus((), [], ["Zorbia"], 0.3) == (0.0, [])


def test_answer_articles_reward_the_last_hop_alone():
    # the scripted two-hop episode: the first hop (Zorbia) earns nothing, the second (Quillton,
    # the article that names the answer) the whole 0.3; the evidence list still has both
    steps = _play(_env(HOP, 0.3, articles="answer"), SCRIPT)
    assert [s.reward for s in steps] == [0.0, 0.0, 0.0, 0.3, 0.0]
    assert [s.info.get(SHAPING_KEY) for s in steps] == [None, None, None, 0.3, None]
    assert steps[-1].info["evidence"] == ["Zorbia", "Quillton"]
    assert steps[-1].info["score"] == 0.0
    # both articles in one search: 0.3 once; the answer's article again later: nothing
    both = _play(_env(HOP, 0.3, articles="answer"), ["<search>both</search>",
                                                     "<search>city</search>"])
    assert [s.reward for s in both] == [0.3, 0.0]
    # a one-article path is its own answer article: the same as "path"
    for articles in ("path", "answer"):
        fact = _play(_env(FACT, 0.3, articles=articles), ["<search>realm</search>",
                                                          "<answer>Zorbia</answer>"])
        assert [s.reward for s in fact] == [0.3, 1.0]
    assert evidence_bonus(("Zorbia", "Quillton"), [], ["Zorbia"], 0.3, "answer") == (
        0.0, ["Zorbia"])
    assert evidence_bonus((), [], ["Zorbia"], 0.3, "answer") == (0.0, [])


@pytest.mark.parametrize("bad", ["last", "", None, 1, "PATH"])
def test_evidence_articles_are_checked(bad, capsys):
    with pytest.raises(ValueError, match="evidence_articles"):
        _env(HOP, 0.3, articles=bad)
    with pytest.raises(ValueError, match="evidence_articles"):
        family.configure(evidence_articles=bad)
    if isinstance(bad, str):
        with pytest.raises(SystemExit):
            family.parse_family_args(["--evidence-articles", bad])
        assert "--evidence-articles" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [1.5, -0.1, True, "0.3", math.nan, None])
def test_the_option_is_a_number_in_0_1(bad):
    with pytest.raises(ValueError, match="evidence_reward"):
        _env(HOP, bad)
    with pytest.raises(ValueError, match="evidence_reward"):
        family.configure(evidence_reward=bad)


def test_the_server_flag_reaches_the_environment_and_is_checked(monkeypatch, capsys):
    monkeypatch.setattr(family, "CONFIG", family.DeepSearchConfig())
    args, rest = family.parse_family_args(["--evidence-reward", "0.3", "--port", "1"])
    assert args.evidence_reward == 0.3 and rest == ["--port", "1"]
    assert family.parse_family_args([])[0].evidence_reward == 0.0  # the default: none
    family.configure(evidence_reward=args.evidence_reward)
    assert family.make_env().evidence_reward == 0.3
    for text in ("2", "-1", "x", "nan"):
        with pytest.raises(SystemExit):
            family.parse_family_args(["--evidence-reward", text])
        assert "--evidence-reward" in capsys.readouterr().err
    assert family.parse_family_args([])[0].evidence_articles == "path"
    args, _ = family.parse_family_args(["--evidence-articles", "answer"])
    family.configure(evidence_articles=args.evidence_articles)
    assert family.make_env().evidence_articles == "answer"
    assert isinstance(family.evidence_reward_arg("1"), float)
    with pytest.raises(argparse.ArgumentTypeError):
        family.evidence_reward_arg("1.01")


def test_experiment_config_adds_only_the_flag():
    from experiments.deepsearch import get_config

    evidence, shuffled = get_config("choice_evidence_gpu"), get_config("choice_shuffled_gpu")
    flags = evidence.env.server_args["deepsearch"].split()
    assert flags == shuffled.env.server_args["deepsearch"].split() + ["--evidence-reward", "0.3"]
    answer = get_config("choice_answer_evidence_gpu")
    assert answer.env.server_args["deepsearch"].split() == flags + ["--evidence-articles", "answer"]
    evidence.env.server_args = answer.env.server_args = shuffled.env.server_args
    assert evidence.to_dict() == shuffled.to_dict() == answer.to_dict()


class _LocalClient:
    """The env client's three calls on an in-process ``DeepSearchEnvironment``."""

    def __init__(self, env: DeepSearchEnvironment):
        self.env = env

    async def create(self, task_id: str, seed: int | None = None):
        r = self.env.reset(task_id)
        return "e0", r.observation, r.info

    async def step(self, env_id: str, action: str):
        return self.env.step(action)

    async def close(self, env_id: str) -> None:
        self.env.close()


def _episode(tokenizer, item: QAItem, replies: list[str], sample: int) -> Trajectory:
    episode = Episode(env_client=_LocalClient(_env(item, 0.3)),
                      backend=ScriptedBackend(tokenizer, replies),
                      formatter=ChatFormatter(tokenizer), parser=get_parser("raw"),
                      env_name="deepsearch", task_id=item.id, group_id=0, sample_index=sample,
                      horizon=10, sampling=SamplingParams(max_new_tokens=32), max_context=4096,
                      policy_version=0, prompt_style="action", response_prefix="",
                      history_turns=0, history_stride=1, option_limits=False, shuffle_options=False)
    return asyncio.run(episode.run())


def test_the_bonus_reaches_the_return_but_not_the_evaluation_score(tokenizer):
    wrong = _episode(tokenizer, HOP, SCRIPT, 0)
    right = _episode(tokenizer, HOP, SCRIPT[:-1] + ["<answer>1311</answer>"], 1)
    lost = _episode(tokenizer, HOP, ["<search>weaver</search>", "<answer>1200</answer>"], 2)
    # the trainer's return (GRPO's R_e, training/rl/batching.py) has the bonus ...
    assert [t.turn_rewards for t in (wrong, right)] == [[0.0, 0.15, 0.0, 0.15, 0.0],
                                                       [0.0, 0.15, 0.0, 0.15, 1.0]]
    assert (wrong.reward, wrong.shaping) == pytest.approx((0.3, 0.3))
    assert (right.reward, right.shaping) == pytest.approx((1.3, 0.3))
    assert (lost.reward, lost.shaping) == (0.0, 0.0)
    # ... the evaluation scores the task reward: 0, 1, 0 (not the returns 0.3, 1.3 -> 1, 0)
    scores = [o.score for o in eval_metrics.outcomes([wrong, right, lost])]
    assert scores == [0.0, 1.0, 0.0]
    result = score_trajectories([wrong, right, lost], k=3)
    assert result.avg_at_k == pytest.approx(1 / 3)  # the clipped returns would give 1.3 / 3
    assert result.pass_at_k == 1.0 and result.success_rate == pytest.approx(1 / 3)
    alone = score_trajectories([wrong, lost], k=2)
    assert alone.avg_at_k == 0.0 and alone.pass_at_k == 0.0  # the bonus alone never passes
    # the same from the records a run writes (trajectory files) and across processes
    records = [t.to_json(step=0) for t in (wrong, right, lost)]
    assert [o.score for o in eval_metrics.outcomes(records)] == [0.0, 1.0, 0.0]
    assert [t.shaping for t in global_records([wrong, right, lost])] == pytest.approx(
        [0.3, 0.3, 0.0])


def test_task_reward_of_old_records_and_float_remainders():
    assert eval_metrics.task_reward(0.7) == 0.7  # no shaping: the reward as it was
    assert eval_metrics.task_reward(None, None) is None
    assert eval_metrics.outcome({"env": "e", "task_id": "t", "reward": 0.5}).score == 0.5
    # a task reward between two bonuses: the return adds them in another order than the
    # shaping, and the plain difference is off in the last bits (0.9999999999999998)
    reward = 0.0
    for r in (0.15, 1.0, 0.15):
        reward += r
    shaping = 0.15 + 0.15
    assert reward - shaping != 1.0 and eval_metrics.task_reward(reward, shaping) == 1.0
    assert eval_metrics.task_reward(0.30000000000000004, 0.3) == 0.0
    assert not eval_metrics.passes(eval_metrics.episode_score(
        eval_metrics.task_reward(0.30000000000000004, 0.3)))
