"""A KV pool the device cannot hold is refused with its size and the flag to lower, not the
allocator's traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.executors.torch_executor import TorchExecutor
from engine.model.loader import load_model
from engine.model.tiny import write_tiny_model


def test_a_kv_pool_past_the_devices_memory_names_its_size_and_the_flag(tmp_path: Path
                                                                          ) -> None:
    write_tiny_model(tmp_path)
    model = load_model(tmp_path, backend="torch")
    # about 2**42 bytes a layer: past this machine's memory and any overcommit allowance
    per_block = 16 * model.config.num_kv_heads * model.config.head_dim * 4
    blocks = 2**42 // per_block
    with pytest.raises(ValueError, match=rf"a KV cache of {blocks:,} blocks of 16 tokens "
                                         r"\(.* GiB\) does not fit in the memory of cpu .*"
                                         r"lower --kv-cache-gib"):
        TorchExecutor(model, num_blocks=blocks, block_size=16)
