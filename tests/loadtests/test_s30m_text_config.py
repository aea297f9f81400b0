"""``kvgate plan --model`` sizes a multimodal model whose config.json keeps its language
model's settings in ``text_config`` (Gemma 3, Llama 4, Mistral 3), as transformers'
``get_text_config`` reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.hf_shape import shape_from_config
from tests.support.model_configs import MISTRAL_SMALL_31_TEXT
from tests.support.plan_runs import plan_for_config

TEXT = MISTRAL_SMALL_31_TEXT
MISTRAL3: dict[str, Any] = {
    "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
    "torch_dtype": "bfloat16", "text_config": TEXT,
    "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24, "head_dim": 64,
                      "num_attention_heads": 16},
}
KV_BYTES = 2 * 40 * 8 * 128 * 2  # K and V x layers x KV heads x head dim x bf16


def test_the_planner_sizes_a_model_from_its_text_config(tmp_path: Path) -> None:
    plan = plan_for_config(tmp_path, MISTRAL3, "--replicas", "2", "--idle-kv-gib", "10",
                           "--sim-requests", "0")
    assert plan["kv_bytes_per_token"] == KV_BYTES == 160 * 1024
    assert (plan["model"]["num_layers"], plan["model"]["num_kv_heads"],
            plan["model"]["head_dim"]) == (40, 8, 128)


def test_the_text_config_reads_as_the_same_model_at_the_top_level() -> None:
    flat = shape_from_config({**TEXT, "torch_dtype": "bfloat16"})
    assert shape_from_config(MISTRAL3) == flat
    assert flat.max_model_len == 131072
    # the dtype of the top level, else the text config's (as vLLM reads it)
    fp32 = {**MISTRAL3, "torch_dtype": None, "text_config": {**TEXT, "torch_dtype": "float32"}}
    assert shape_from_config(fp32).dtype_bytes == 4


def test_a_top_level_with_the_settings_is_read_as_before() -> None:
    both = {**TEXT, "num_hidden_layers": 2, "text_config": TEXT}
    assert shape_from_config(both).num_layers == 2


@pytest.mark.parametrize(("config", "message"), [
    ({**MISTRAL3, "text_config": {**TEXT, "hidden_size": None}},
     "config.json text_config.hidden_size must be a positive integer, got None"),
    ({**MISTRAL3, "text_config": {**TEXT, "num_key_value_heads": 0}},
     "config.json text_config.num_key_value_heads must be a positive integer, got 0"),
    ({**MISTRAL3, "text_config": "mistral"},
     "config.json text_config must be an object, got 'mistral'"),
])
def test_a_bad_text_config_is_refused_naming_the_nested_key(config: dict[str, Any],
                                                            message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shape_from_config(config)
