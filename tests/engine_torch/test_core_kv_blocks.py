"""An engine core whose config names more KV blocks than its executor's cache holds is
refused when it is built, naming both: its block ids past the cache would fail every step
handed one, and three failed steps in a row stop the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core import EngineConfig, EngineCore
from engine.executors.torch_executor import TorchExecutor
from engine.model.tiny import write_tiny_model


def test_a_config_past_the_executors_cache_is_refused_naming_both(tmp_path: Path) -> None:
    model_dir = write_tiny_model(tmp_path, "llama", seed=1)
    executor = TorchExecutor.from_dir(model_dir, num_blocks=8, block_size=16, device="cpu")
    with pytest.raises(ValueError, match="holds 8 KV blocks, fewer than config num_blocks 9"):
        EngineCore(executor, EngineConfig(model_id="tiny", num_blocks=9, block_size=16))
    core = EngineCore(executor, EngineConfig(model_id="tiny", num_blocks=8, block_size=16))
    assert core.kv.pool.num_free_blocks <= 8
