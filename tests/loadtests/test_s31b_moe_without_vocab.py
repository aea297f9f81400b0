"""A mixture of experts' ``num_parameters`` without ``vocab_size`` is not taken as dense:
its active share is the count less the routed experts a token is not sent to, which
their counts and sizes give without the embeddings, and the plan says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.hf_shape import estimate_params, shape_from_config
from loadtests.plan_report import render
from tests.support.model_configs import MIXTRAL_8X7B
from tests.support.plan_runs import plan_for_config

NO_VOCAB = {k: v for k, v in MIXTRAL_8X7B.items() if k != "vocab_size"}
# Mixtral-8x7B's published count; an expert 3 x 4,096 x 14,336 = 176,160,768, of which a
# token skips 8 - 2 = 6 in each of 32 layers: 33,822,867,456; active
# 46,702,792,704 - 33,822,867,456 = 12,879,925,248 (published: 12.9B)
GIVEN, UNUSED = 46_702_792_704, 33_822_867_456


def test_the_active_share_comes_from_the_experts() -> None:
    shape = shape_from_config({**NO_VOCAB, "num_parameters": GIVEN})
    assert shape.params == GIVEN
    assert shape.active_params == GIVEN - UNUSED == 12_879_925_248
    assert (shape.num_experts, shape.experts_per_token) == (8, 2)
    # the estimate with vocab_size skips the same experts
    count = estimate_params(MIXTRAL_8X7B)
    assert count.total - count.active == UNUSED


def test_the_plan_says_how_the_active_share_was_counted(tmp_path: Path) -> None:
    plan = plan_for_config(tmp_path, {**NO_VOCAB, "num_parameters": GIVEN},
                           "--replicas", "2", "--idle-kv-gib", "10", "--sim-requests", "0")
    assert plan["model"]["active_params"] == 12_879_925_248
    (note,) = plan["notes"]
    assert note == ("vocab_size absent: the 12.9B active parameters are num_parameters "
                    "less the routed experts a token is not sent to (2 of 8 a layer, "
                    "counted from their sizes)")
    text = render(plan)
    assert "12.9B active per token" in text and f"note: {note}" in text


def test_a_count_below_the_skipped_experts_is_refused_naming_it() -> None:
    with pytest.raises(ValueError) as exc:
        shape_from_config({**NO_VOCAB, "num_parameters": 30e9})
    assert str(exc.value) == (
        "config.json num_parameters 30,000,000,000 is not more than the 33,822,867,456 of "
        "its routed experts a token is not sent to (2 of 8 a layer, from their sizes): it "
        "cannot be this model's count")
