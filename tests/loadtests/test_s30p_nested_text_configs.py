"""A multimodal config.json whose language model is nested under another key than
``text_config`` is sized from it: ``llm_config`` (InternVL), ``language_config``
(DeepSeek-VL2), ``thinker_config.text_config`` (Qwen2.5-Omni)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.hf_shape import shape_from_config
from tests.support.model_configs import QWEN2_7B

LLM = QWEN2_7B  # a Qwen2-7B language model
VISION = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16}
KV_BYTES = 2 * 28 * 4 * 128 * 2


@pytest.mark.parametrize("config", [
    {"model_type": "internvl_chat", "llm_config": LLM, "vision_config": VISION},
    {"model_type": "deepseek_vl_v2", "language_config": LLM, "vision_config": VISION},
    {"model_type": "qwen2_5_omni", "thinker_config": {
        "model_type": "qwen2_5_omni_thinker", "text_config": LLM,
        "audio_config": VISION, "vision_config": VISION}},
], ids=["llm_config", "language_config", "thinker_config.text_config"])
def test_the_nested_language_model_is_the_one_sized(config: dict[str, Any]) -> None:
    shape = shape_from_config(config)
    assert shape == shape_from_config(LLM)
    assert shape.kv_bytes_per_token == KV_BYTES and shape.max_model_len == 32768


def test_a_bad_nested_value_names_its_path() -> None:
    bad = {"thinker_config": {"text_config": {**LLM, "num_key_value_heads": 0}}}
    with pytest.raises(ValueError) as bad_value:
        shape_from_config(bad)
    assert str(bad_value.value) == ("config.json thinker_config.text_config."
                                    "num_key_value_heads must be a positive integer, got 0")
    with pytest.raises(ValueError) as not_object:
        shape_from_config({"llm_config": 7})
    assert str(not_object.value) == "config.json llm_config must be an object, got 7"
