"""Shared fixtures for the rollout tests: tiny random models, a byte-level tokenizer, a reference
generation loop, and engines cached per process (each jitted shape costs seconds to compile)."""

from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import CausalLM, init_model

TINY = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16, eos_token_id=1, bos_token_id=0,
                   pad_token_id=1, max_position_embeddings=256)
REF_LEN = 128  # the reference forward pads every sequence to this length (one compile)


def tiny_model(seed: int = 0, cfg: ModelConfig = TINY, logit_scale: float = 40.0) -> CausalLM:
    """A random model whose next-token distributions are peaked (lm_head scaled up), so greedy
    argmax is far from ties and token-for-token comparisons are robust to float noise."""
    model = init_model(cfg, seed)
    model.lm_head.kernel[...] = model.lm_head.kernel[...] * logit_scale
    return model


@functools.lru_cache(maxsize=None)
def _ref_forward(graphdef):
    @jax.jit
    def fwd(state, ids):
        model = nnx.merge(graphdef, state)
        return jax.nn.log_softmax(model(ids).logits, axis=-1)
    return fwd


def full_logprobs(model: CausalLM, ids: list[int], length: int = REF_LEN) -> np.ndarray:
    """log_softmax of a no-cache causal forward over ``ids`` -> [len(ids), V] (float32)."""
    graphdef, state = nnx.split(model)
    assert len(ids) <= length
    padded = np.zeros((1, length), np.int32)
    padded[0, :len(ids)] = ids
    return np.asarray(_ref_forward(graphdef)(state, padded))[0, :len(ids)]


def reference_greedy(model: CausalLM, prompt: list[int], max_new: int,
                     stop_ids: tuple[int, ...] = ()) -> list[int]:
    """Plain argmax loop: a full no-cache forward over the whole sequence for every token."""
    ids = list(prompt)
    out = []
    for _ in range(max_new):
        nxt = int(np.argmax(full_logprobs(model, ids)[-1]))
        out.append(nxt)
        ids.append(nxt)
        if nxt in stop_ids or len(ids) >= REF_LEN:
            break
    return out


def byte_tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer (256 byte tokens, no merges) with ChatML specials and filler
    (non-special) tokens ``<extra_i>`` up to ``vocab_size`` -- a real PreTrainedTokenizerFast with a chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    specials = ["<|endoftext|>", "<|im_end|>", "<|im_start|>"]
    byte_chars = list(bytes_to_unicode().values())
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in byte_chars:
        vocab[ch] = len(vocab)
    fillers = [f"<extra_{i}>" for i in range(vocab_size - len(vocab))]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in fillers])
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% endif %}")
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=template)


ENGINE_KW = dict(max_batch=8, max_length=REF_LEN, prefill_chunks=(16, 64), prefill_tokens=128,
                 decode_steps=4)


def make_engine(model: CausalLM | None = None, tokenizer=None, warmup: bool = True,
                devices=None, **overrides):
    """An engine over the tiny model. Engines with the same shapes share compiled functions;
    ``warmup=False`` compiles only the shapes actually used."""
    from agentrl_jax.rollout.engine.engine import Engine, EngineConfig

    model = model if model is not None else tiny_model()
    return Engine(model, EngineConfig(**{**ENGINE_KW, **overrides}), tokenizer=tokenizer,
                  warmup=warmup, devices=devices)


def random_prompt(rng: np.random.Generator, length: int, vocab: int = TINY.vocab_size
                  ) -> list[int]:
    """Token ids avoiding 0-2 (bos / eos / specials) so prompts never contain a stop id."""
    return [int(t) for t in rng.integers(3, vocab, size=length)]


@functools.lru_cache(maxsize=None)
def smollm2_engine():
    """The real SmolLM2-135M-Instruct behind a small engine, loaded once per test process."""
    import pytest

    from agentrl_jax.models.pretrained import load_pretrained
    from agentrl_jax.rollout.engine.engine import Engine, EngineConfig

    try:
        pretrained = load_pretrained("smollm2")
    except FileNotFoundError as e:
        pytest.skip(f"SmolLM2 not available: {e}")
    # warmup=False: compile only what the tests use (greedy decode, one prefill bucket).
    return Engine(pretrained, EngineConfig(max_batch=2, max_length=256, prefill_chunks=(64,),
                                           prefill_tokens=64, decode_steps=8), warmup=False)


def start_server(engine, **kwargs):
    """Serve ``engine`` on a free localhost port from a background thread -> ServerThread."""
    from agentrl_jax.rollout.servers.app import RolloutServer
    from agentrl_jax.rollout.servers.server import ServerThread

    thread = ServerThread(RolloutServer(engine, **kwargs))
    thread.start()
    return thread
