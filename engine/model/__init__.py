"""Llama-family models (Llama 2/3, Mistral, Qwen2) for the ``torch`` executor."""

from engine.model.config import (
    ModelConfig,
    ModelLoadError,
    kv_bytes_per_token,
    num_blocks_for_budget,
)

__all__ = ["ModelConfig", "ModelLoadError", "kv_bytes_per_token", "num_blocks_for_budget"]
