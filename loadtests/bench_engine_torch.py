"""CPU benchmark of the ``torch`` executor: time to first token for a long prompt computed
cold versus after a prefix hit (the prefix's KV already in the paged cache).

    python -m loadtests.bench_engine_torch --json PATH

Measures the executor step that produces the first token (prefill of the whole prompt, or
of the uncached tail only); prints and writes JSON. Target: the hit is >= 5x faster.
``decode_step_metadata``: the median time to lay out a 256-decode step's attention
metadata over 500 blocks each (per-step work before the kernels run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from engine.executor import Batch, SeqWork
from engine.executors.torch_executor import TorchExecutor
from engine.model.tiny import write_tiny_model
from loadtests.json_out import print_json

# a small Llama-shaped model: ~25M parameters in the decoder, GQA 4
SMALL = dict(hidden_size=512, layers=8, heads=8, kv_heads=2, intermediate_size=1408)
TARGET_SPEEDUP = 5.0


def _first_token_seconds(ex: TorchExecutor, work: SeqWork) -> float:
    return ex.execute(Batch((work,))).seconds


def run_benchmark(prompt_tokens: int, cached_tokens: int, repeats: int,
                  sizes: dict[str, int], block_size: int = 16) -> dict[str, Any]:
    if cached_tokens % block_size or not 0 < cached_tokens < prompt_tokens:
        raise ValueError(f"cached_tokens={cached_tokens} must be a positive multiple of "
                         f"block_size={block_size} below prompt_tokens={prompt_tokens}")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_tiny_model(Path(tmp), "llama", seed=0,
                                     max_position=max(4096, prompt_tokens), **sizes)
        blocks_per_prompt = -(-prompt_tokens // block_size)
        ex = TorchExecutor.from_dir(model_dir, num_blocks=2 * blocks_per_prompt,
                                    block_size=block_size, device="cpu")
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, ex.config.vocab_size, (prompt_tokens,), generator=gen).tolist()
    cold_blocks = list(range(blocks_per_prompt))
    # the hit reuses the cold run's prefix blocks and writes its tail into fresh ones
    hit_blocks = cold_blocks[: cached_tokens // block_size] + list(
        range(blocks_per_prompt, 2 * blocks_per_prompt - cached_tokens // block_size))
    cold_work = SeqWork("cold", prompt, 0, cold_blocks, True)
    hit_work = SeqWork("hit", prompt[cached_tokens:], cached_tokens, hit_blocks, True)
    _first_token_seconds(ex, cold_work)  # warm-up: allocator, thread pools
    _first_token_seconds(ex, hit_work)
    cold = [_first_token_seconds(ex, cold_work) for _ in range(repeats)]
    hit = [_first_token_seconds(ex, hit_work) for _ in range(repeats)]
    same = ex.execute(Batch((cold_work,))).next_tokens["cold"] == ex.execute(
        Batch((hit_work,))).next_tokens["hit"]
    cold_s, hit_s = statistics.median(cold), statistics.median(hit)
    params = sum(p.numel() for p in ex.model.parameters())
    return {
        "benchmark": "engine_torch_prefix_hit_ttft",
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "model": {"arch": "llama", "parameters": params, **sizes},
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "repeats": repeats,
        "ttft_cold_s": round(cold_s, 5),
        "ttft_hit_s": round(hit_s, 5),
        "ttft_cold_all_s": [round(x, 5) for x in cold],
        "ttft_hit_all_s": [round(x, 5) for x in hit],
        "speedup": round(cold_s / hit_s, 2),
        "target_speedup": TARGET_SPEEDUP,
        "meets_target": cold_s / hit_s >= TARGET_SPEEDUP,
        "same_first_token": same,
    }


def metadata_ms(decodes: int = 256, blocks_each: int = 500, block_size: int = 16,
                repeats: int = 20) -> dict[str, Any]:
    """Median milliseconds to lay out one decode step's attention metadata (slots, block
    tables, positions; every block id checked against the cache), the per-step work a
    large batch of long contexts pays before its kernels run: ``decodes`` sequences of
    ``blocks_each`` blocks, one new token each."""
    from engine.kernels import build_metadata

    seqs = [(blocks_each * block_size - 1, 1, list(range(i * blocks_each,
                                                         (i + 1) * blocks_each)))
            for i in range(decodes)]
    cache = decodes * blocks_each
    build_metadata(seqs, block_size, num_blocks=cache)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        build_metadata(seqs, block_size, num_blocks=cache)
        times.append((time.perf_counter() - start) * 1000)
    return {"decodes": decodes, "blocks_each": blocks_each,
            "build_ms": round(statistics.median(times), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--cached-tokens", type=int, default=1984)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden-size", type=int, default=SMALL["hidden_size"])
    parser.add_argument("--layers", type=int, default=SMALL["layers"])
    parser.add_argument("--intermediate-size", type=int, default=SMALL["intermediate_size"])
    args = parser.parse_args(argv)
    sizes = {**SMALL, "hidden_size": args.hidden_size, "layers": args.layers,
             "intermediate_size": args.intermediate_size}
    result = run_benchmark(args.prompt_tokens, args.cached_tokens, args.repeats, sizes)
    result["decode_step_metadata"] = metadata_ms()
    print_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
