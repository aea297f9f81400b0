"""The benchmark scripts' CPU-runnable parts: the prefix-hit TTFT benchmark at toy size, and
the kernel benchmark's layouts, SDPA baselines, accounting and its no-CUDA exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.kernels import reference
from loadtests import bench_engine_torch, bench_kernels


def test_bench_engine_torch_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert bench_engine_torch.main([
        "--json", str(out), "--prompt-tokens", "96", "--cached-tokens", "64",
        "--repeats", "1", "--hidden-size", "64", "--layers", "1",
        "--intermediate-size", "64"]) == 0
    result = json.loads(out.read_text())
    assert result["prompt_tokens"] == 96 and result["cached_tokens"] == 64
    assert result["ttft_cold_s"] > 0 and result["ttft_hit_s"] > 0
    assert result["same_first_token"] is True
    step = result["decode_step_metadata"]
    assert (step["decodes"], step["blocks_each"]) == (256, 500) and step["build_ms"] > 0
    with pytest.raises(ValueError, match="multiple of block_size"):
        bench_engine_torch.run_benchmark(96, 60, 1, bench_engine_torch.SMALL)


def test_bench_kernels_exits_clearly_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the benchmark would run for real")
    assert bench_kernels.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("case", [
    bench_kernels.Case("decode", ((23, 1), (23, 1), (23, 1)), 4, 2, 16, 4),
    bench_kernels.Case("prefill_cold", ((0, 19),), 4, 1, 16, 4),
    bench_kernels.Case("prefill_hit", ((12, 7),), 4, 2, 16, 4),
])
def test_sdpa_baseline_matches_reference(case: bench_kernels.Case) -> None:
    inp = bench_kernels.make_inputs(case, "cpu", torch.float32)
    scale = case.head_dim ** -0.5
    ref = reference.naive_attention(inp.query, inp.key_cache, inp.value_cache, inp.meta,
                                    scale)
    for expand in (False, True):
        got = bench_kernels.sdpa_as_tokens(bench_kernels.sdpa_runner(case, inp, expand)())
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
    assert bench_kernels.sdpa_baseline(case, inp)[1] == "native_gqa"
    assert bench_kernels.time_fn(bench_kernels.sdpa_runner(case, inp), 1, 2) > 0


def test_kernel_check_and_accounting_on_cpu() -> None:
    from engine.kernels import triton_ops

    case = bench_kernels.Case("mixed", ((0, 9), (5, 1), (8, 6)), 4, 2, 16, 4)

    def attention(*args: object) -> torch.Tensor:
        return triton_ops.paged_attention(*args, block_m=16, block_n=16)  # type: ignore[arg-type]

    assert bench_kernels.max_error(case, "cpu", torch.float32, attention) < 1e-4
    # pairs: 9*10/2 + (5 + 1) + (6*8 + 6*7/2) = 45 + 6 + 69
    assert case.flops() == 4 * 4 * 16 * 120
    # K+V over 9 + 6 + 14 context positions, Q+O over 16 query tokens, 2 bytes each
    assert case.bytes_moved(2) == (2 * 29 * 2 * 16 + 2 * 16 * 4 * 16) * 2
    decode = bench_kernels.TIMED_CASES[0]
    row = bench_kernels.summarize(decode, 1e-3, 2e-3, 2, 4.8e12)
    assert row["ours_vs_sdpa"] == 0.5 and row["fraction_of_hbm"] == pytest.approx(
        decode.bytes_moved(2) / 1e-3 / 4.8e12, abs=1e-3)
    assert decode.bytes_moved(2) == pytest.approx(2 * 64 * 4096 * 8 * 128 * 2, rel=0.01)
