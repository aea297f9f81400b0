"""A multi-head latent attention model's KV is kept and reported as its latent: the
shape has the latent's width (``mla_latent_width``), not a head of half of it, and the
plan says "MLA latent 576 values per token per layer"."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from engine.cost_model import ModelShape
from engine.hf_shape import shape_from_config
from loadtests import plan as plan_cli
from loadtests.plan_report import render

DEEPSEEK_V3: dict[str, Any] = {  # DeepSeek-V3's config.json, the keys sizing reads
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
}


def test_the_shape_keeps_the_latent_width() -> None:
    shape = shape_from_config(DEEPSEEK_V3)
    assert shape.mla_latent_width == 576 and shape.kv_values_per_token_layer == 576
    assert shape.kv_bytes_per_token == 61 * 576 * 2
    # a head attends over its no-rope and rope parts; one KV head, as vLLM counts MLA
    assert (shape.num_kv_heads, shape.head_dim) == (1, 128 + 64)
    plain = ModelShape("m", 8e9, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128)
    assert plain.mla_latent_width is None and plain.kv_bytes_per_token == 128 * 1024


def test_the_plan_names_the_latent(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    parser = argparse.ArgumentParser(prog="kvgate plan")
    plan_cli.add_arguments(parser)
    plan = plan_cli.build_plan(parser.parse_args(
        ["--model", str(tmp_path), "--replicas", "2", "--idle-kv-gib", "10",
         "--sim-requests", "0"]))
    assert plan["model"]["mla_latent_width"] == 576
    text = render(plan)
    assert "61 layers x MLA latent 576 values per token per layer x 2 B = 69 KiB" in text
    assert "KV heads" not in text and "288" not in text


@pytest.mark.parametrize("width", [0, 1.5, True])
def test_a_bad_latent_width_is_refused_naming_it(width: object) -> None:
    with pytest.raises(ValueError) as exc:
        ModelShape("m", 8e9, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=64,
                   mla_latent_width=width)  # type: ignore[arg-type]
    assert str(exc.value) == f"model.mla_latent_width must be a positive integer, got {width!r}"
