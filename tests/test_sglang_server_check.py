"""``benchmarks/checks/sglang_server_check.py`` (the checks our SGLang client ran against a real SGLang
server on a GPU) against our own server on the tiny model: every check passes there, and a
server that answers differently fails the check it breaks."""

from __future__ import annotations

import os
import sys

import pytest

from agentrl_jax.models.safetensors_io import save_hf_directory
from rollout_helpers import TINY, byte_tokenizer, make_engine, start_server, tiny_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "checks"))
import sglang_server_check  # noqa: E402

SMALL = ["--vocab", str(TINY.vocab_size), "--check-prompt-len", "16", "--reuse-prompt-len",
         "48", "--batch", "4", "--prompt-len", "8", "--new-tokens", "8", "--wait-s", "30"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = tiny_model(seed=0)
    model_dir = str(tmp_path_factory.mktemp("hf") / "tiny")
    save_hf_directory(model, model_dir, dtype="float32")
    engine = make_engine(model, byte_tokenizer(TINY.vocab_size))
    thread = start_server(engine, weights_dirs=[os.path.dirname(model_dir)])
    yield thread.url, model_dir, engine
    thread.stop()
    engine.close()


def test_every_check_passes_against_our_server(served, tmp_path):
    url, model_dir, _ = served
    # abort: a 100-token request on the tiny CPU model can finish inside the 0.5 s wait
    out = sglang_server_check.main(["--url", url, "--model-dir", model_dir, *SMALL,
                                    "--skip", "abort", "--json", str(tmp_path / "c.json")])
    checks = out["checks"]
    assert set(checks) == {"generate", "n_samples", "stop_token", "prefix_reuse",
                           "update_weights", "logprobs"}
    assert out["all_ok"], {k: v for k, v in checks.items() if not v["ok"]}
    assert checks["prefix_reuse"]["turn2_cached"] >= 48
    assert checks["logprobs"]["max_abs_diff"] < 1e-3  # float32 server, float32 reference
    assert out["throughput"]["generated_tokens"] == 4 * 8
    assert (tmp_path / "c.json").exists()


def test_a_server_that_keeps_its_cache_fails_the_flush_check(served, monkeypatch):
    url, _, engine = served

    async def flush_nothing() -> int:
        return 0

    monkeypatch.setattr(engine, "flush_cache", flush_nothing)
    out = sglang_server_check.main(["--url", url, *SMALL,
                                    "--skip", "generate,n_samples,abort,throughput"])
    reuse = out["checks"]["prefix_reuse"]
    assert not reuse["ok"] and reuse["after_flush_cached"] > 0 and not out["all_ok"]
