"""The small evaluation records (``eval_episodes.jsonl``) keep each episode's final context
length and parse failures.

A real evaluation of the smoke config (``experiments/smoke.py``: real BabyAI and TextCraft
servers, the config's actor pool, ``Evaluator`` writing the eval trajectory log) with a scripted
backend whose replies are unparseable on chosen turns; ``learning_report.collect_run`` then
writes the small records, as ``benchmarks/gpu/jobs_lib.sh``'s collect does. The references are
independent of the code under test: the parse failures are counted from the script the backend
played to each session, the context from the last request the backend saw (its prompt ids + the
reply ids: what the engine held at the end); the token count of the full trajectory is the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import types

import pytest
from fake_backends import QuietBackend

from agentrl_common.jsonl_files import read_run_file
from agentrl_jax.models.pretrained import resolve_model_path
from agentrl_jax.models.tokenizer import load_tokenizer
from agentrl_jax.rollout.contract import GenerateResult
from agentrl_jax.training.config.experiment import to_run_config
from agentrl_jax.training.outputs.progress import OFF, ProgressSettings
from agentrl_jax.training.outputs.run_output import RunOutput
from agentrl_jax.training.rl.trainer_eval import Evaluator
from agentrl_jax.training.runtime import services
from experiments.smoke import get_config

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "analysis"))
import episode_diagnosis
import eval_breakdown
import family_shortfall
import learning_report

pytestmark = pytest.mark.timeout(300)

BAD = ' ""'  # after the response prefix "Action:": an empty action -> unparsable
OK = " turn left"  # BabyAI takes it; TextCraft parses it but refuses it (no such command)
#: each session plays one script (by the order of its first request), one reply per turn
SCRIPTS = ((BAD, OK, BAD), (OK, OK, OK), (BAD, BAD, BAD), (OK, BAD, OK))
HORIZON = 3


class ScriptedBackend(QuietBackend):
    """Answers session n's turns with ``SCRIPTS[n % 4]`` (each reply ending with EOS) and
    records, per session, how many unparsable replies it gave and its last request's prompt
    and reply lengths."""

    name = "scripted"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.script: dict[str, tuple[str, ...]] = {}
        self.turn: dict[str, int] = {}
        self.bad: dict[str, int] = {}
        self.last: dict[str, tuple[int, int]] = {}

    async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
        script = self.script.setdefault(session_id, SCRIPTS[len(self.script) % len(SCRIPTS)])
        turn = self.turn.get(session_id, 0)
        self.turn[session_id] = turn + 1
        reply = script[turn]
        self.bad[session_id] = self.bad.get(session_id, 0) + (reply == BAD)
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        self.last[session_id] = (len(input_ids), len(ids))
        return GenerateResult(
            output_ids=ids,
            output_logprobs=[-1.0] * len(ids),
            finish_reason="stop",
            prompt_tokens=len(input_ids),
        )


async def _evaluate(config, workdir: str) -> ScriptedBackend:
    """One evaluation at step 0 of ``config``'s test tasks, logged to ``workdir``."""
    tokenizer = load_tokenizer(resolve_model_path("smollm2"))
    backend = ScriptedBackend(tokenizer)
    output = RunOutput(config, workdir)
    output.write_config()
    with contextlib.ExitStack() as stack:
        urls = services.start_env_services(config, stack)
        async with contextlib.AsyncExitStack() as astack:
            clients = services.make_env_clients(urls, config, astack)
            pool = services.make_actor_pool(config, backend, clients, tokenizer)
            tasks = await services.task_refs(
                clients, "test", config.train.eval_tasks, filters=services.task_filters(config)
            )
            evaluator = Evaluator(config, output, ProgressSettings(OFF, 30.0))
            await evaluator.evaluate(pool, tasks, 0, types.SimpleNamespace(writer=None))
    return backend


