"""Published models' ``config.json`` settings, the keys kvgate's sizing reads (from each
model's config on the Hugging Face Hub), a minimal Llama config the torch executor's
config tests build on, and ``refused_shape`` for the ``ModelShape`` values refused."""

from __future__ import annotations

from typing import Any

from engine.cost_model import ModelShape

DEEPSEEK_V3: dict[str, Any] = {  # MLA (one latent of 512 + 64 a layer), 256 experts
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "tie_word_embeddings": False,
    "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
}
DEEPSEEK_V2_LITE: dict[str, Any] = {  # MLA without a q latent (q_lora_rank null)
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
    "hidden_size": 2048, "intermediate_size": 10944, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 102400, "torch_dtype": "bfloat16",
}
QWEN2_7B: dict[str, Any] = {  # Qwen2-7B-Instruct: a sliding window it does not use
    "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "vocab_size": 152064, "sliding_window": 131072, "use_sliding_window": False,
    "max_window_layers": 28, "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
}
QWEN15_MOE_A27B: dict[str, Any] = {  # 60 experts, 4 a token, a shared expert
    "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
    "vocab_size": 151936, "num_experts": 60, "num_experts_per_tok": 4,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
MIXTRAL_8X7B: dict[str, Any] = {  # 8 experts, 2 a token
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
MISTRAL_7B_V01: dict[str, Any] = {  # every layer within a sliding window of 4096
    "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "sliding_window": 4096, "torch_dtype": "bfloat16",
}
LLAMA3_8B: dict[str, Any] = {  # Meta-Llama-3-8B
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "torch_dtype": "bfloat16",
}
GEMMA2_9B: dict[str, Any] = {  # every other layer local (transformers' default)
    "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
    "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 256, "vocab_size": 256000, "sliding_window": 4096,
}
GEMMA3_27B: dict[str, Any] = {  # gemma-3-27b-it's text_config: 5 local layers in 6
    "model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504,
    "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16,
    "head_dim": 128, "vocab_size": 262208, "sliding_window": 1024,
    "sliding_window_pattern": 6,
}
MISTRAL_SMALL_31_TEXT: dict[str, Any] = {  # Mistral-Small-3.1-24B's text_config
    "model_type": "mistral", "hidden_size": 5120, "head_dim": 128,
    "intermediate_size": 32768, "num_hidden_layers": 40, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 131072, "max_position_embeddings": 131072,
}
# meta-llama/Llama-4-Maverick-17B-128E's text_config: 128 experts in every other layer
# (moe_layers by default the odd ones), the dense layers' MLP of intermediate_size_mlp,
# each MoE layer's shared expert of intermediate_size
LLAMA4_MAVERICK_TEXT: dict[str, Any] = {
    "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
    "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048,
    "num_local_experts": 128, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
    "max_position_embeddings": 1048576, "torch_dtype": "bfloat16",
}
LLAMA4_MAVERICK: dict[str, Any] = {
    "model_type": "llama4", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "text_config": LLAMA4_MAVERICK_TEXT,
}
LLAMA4_SCOUT: dict[str, Any] = {  # Llama-4-Scout-17B-16E: 16 experts in every layer
    **LLAMA4_MAVERICK, "text_config": {
        **LLAMA4_MAVERICK_TEXT, "num_local_experts": 16, "interleave_moe_layer_step": 1,
        "max_position_embeddings": 10485760},
}

# the smallest Llama the torch executor's ModelConfig reads (no torch needed to build it)
LLAMA_MIN: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def refused_shape(**changes: Any) -> str:
    """The message of the ``ValueError`` a small ``ModelShape`` with ``changes`` raises."""
    try:
        ModelShape("m", 8e9, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=64,
                   **changes)
    except ValueError as exc:
        return str(exc)
    raise AssertionError(f"ModelShape took {changes}")
