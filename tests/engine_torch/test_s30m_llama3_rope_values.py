"""A llama3 rope scaling no model has is refused naming the key and the value: an
``original_max_position_embeddings`` of 0 (or below) made every wavelength count as long
and scaled every frequency by ``factor``, a model that loaded and answered wrongly."""

from __future__ import annotations

from typing import Any

import pytest

from engine.model.config import ModelConfig, ModelLoadError
from tests.support.model_configs import LLAMA_MIN

BASE = LLAMA_MIN
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.mark.parametrize(("changes", "message"), [
    ({"original_max_position_embeddings": 0},
     "config.json original_max_position_embeddings must be positive, got 0"),
    ({"original_max_position_embeddings": -8192},
     "config.json original_max_position_embeddings must be positive, got -8192"),
    ({"factor": 0}, "factor must be positive, got theta=10000.0 factor=0.0"),
    ({"factor": -8.0}, "factor must be positive, got theta=10000.0 factor=-8.0"),
    ({"low_freq_factor": 0}, r"0 < low_freq_factor < high_freq_factor, got 0.0 and 4.0"),
    ({"high_freq_factor": -1}, r"0 < low_freq_factor < high_freq_factor, got 1.0 and -1.0"),
    ({"low_freq_factor": 4.0}, r"0 < low_freq_factor < high_freq_factor, got 4.0 and 4.0"),
])
@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
def test_a_llama3_scaling_no_model_has_is_refused_naming_it(
        key: str, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_dict({**BASE, key: {**LLAMA3, **changes}})


def test_llama3s_own_scaling_still_loads() -> None:
    rope = ModelConfig.from_dict({**BASE, "rope_scaling": LLAMA3}).rope
    assert (rope.rope_type, rope.factor, rope.original_max_position_embeddings) == (
        "llama3", 8.0, 8192)
