"""Decoder configuration for the Llama / Qwen2 / Qwen3 / Mistral / SmolLM2 family.

One dataclass covers every supported architecture; the differences are flags:

* Qwen2 / Qwen2.5: ``attention_bias=True`` (bias on q/k/v projections).
* Qwen3: ``qk_norm=True`` (RMSNorm over head_dim on q and k before RoPE), explicit ``head_dim``.
* Llama 3.x: ``rope_scaling={"rope_type": "llama3", ...}``.
* SmolLM2 / Llama 2 / Mistral: plain Llama.

Each supported HF ``model_type`` is a ``ModelFamily`` in ``MODEL_FAMILIES`` (an
``agentrl_common.registry.Registry``): the flags it forces, its HF architecture name, the
``config.json`` keys it writes and whether llama.cpp permutes its Q/K rows. A decoder that these
flags describe is supported by registering one more ``ModelFamily`` (docs/EXTENDING.md).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Sequence

from agentrl_common.registry import Registry, did_you_mean

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")

#: the largest size of each dimension a config may declare (several times the largest released
#: decoder's: Llama 3.1 405B has 126 layers, hidden 16384, 128 heads, intermediate 53248), so
#: that a forged config.json is refused before anything of its size is built
MAX_MODEL_SIZES = {"num_layers": 512, "hidden_size": 65536, "intermediate_size": 262144,
                   "num_heads": 1024, "num_kv_heads": 1024, "head_dim": 1024,
                   "vocab_size": 4 * 1024**2, "max_position_embeddings": 16 * 1024**2}
ATTENTION_IMPLS = (None, "chunked", "xla", "cudnn", "pallas", "pallas_segments")
# config.json key of a restricted policy's token ids (``ModelConfig.output_token_ids``)
OUTPUT_TOKENS_HF_KEY = "agentrl_output_token_ids"
# config.json key of the restriction's option tokens in their listed order
# (``ModelConfig.option_token_ids``)
OPTION_TOKENS_HF_KEY = "agentrl_option_token_ids"


class UnsupportedModelError(ValueError):
    """A checkpoint whose architecture or options this implementation does not cover."""


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """What distinguishes one HF ``model_type`` of the Llama-like decoder.

    hf_architecture: the ``architectures`` entry of its ``config.json`` (``"LlamaForCausalLM"``).
    qkv_bias: ``True``: q/k/v projections always have a bias (Qwen2, whose config.json has no
      ``attention_bias`` key); ``None``: read ``attention_bias`` from the config.
    qk_norm: RMSNorm over head_dim on q and k before RoPE (Qwen3).
    gguf_permuted_qk: llama.cpp's converter permutes this architecture's Q/K rows (undone on load).
    hf_attention_bias_key: ``to_hf_dict`` writes ``attention_bias``.
    hf_extra: constant keys ``to_hf_dict`` adds (``(("mlp_bias", False),)``).
    """

    hf_architecture: str
    qkv_bias: bool | None = None
    qk_norm: bool = False
    gguf_permuted_qk: bool = False
    hf_attention_bias_key: bool = True
    hf_extra: tuple[tuple[str, Any], ...] = ()


_NO_SLIDING_WINDOW = (("sliding_window", None), ("use_sliding_window", False))

#: HF ``model_type`` -> ``ModelFamily`` (also GGUF ``general.architecture``)
MODEL_FAMILIES: Registry[ModelFamily] = Registry("model type", expected=ModelFamily)
MODEL_FAMILIES.register("llama", ModelFamily("LlamaForCausalLM", gguf_permuted_qk=True,
                                             hf_extra=(("mlp_bias", False),)))
MODEL_FAMILIES.register("mistral", ModelFamily("MistralForCausalLM", gguf_permuted_qk=True,
                                               hf_extra=(("mlp_bias", False), *_NO_SLIDING_WINDOW)))
MODEL_FAMILIES.register("qwen2", ModelFamily("Qwen2ForCausalLM", qkv_bias=True,
                                             hf_attention_bias_key=False,
                                             hf_extra=_NO_SLIDING_WINDOW))
MODEL_FAMILIES.register("qwen3", ModelFamily("Qwen3ForCausalLM", qk_norm=True,
                                             hf_extra=_NO_SLIDING_WINDOW))


def model_family(model_type: Any, where: str = "model_type") -> ModelFamily:
    """The registered family of ``model_type``; ``UnsupportedModelError`` (one line, the supported
    types and a did-you-mean) otherwise. ``where`` starts the message."""
    if isinstance(model_type, str) and model_type in MODEL_FAMILIES:
        return MODEL_FAMILIES.get(model_type)
    known = MODEL_FAMILIES.names()
    hint = did_you_mean(model_type, known) if isinstance(model_type, str) else ""
    raise UnsupportedModelError(
        f"{where} {model_type!r} is not supported (supported: {', '.join(known)}){hint}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only transformer.

    dtype: the compute dtype (``"float32"`` or ``"bfloat16"``); parameters are stored in
    ``param_dtype`` (float32 by default, i.e. bf16 compute with f32 master weights).
    remat: recompute each layer's activations in the backward pass.
    remat_policy: with ``remat``, the name of a ``jax.checkpoint_policies`` policy deciding what
        each layer saves (e.g. ``"dots_with_no_batch_dims_saveable"`` keeps matmul outputs);
        ``None`` saves nothing (full recompute).
    attention_impl: the cache-less (training / log-prob) attention: ``"chunked"``: blockwise
        flash-style attention in pure JAX (``models/attention.py``: never a ``[T, T]`` tensor,
        any backend, masks and ``segment_ids`` included); ``"xla"`` / ``"cudnn"``: passed to
        ``jax.nn.dot_product_attention`` (cuDNN: GPU + bf16/fp16, causal without masks only;
        masked calls use XLA with a ``[B, 1, T, T]`` mask); ``"pallas"``: JAX's Pallas (Triton)
        flash attention on NVIDIA GPUs with ``segment_ids`` (``kernels/flash_attention.py``;
        packed rows, T a multiple of 32; calls with a key mask use ``"chunked"``);
        ``"pallas_segments"``: our Pallas (Triton) kernels that skip the blocks between packed
        sequences (``kernels/segment_attention.py``; T a multiple of 64, GQA without repeating
        the keys; calls with a key mask use ``"chunked"``); ``None``:
        ``"chunked"`` on CPU,
        XLA elsewhere. Cached (decode) attention always uses XLA.
    attention_block_size: query / key block of the chunked attention (its largest temporary
        is ``[B, H, block, block]`` float32).
    remat_impl: with ``remat``, how the cache-less layer stack recomputes activations:
        ``"checkpoint"`` (each layer under ``nnx.remat``, unrolled) or ``"scan"`` (one
        ``lax.scan`` over stacked layer parameters, its step under ``jax.checkpoint``);
        ``None``: ``"scan"`` on CPU, where XLA undoes ``"checkpoint"``'s remat, else
        ``"checkpoint"`` (see ``llama.resolve_remat_impl``). Both honour ``remat_policy``.
    output_token_ids: the policy restricted to these token ids (sorted): every other token's
        logit is -inf in every place logits are made (``models/output_tokens.py``), so the
        sampler and the learner renormalise over the same set; ``None``: the whole vocabulary.
        ``to_hf_dict`` writes it as ``config.json``'s ``agentrl_output_token_ids`` (a key of
        ours that other loaders ignore) and ``from_hf_dict`` reads it back.
    option_token_ids: the restriction's listed entries in their order (entry ``k`` is option
        ``k``; a subset of ``output_token_ids``, EOS not among them): the ranks of a per-turn
        option limit (``output_tokens.option_ranks``, ``limit_to_options``); ``None``: no
        per-turn limits. ``config.json``: ``agentrl_option_token_ids``.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    model_type: str = "llama"
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False
    remat_policy: str | None = None
    attention_impl: str | None = None
    attention_block_size: int = 128
    remat_impl: str | None = None
    output_token_ids: tuple[int, ...] | None = None
    option_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        model_family(self.model_type)
        for key, most in MAX_MODEL_SIZES.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                    or not 1 <= value <= most:
                raise UnsupportedModelError(
                    f"{key} must be an integer from 1 to {most}, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"attention_impl {self.attention_impl!r} is not one of {ATTENTION_IMPLS}")
        if self.remat_impl not in (None, "checkpoint", "scan"):
            raise ValueError(f"remat_impl {self.remat_impl!r} is not None, 'checkpoint' or 'scan'")
        if self.attention_block_size < 1:
            raise ValueError(f"attention_block_size must be >= 1, got {self.attention_block_size}")
        if self.output_token_ids is not None:
            from agentrl_jax.models.output_tokens import check_token_ids

            object.__setattr__(self, "output_token_ids",
                               check_token_ids(self.output_token_ids, self.vocab_size))
        if self.option_token_ids is not None:
            options = tuple(int(i) for i in self.option_token_ids)
            if self.output_token_ids is None or not set(options) <= set(self.output_token_ids) \
                    or len(set(options)) != len(options) or not options:
                raise ValueError(f"option_token_ids {options} must be distinct tokens of "
                                 f"output_token_ids {self.output_token_ids}")
            object.__setattr__(self, "option_token_ids", options)
        rope_type = self.rope_scaling_dict.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope_scaling type {rope_type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})")

    @property
    def rope_scaling_dict(self) -> dict[str, Any]:
        return dict(self.rope_scaling) if self.rope_scaling else {}

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def restricted_to(self, tokenizer: Any, spec: "str | Sequence[str]") -> "ModelConfig":
        """This config restricted to the tokens of ``spec`` (``model.output_tokens``) and its
        EOS tokens (the tokenizer's when the config names none): ``output_token_ids`` set.
        ``ValueError`` as ``output_tokens.resolve_output_tokens`` (an entry that is not one
        token of ``tokenizer``, a repeated token, an empty list)."""
        from agentrl_jax.models.output_tokens import resolve_option_tokens, resolve_output_tokens

        eos = self.eos_token_ids or ((tokenizer.eos_token_id,)
                                     if tokenizer.eos_token_id is not None else ())
        return self.replace(output_token_ids=resolve_output_tokens(tokenizer, spec, eos),
                            option_token_ids=resolve_option_tokens(tokenizer, spec))

    @property
    def num_parameters(self) -> int:
        d, f, h, kv, hd = (self.hidden_size, self.intermediate_size, self.num_heads,
                           self.num_kv_heads, self.head_dim)
        attn = d * h * hd * 2 + d * kv * hd * 2
        if self.attention_bias:
            attn += h * hd + 2 * kv * hd
        if self.qk_norm:
            attn += 2 * hd
        layer = attn + 3 * d * f + 2 * d
        head = 0 if self.tie_word_embeddings else d * self.vocab_size
        return self.num_layers * layer + self.vocab_size * d + d + head

    # ----------------------------------------------------------------- HF config.json
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], **overrides: Any) -> "ModelConfig":
        """Build from a HF ``config.json`` dictionary (LlamaConfig / Qwen2Config / Qwen3Config ...)."""
        model_type = hf.get("model_type")
        if model_type is None:
            archs = hf.get("architectures") or []
            raise UnsupportedModelError(f"config has no model_type (architectures={archs})")
        family = model_family(model_type)
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"):
            if key not in hf:
                raise UnsupportedModelError(f"config.json lacks required key {key!r}")
        num_heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
        head_dim = hf.get("head_dim")
        if not head_dim:  # derived: the heads must split the hidden size evenly
            if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                       for v in (num_heads, hidden)) or num_heads < 1 or hidden % num_heads:
                raise UnsupportedModelError(
                    f"hidden_size={hidden!r} is not a multiple of num_attention_heads="
                    f"{num_heads!r} (and config.json gives no head_dim)")
            head_dim = hidden // num_heads
        rope_scaling = hf.get("rope_scaling")
        if rope_scaling is None and isinstance(hf.get("rope_parameters"), dict):
            # transformers >= 5 folds rope_theta and scaling into ``rope_parameters``.
            rope_scaling = hf["rope_parameters"]
        rope_theta = hf.get("rope_theta")
        if rope_theta is None and rope_scaling:
            rope_theta = rope_scaling.get("rope_theta")
        if rope_scaling:
            rope_scaling = dict(rope_scaling)
            rope_scaling.setdefault("rope_type", rope_scaling.pop("type", "default"))
            rope_scaling.pop("rope_theta", None)
            if rope_scaling.get("rope_type") == "default":
                rope_scaling = None
        attention_bias = (family.qkv_bias if family.qkv_bias is not None
                          else bool(hf.get("attention_bias", False)))
        eos = hf.get("eos_token_id")
        if isinstance(eos, list):
            eos = tuple(eos)
        values = dict(
            vocab_size=hf["vocab_size"],
            hidden_size=hidden,
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            model_type=model_type,
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=tuple(sorted(rope_scaling.items())) if rope_scaling else None,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            qk_norm=family.qk_norm,
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=eos,
            pad_token_id=hf.get("pad_token_id"),
        )
        restricted = hf.get(OUTPUT_TOKENS_HF_KEY)
        if restricted is not None:  # an export of a restricted policy (``to_hf_dict``)
            if not isinstance(restricted, list) or not all(
                    isinstance(i, int) and not isinstance(i, bool) for i in restricted):
                raise UnsupportedModelError(
                    f"config.json's {OUTPUT_TOKENS_HF_KEY} must be a list of token ids")
            values["output_token_ids"] = tuple(restricted)
            options = hf.get(OPTION_TOKENS_HF_KEY)
            if options is not None:
                if not isinstance(options, list) or not all(
                        isinstance(i, int) and not isinstance(i, bool) for i in options):
                    raise UnsupportedModelError(
                        f"config.json's {OPTION_TOKENS_HF_KEY} must be a list of token ids")
                values["option_token_ids"] = tuple(options)
        values.update(overrides)
        return cls(**values)

    def to_hf_dict(self) -> dict[str, Any]:
        """A HF ``config.json`` dictionary that transformers and SGLang load."""
        family = model_family(self.model_type)
        hf: dict[str, Any] = {
            "architectures": [family.hf_architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling_dict or None,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": "float32" if self.param_dtype == "float32" else "bfloat16",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple)
            else self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "attention_dropout": 0.0,
            "use_cache": True,
        }
        if family.hf_attention_bias_key:
            hf["attention_bias"] = self.attention_bias
        hf.update(family.hf_extra)
        if self.output_token_ids is not None:
            # ours alone: transformers / SGLang keep it as an unused attribute and sample from
            # the whole vocabulary (restrict them to these ids yourself); ``from_hf_dict`` and so
            # our servers and ``--config.model.name=DIR`` restore the restriction
            hf[OUTPUT_TOKENS_HF_KEY] = list(self.output_token_ids)
            if self.option_token_ids is not None:
                hf[OPTION_TOKENS_HF_KEY] = list(self.option_token_ids)
        return hf
