"""Agent pieces: action parsing, horizon schedules, task sampling, Avg@k/Pass@k, token-exact chat."""

from __future__ import annotations

import pytest

from agentrl_jax.agent.actor_pool import TaskRef
from agentrl_jax.agent.parsing import parse_react
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.training.evaluation.held_out import score_trajectories
from agentrl_jax.training.rl.schedule import HorizonSchedule
from agentrl_jax.training.rl.task_sampler import TaskSampler


@pytest.mark.parametrize("text, action", [
    ("Thought: the ball is ahead.\nAction: move forward", "move forward"),
    ("Thought: x\nAction: `go to red ball 1`.\nmore text", "go to red ball 1"),
    ("action: craft 4 oak planks using 1 oak log", "craft 4 oak planks using 1 oak log"),
    ("Action: turn left\nThought: no wait\nAction: turn right", "turn right"),
    ("Thought: search\nAction: <search>capital of France</search>",
     "<search>capital of France</search>"),
])
def test_react_parser_extracts_the_last_action(text, action):
    assert parse_react(text).action == action


@pytest.mark.parametrize("text", ["I will move forward", "Thought: hmm\nAction:   ", "Action: ''",
                                  "Action: " + "x" * 600])
def test_react_parser_rejects_replies_without_a_usable_action(text):
    parsed = parse_react(text)
    assert parsed.action is None and parsed.error


def test_scaling_inter_schedule_matches_the_published_babyai_phases():
    s = HorizonSchedule.from_config({"type": "scaling_inter", "phases": [6, 13, 20],
                                     "steps_per_phase": 100})
    expected = [6] * 100 + [13] * 100 + [20] * 150
    assert [s.horizon(step) for step in range(350)] == expected
    assert s.max_horizon == 20 and s.phase(199) == 1 and s.phase(200) == 2
    assert HorizonSchedule.from_config({"type": "fixed", "turns": 30}).horizon(12345) == 30
    with pytest.raises(ValueError, match="non-decreasing"):
        HorizonSchedule(phases=(10, 5))
    with pytest.raises(ValueError, match="unknown"):
        HorizonSchedule.from_config({"type": "cosine"})


def test_task_sampler_alternates_envs_and_resumes_exactly():
    tasks = [TaskRef("babyai", f"b{i}") for i in range(50)] + [TaskRef("textcraft", f"t{i}")
                                                               for i in range(7)]
    sampler = TaskSampler(tasks, seed=3)
    first = sampler.next(20)
    assert [t.env for t in first] == ["babyai", "textcraft"] * 10
    # every textcraft task once per epoch of 7 draws
    first_textcraft = [t.task_id for t in first if t.env == "textcraft"][:7]
    assert sorted(first_textcraft) == sorted(f"t{i}" for i in range(7))
    rest = sampler.next(15)
    resumed = TaskSampler(tasks, seed=3, cursor=20)
    assert resumed.next(15) == rest


def _traj(task: str, reward: float, status: str = "done", success: bool | None = None):
    t = Trajectory(env="e", task_id=task, group_id=0, sample_index=0, reward=reward,
                   status=status)
    t.success = reward > 0 if success is None else success
    return t


def test_avg_and_pass_at_k_by_hand():
    trajs = [_traj("a", 1.0), _traj("a", 0.0), _traj("b", 0.0), _traj("b", 0.0),
             _traj("c", 0.5), _traj("c", 0.9), _traj("c", 0.0, status="env_error")]
    r = score_trajectories(trajs, k=2)
    # mean task scores: a (1 + 0)/2, b 0, c (0.5 + 0.9)/2 (the env_error episode is excluded);
    # passes (score > 0): a and c; completed (the flag, here reward > 0): a 1/2, b 0, c 2/2
    assert r.avg_at_k == pytest.approx((0.5 + 0.0 + 0.7) / 3)
    assert r.pass_at_k == pytest.approx(2 / 3)
    assert r.success_rate == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert r.dropped == 1 and r.num_tasks == 3
    assert r.mean_reward == pytest.approx((1.0 + 0.5 + 0.9) / 6)


def test_observation_ids_fast_path_matches_rendering_and_falls_back_for_trimming_templates():
    """The cached before/after split of the template equals a full render; a template that
    transforms the content (here: trim) is detected and rendered every time."""
    import copy

    from agentrl_jax.agent.chat import ChatFormatter
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model_path("smollm2"))
    observations = ["You see a red ball.", "  padded  \n", "{braces} and 'quotes'\n\nline"]
    for template_kind in ("native", "trim"):
        tok = copy.deepcopy(tokenizer)
        if template_kind == "trim":
            tok.chat_template = tok.chat_template.replace("message['content']",
                                                          "message['content'] | trim")
        formatter = ChatFormatter(tok)
        for obs in observations:
            full = tok.apply_chat_template(
                [{"role": "system", "content": "S"}, {"role": "user", "content": "u"},
                 {"role": "assistant", "content": "a"}, {"role": "user", "content": obs}],
                tokenize=False, add_generation_prompt=True)
            head = tok.apply_chat_template(
                [{"role": "system", "content": "S"}, {"role": "user", "content": "u"},
                 {"role": "assistant", "content": "a"}], tokenize=False)
            # generated "a" without EOS: the suffix starts with the template's end-of-turn
            expected = tok.encode(full[len(head) - len("<|im_end|>\n"):],
                                  add_special_tokens=False)
            assert formatter.observation_ids("S", obs, tok.encode("a")) == expected
        assert (formatter._suffix_parts["S"] is None) == (template_kind == "trim")
