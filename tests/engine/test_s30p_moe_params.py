"""A mixture-of-experts model is counted as one: all its parameters (what its weights'
memory holds) and those one token computes with, and the roofline uses each where it
belongs: a token's FLOPs from the active ones, a step's weight reads from the experts
its tokens go to (a token's own few, nearly all of them in a large batch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.cost_model import CostModel, GPUSpec, load_profile
from engine.hf_shape import estimate_params, shape_from_config
from loadtests.plan_report import render
from tests.support.model_configs import (
    DEEPSEEK_V3,
    LLAMA4_MAVERICK,
    LLAMA4_MAVERICK_TEXT,
    LLAMA4_SCOUT,
    MIXTRAL_8X7B,
    QWEN15_MOE_A27B,
    refused_shape,
)
from tests.support.plan_runs import plan_for_config


@pytest.mark.parametrize(("config", "total", "active"), [
    (MIXTRAL_8X7B, 46.7e9, 12.9e9),
    (DEEPSEEK_V3, 671e9, 37e9),
    (QWEN15_MOE_A27B, 14.3e9, 2.7e9),
    (LLAMA4_MAVERICK, 400e9, 17e9),  # published with its vision encoder: ~1B of them
    (LLAMA4_SCOUT, 109e9, 17e9),
], ids=["mixtral-8x7b", "deepseek-v3", "qwen1.5-moe-a2.7b", "llama4-maverick",
        "llama4-scout"])
def test_published_totals_and_active_counts(config: dict[str, Any], total: float,
                                            active: float) -> None:
    count = estimate_params(config)
    assert count.total == pytest.approx(total, rel=0.05)
    assert count.active == pytest.approx(active, rel=0.05)
    shape = shape_from_config(config)
    assert (shape.params, shape.active) == (count.total, count.active)


def test_llama4s_moe_layers_are_its_listed_ones() -> None:
    listed = {**LLAMA4_MAVERICK, "text_config": {
        **LLAMA4_MAVERICK_TEXT, "moe_layers": list(range(1, 48, 2))}}
    assert estimate_params(listed) == estimate_params(LLAMA4_MAVERICK)
    every = {**LLAMA4_MAVERICK, "text_config": {
        **LLAMA4_MAVERICK_TEXT, "moe_layers": list(range(48))}}
    assert estimate_params(every).total == pytest.approx(
        estimate_params(LLAMA4_MAVERICK).total * 2, rel=0.05)
    with pytest.raises(ValueError) as exc:
        estimate_params({**LLAMA4_MAVERICK, "text_config": {
            **LLAMA4_MAVERICK_TEXT, "moe_layers": [1, 48]}})
    assert str(exc.value) == ("config.json text_config.moe_layers must be a list of layer "
                              "indices below 48, got [1, 48]")


def test_a_dense_model_is_all_active() -> None:
    dense = {k: v for k, v in MIXTRAL_8X7B.items()
             if k not in ("num_local_experts", "num_experts_per_tok")}
    count = estimate_params(dense)
    assert count.total == count.active == pytest.approx(7.24e9, rel=0.01)  # Mistral-7B
    assert shape_from_config(dense).active_params is None


H100 = GPUSpec("H100", peak_tflops=989.0, hbm_tb_per_s=3.35, step_overhead_ms=0.0)


def test_the_roofline_reads_the_experts_a_step_uses() -> None:
    shape = shape_from_config(DEEPSEEK_V3)
    total, active = shape.params * 2, shape.active * 2  # bf16 bytes
    assert shape.weight_bytes_read(1) == pytest.approx(active)
    # 8 of 256 experts a token: 64 tokens leave 13% of the routed weights unread
    share = (1 - 8 / 256) ** 63
    assert shape.weight_bytes_read(64) == pytest.approx(total - (total - active) * share)
    assert active < shape.weight_bytes_read(8) < shape.weight_bytes_read(64) < total
    assert shape.weight_bytes_read(4096) == pytest.approx(total)
    cost = CostModel(shape, H100)
    # a lone decode step is bound by reading a token's 37B parameters, not all 671B
    decode_s = cost.step_seconds([(100, 1)])
    bandwidth = 3.35e12 * H100.bandwidth_efficiency
    assert decode_s == pytest.approx(
        (active + shape.kv_bytes_per_token * 102) / bandwidth)
    # a prefill's FLOPs are a token's active parameters' (attention aside)
    prefill = cost.step_seconds([(0, 8192)])
    flops_rate = 989e12 * H100.compute_efficiency
    dense_flops_s = 2 * shape.active * 8192 / flops_rate
    assert dense_flops_s < prefill < 2 * dense_flops_s


def test_a_dense_profile_is_unchanged() -> None:
    model = load_profile("llama3-8b-h100").model
    assert model.active == model.params == 8.03e9
    assert all(model.weight_bytes_read(n) == 8.03e9 * 2 for n in (1, 64, 4096))


@pytest.mark.parametrize(("changes", "message"), [
    ({"active_params": 9e9}, "model.active_params must be a number in (0, params=8e+09], "
                             "got 9000000000.0"),
    ({"num_experts": 4, "experts_per_token": 8},
     "model.experts_per_token 8 is more than num_experts 4"),
    # every expert a token's: no weights it leaves out (0 ** (tokens - 1) bytes unread)
    ({"active_params": 2e9}, "model.active_params 2e+09 below params 8e+09 needs "
     "num_experts more than experts_per_token, got num_experts 1 and experts_per_token 1"),
    ({"active_params": 2e9, "num_experts": 8, "experts_per_token": 8},
     "model.active_params 2e+09 below params 8e+09 needs num_experts more than "
     "experts_per_token, got num_experts 8 and experts_per_token 8"),
])
def test_bad_expert_settings_are_refused_naming_them(changes: dict[str, Any],
                                                     message: str) -> None:
    assert refused_shape(**changes) == message


def test_a_config_with_more_experts_per_token_than_experts_is_refused() -> None:
    with pytest.raises(ValueError) as exc:
        estimate_params({**MIXTRAL_8X7B, "num_experts_per_tok": 9})
    assert str(exc.value) == ("config.json num_experts_per_tok 9 is more than its 8 "
                              "experts (num_local_experts)")


def test_the_plan_reports_the_weights_and_their_active_share(tmp_path: Path) -> None:
    plan = plan_for_config(tmp_path, MIXTRAL_8X7B, "--replicas", "2", "--idle-kv-gib", "10",
                           "--sim-requests", "0")
    assert plan["model"]["weight_bytes"] == plan["model"]["params"] * 2
    text = render(plan)
    assert "weights              46.7B parameters x 2 B = 86.99 GiB" in text
    assert "12.9B active per token" in text
