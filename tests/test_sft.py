"""Behaviour cloning: expert episodes recorded through the RL path have the RL token layout, the
SFT loss is the NLL of the assistant tokens only (against HF transformers on the same weights,
with a mask derived independently from the rendered text), and an SFT run's exported policy is
what an RL run loads; the same command resumes from the SFT checkpoint.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from agentrl_jax.training.config.experiment import to_run_config
from agentrl_jax.training.outputs.code_version import source_digest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _config(data_dir: str, steps: int):
    """The smoke SFT config on TextCraft (short expert episodes), packed rows of 1024 tokens
    (the learners run on one device: ``one_device``)."""
    from experiments.smoke import sft as get_config

    c = get_config()
    c.env.names = "textcraft"
    c.sft.data = data_dir
    c.sft.steps = steps
    c.sft.eval_after = False
    c.sft.batch_size = 2
    c.rollout.max_context = 1024
    c.learner.pack_length = 1024
    c.learner.micro_batch_size = 1
    c.learner.logprob_batch_size = 1
    return c


@pytest.fixture
def one_device(monkeypatch):
    """Learners built from a config get a one-device mesh (the suite has 8 virtual devices,
    and a packed micro-batch per device would be 8 rows of 49k-vocabulary logits)."""
    import jax

    from agentrl_jax.learner import learner as learner_module
    from agentrl_jax.sharding.mesh import make_mesh

    monkeypatch.setattr(learner_module, "mesh_from_config",
                        lambda _cfg: make_mesh(devices=jax.devices()[:1]))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Four TextCraft expert episodes recorded with the smoke SFT config (SmolLM2 tokenizer)."""
    from agentrl_jax.training.jobs.record_experts import record_experts_sync

    out = str(tmp_path_factory.mktemp("experts"))
    c = _config(out, 2)
    # offset 4: since the dev split was carved out of the training goals, the first four include
    # "painting", whose first prompt alone (1,237 tokens) exceeds this config's 1,024-token context
    meta = record_experts_sync(to_run_config(c), "textcraft", 4, out, horizon=12, offset=4,
                               say=lambda *a, **k: None)
    with open(os.path.join(out, "textcraft.jsonl")) as f:
        trajectories = [json.loads(line) for line in f]
    return out, meta, trajectories


