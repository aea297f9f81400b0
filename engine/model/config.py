"""A Llama-family model's shape, read from a Hugging Face style ``config.json``.

Accepts both the older layout (``rope_theta`` + ``rope_scaling`` at top level) and the
newer one (``rope_parameters``). Errors name the key and the bad value.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvwire.regular_files import FileTooLarge, NotRegularFile, read_regular

# architecture -> attention flavour ("qwen2" adds q/k/v bias)
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM"}
ROPE_TYPES = ("default", "linear", "llama3")


class ModelLoadError(ValueError):
    """A model directory, config or checkpoint that cannot be served."""


# Upper bounds on a config's sizes, each far past every released model (the largest noted),
# so that a config describing an absurd model is refused naming the key before a module
# is built or a weight allocated. field -> (config.json key, bound)
MAX_SIZES: dict[str, tuple[str, int]] = {
    "vocab_size": ("vocab_size", 1 << 22),  # 4,194,304 (262,144: Gemma 3)
    "hidden_size": ("hidden_size", 1 << 16),  # 65,536 (16,384: Llama 3.1 405B)
    "intermediate_size": ("intermediate_size", 1 << 18),  # 262,144 (53,248: the same)
    "num_layers": ("num_hidden_layers", 1024),  # (126: Llama 3.1 405B)
    "num_heads": ("num_attention_heads", 1024),  # (128)
    "num_kv_heads": ("num_key_value_heads", 1024),
    "head_dim": ("head_dim", 1024),  # (256: Gemma)
    "max_position_embeddings": ("max_position_embeddings", 1 << 30),  # (10,485,760: Llama 4)
}


@dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ModelLoadError(f"rope_type {self.rope_type!r} is not supported; "
                                 f"supported: {ROPE_TYPES}")
        if self.theta <= 0 or self.factor <= 0:
            raise ModelLoadError(f"rope theta and factor must be positive, got "
                                 f"theta={self.theta} factor={self.factor}")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for field, (key, bound) in MAX_SIZES.items():
            value = getattr(self, field)
            if value <= 0:
                raise ModelLoadError(f"config {key} must be positive, got {value}")
            if value > bound:
                raise ModelLoadError(f"config {key} {value} is above {bound:,}, which no "
                                     f"released model comes near")
        if self.head_dim % 2:
            raise ModelLoadError(f"config head_dim={self.head_dim} must be even: the rotary "
                                 f"embedding turns pairs of dimensions")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"num_attention_heads={self.num_heads} is not a multiple "
                                 f"of num_key_value_heads={self.num_kv_heads}")

    @property
    def flavour(self) -> str:
        return ARCHITECTURES[self.architecture]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        archs = raw.get("architectures") or [_MODEL_TYPES.get(raw.get("model_type", ""), "")]
        arch = archs[0]
        if arch not in ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {arch or raw.get('model_type')!r}; supported: "
                f"{sorted(ARCHITECTURES)}")
        for key in ("quantization_config", "compression_config"):
            quant = raw.get(key)
            if quant:  # quantized weights need their scales: not implemented
                method = quant.get("quant_method") if isinstance(quant, dict) else quant
                raise ModelLoadError(f"{key} (quant_method {method!r}) is not supported; "
                                     f"only float32, float16 and bfloat16 weights are")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ModelLoadError(f"hidden_act {act!r} is not supported (only 'silu')")
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"):
            if key not in raw:
                raise ModelLoadError(f"config.json lacks {key!r}")
        heads = _positive("num_attention_heads", raw["num_attention_heads"])
        # unset (absent or null) takes transformers' default; 0 is refused, not replaced
        head_dim = raw.get("head_dim")
        if head_dim is None:
            head_dim = _integer("hidden_size", raw["hidden_size"]) // heads
        head_dim = _positive("head_dim", head_dim)
        kv_heads = raw.get("num_key_value_heads")
        qwen = ARCHITECTURES[arch] == "qwen2"
        positions = _integer("max_position_embeddings",
                             raw.get("max_position_embeddings", 4096))
        window = _sliding_window(raw, arch)
        if window is not None and window < positions:
            # attention here sees the whole context: exact only while it fits the window
            raise ModelLoadError(
                f"sliding_window={window} is smaller than max_position_embeddings="
                f"{positions}: sliding-window attention is not implemented (set "
                f"max_position_embeddings to at most {window} in config.json to serve "
                f"the model up to its window)")
        attention_bias = bool(raw.get("attention_bias", False))
        vocab_size = _integer("vocab_size", raw["vocab_size"])
        return cls(
            architecture=arch,
            vocab_size=vocab_size,
            hidden_size=_integer("hidden_size", raw["hidden_size"]),
            intermediate_size=_integer("intermediate_size", raw["intermediate_size"]),
            num_layers=_integer("num_hidden_layers", raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=heads if kv_heads is None else _positive("num_key_value_heads",
                                                                   kv_heads),
            head_dim=head_dim,
            rms_norm_eps=_number("rms_norm_eps", raw.get("rms_norm_eps", 1e-6)),
            rope=_rope(raw),
            max_position_embeddings=positions,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=qwen or attention_bias,
            o_bias=attention_bias and not qwen,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            eos_token_ids=_eos_ids(raw, vocab_size),
            sliding_window=window,
            dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        """The config in ``path``, with the end-of-sequence ids of the
        ``generation_config.json`` beside it (where there is one) after its own: an instruct
        model's config.json often names the base model's end-of-text id alone, and its
        generation_config.json the end-of-turn id too, on both of which vLLM and
        transformers stop."""
        path = Path(path)
        config = cls.from_dict(_json_object(path))
        generation = path.parent / GENERATION_CONFIG
        if not generation.is_file():
            return config
        more = _eos_ids(_json_object(generation), config.vocab_size, generation.name)
        eos = config.eos_token_ids + tuple(e for e in dict.fromkeys(more)
                                           if e not in config.eos_token_ids)
        return dataclasses.replace(config, eos_token_ids=eos)


GENERATION_CONFIG = "generation_config.json"


def _json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ModelLoadError(f"{path} not found")
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path} must hold a JSON object, got {type(raw).__name__}")
    return raw


def _eos_ids(raw: dict[str, Any], vocab_size: int,
             file: str = "config.json") -> tuple[int, ...]:
    """``raw``'s ``eos_token_id``: one id, a list of them or none, each a token of the
    model's ``vocab_size`` (an id past it could never be sampled, so never stop a
    sequence)."""
    eos = raw.get("eos_token_id")
    ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    checked = tuple(_integer("eos_token_id", e, file) for e in ids)
    for e in checked:
        if not 0 <= e < vocab_size:
            raise ModelLoadError(f"{file} eos_token_id {e} is outside the vocabulary: ids "
                                 f"run from 0 to {vocab_size - 1} (vocab_size {vocab_size})")
    return checked


MAX_JSON_BYTES = 64 << 20  # config.json, the shard index: metadata, never near this size


def read_json(path: Path) -> Any:
    """The JSON in ``path``, read only when it is a regular file at most ``MAX_JSON_BYTES``
    long (``read_regular``: told by its size, and as it is read)."""
    try:
        data = read_regular(path, MAX_JSON_BYTES)
    except NotRegularFile as exc:
        raise ModelLoadError(f"{path} is {exc.kind}, not a regular file") from None
    except FileTooLarge as exc:
        raise ModelLoadError(f"{path} is {exc.size} bytes; a model's JSON files are read up "
                             f"to {MAX_JSON_BYTES}") from None
    if len(data) > MAX_JSON_BYTES:
        raise ModelLoadError(f"{path} holds over {MAX_JSON_BYTES} bytes; a model's JSON "
                             f"files are read up to {MAX_JSON_BYTES}")
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc


def _sliding_window(raw: dict[str, Any], arch: str) -> int | None:
    """The window of the layers that attend through one, as transformers reads the
    config: Llama has none; Mistral's defaults to 4096; Qwen2's applies only with
    ``use_sliding_window``, to the layers ``layer_types`` names sliding (else those from
    ``max_window_layers``, 28 by default)."""
    if arch == "LlamaForCausalLM":
        return None
    window = raw.get("sliding_window", 4096)
    if ARCHITECTURES[arch] == "qwen2":
        if not raw.get("use_sliding_window", False):
            return None
        layer_types = raw.get("layer_types")
        if layer_types is not None:
            sliding = "sliding_attention" in layer_types
        else:
            sliding = (_integer("max_window_layers", raw.get("max_window_layers", 28))
                       < _integer("num_hidden_layers", raw["num_hidden_layers"]))
        if not sliding:
            return None
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ModelLoadError(f"sliding_window must be a positive integer or null, got "
                             f"{window!r}")
    return window


def _rope(raw: dict[str, Any]) -> RopeConfig:
    for key in ("rope_parameters", "rope_scaling"):
        if not isinstance(raw.get(key) or {}, dict):
            raise ModelLoadError(f"config.json {key} must be a JSON object, got "
                                 f"{repr(raw[key])[:200]}")
    params = dict(raw.get("rope_parameters") or {})
    scaling = dict(raw.get("rope_scaling") or {})
    params.update(scaling)
    theta = _number("rope_theta", params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1:
        raise ModelLoadError(f"partial_rotary_factor {partial!r} is not supported (only 1: "
                             f"rotary embedding over the whole head)")
    if rope_type == "default":
        return RopeConfig(theta=theta)
    if "factor" not in params:
        raise ModelLoadError(f"rope scaling {rope_type!r} lacks 'factor'")
    factor = _number("factor", params["factor"])
    if rope_type == "linear":
        return RopeConfig(theta=theta, rope_type="linear", factor=factor)
    if rope_type == "llama3":
        # as transformers: each of these is required, none has a default
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in params:
                raise ModelLoadError(f"rope scaling 'llama3' lacks {key!r}")
        low = _number("low_freq_factor", params["low_freq_factor"])
        high = _number("high_freq_factor", params["high_freq_factor"])
        if not 0 < low < high:
            raise ModelLoadError(f"rope scaling 'llama3' needs 0 < low_freq_factor < "
                                 f"high_freq_factor, got {low} and {high}")
        return RopeConfig(
            theta=theta, rope_type="llama3", factor=factor,
            low_freq_factor=low, high_freq_factor=high,
            original_max_position_embeddings=_positive(  # 0 slowed every frequency
                "original_max_position_embeddings", params["original_max_position_embeddings"]),
        )
    raise ModelLoadError(f"rope_type {rope_type!r} is not supported; supported: {ROPE_TYPES}")


def _integer(key: str, value: Any, file: str = "config.json") -> int:
    """``value``, config key ``key``'s, which must be an integer: 2.5, "32", true or null
    is refused naming the key, never truncated or left to a TypeError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelLoadError(f"{file} {key} must be an integer, got {value!r}")
    return value


def _positive(key: str, value: Any) -> int:
    """``value``, config key ``key``'s, which must be an integer above 0."""
    number = _integer(key, value)
    if number <= 0:
        raise ModelLoadError(f"config.json {key} must be positive, got {number}")
    return number


def _number(key: str, value: Any) -> float:
    """``value``, config key ``key``'s, as a float; it must be a finite number (JSON as
    Python reads it also has NaN and Infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value):
        raise ModelLoadError(f"config.json {key} must be a finite number, got {value!r}")
    return float(value)


def torch_dtype(name: str) -> torch.dtype:
    dtypes = {"float32": torch.float32, "float16": torch.float16,
              "bfloat16": torch.bfloat16}
    if name not in dtypes:
        raise ModelLoadError(f"dtype {name!r} is not supported; supported: {sorted(dtypes)}")
    return dtypes[name]


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """K and V, every layer: what one cached token costs in the paged pool."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize


def num_blocks_for_budget(config: ModelConfig, budget_bytes: int, block_size: int,
                          dtype: torch.dtype) -> int:
    return budget_bytes // (kv_bytes_per_token(config, dtype) * block_size)
