"""GPU benchmark of the Triton paged-attention kernel (needs CUDA).

    python -m loadtests.bench_kernels [--json PATH] [--quick]

1. Correctness in bf16 against the torch reference on mixed layouts (prefill, prefix hits
   mid-block and on a boundary, chunked prefill, decode; GQA 1/2/4).
2. Timings against ``torch.nn.functional.scaled_dot_product_attention`` on the same data
   laid out contiguously, for decode (batch 64, context 4k) and prefill of a 4k-token prompt
   with 0 and 3k tokens cached; achieved HBM GB/s and TFLOP/s; HBM bandwidth measured with a
   device-to-device copy. Goals: decode >= 60% of measured bandwidth, prefill <= 1.5x SDPA.

Shapes are Llama-3-8B's attention: 32 query heads, 8 KV heads, head_dim 128, blocks of 16.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from engine.kernels import build_metadata, reference
from engine.kernels.metadata import AttentionMetadata
from loadtests.json_out import print_json

DECODE_BW_GOAL = 0.60
PREFILL_SDPA_GOAL = 1.5


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    seqs: tuple[tuple[int, int], ...]  # (cached, new) tokens per sequence
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16

    @property
    def num_tokens(self) -> int:
        return sum(new for _, new in self.seqs)

    def flops(self) -> float:
        """QK^T and PV over the visible (causal) pairs: 4 x heads x head_dim per pair."""
        pairs = sum(new * cached + new * (new + 1) // 2 for cached, new in self.seqs)
        return 4.0 * self.heads * self.head_dim * pairs

    def bytes_moved(self, itemsize: int) -> float:
        """Minimum traffic: K and V of every context position once, Q read, O written."""
        ctx = sum(cached + new for cached, new in self.seqs)
        kv = 2 * ctx * self.kv_heads * self.head_dim
        qo = 2 * self.num_tokens * self.heads * self.head_dim
        return float((kv + qo) * itemsize)


TIMED_CASES = (
    Case("decode_b64_ctx4k", tuple((4095, 1) for _ in range(64))),
    Case("prefill_4k_cold", ((0, 4096),)),
    Case("prefill_4k_3k_cached", ((3072, 1024),)),
)
CHECK_CASES = (
    Case("mixed_gqa4", ((0, 37), (21, 11), (32, 1), (100, 1), (48, 17)), 16, 4, 64),
    Case("mixed_gqa2", ((16, 16), (5, 1), (0, 130)), 8, 4, 128),
    Case("mha_decode", tuple((n, 1) for n in (1, 15, 16, 17, 300)), 4, 4, 64),
)


@dataclass(frozen=True, slots=True)
class Inputs:
    query: torch.Tensor  # [T, H, D]
    key_cache: torch.Tensor  # [NB, BS, Hkv, D]
    value_cache: torch.Tensor
    meta: AttentionMetadata


def make_inputs(case: Case, device: str, dtype: torch.dtype, seed: int = 0) -> Inputs:
    """Random paged layout: every sequence's blocks are scattered over the pool."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-(c + n) // case.block_size) for c, n in case.seqs]
    num_blocks = sum(per_seq) + 8
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    layout = []
    for (cached, new), count in zip(case.seqs, per_seq, strict=True):
        layout.append((cached, new, perm[:count]))
        perm = perm[count:]
    shape = (num_blocks, case.block_size, case.kv_heads, case.head_dim)
    return Inputs(
        query=torch.randn(case.num_tokens, case.heads, case.head_dim, generator=gen)
        .to(device, dtype),
        key_cache=torch.randn(shape, generator=gen).to(device, dtype),
        value_cache=torch.randn(shape, generator=gen).to(device, dtype),
        meta=build_metadata(layout, case.block_size, device),
    )


