"""A model's KV shape from a Hugging Face ``config.json``, for sizing (``kvgate plan``).

Unlike ``engine.model.config.ModelConfig`` (what the torch executor can load), this reads
any decoder's config without torch and without checking that kvgate can run it: sizing a
KV cache needs only layers, KV heads, head dim and dtype. The parameter counts the sim
executor's roofline uses (``estimate_params``) come from the shapes: embeddings, attention,
gated MLP, and a mixture of experts' routed and shared experts (Mixtral, DeepSeek-V2/V3,
Qwen MoE, Llama 4), all of them (``params``) and those one token uses (``active_params``). A
multimodal model's config keeps its language model's settings nested (``text_config``:
Gemma 3, Llama 4, Mistral 3; ``llm_config``: InternVL; ``language_config``: DeepSeek-VL2;
``thinker_config.text_config``: Qwen2.5-Omni): they are read there. A multi-head latent
attention model (DeepSeek-V2/V3) caches one latent per token and layer
(``mla_latent_width``), which the shape keeps as its KV width. Sliding-window layers
(Mistral-7B-v0.1; Gemma 2 and 3's local layers) are counted (``sliding_window_layers``),
whose cached KV ``kvgate plan`` sizes at their window (``ModelShape.kv_bytes_cached``).
The weights' memory (``engine.hf_quant.weight_memory``) is their checkpoint's: a
``quantization_config``'s bytes a weight for all but the embeddings and output head,
kept in the shape (``ModelShape.weights``), whose steps the sim executor times at those
bytes; ``sizing_from_config`` gives it with the shape and notes on what either assumed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from engine.cost_model import ModelShape
from engine.hf_quant import ConfigSection, Weights, quantization_config, weight_memory

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1}


# what a language model's config has at its top level, a multimodal one's in text_config
_TEXT_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads")


# where a multimodal config keeps its language model's settings, as transformers'
# get_text_config and vLLM look (Gemma 3, Llama 4, Mistral 3; InternVL; DeepSeek-VL2;
# Qwen2.5-Omni's thinker)
_NESTED = (("text_config",), ("llm_config",), ("language_config",),
           ("thinker_config", "text_config"))


def text_config(raw: Mapping[str, Any]) -> ConfigSection:
    """``raw`` itself, or the first of its nested language model configs (``_NESTED``)
    where the top level lacks the language model's settings, as transformers'
    ``get_text_config`` reads it."""
    if all(raw.get(key) is not None for key in _TEXT_KEYS):
        return ConfigSection(raw)
    for path in _NESTED:
        nested: Any = raw
        where = ""
        for key in path:
            if not isinstance(nested, Mapping) or nested.get(key) is None:
                break
            nested, where = nested[key], f"{where}{key}."
            if not isinstance(nested, Mapping):
                raise ValueError(f"config.json {where[:-1]} must be an object, got "
                                 f"{repr(nested)[:200]}")
        else:
            return ConfigSection(nested, where)
    return ConfigSection(raw)


def dtype_bytes(raw: Mapping[str, Any]) -> int:
    """The bytes of the dtype the top level names, else its language model's (as vLLM
    reads it), else bfloat16's."""
    text = text_config(raw).values
    name = (raw.get("dtype") or raw.get("torch_dtype") or text.get("dtype")
            or text.get("torch_dtype") or "bfloat16")
    if name not in DTYPE_BYTES:
        raise ValueError(f"config.json dtype {name!r} is not known; known: "
                         f"{sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


class ParamCount(NamedTuple):
    """A model's parameters: ``total``, every weight (what the weights' memory holds), and
    ``active``, those one token computes with (a mixture of experts' shared layers, shared
    experts and the ``experts_per_token`` of its ``num_experts`` routed ones it is sent
    to; a dense model's are all of them)."""

    total: float
    active: float
    num_experts: int = 1
    experts_per_token: int = 1


def _attention_params(text: ConfigSection, hidden: int, heads: int, kv_heads: int,
                      head_dim: int) -> int:
    """One layer's attention weights: q/k/v/o, or multi-head latent attention's."""
    if text.values.get("kv_lora_rank") is None:
        return hidden * head_dim * (2 * heads + 2 * kv_heads)
    # MLA: q (through a q_lora_rank latent where set), the KV latent and the rope key,
    # the latent's expansion to each head's no-rope key and value, the output
    nope, rope = text.positive("qk_nope_head_dim"), text.positive("qk_rope_head_dim")
    rank, v_dim = text.positive("kv_lora_rank"), text.positive("v_head_dim", nope)
    q = heads * (nope + rope)
    q_params = hidden * q if text.values.get("q_lora_rank") is None else \
        text.positive("q_lora_rank") * (hidden + q)
    return (q_params + hidden * (rank + rope) + rank * heads * (nope + v_dim)
            + heads * v_dim * hidden)


def _experts(text: ConfigSection) -> tuple[int, int]:
    """Routed experts per mixture-of-experts layer and how many a token goes to; (0, 0)
    for a dense model."""
    for key in ("num_local_experts", "n_routed_experts", "num_experts"):  # Mixtral,
        if text.values.get(key) not in (None, 0):  # DeepSeek, Qwen MoE
            experts = text.positive(key)
            per_token = text.positive("num_experts_per_tok")
            if per_token > experts:
                raise ValueError(f"config.json {text.where}num_experts_per_tok "
                                 f"{per_token} is more than its {experts} experts ({key})")
            return experts, per_token
    return 0, 0


def _moe_layers(text: ConfigSection, layers: int) -> int:
    """The layers whose MLP is a mixture of experts: DeepSeek's after its
    ``first_k_dense_replace`` dense ones (every ``moe_layer_freq``-th), Qwen MoE's every
    ``decoder_sparse_step``-th but its ``mlp_only_layers``, Llama 4's ``moe_layers`` (by
    default every ``interleave_moe_layer_step``-th: Maverick's odd ones, Scout's all);
    Mixtral's all."""
    listed = text.values.get("moe_layers")
    if listed is not None:  # Llama 4's, as transformers reads them
        if not isinstance(listed, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers
                for i in listed):
            raise ValueError(f"config.json {text.where}moe_layers must be a list of layer "
                             f"indices below {layers}, got {repr(listed)[:200]}")
        return len(set(listed))
    first = text.values.get("first_k_dense_replace") or 0
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise ValueError(f"config.json {text.where}first_k_dense_replace must be a "
                         f"non-negative integer, got {first!r}")
    freq = text.positive("moe_layer_freq", 1)
    # layers (i + 1) % step == 0: Qwen MoE's, and Llama 4's range(step - 1, layers, step)
    step = text.positive("interleave_moe_layer_step" if "interleave_moe_layer_step"
                         in text.values else "decoder_sparse_step", 1)
    dense = set(text.values.get("mlp_only_layers") or ())
    return sum(1 for i in range(first, layers)
               if i % freq == 0 and (i + 1) % step == 0 and i not in dense)


def _is_llama4(raw: Mapping[str, Any], text: ConfigSection) -> bool:
    """Whether the config is Llama 4's (its text config's model_type, or the top level's),
    whose every MoE layer has one shared expert no key counts."""
    return text.values.get("model_type") == "llama4_text" or \
        raw.get("model_type") in ("llama4", "llama4_text")


def _embedding_params(raw: Mapping[str, Any], text: ConfigSection) -> int:
    """The embeddings' parameters, and the output head's unless tied to them."""
    hidden = text.positive("hidden_size")
    tied = text.values.get("tie_word_embeddings", raw.get("tie_word_embeddings"))
    return text.positive("vocab_size") * hidden * (1 if tied else 2)


def _layer_params(raw: Mapping[str, Any], text: ConfigSection) -> ParamCount:
    """The decoder layers' parameters (attention, MLP, experts and router), embeddings
    left out: all of them and those one token uses, as ``estimate_params``."""
    hidden = text.positive("hidden_size")
    heads = text.positive("num_attention_heads")
    kv_heads = text.positive("num_key_value_heads", heads)
    head_dim = text.positive("head_dim", hidden // heads)
    inter = text.positive("intermediate_size", 4 * hidden)
    layers = text.positive("num_hidden_layers")
    attention = layers * _attention_params(text, hidden, heads, kv_heads, head_dim)
    # a dense layer's MLP: Llama 4's intermediate_size_mlp, its experts' intermediate_size
    dense_mlp = 3 * hidden * text.positive("intermediate_size_mlp", inter)
    experts, per_token = _experts(text)
    if not experts:
        dense = float(attention + layers * dense_mlp)
        return ParamCount(dense, dense)
    sparse = _moe_layers(text, layers)
    expert = 3 * hidden * text.positive("moe_intermediate_size", inter)
    if text.values.get("shared_expert_intermediate_size") is not None:  # Qwen MoE
        shared_experts = 3 * hidden * text.positive("shared_expert_intermediate_size")
    elif _is_llama4(raw, text):  # one shared expert of the routed ones' size
        shared_experts = expert
    else:  # DeepSeek's n_shared_experts of the routed ones' size
        shared_experts = (text.values.get("n_shared_experts") or 0) * expert
    common = attention + (layers - sparse) * dense_mlp \
        + sparse * (shared_experts + hidden * experts)  # hidden * experts: the router
    return ParamCount(float(common + sparse * experts * expert),
                      float(common + sparse * per_token * expert), experts, per_token)


def estimate_params(raw: Mapping[str, Any]) -> ParamCount:
    """Parameters from the shapes: embeddings (twice unless tied), attention and a gated
    MLP per layer, a mixture of experts' MLP (its routed experts, shared experts and
    router) in its sparse layers, counted in full for ``total`` and as one token uses
    them (shared, and ``num_experts_per_tok`` of the routed) for ``active``: Mixtral,
    DeepSeek-V2/V3, Qwen MoE, Llama 4 (Scout 108B / 17B, Maverick 401B / 17B)."""
    text = text_config(raw)
    count = _layer_params(raw, text)
    embeddings = _embedding_params(raw, text)
    return count._replace(total=count.total + embeddings, active=count.active + embeddings)


def mla_latent_width(text: ConfigSection) -> int:
    """The values a multi-head latent attention model (DeepSeek-V2/V3: ``kv_lora_rank``
    set) caches per token and layer, as vLLM caches them: one compressed KV latent and the
    rotary key part all heads share, ``kv_lora_rank + qk_rope_head_dim`` (576 for
    DeepSeek-V3), not a K and a V per head."""
    return text.positive("kv_lora_rank") + text.positive("qk_rope_head_dim")


# transformers' defaults for the models that alternate local and global layers: every
# n-th layer global, the others within the sliding window
_WINDOW_PATTERNS = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4}


def sliding_window_layers(text: ConfigSection, layers: int) -> tuple[int | None, int]:
    """The sliding window and how many of the ``layers`` attend within it, as
    transformers reads them: ``layer_types``' "sliding_attention" layers, else all but
    every ``sliding_window_pattern``-th (Gemma 2 and 3's defaults), Qwen2's past
    ``max_window_layers`` where ``use_sliding_window``, else all of them (Mistral-7B-v0.1);
    ``(None, 0)`` without a window."""
    values = text.values
    if values.get("sliding_window") is None or values.get("use_sliding_window") is False:
        return None, 0
    window = text.positive("sliding_window")
    types = values.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ValueError(f"config.json {text.where}layer_types must be a list of "
                             f"{layers} layer types, got {repr(types)[:200]}")
        return window, sum(1 for kind in types if kind == "sliding_attention")
    pattern = values.get("sliding_window_pattern") or \
        _WINDOW_PATTERNS.get(str(values.get("model_type")))
    if pattern is not None:
        pattern = text.positive("sliding_window_pattern", pattern)
        return window, layers - layers // pattern  # layers (i + 1) % pattern != 0
    if values.get("use_sliding_window") and values.get("max_window_layers") is not None:
        return window, max(0, layers - text.positive("max_window_layers"))
    return window, layers


class _Counted(NamedTuple):
    """A config's parameters, those of its embeddings and output head (None: without
    ``vocab_size`` they cannot be told apart), and what the count assumed."""

    params: ParamCount
    embeddings: float | None
    notes: tuple[str, ...] = ()


def _param_count(raw: Mapping[str, Any], text: ConfigSection) -> _Counted:
    """The config's ``num_parameters`` where it gives them, else the estimate. Their
    active share: the estimate's where it can be made (``vocab_size`` given); without
    ``vocab_size``, a mixture of experts' ``num_parameters`` less the routed experts a
    token is not sent to (from the expert counts and sizes, which need no embeddings:
    ``_layer_params``' total less its active, with a note), a dense model's all of them."""
    given = raw.get("num_parameters")
    if given is not None and (isinstance(given, bool) or not isinstance(given, int | float)
                              or not math.isfinite(given) or given <= 0):
        raise ValueError(f"config.json num_parameters must be a positive number, got "
                         f"{given!r}")
    layers = _layer_params(raw, text)
    if given is not None and text.values.get("vocab_size") is None:
        unused = layers.total - layers.active  # the routed experts a token skips
        if not unused:
            return _Counted(ParamCount(float(given), float(given)), None)
        if given <= unused:
            raise ValueError(f"config.json num_parameters {given:,.0f} is not more than "
                             f"the {unused:,.0f} of its routed experts a token is not sent "
                             f"to ({layers.experts_per_token} of {layers.num_experts} a "
                             "layer, from their sizes): it cannot be this model's count")
        note = (f"vocab_size absent: the {(given - unused) / 1e9:,.1f}B active parameters "
                "are num_parameters less the routed experts a token is not sent to "
                f"({layers.experts_per_token} of {layers.num_experts} a layer, counted "
                "from their sizes)")
        return _Counted(layers._replace(total=float(given), active=given - unused), None,
                        (note,))
    embeddings = float(_embedding_params(raw, text))
    count = layers._replace(total=layers.total + embeddings,
                            active=layers.active + embeddings)
    if given is not None:
        count = count._replace(total=float(given),
                               active=given * count.active / count.total)
    return _Counted(count, embeddings)


class ModelSizing(NamedTuple):
    """A ``config.json``'s shape, its weights' memory, and what their reading assumed
    where the config leaves it open (notes for ``kvgate plan``)."""

    shape: ModelShape
    weights: Weights
    notes: tuple[str, ...]


def sizing_from_config(raw: Mapping[str, Any], name: str = "model") -> ModelSizing:
    """The shape, weights and notes of a ``config.json`` mapping; errors name the key."""
    text = text_config(raw)
    counted = _param_count(raw, text)
    quant = quantization_config(ConfigSection(raw), text)
    memory, said = weight_memory(quant, counted.params.total, counted.embeddings,
                                 dtype_bytes(raw))
    return ModelSizing(_shape(raw, text, counted.params, memory, name), memory,
                       counted.notes + said)


def shape_from_config(raw: Mapping[str, Any], name: str = "model") -> ModelShape:
    """The ``ModelShape`` a ``config.json`` mapping describes; errors name the key."""
    return sizing_from_config(raw, name).shape


def _shape(raw: Mapping[str, Any], text: ConfigSection, count: ParamCount,
           weights: Weights, name: str) -> ModelShape:
    """The ``ModelShape`` of ``raw`` (its language model's settings ``text``) with the
    parameters ``count``, stored as ``weights`` says (the shape's ``weights``)."""
    hidden = text.positive("hidden_size")
    heads = text.positive("num_attention_heads")
    kv_heads = text.positive("num_key_value_heads", heads)
    head_dim = text.positive("head_dim", hidden // heads)
    latent = None
    if text.values.get("kv_lora_rank") is not None:
        # one latent per token and layer (vLLM's single KV head of that width); a head
        # attends over qk_nope_head_dim + qk_rope_head_dim
        latent = mla_latent_width(text)
        kv_heads = 1
        head_dim = text.positive("qk_nope_head_dim") + text.positive("qk_rope_head_dim")
    layers = text.positive("num_hidden_layers")
    window, window_layers = sliding_window_layers(text, layers)
    return ModelShape(
        name=str(raw.get("_name_or_path") or name),
        params=count.total,
        active_params=None if count.active == count.total else count.active,
        num_experts=count.num_experts,
        experts_per_token=count.experts_per_token,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        dtype_bytes=dtype_bytes(raw),
        max_model_len=text.positive("max_position_embeddings", 8192),
        mla_latent_width=latent,
        sliding_window=window if window_layers else None,
        sliding_window_layers=window_layers,
        model_dim=hidden,
        quantized_params=weights.quantized,
        bytes_per_quantized_param=weights.bytes_per_quantized,
        quantization=weights.method,
    )


def sizing_from_dir(path: str | Path) -> ModelSizing:
    """The sizing of the model in directory ``path`` (its ``config.json``), or of a
    ``config.json`` given directly."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"--model {str(path)!r}: no config.json there")
    try:
        raw = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{file} must hold a JSON object")
    return sizing_from_config(raw, name=path.name)
