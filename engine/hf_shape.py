"""A model's KV shape from a Hugging Face ``config.json``, for sizing (``kvgate plan``).

Unlike ``engine.model.config.ModelConfig`` (what the torch executor can load), this reads
any decoder's config without torch and without checking that kvgate can run it: sizing a
KV cache needs only layers, KV heads, head dim and dtype. The parameter count, used by the
sim executor's roofline, is estimated from the dense shapes (embeddings, attention, gated
MLP) when the config does not give it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.cost_model import ModelShape

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1}


def _int(raw: Mapping[str, Any], key: str, default: Any = None) -> int:
    value = raw.get(key)
    if value is None:  # absent, or null as many configs write an unset head_dim
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config.json {key} must be a positive integer, got {value!r}")
    return value


def dtype_bytes(raw: Mapping[str, Any]) -> int:
    name = raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"
    if name not in DTYPE_BYTES:
        raise ValueError(f"config.json dtype {name!r} is not known; known: "
                         f"{sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def estimate_params(raw: Mapping[str, Any]) -> float:
    """Dense parameters: embeddings (twice unless tied), q/k/v/o, gated MLP per layer."""
    hidden = _int(raw, "hidden_size")
    heads = _int(raw, "num_attention_heads")
    kv_heads = _int(raw, "num_key_value_heads", heads)
    head_dim = _int(raw, "head_dim", hidden // heads)
    inter = _int(raw, "intermediate_size", 4 * hidden)
    vocab = _int(raw, "vocab_size")
    layers = _int(raw, "num_hidden_layers")
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * inter
    embeddings = vocab * hidden * (1 if raw.get("tie_word_embeddings") else 2)
    return float(embeddings + layers * (attention + mlp))


def shape_from_config(raw: Mapping[str, Any], name: str = "model") -> ModelShape:
    """The ``ModelShape`` a ``config.json`` mapping describes; errors name the key."""
    hidden = _int(raw, "hidden_size")
    heads = _int(raw, "num_attention_heads")
    return ModelShape(
        name=str(raw.get("_name_or_path") or name),
        params=float(raw.get("num_parameters") or estimate_params(raw)),
        num_layers=_int(raw, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=_int(raw, "num_key_value_heads", heads),
        head_dim=_int(raw, "head_dim", hidden // heads),
        dtype_bytes=dtype_bytes(raw),
        max_model_len=_int(raw, "max_position_embeddings", 8192),
    )


def shape_from_dir(path: str | Path) -> ModelShape:
    """The shape of the model in directory ``path`` (its ``config.json``), or of a
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
    return shape_from_config(raw, name=path.name)