def test_a_smoke_evaluation_records_context_tokens_and_parse_failures(tmp_path):
    c = get_config()
    c.train.eval_horizon = HORIZON  # smoke's 2 turns, one more: a failure before the last turn
    config = to_run_config(c)
    run, small = str(tmp_path / "run"), str(tmp_path / "small")
    os.makedirs(run)
    backend = asyncio.run(_evaluate(config, run))

    full = read_run_file(run, "trajectories_eval.jsonl")
    assert len(full) == 2 * config.train.eval_tasks * config.train.eval_samples == 4
    assert learning_report.collect_run(run, small) == 4
    written = read_run_file(small, "eval_episodes.jsonl")
    key = lambda e: (e["env"], e["task_id"], e["sample_index"], e["step"])
    records = {key(e): e for e in written}
    assert len(records) == 4 and all(set(e) == set(learning_report.EPISODE_FIELDS) for e in written)
    refused = {"babyai": 0, "textcraft": 0}
    for t in full:
        e, session = records[key(t)], t["episode_id"]
        assert t["status"] == "max_turns" and t["num_turns"] == HORIZON
        # the final context: the trajectory's token count, and what the backend last held
        assert e["context_tokens"] == len(t["token_ids"]) == sum(backend.last[session])
        assert e["context_tokens"] <= config.rollout.max_context
        # parse failures: the unparsable replies the script gave this session
        assert e["parse_failures"] == t["parse_failures"] == backend.bad[session]
        assert isinstance(e["context_tokens"], int) and isinstance(e["parse_failures"], int)
        refused[t["env"]] += e["invalid_actions"] - e["parse_failures"]
        # the old count from feedback messages misses a failure on the last turn
        last_bad = backend.script[session][-1] == BAD
        assert episode_diagnosis.parse_failures({"messages": t["messages"]}) == (
            backend.bad[session] - last_bad
        )
    assert sorted(backend.bad.values()) == [0, 1, 2, 3]  # every script was played once
    # "turn left": a BabyAI action, a command TextCraft refuses (parsed, not a parse failure)
    ok_turns = {t["env"]: 0 for t in full}
    for t in full:
        ok_turns[t["env"]] += HORIZON - backend.bad[t["episode_id"]]
    assert refused == {"babyai": 0, "textcraft": ok_turns["textcraft"]}
    # the limit the contexts are held to is the run's config.json, not repeated per episode
    with open(os.path.join(small, "config.json")) as f:
        assert json.load(f)["rollout"]["max_context"] == config.rollout.max_context == 1024

    # the readers: the diagnosis and the shortfall numbers from the small records alone
    turns = sum(t["num_turns"] for t in full)
    tokens = [len(t["token_ids"]) for t in full]
    d = episode_diagnosis.summarise(learning_report.eval_episodes(small))
    assert d["parse_failures_per_turn"] == pytest.approx(sum(backend.bad.values()) / turns)
    assert d["tokens_mean"] == pytest.approx(sum(tokens) / 4) and d["tokens_max"] == max(tokens)
    n = family_shortfall.evaluation(learning_report.eval_episodes(small), 0)
    assert n["diagnosed"] and n["tokens_max"] == max(tokens)
    assert n["parse_failures_per_turn"] == pytest.approx(6 / 12)  # 2 + 0 + 3 + 1 of 12 turns
    b = eval_breakdown.breakdown(learning_report.eval_episodes(small), 0)
    assert b["parse_failures_per_episode"] == pytest.approx(6 / 4)


