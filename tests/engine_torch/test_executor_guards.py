"""What the torch executor refuses before it computes: a KV pool the device cannot hold
(its size and the flag to lower, not the allocator's traceback), a step naming block ids
outside its cache (the request named)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.executor import Batch, SeqWork
from engine.executors.torch_executor import TorchExecutor
from engine.model.loader import load_model
from engine.model.tiny import write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("tiny")
    write_tiny_model(path)
    return load_model(path, backend="torch")


def test_a_kv_pool_past_the_devices_memory_names_its_size_and_the_flag(model: Any) -> None:
    # about 2**42 bytes a layer: past this machine's memory and any overcommit allowance
    per_block = 16 * model.config.num_kv_heads * model.config.head_dim * 4
    blocks = 2**42 // per_block
    with pytest.raises(ValueError, match=rf"a KV cache of {blocks:,} blocks of 16 tokens "
                                         r"\(.* GiB\) does not fit in the memory of cpu .*"
                                         r"lower --kv-cache-gib"):
        TorchExecutor(model, num_blocks=blocks, block_size=16)


def test_a_step_naming_block_ids_outside_the_cache_names_the_request(model: Any) -> None:
    executor = TorchExecutor(model, num_blocks=8, block_size=16)
    seqs = [SeqWork("fine", [5, 6, 7], 0, [0], True),
            SeqWork("req-b", [5, 6], 20, [1, 8], True)]
    with pytest.raises(ValueError, match=r"request req-b: block ids \[8\] outside \[0, 8\)"):
        executor.execute(Batch(tuple(seqs)))