def _assistant_mask_from_text(tokenizer, traj, prefix: str) -> list[int]:
    """Independent of the recorder: render the conversation with the chat template, find each
    assistant message's text after the response prefix by character offsets, and mark the
    tokens whose characters lie inside it."""
    text = tokenizer.apply_chat_template(traj["messages"], tokenize=False,
                                         add_generation_prompt=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans, pos = [], 0
    for m in traj["messages"]:
        at = text.index(m["content"], pos)
        pos = at + len(m["content"])
        if m["role"] == "assistant":
            assert m["content"].startswith(prefix)
            spans.append((at + len(prefix), pos))
    mask = [int(any(a <= s and e <= b for a, b in spans) and e > s)
            for s, e in enc["offset_mapping"]]
    return enc["input_ids"], mask


def test_recorded_episodes_have_the_rl_layout(recorded):
    """Token ids = the chat template's rendering of the messages; the loss mask covers exactly
    each action's tokens after the "Action:" prefix, ending with the turn's stop (newline)."""
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    _, meta, trajectories = recorded
    assert meta["response_prefix"] == "Action:" and meta["stop"] == ["\n"]
    assert meta["successful"] == 4
    tok = load_tokenizer(resolve_model_path("smollm2"))
    for t in trajectories:
        assert t["status"] not in ("env_error", "engine_error"), t["error"]
        ids, mask = _assistant_mask_from_text(tok, t, "Action:")
        n = len(t["token_ids"])
        assert t["token_ids"] == ids[:n]
        assert t["loss_mask"] == mask[:n]
        spans = tok.decode([i for i, m in zip(t["token_ids"], t["loss_mask"]) if m])
        actions = [m["content"][len("Action:"):] for m in t["messages"] if m["role"] == "assistant"]
        assert spans == "".join(actions) and all(a.endswith("\n") for a in actions)


@pytest.fixture(scope="module")
def recorded_windowed(tmp_path_factory):
    """Two TextCraft expert episodes recorded with a history window of one turn
    (``agent.history_turns = 1``), as an SFT run of a windowed config records them."""
    from agentrl_jax.training.jobs.record_experts import record_experts_sync

    out = str(tmp_path_factory.mktemp("experts_windowed"))
    c = _config(out, 2)
    c.agent.history_turns = 1
    config = to_run_config(c)
    meta = record_experts_sync(config, "textcraft", 2, out, horizon=12, offset=4,
                               say=lambda *a, **k: None)
    with open(os.path.join(out, "textcraft.jsonl")) as f:
        trajectories = [json.loads(line) for line in f]
    return out, config, meta, trajectories


def test_recording_follows_the_configs_history_window(recorded_windowed):
    """Each prompt of a recorded episode is the one an RL run of the same config builds: from
    turn 2 on the system prompt, the task marked with the omitted turns and only the last
    (reply, observation) pair, rendered by the chat template (a hand-built message list),
    then "Action:"; each such prompt starts a chunk, whose only trained ids are its reply."""
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    _, _, meta, trajectories = recorded_windowed
    assert (meta["history_turns"], meta["parser"]) == (1, "react")
    tok = load_tokenizer(resolve_model_path("smollm2"))

    def rendered(messages):
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return (tok.encode(text, add_special_tokens=False)
                + tok.encode("Action:", add_special_tokens=False))

    checked = 0
    for t in trajectories:
        assert t["status"] not in ("env_error", "engine_error"), t["error"]
        m = t["messages"]  # system, task, then (reply, observation) pairs: the whole record
        turns = sum(1 for x in m if x["role"] == "assistant")
        starts = t["chunk_starts"] + [len(t["token_ids"])]
        assert len(t["chunk_starts"]) == max(turns - 1, 1)
        for turn in range(2, turns):
            a, b = starts[turn - 1], starts[turn]
            omitted = "turn" if turn == 2 else "turns"
            expected = rendered([
                m[0], {"role": "user",
                       "content": f"{m[1]['content']}\n\n({turn - 1} earlier {omitted} omitted)"},
                m[2 * turn], m[2 * turn + 1]])
            assert t["token_ids"][a:a + len(expected)] == expected, turn
            assert t["loss_mask"][a:b] == [0] * len(expected) + [1] * (b - a - len(expected))
            reply = m[2 * turn + 2]["content"][len("Action:"):]
            assert tok.decode(t["token_ids"][a + len(expected):b]) == reply
            checked += 1
    assert checked > 0  # some episode has a windowed turn


def test_sft_trains_a_windowed_recording_chunk_by_chunk(recorded_windowed):
    """The SFT loader makes one row of each chunk (what the generated ids were sampled in)
    and refuses the recording for a config without the window."""
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer
    from agentrl_jax.training.jobs.record_experts import answer_format, tokenizer_fingerprint
    from agentrl_jax.training.jobs.sft import load_expert_data

    out, config, _, trajectories = recorded_windowed
    files = [os.path.join(out, "textcraft.jsonl")]
    fingerprint = tokenizer_fingerprint(load_tokenizer(resolve_model_path("smollm2")))
    items, counts = load_expert_data(files, fingerprint, answer_format(config),
                                     only_success=False)
    rows = []
    for t in trajectories:
        starts = t["chunk_starts"] + [len(t["token_ids"])]
        rows += [t["token_ids"][a:b] for a, b in zip(starts, starts[1:])]
    assert counts["kept"] == len(trajectories) and len(rows) > len(trajectories)
    assert [list(it["token_ids"]) for it in items] == rows
    unwindowed = config.replace(agent=config.agent.replace(history_turns=0))
    with pytest.raises(ValueError, match="history_turns 1 != 0"):
        load_expert_data(files, fingerprint, answer_format(unwindowed))


def test_a_parser_that_cannot_read_expert_replies_is_refused():
    """The experts answer with the action's text: ``react`` reads it back, ``choice`` (an
    option letter) and ``raw`` after an "Action:" prefix do not."""
    from agentrl_jax.training.jobs.record_experts import check_expert_parser

    check_expert_parser("react", "Action:", "\n")
    check_expert_parser("react", "", None)
    check_expert_parser("raw", " ", None)
    for name, prefix in (("choice", "Action:"), ("raw", "Action:"), ("raw", "")):
        with pytest.raises(ValueError, match=f"rollout.parser='{name}'"):
            check_expert_parser(name, prefix, "\n")


def _hf_assistant_nll(model, trajectories, tmp_path) -> list[float]:
    """Per assistant token NLL under HF transformers' Llama with ``model``'s weights, the mask
    derived from the rendered text (``_assistant_mask_from_text``)."""
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.safetensors_io import save_hf_directory
    from agentrl_jax.models.tokenizer import load_tokenizer

    hf_dir = save_hf_directory(model, str(tmp_path / "hf_initial"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    tok = load_tokenizer(resolve_model_path("smollm2"))
    nll = []
    for t in trajectories:
        ids, mask = _assistant_mask_from_text(tok, t, "Action:")
        ids, mask = ids[:len(t["token_ids"])], mask[:len(t["token_ids"])]
        with torch.no_grad():
            logp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1)
        nll += [-float(logp[i - 1, ids[i]]) for i in range(1, len(ids)) if mask[i]]
    return nll


def test_sft_nll_export_and_resume(recorded, tmp_path, capsys, one_device):
    """* The loss of the first SFT step (before its update) is the mean NLL of the step's
      assistant tokens under HF transformers with the initial weights (mask from the text).
    * Two SFT steps, then the same command with three steps resumes at step 2.
    * The exported HF directory holds the learner's parameters and is what ``load_policy``
      (launch/run.py's model loading, ``--config.model.name=<workdir>/model``) gives."""
    import jax
    from flax import nnx

    from agentrl_jax.learner import Learner
    from agentrl_jax.training.jobs.sft import SFTRun, batch_rows, finished_step
    from agentrl_jax.training.runtime.policy import load_policy

    data, _, trajectories = recorded
    c = _config(data, 2)
    first = [trajectories[i] for i in batch_rows(0, len(trajectories), 2, int(c.seed))]
    nll = _hf_assistant_nll(load_policy(to_run_config(c))[0], first, tmp_path)
    work = str(tmp_path / "sft")
    SFTRun(to_run_config(c), work, progress=False).run()
    assert finished_step(work) == 2
    summary = SFTRun(to_run_config(_config(data, 3)), work, progress=False).run()
    assert "resumed at step 2" in capsys.readouterr().out
    assert summary["final_step"] == 3 and finished_step(work) == 3
    assert summary["code"]["source_sha256"] == source_digest()  # the code that trained it
    rows = [json.loads(line) for line in open(os.path.join(work, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2, 3] and all("actor/nll" in r for r in rows)
    assert rows[0]["batch/generated_tokens"] == len(nll)
    assert rows[0]["actor/nll"] == pytest.approx(np.mean(nll), rel=1e-4)
    assert rows[0]["actor/pg_loss"] == pytest.approx(np.mean(nll), rel=1e-4)
    assert rows[2]["actor/nll"] < rows[0]["actor/nll"]  # lr 1e-3: the NLL falls

    c = _config(data, 3)
    restored = Learner(load_policy(to_run_config(c))[0], dict(c.learner),
                       checkpoint_dir=os.path.join(work, "checkpoints"))
    restored.restore()
    rl = _config(data, 3)
    rl.model.name = os.path.join(work, "model")
    rl.model.random_init = {}
    model, tokenizer, path = load_policy(to_run_config(rl))
    assert path == os.path.join(work, "model")
    assert len(tokenizer) == len(load_policy(to_run_config(c))[1])
    ours = jax.tree.leaves(nnx.state(model, nnx.Param))
    ref = jax.tree.leaves(restored.params)
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    restored.close()


def test_sft_time_budget_counts_every_session(recorded, tmp_path, capsys, one_device):
    """``sft.max_seconds`` is the training time of the whole run: a session resumed after its
    budget was spent trains no step (it used to train for another ``max_seconds``), and the
    seconds trained are kept in the checkpoint and in ``summary.json``."""
    from agentrl_jax.training.jobs.sft import SFTRun

    data, _, _ = recorded
    work = str(tmp_path / "sft")
    c = _config(data, 2)
    c.sft.count_first_update = True
    first = SFTRun(to_run_config(c), work, progress=False).run()
    assert first["final_step"] == 2 and first["train_seconds"] > 0.05  # compile + 2 updates
    more = _config(data, 6)
    more.sft.count_first_update = True
    more.sft.max_seconds = 0.05  # already spent by the first session
    second = SFTRun(to_run_config(more), work, progress=False).run()
    out = capsys.readouterr().out
    assert "resumed at step 2" in out and "already spent" in out
    assert second["final_step"] == 2
    assert second["train_seconds"] == pytest.approx(first["train_seconds"], abs=1e-3)
    rows = [json.loads(line) for line in open(os.path.join(work, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2]


@pytest.mark.parametrize("count_first_update", [False, True])
def test_sft_time_budget_leaves_out_the_first_update_unless_asked(
        recorded, tmp_path, monkeypatch, one_device, count_first_update):
    """The first update (the compile) takes 100 s on this run's clock, a budget of 50 s: left
    out of the budget (the default) the run trains all 3 steps and counts under 50 s; counted,
    the budget is spent by the first step, which is where the run stops."""
    import time as real_time

    from agentrl_jax.training.jobs import sft as sft_module
    from agentrl_jax.training.jobs.sft import SFTRun

    class Clock:  # a fake clock: 0.5 s a reading, 100 s ahead from inside the first update on
        offset = 0.0  # (no real elapsed time enters the budget: the box's load cannot matter)
        ticks = 0

        def monotonic(self):
            self.ticks += 1
            return 0.5 * self.ticks + self.offset

        def __getattr__(self, name):
            return getattr(real_time, name)

    clock = Clock()
    quietly = sft_module.compile_notice.quietly

    def slow_first_update(fn, *args, **kwargs):
        clock.offset += 100.0
        return quietly(fn, *args, **kwargs)

    monkeypatch.setattr(sft_module, "time", clock)
    monkeypatch.setattr(sft_module.compile_notice, "quietly", slow_first_update)
    c = _config(recorded[0], 3)
    c.sft.max_seconds = 50.0
    c.sft.count_first_update = count_first_update
    summary = SFTRun(to_run_config(c), str(tmp_path / "sft"), progress=False).run()
    if count_first_update:
        assert summary["final_step"] == 1 and summary["train_seconds"] > 100.0
    else:
        assert summary["final_step"] == 3 and summary["train_seconds"] < 50.0