def test_records_without_the_fields_read_as_unknown(tmp_path):
    """A small file written before the fields: the readers give None, never 0; writing it
    again leaves them out rather than writing nulls."""
    old = {
        "env": "babyai",
        "task_id": "t",
        "group_id": 0,
        "sample_index": 0,
        "step": 0,
        "status": "max_turns",
        "reward": 0.0,
        "success": False,
        "num_turns": 4,
        "invalid_actions": 1,
    }
    run = tmp_path / "old"
    run.mkdir()
    (run / "eval_episodes.jsonl").write_text(json.dumps(old) + "\n")
    (e,) = learning_report.eval_episodes(str(run))
    assert e["parse_failures"] is None and e["context_tokens"] is None
    d = episode_diagnosis.summarise([e])
    assert d["parse_failures_per_turn"] is None and d["tokens_mean"] is None
    assert d["valid_action_share"] == pytest.approx(0.75)
    n = family_shortfall.evaluation([e], 0)
    assert not n["diagnosed"] and n["tokens_mean"] is None
    learning_report.collect_run(str(run), str(tmp_path / "again"))
    assert read_run_file(str(tmp_path / "again"), "eval_episodes.jsonl") == [old]


def test_context_tokens_with_a_history_window_is_the_last_chunk():
    """With a history window the engine holds only the last chunk: 3 prompt ids + 2 turns of
    (2 + 1) ids, then a new chunk of 4 prompt ids and one turn of 2 ids: 6 ids held of 15."""
    from agentrl_jax.agent.trajectory import Trajectory, record_context_tokens

    t = Trajectory(env="babyai", task_id="t", group_id=0, sample_index=0)
    t.append([1, 2, 3], generated=False, turn=-1)
    for turn in range(2):
        t.append([4, 5], generated=True, turn=turn)
        t.append([6], generated=False, turn=turn)
    assert t.context_tokens == 9 == record_context_tokens(t.to_json())
    t.start_chunk([7, 7, 7, 7])
    t.append([8, 8], generated=True, turn=2)
    assert len(t.token_ids) == 15 and t.context_tokens == 6 == len(t.context_ids())
    assert record_context_tokens(t.to_json()) == 6
    assert record_context_tokens({"token_ids": [1] * 15}) == 15  # no chunk_starts: one chunk
    assert record_context_tokens({"context_tokens": 6, "token_ids": [1] * 15}) == 6
    assert record_context_tokens({"num_turns": 3}) is None


def test_diagnosis_rates_count_the_task_reward_not_the_shaping():
    """Deep search's evidence bonus is training-only: an episode whose whole reward is bonus
    (0.15 of 0.15) did not score, one with a correct answer after the bonus (1.3 = 1 + 0.3) did;
    reward_rate 1/2 and mean_reward (0 + 1) / 2, the bonus apart as mean_shaping
    (0.15 + 0.3) / 2."""
    base = {"env": "deepsearch", "task_id": "q", "status": "done", "num_turns": 3,
            "invalid_actions": 0, "success": False}
    episodes = [{**base, "reward": 0.15, "shaping": 0.15},
                {**base, "reward": 1.3, "shaping": 0.3, "success": True}]
    d = episode_diagnosis.summarise(episodes)
    assert d["reward_rate"] == pytest.approx(0.5)
    assert d["mean_reward"] == pytest.approx(0.5)
    assert d["mean_shaping"] == pytest.approx(0.225)
    assert d["success_rate"] == pytest.approx(0.5)


def test_the_small_record_keeps_the_option_picks_where_recorded():
    full = {"env": "textcraft", "task_id": "t", "group_id": 0, "sample_index": 1, "step": 45,
            "status": "done", "reward": 1.0, "success": True, "num_turns": 3,
            "invalid_actions": 1, "parse_failures": 1, "token_ids": [1] * 20,
            "chunk_starts": [0], "option_picks": [3, -1, 0], "letter_picks": [0, -1, 2]}
    e = learning_report.small_record(full)
    assert e["option_picks"] == [3, -1, 0] and e["letter_picks"] == [0, -1, 2]
    assert "token_ids" not in e and e["context_tokens"] == 20
    # a free-text episode (empty lists) and a small file from before them: no such keys
    for record in ({**full, "option_picks": [], "letter_picks": []},
                   {k: v for k, v in full.items() if not k.endswith("_picks")}):
        assert not set(learning_report.small_record(record)) & set(learning_report.PICK_FIELDS)
