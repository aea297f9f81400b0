"""kvgate plan sizes a sliding-window layer's cached KV as vLLM's hybrid KV cache manager
keeps it, the window's blocks (and one more where the window starts within a block), and
a full layer's at the whole context; a model without windows is sized as before."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from engine.hf_shape import shape_from_config
from engine.kv_sizing import GIB, window_blocks
from loadtests.plan_report import render
from tests.support.model_configs import GEMMA2_9B, GEMMA3_27B, MISTRAL_7B_V01, QWEN2_7B
from tests.support.plan_runs import plan_for_config

GEMMA3 = {"model_type": "gemma3", "torch_dtype": "bfloat16", "text_config": GEMMA3_27B}
FLAGS = ("--replicas", "2", "--idle-kv-gib", "25", "--sim-requests", "0")
REQUEST_BLOCKS = 380  # a document of 6,000 tokens and its question of 80, in blocks of 16


def _kept_by_vllm(computed: int, window: int, block_size: int) -> int:
    """The blocks a window layer still holds after ``computed`` tokens, by the rule vLLM's
    SlidingWindowManager.remove_skipped_blocks frees them: those before the block of token
    ``computed - window + 1``, the first one the next token attends to."""
    return math.ceil(computed / block_size) - max(0, computed - window + 1) // block_size


@pytest.mark.parametrize(("window", "block_size"), [(1024, 16), (4096, 16), (4000, 16),
                                                    (17, 16), (1024, 32)])
def test_a_window_layer_keeps_the_most_blocks_vllm_holds(window: int,
                                                         block_size: int) -> None:
    most = max(_kept_by_vllm(t, window, block_size)
               for t in range(window, window + 4 * block_size))
    assert window_blocks(10**6, window, block_size) == most
    assert window_blocks(2, window, block_size) == 2  # a shorter prefix: all of it
    # token by token: min(context, window)
    assert window_blocks(10**6, window, 1) == window
    assert window_blocks(window - 1, window, 1) == window - 1


def test_a_cached_prefix_keeps_its_window_layers_window() -> None:
    shape = shape_from_config(GEMMA3_27B)
    per_layer_token = 2 * 16 * 128 * 2
    # 10 full layers keep all 380 blocks, 52 window layers 1,023 / 16 -> 64 blocks + 1
    assert shape.kv_bytes_cached(6080, 16) == per_layer_token * 16 * (10 * 380 + 52 * 65)
    assert shape.kv_bytes_cached(6000) == per_layer_token * (10 * 6000 + 52 * 1024)
    assert shape.kv_bytes_cached(512, 16) == 512 * shape.kv_bytes_per_token
    full = shape_from_config(QWEN2_7B)  # its window unused: every layer in full
    assert full.kv_bytes_cached(6080, 16) == 6080 * full.kv_bytes_per_token


@pytest.mark.parametrize(("config", "full_layers", "window_layers", "kept", "docs"), [
    (GEMMA3, 10, 52, 65, 28),  # 1,024 tokens: 64 blocks and one more
    (MISTRAL_7B_V01, 0, 32, 257, 49),  # 4,096 tokens: 256 and one more
    (GEMMA2_9B, 21, 21, 257, 15),
], ids=["gemma3", "mistral-v0.1", "gemma2"])
def test_the_plan_sizes_window_layers_at_their_window(
        tmp_path: Path, config: dict[str, Any], full_layers: int, window_layers: int,
        kept: int, docs: int) -> None:
    plan = plan_for_config(tmp_path, config, *FLAGS)
    shape = shape_from_config(config)
    per_layer_block = shape.kv_bytes_per_token // shape.num_layers * 16
    request = per_layer_block * (full_layers * REQUEST_BLOCKS + window_layers * kept)
    assert plan["bytes_per_request"] == request
    assert plan["docs_per_replica"] == docs == 25 * GIB // request
    window = shape.sliding_window
    assert plan["bytes_per_doc"] == per_layer_block // 16 * (
        full_layers * 6000 + window_layers * min(6000, window))
    assert plan["kv_bytes_per_token"] == shape.kv_bytes_per_token  # a token's in full
    every_layer = REQUEST_BLOCKS * 16 * shape.kv_bytes_per_token
    (note,) = plan["notes"]
    assert note.startswith(f"{window_layers} of {full_layers + window_layers} layers "
                           f"attend within a sliding window of {window:,} tokens: the "
                           f"figures keep {kept} of a request's 380 blocks of 16 tokens")
    assert f"{every_layer / (1 << 20):,.0f} MiB, {25 * GIB // every_layer} documents a " \
        "replica" in note
    assert f"note: {note}" in render(plan)


def test_the_gemma3_note_names_both_sizes(tmp_path: Path) -> None:
    (note,) = plan_for_config(tmp_path, GEMMA3, *FLAGS)["notes"]
    assert "a document with its question takes 898 MiB" in note
    assert "--disable-hybrid-kv-cache-manager every layer keeps every block: 2,945 MiB, " \
        "8 documents a replica" in note


def test_the_plan_says_which_memory_each_figure_keeps(tmp_path: Path) -> None:
    """The simulation keeps every layer in full (8 Gemma 3 documents a replica), the
    arithmetic the window layers at their window (28): the recommendation and the note say
    which figure is which."""
    plan = plan_for_config(tmp_path, GEMMA3, "--replicas", "2", "--idle-kv-gib", "25",
                           "--sim-requests", "100", "--docs", "100", "--hot", "40",
                           "--policies", "round_robin,cost")
    assert plan["policies"] and plan["docs_per_replica"] == 28
    why = plan["recommendation"]["why"]
    assert "of the best hit rate (simulated with every layer's KV in full: 8 documents a " \
        "replica); " in why
    assert "(28 documents each, the window layers kept to their window)" in why
    (note,) = plan["notes"]
    assert "The simulation keeps every layer in full too: the policies' simulated hit " \
        "rates" in note
    assert "are figures of 8 documents a replica; docs_per_replica, replicas_for_hot_set, " \
        "the verdict, hot_prefill_reduction_arithmetic and the replica count recommended, " \
        "of 28 (the window layers kept to their window)" in note


def test_a_model_without_windows_is_sized_in_full(tmp_path: Path) -> None:
    plan = plan_for_config(tmp_path, QWEN2_7B, *FLAGS)
    per_token = shape_from_config(QWEN2_7B).kv_bytes_per_token
    assert plan["bytes_per_request"] == REQUEST_BLOCKS * 16 * per_token
    assert plan["bytes_per_doc"] == 6000 * per_token
    assert plan["notes"] == []
    assert "window" not in plan["recommendation"]["why"]  # one memory: nothing to tell apart
