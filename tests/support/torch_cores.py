"""An engine core over the torch executor and a tiny model on the CPU, built as
``kvgate engine --executor torch`` builds it."""

from __future__ import annotations

import argparse
from pathlib import Path

from engine import cli
from engine.core import EngineConfig, EngineCore
from kvwire.tokenizer import load_tokenizer


def torch_core(model_dir: Path, **config: int) -> EngineCore:
    """A core for the model in ``model_dir`` with a small KV cache; ``config``: more
    ``EngineConfig`` fields (``max_num_batched_tokens``...)."""
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--executor", "torch", "--model", str(model_dir),
                              "--device", "cpu", "--kv-cache-gib", "0.001"])
    executor, info = cli.make_executor(args, load_tokenizer(model_dir))
    return EngineCore(executor, EngineConfig(
        model_id=info.model_id, num_blocks=info.num_blocks, block_size=args.block_size,
        max_model_len=info.max_model_len, **config))
