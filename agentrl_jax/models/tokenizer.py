"""Tokenizers: HF directories through ``transformers``; GGUF files rebuilt from their metadata.

For a GGUF file the BPE vocabulary, merges, pre-tokenizer, special tokens and chat template are
read from the metadata once (seconds for 49k tokens) and cached as ``tokenizer.json`` +
``tokenizer_config.json`` under the cache directory; later loads take milliseconds. Chat templates
are rendered by ``transformers`` itself (``apply_chat_template``), so the result is exactly what
transformers produces. No torch is needed.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from agentrl_jax.models.gguf_io import field_value, open_gguf
from agentrl_jax.models.weights import CheckpointError

# llama.cpp pre-tokenizer names -> HF pre-tokenizer recipe.
_GPT2_PRE_TOKENIZERS = {
    # SmolLM / StarCoder style: digits split individually, then GPT-2 byte level.
    "smollm": "digits_bytelevel",
    "starcoder": "digits_bytelevel",
    "refact": "digits_bytelevel",
    "gpt2": "bytelevel",
    "default": "bytelevel",
}
_CONTROL = 3  # llama.cpp token type of control (special) tokens
_USER_DEFINED = 4


def cache_dir() -> str:
    """``$AGENTRL_JAX_CACHE`` or ``~/.cache/agentrl_jax``."""
    return os.environ.get("AGENTRL_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache",
                                                             "agentrl_jax"))


def _file_key(path: str) -> str:
    stat = os.stat(path)
    h = hashlib.sha256(f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _build_gguf_tokenizer_files(path: str, out_dir: str) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    reader = open_gguf(path)
    kind = field_value(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise CheckpointError(f"{path}: GGUF tokenizer model {kind!r} is not supported (only BPE "
                              "'gpt2' tokenizers); use the HF checkpoint's tokenizer instead")
    pre = field_value(reader, "tokenizer.ggml.pre", "default")
    if pre not in _GPT2_PRE_TOKENIZERS:
        raise CheckpointError(f"{path}: GGUF pre-tokenizer {pre!r} is not supported "
                              f"(supported: {sorted(_GPT2_PRE_TOKENIZERS)})")
    tokens = field_value(reader, "tokenizer.ggml.tokens")
    types = field_value(reader, "tokenizer.ggml.token_type")
    merges = field_value(reader, "tokenizer.ggml.merges")
    if not tokens or not merges:
        raise CheckpointError(f"{path}: GGUF metadata lacks tokenizer tokens or merges")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False,
                               byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if _GPT2_PRE_TOKENIZERS[pre] == "digits_bytelevel":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [tokens[i] for i, t in enumerate(types) if t in (_CONTROL, _USER_DEFINED)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.save(os.path.join(out_dir, "tokenizer.json"))

    def token(key: str) -> str | None:
        index = field_value(reader, key)
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(field_value(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(field_value(
            reader, f"{field_value(reader, 'general.architecture')}.context_length", 8192)),
        "additional_special_tokens": [s for s in specials if s not in (
            token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id"),
            token("tokenizer.ggml.unknown_token_id"), token("tokenizer.ggml.padding_token_id"))],
    }
    template = field_value(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump({k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                   if config.get(k)}, f, indent=2)


def gguf_tokenizer_dir(path: str) -> str:
    """The cached HF tokenizer directory for a GGUF file, built on first use."""
    out_dir = os.path.join(cache_dir(), "tokenizers", _file_key(path))
    if not os.path.exists(os.path.join(out_dir, "tokenizer_config.json")):
        tmp = out_dir + f".tmp{os.getpid()}"
        os.makedirs(tmp, exist_ok=True)
        _build_gguf_tokenizer_files(path, tmp)
        os.makedirs(os.path.dirname(out_dir), exist_ok=True)
        try:
            os.replace(tmp, out_dir)
        except OSError:  # another process won the race; its files are identical
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def load_tokenizer(source: str):
    """A ``transformers`` fast tokenizer for a HF directory or a ``.gguf`` file."""
    from transformers import AutoTokenizer

    if source.endswith(".gguf"):
        source = gguf_tokenizer_dir(source)
    if not os.path.isdir(source):
        raise FileNotFoundError(f"tokenizer source not found: {source}")
    return AutoTokenizer.from_pretrained(source)


def render_chat(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = True
                ) -> str:
    """The prompt text of ``messages`` under the tokenizer's own chat template."""
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def encode_chat(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = True
                ) -> list[int]:
    """Token ids of the rendered chat (special tokens come from the template text)."""
    return tokenizer.encode(render_chat(tokenizer, messages, add_generation_prompt),
                            add_special_tokens=False)