def contiguous_kv(inp: Inputs, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's K and V as ``[1, Hkv, ctx, D]`` (what SDPA reads)."""
    ctx = inp.meta.seq_lens_host[seq]
    k = reference.gather_kv(inp.key_cache, inp.meta.block_tables[seq], ctx)
    v = reference.gather_kv(inp.value_cache, inp.meta.block_tables[seq], ctx)
    return k.transpose(0, 1)[None].contiguous(), v.transpose(0, 1)[None].contiguous()


def sdpa_runner(case: Case, inp: Inputs, expand_kv: bool = False
                ) -> Callable[[], torch.Tensor]:
    """SDPA on contiguous data: decode batched as [B, H, 1, D]; a prefill as one sequence
    with a bottom-right causal mask when part of the context is cached. GQA is native
    (``enable_gqa``) unless ``expand_kv`` repeats K/V to the query heads beforehand."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    scale = case.head_dim ** -0.5
    if all(new == 1 for _, new in case.seqs) and len({c for c, _ in case.seqs}) == 1:
        kv = [contiguous_kv(inp, i) for i in range(len(case.seqs))]
        k, v = torch.cat([a for a, _ in kv]), torch.cat([b for _, b in kv])
        q = inp.query[:, :, None, :]  # [B, H, 1, D]
        kwargs: dict[str, Any] = {}
    elif len(case.seqs) == 1:
        cached, new = case.seqs[0]
        k, v = contiguous_kv(inp, 0)
        q = inp.query.transpose(0, 1)[None].contiguous()
        kwargs = ({"is_causal": True} if cached == 0
                  else {"attn_mask": causal_lower_right(new, cached + new)})
    else:
        raise ValueError(f"{case.name}: SDPA baseline covers decode or one prefill")
    if expand_kv:
        group = case.heads // case.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    else:
        kwargs["enable_gqa"] = True
    return functools.partial(F.scaled_dot_product_attention, q, k, v, scale=scale, **kwargs)


def sdpa_baseline(case: Case, inp: Inputs) -> tuple[Callable[[], torch.Tensor], str]:
    """The native-GQA baseline when this torch/GPU supports it for ``case``, else K/V
    expanded to the query heads; the second value says which."""
    native = sdpa_runner(case, inp)
    try:
        native()
    except (RuntimeError, NotImplementedError):
        return sdpa_runner(case, inp, expand_kv=True), "expanded_kv"
    return native, "native_gqa"


def sdpa_as_tokens(out: torch.Tensor) -> torch.Tensor:
    """SDPA's ``[B, H, 1, D]`` (decode) or ``[1, H, q, D]`` (prefill) as ``[T, H, D]``."""
    return out[:, :, 0] if out.shape[2] == 1 else out[0].transpose(0, 1)


def time_fn(fn: Callable[[], Any], warmup: int = 3, iters: int = 10) -> float:
    """Median seconds per call; CUDA events on a GPU, the wall clock elsewhere."""
    for _ in range(warmup):
        fn()
    samples = []
    cuda = torch.cuda.is_available()
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def max_error(case: Case, device: str, dtype: torch.dtype,
              attention: Callable[..., torch.Tensor]) -> float:
    """Largest |kernel - fp32 reference| over a random layout of ``case``."""
    inp = make_inputs(case, device, dtype, seed=1)
    scale = case.head_dim ** -0.5
    got = attention(inp.query, inp.key_cache, inp.value_cache, inp.meta, scale)
    ref = reference.paged_attention(inp.query.float(), inp.key_cache.float(),
                                    inp.value_cache.float(), inp.meta, scale)
    return float((got.float() - ref).abs().max())


def measured_bandwidth(num_bytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy (read + write)."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = time_fn(lambda: dst.copy_(src), warmup=3, iters=10)
    return 2 * num_bytes / seconds


def summarize(case: Case, ours_s: float, sdpa_s: float, itemsize: int, bandwidth: float
              ) -> dict[str, Any]:
    gbps = case.bytes_moved(itemsize) / ours_s / 1e9
    row: dict[str, Any] = {
        "case": case.name, "shape": asdict(case) | {"seqs": len(case.seqs)},
        "ours_ms": round(ours_s * 1e3, 4), "sdpa_ms": round(sdpa_s * 1e3, 4),
        "ours_vs_sdpa": round(ours_s / sdpa_s, 3),
        "ours_gbps": round(gbps, 1), "ours_tflops": round(case.flops() / ours_s / 1e12, 2),
        "sdpa_tflops": round(case.flops() / sdpa_s / 1e12, 2),
    }
    if case.name.startswith("decode"):
        row["fraction_of_hbm"] = round(gbps * 1e9 / bandwidth, 3)
        row["meets_goal"] = row["fraction_of_hbm"] >= DECODE_BW_GOAL
    else:
        row["meets_goal"] = row["ours_vs_sdpa"] <= PREFILL_SDPA_GOAL
    return row


def run(quick: bool) -> dict[str, Any]:
    from engine.kernels import triton_ops

    dtype = torch.bfloat16
    errors = {c.name: max_error(c, "cuda", dtype, triton_ops.paged_attention)
              for c in CHECK_CASES}
    bandwidth = measured_bandwidth()
    rows = []
    for case in TIMED_CASES:
        inp = make_inputs(case, "cuda", dtype)
        scale = case.head_dim ** -0.5
        ours = triton_ops.paged_attention(inp.query, inp.key_cache, inp.value_cache,
                                          inp.meta, scale)
        base, sdpa_mode = sdpa_baseline(case, inp)
        errors[case.name] = float((ours.float() - sdpa_as_tokens(base()).float()).abs().max())
        iters = 5 if quick else 20
        ours_s = time_fn(functools.partial(triton_ops.paged_attention, inp.query,
                                           inp.key_cache, inp.value_cache, inp.meta, scale),
                         iters=iters)
        sdpa_s = time_fn(base, iters=iters)
        rows.append(summarize(case, ours_s, sdpa_s, 2, bandwidth) | {"sdpa_mode": sdpa_mode})
    return {
        "benchmark": "paged_attention_kernels",
        "device": torch.cuda.get_device_name(),
        "dtype": "bfloat16",
        "measured_hbm_gbps": round(bandwidth / 1e9, 1),
        "max_abs_error": {k: round(v, 5) for k, v in errors.items()},
        "correct": all(v < 3e-2 for v in errors.values()),
        "timings": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--quick", action="store_true", help="fewer timing iterations")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels needs a CUDA GPU (torch.cuda.is_available() is False); "
              "the kernels' CPU tests live in tests/engine_torch/test_kernels.py",
              file=sys.stderr)
        return 2
    result = run(args.quick)
    print_json(result, args.json)
    return 0 if result["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
