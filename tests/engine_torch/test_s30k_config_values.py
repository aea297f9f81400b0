"""config.json values the model cannot be built from are refused when the config is read,
naming the key and the value: never a division by zero, a value of 0 silently replaced
by a default, or a failure at the first request."""

from __future__ import annotations

from typing import Any

import pytest

from engine.model.config import ModelConfig, ModelLoadError
from tests.support.model_configs import LLAMA_MIN

BASE = LLAMA_MIN


@pytest.mark.parametrize(("changes", "message"), [
    ({"num_attention_heads": 0}, "num_attention_heads must be positive, got 0"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be positive, got 0"),
    ({"head_dim": 0}, "config.json head_dim must be positive, got 0"),
    ({"head_dim": 7}, "head_dim=7 must be even"),
    ({"num_attention_heads": 4, "hidden_size": 28}, "head_dim=7 must be even"),
    ({"rope_scaling": "linear"}, "rope_scaling must be a JSON object, got 'linear'"),
    ({"rope_parameters": [10000.0]}, r"rope_parameters must be a JSON object, got \[10000"),
])
def test_a_value_no_model_has_is_refused_naming_it(changes: dict[str, Any], message: str
                                                   ) -> None:
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_dict({**BASE, **changes})


def test_unset_values_still_take_their_defaults() -> None:
    config = ModelConfig.from_dict({**BASE, "head_dim": None, "num_key_value_heads": None,
                                    "rope_scaling": None})
    assert (config.head_dim, config.num_kv_heads, config.rope.rope_type) == (8, 4, "default")
