"""benchmarks/analysis/action_scoring.py: the policies' distributions against hand-computed
ones, and the cached scorer against a full forward of prompt + reply (a tiny random Llama)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "analysis"))

from action_scoring import ActionScorer, choice_distribution  # noqa: E402


def test_distributions_by_hand():
    logps = [[-1.0, -1.0], [-3.0], [-0.5, -0.5, -2.0]]  # sums -2, -3, -3; means -1, -3, -1
    z = math.exp(-2) + 2 * math.exp(-3)
    assert choice_distribution(logps, "lm_sum") == pytest.approx(
        [math.exp(-2) / z, math.exp(-3) / z, math.exp(-3) / z])
    z = 2 * math.exp(-1) + math.exp(-3)
    assert choice_distribution(logps, "lm_mean") == pytest.approx(
        [math.exp(-1) / z, math.exp(-3) / z, math.exp(-1) / z])
    assert choice_distribution(logps, "lm_greedy") == [1.0, 0.0, 0.0]  # the first of equals
    assert choice_distribution(logps, "uniform") == pytest.approx([1 / 3] * 3)
    assert choice_distribution(logps, "first") == [1.0, 0.0, 0.0]
    assert choice_distribution([[-9.0], [-0.1]], "first") == [1.0, 0.0]  # whatever the scores


def test_cached_scores_match_a_full_forward():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config).float()
    scorer = ActionScorer(model)
    rng = np.random.default_rng(0)
    first = rng.integers(0, 97, 23).tolist()
    # a first prompt, the next turn extending it, the same again (all cached), one that
    # diverges from it at token 10, and one that is a prefix of it
    prompts = [first, first + rng.integers(0, 97, 9).tolist()]
    prompts += [prompts[1], first[:10] + rng.integers(0, 97, 5).tolist(), first[:10]]
    for prompt in prompts:
        replies = [rng.integers(0, 97, n).tolist() for n in (1, 4, 2, 6)]
        got = scorer.score(prompt, replies)
        with torch.no_grad():
            for reply, lp in zip(replies, got):
                ids = torch.tensor([prompt + reply])
                logits = torch.log_softmax(model(ids).logits[0].double(), -1)
                want = [float(logits[len(prompt) - 1 + i, t]) for i, t in enumerate(reply)]
                assert lp == pytest.approx(want, abs=1e-5)
