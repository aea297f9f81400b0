"""A multi-head latent attention model's KV is kept and reported as its latent: the
shape has the latent's width (``mla_latent_width``), not a head of half of it, and the
plan says "MLA latent 576 values per token per layer"."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cost_model import ModelShape
from engine.hf_shape import shape_from_config
from loadtests.plan_report import render
from tests.support.model_configs import DEEPSEEK_V3, refused_shape
from tests.support.plan_runs import plan_for_config


def test_the_shape_keeps_the_latent_width() -> None:
    shape = shape_from_config(DEEPSEEK_V3)
    assert shape.mla_latent_width == 576 and shape.kv_values_per_token_layer == 576
    assert shape.kv_bytes_per_token == 61 * 576 * 2
    # a head attends over its no-rope and rope parts; one KV head, as vLLM counts MLA
    assert (shape.num_kv_heads, shape.head_dim) == (1, 128 + 64)
    plain = ModelShape("m", 8e9, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128)
    assert plain.mla_latent_width is None and plain.kv_bytes_per_token == 128 * 1024


def test_the_plan_names_the_latent(tmp_path: Path) -> None:
    plan = plan_for_config(tmp_path, DEEPSEEK_V3, "--replicas", "2", "--idle-kv-gib", "10",
                           "--sim-requests", "0")
    assert plan["model"]["mla_latent_width"] == 576
    text = render(plan)
    assert "61 layers x MLA latent 576 values per token per layer x 2 B = 69 KiB" in text
    assert "KV heads" not in text and "288" not in text


@pytest.mark.parametrize("width", [0, 1.5, True])
def test_a_bad_latent_width_is_refused_naming_it(width: object) -> None:
    assert refused_shape(mla_latent_width=width) == \
        f"model.mla_latent_width must be a positive integer, got {width!r}"
