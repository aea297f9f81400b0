"""A multi-head latent attention model (DeepSeek-V2/V3) is sized as vLLM caches it: one
latent of ``kv_lora_rank + qk_rope_head_dim`` values per token and layer, not a K and a V
per head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.hf_shape import shape_from_config
from tests.support.model_configs import DEEPSEEK_V2_LITE, DEEPSEEK_V3
from tests.support.plan_runs import plan_for_config


@pytest.mark.parametrize(("config", "layers"), [(DEEPSEEK_V3, 61), (DEEPSEEK_V2_LITE, 27)])
def test_an_mla_model_caches_one_latent_per_token_and_layer(config: dict[str, Any],
                                                            layers: int) -> None:
    shape = shape_from_config(config)
    assert shape.kv_bytes_per_token == layers * (512 + 64) * 2  # bf16
    assert shape.num_layers == layers and shape.num_heads == config["num_attention_heads"]


def test_the_planner_sizes_deepseek_v3_by_its_latent(tmp_path: Path) -> None:
    plan = plan_for_config(tmp_path, DEEPSEEK_V3, "--replicas", "2", "--idle-kv-gib", "10",
                           "--sim-requests", "0")
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
