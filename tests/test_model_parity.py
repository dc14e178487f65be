"""Our Flax decoder against HF transformers (PyTorch, CPU) on the same weights.

Independent reference: transformers' own Llama / Qwen2 / Qwen3 implementations, loading the
checkpoint from disk; we load the same safetensors files with our loader.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentrl_jax.models.llama import KVCache  # noqa: E402
from agentrl_jax.models.safetensors_io import load_safetensors_model, save_hf_directory  # noqa: E402

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rms_norm_eps=1e-6)

FAMILIES = {
    "llama_untied": ("LlamaConfig", dict(tie_word_embeddings=False, rope_theta=10000.0)),
    "llama_tied": ("LlamaConfig", dict(tie_word_embeddings=True, rope_theta=500000.0)),
    "llama3_scaled_rope": ("LlamaConfig", dict(
        tie_word_embeddings=False, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "qwen2_tied": ("Qwen2Config", dict(tie_word_embeddings=True, rope_theta=1000000.0)),
    "qwen2_untied": ("Qwen2Config", dict(tie_word_embeddings=False)),
    "qwen3_untied": ("Qwen3Config", dict(tie_word_embeddings=False, head_dim=24)),
    "qwen3_tied": ("Qwen3Config", dict(tie_word_embeddings=True, head_dim=16)),
    "mistral": ("MistralConfig", dict(tie_word_embeddings=False, sliding_window=None)),
}


def _make_hf_model(family: str, directory: str, seed: int = 0):
    config_cls, extra = FAMILIES[family]
    config = getattr(transformers, config_cls)(**BASE, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():  # norms and biases away from their 1 / 0 init, so they are tested
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(directory, safe_serialization=True)
    return model


def _hf_logits(model, tokens: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
    with torch.no_grad():
        kwargs = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = torch.tensor(attention_mask)
        return model(torch.tensor(tokens), **kwargs).logits.float().numpy()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_transformers(family, tmp_path):
    hf_model = _make_hf_model(family, str(tmp_path))
    model, cfg = load_safetensors_model(str(tmp_path))
    assert cfg.model_type == hf_model.config.model_type
    tokens = np.random.RandomState(1).randint(0, BASE["vocab_size"], (2, 40))
    ours = np.asarray(model(jnp.asarray(tokens)).logits)
    ref = _hf_logits(hf_model, tokens)
    assert np.abs(ours - ref).max() <= 1e-4, np.abs(ours - ref).max()


def test_padded_batch_and_kv_cache_match_transformers(tmp_path):
    """Right padding with an attention mask, and incremental decoding through the KV cache."""
    hf_model = _make_hf_model("qwen2_untied", str(tmp_path), seed=3)
    model, cfg = load_safetensors_model(str(tmp_path))
    rng = np.random.RandomState(2)
    tokens = rng.randint(0, BASE["vocab_size"], (2, 24))
    mask = np.ones_like(tokens)
    mask[1, 17:] = 0
    ours = np.asarray(model(jnp.asarray(tokens), attention_mask=jnp.asarray(mask)).logits)
    ref = _hf_logits(hf_model, tokens, mask)
    assert np.abs(ours[0] - ref[0]).max() <= 1e-4
    assert np.abs(ours[1, :17] - ref[1, :17]).max() <= 1e-4

    # Prefill 10 tokens, then decode one token at a time through the cache.
    cache = KVCache.zeros(cfg, batch_size=2, max_length=32)
    positions = jnp.broadcast_to(jnp.arange(10), (2, 10))
    out = model(jnp.asarray(tokens[:, :10]), positions=positions, cache=cache)
    steps = [np.asarray(out.logits)]
    cache = out.cache
    for t in range(10, 24):
        out = model(jnp.asarray(tokens[:, t:t + 1]), positions=jnp.full((2, 1), t), cache=cache)
        cache = out.cache
        steps.append(np.asarray(out.logits))
    incremental = np.concatenate(steps, axis=1)
    full = _hf_logits(hf_model, tokens)
    assert np.abs(incremental - full).max() <= 1e-4


def test_export_roundtrip_and_transformers_loads_export(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    hf_model = _make_hf_model("qwen3_untied", str(src), seed=5)
    model, cfg = load_safetensors_model(str(src))
    save_hf_directory(model, str(dst))
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        assert (dst / name).exists()
    reloaded, cfg2 = load_safetensors_model(str(dst))
    assert cfg2 == cfg
    a = jax.tree.leaves(jax.tree.map(np.asarray, __import__("flax").nnx.state(model)))
    b = jax.tree.leaves(jax.tree.map(np.asarray, __import__("flax").nnx.state(reloaded)))
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    hf_reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(dst)).float().eval()
    tokens = np.random.RandomState(4).randint(0, BASE["vocab_size"], (1, 16))
    assert np.abs(_hf_logits(hf_reloaded, tokens) - _hf_logits(hf_model, tokens)).max() <= 1e-5


def test_bad_checkpoints_give_clear_errors(tmp_path):
    from agentrl_jax.models.config import UnsupportedModelError
    from agentrl_jax.models.gguf_io import load_gguf_model
    from agentrl_jax.models.weights import CheckpointError

    with pytest.raises(FileNotFoundError, match="nope"):
        load_safetensors_model(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        load_gguf_model(str(tmp_path / "missing.gguf"))

    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + os.urandom(300))
    with pytest.raises(CheckpointError, match="corrupt.gguf"):
        load_gguf_model(str(corrupt))

    good = tmp_path / "good"
    _make_hf_model("llama_untied", str(good))
    config = json.loads((good / "config.json").read_text())

    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({**config, "model_type": "gpt_neox"}))
    with pytest.raises(UnsupportedModelError, match="gpt_neox"):
        load_safetensors_model(str(unknown))

    # A config that disagrees with the tensors: the error names the tensor and the file.
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    shutil.copy(good / "model.safetensors", wrong / "model.safetensors")  # (a link out is refused)
    with pytest.raises(CheckpointError, match=r"mlp\.(gate|up|down)_proj\.weight.*shape"):
        load_safetensors_model(str(wrong))

    # A missing tensor.
    import safetensors.numpy
    tensors = safetensors.numpy.load_file(str(good / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    missing = tmp_path / "missing_tensor"
    missing.mkdir()
    (missing / "config.json").write_text(json.dumps(config))
    safetensors.numpy.save_file(tensors, str(missing / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing_tensor.*layers\.1\.self_attn\.k_proj"):
        load_safetensors_model(str(missing))


def test_sharded_forward_equals_single_device(tmp_path):
    from flax import nnx

    from agentrl_jax.sharding.mesh import make_mesh
    from agentrl_jax.sharding.rules import shard_batch, sharding_fn

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
    _make_hf_model("qwen2_untied", str(tmp_path), seed=7)
    model, _ = load_safetensors_model(str(tmp_path))
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, BASE["vocab_size"], (8, 32)))
    ref = np.asarray(model(tokens).logits)
    forward = nnx.jit(lambda m, x: m(x).logits)
    for mesh in (make_mesh(fsdp=4, tensor=2), make_mesh(data=8, fsdp=1)):
        sharded, _ = load_safetensors_model(str(tmp_path), sharding_fn=sharding_fn(mesh))
        kernel = sharded.layers[0].mlp.gate_proj.kernel[...]
        assert len(kernel.sharding.device_set) == 8
        out = np.asarray(forward(sharded, shard_batch(tokens, mesh)))
        assert np.abs(out - ref).max() <= 1e-5
