"""A multi-head latent attention model (DeepSeek-V2/V3) is sized as vLLM caches it: one
latent of ``kv_lora_rank + qk_rope_head_dim`` values per token and layer, not a K and a V
per head."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from engine.hf_shape import shape_from_config
from loadtests import plan as plan_cli

DEEPSEEK_V3: dict[str, Any] = {  # DeepSeek-V3's config.json, the keys sizing reads
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
}
DEEPSEEK_V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
    "hidden_size": 2048, "intermediate_size": 10944, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 102400, "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(("config", "layers"), [(DEEPSEEK_V3, 61), (DEEPSEEK_V2_LITE, 27)])
def test_an_mla_model_caches_one_latent_per_token_and_layer(config: dict[str, Any],
                                                            layers: int) -> None:
    shape = shape_from_config(config)
    assert shape.kv_bytes_per_token == layers * (512 + 64) * 2  # bf16
    assert shape.num_layers == layers and shape.num_heads == config["num_attention_heads"]


def test_the_planner_sizes_deepseek_v3_by_its_latent(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    parser = argparse.ArgumentParser(prog="kvgate plan")
    plan_cli.add_arguments(parser)
    plan = plan_cli.build_plan(parser.parse_args(
        ["--model", str(tmp_path), "--replicas", "2", "--idle-kv-gib", "10",
         "--sim-requests", "0"]))
    assert plan["kv_bytes_per_token"] == 61 * 576 * 2 == 70272  # 68.6 KiB, not 1.7 MiB


def test_a_null_kv_lora_rank_is_an_ordinary_attention_model() -> None:
    plain = {k: v for k, v in DEEPSEEK_V2_LITE.items() if k != "kv_lora_rank"}
    assert shape_from_config({**plain, "kv_lora_rank": None}) == shape_from_config(plain)
    assert shape_from_config(plain).kv_bytes_per_token == 2 * 27 * 16 * 128 * 2


@pytest.mark.parametrize(("changes", "message"), [
    ({"kv_lora_rank": 0}, "config.json kv_lora_rank must be a positive integer, got 0"),
    ({"qk_rope_head_dim": None},
     "config.json qk_rope_head_dim must be a positive integer, got None"),
])
def test_a_bad_latent_size_is_refused_naming_it(changes: dict[str, Any], message: str
                                                ) -> None:
    with pytest.raises(ValueError, match=message):
        shape_from_config({**DEEPSEEK_V3, **changes})
