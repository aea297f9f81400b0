"""Sliding-window layers (Mistral-7B-v0.1, Gemma 2 and 3's local layers) are counted from
config.json, and kvgate plan says how it sizes them: their window's blocks, as vLLM's
hybrid KV cache manager keeps them, and what every layer in full would take."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.hf_shape import shape_from_config
from loadtests.plan_report import render
from tests.support.model_configs import (
    GEMMA2_9B,
    GEMMA3_27B,
    MISTRAL_7B_V01,
    QWEN2_7B,
    refused_shape,
)
from tests.support.plan_runs import plan_for_config

LAYER_TYPES = {**GEMMA3_27B, "sliding_window_pattern": None,
               "layer_types": ["sliding_attention"] * 60 + ["full_attention"] * 2}


@pytest.mark.parametrize(("config", "window", "layers"), [
    (GEMMA3_27B, 1024, 52), ({**GEMMA3_27B, "sliding_window_pattern": None}, 1024, 52),
    (MISTRAL_7B_V01, 4096, 32), (GEMMA2_9B, 4096, 21), (LAYER_TYPES, 1024, 60),
    (QWEN2_7B, None, 0), ({**MISTRAL_7B_V01, "sliding_window": None}, None, 0),
], ids=["gemma3", "gemma3-default", "mistral-v0.1", "gemma2", "layer_types", "qwen2",
        "mistral-v0.3"])
def test_sliding_window_layers_are_counted(config: dict[str, Any], window: int | None,
                                           layers: int) -> None:
    shape = shape_from_config(config)
    assert (shape.sliding_window, shape.sliding_window_layers) == (window, layers)
    # sized in full, as every layer
    assert shape.kv_bytes_per_token == 2 * shape.num_layers * shape.num_kv_heads \
        * shape.head_dim * shape.dtype_bytes


def test_a_window_keeps_only_its_tokens_on_its_layers() -> None:
    shape = shape_from_config(GEMMA3_27B)
    per_layer = 2 * 16 * 128 * 2
    assert shape.kv_bytes_cached(6000) == per_layer * (10 * 6000 + 52 * 1024)
    assert shape.kv_bytes_cached(512) == 512 * shape.kv_bytes_per_token
    full = shape_from_config(QWEN2_7B)
    assert full.kv_bytes_cached(6000) == 6000 * full.kv_bytes_per_token


def test_the_plan_says_how_it_sizes_window_layers(tmp_path: Path) -> None:
    plan = plan_for_config(
        tmp_path, {"model_type": "gemma3", "torch_dtype": "bfloat16", "text_config": GEMMA3_27B},
        "--replicas", "2", "--idle-kv-gib", "25", "--sim-requests", "0")
    assert plan["kv_bytes_per_token"] == 62 * 2 * 16 * 128 * 2
    assert plan["docs_per_replica"] == 28  # the window layers at their window's blocks
    (note,) = plan["notes"]
    assert note.startswith("52 of 62 layers attend within a sliding window of 1,024 tokens")
    assert "898 MiB. With --disable-hybrid-kv-cache-manager every layer keeps every " \
        "block: 2,945 MiB, 8 documents a replica" in note
    assert f"note: {note}" in render(plan)


def test_a_model_without_windows_has_no_note(tmp_path: Path) -> None:
    plan = plan_for_config(tmp_path, QWEN2_7B, "--sim-requests", "0")
    assert plan["notes"] == [] and "note:" not in render(plan)


@pytest.mark.parametrize(("changes", "message"), [
    ({"sliding_window_layers": 3}, "model.sliding_window_layers must be an integer in "
                                   "[0, num_layers=2], got 3"),
    ({"sliding_window_layers": 1}, "model.sliding_window must be a positive integer with "
                                   "1 sliding_window_layers, got None"),
])
def test_bad_window_settings_are_refused_naming_them(changes: dict[str, Any],
                                                     message: str) -> None:
    assert refused_shape(**changes) == message
