"""Our model against transformers' LlamaForCausalLM / Qwen2ForCausalLM on the same random
weights (fp32). Tolerance: |diff| <= 1e-4 + 1e-4 * |ref| on logits of order 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.executor import Batch, SeqWork
from engine.executors.torch_executor import TorchExecutor
from engine.model.loader import load_model
from tests.support.hf_models import VOCAB, build_hf_model

BLOCK = 4
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[torch.nn.Module, Path]:
    out = tmp_path_factory.mktemp(request.param)
    return build_hf_model(request.param, out), out


def _executor(model_dir: Path, backend: str = "torch") -> TorchExecutor:
    return TorchExecutor(load_model(model_dir, backend=backend), num_blocks=48,
                         block_size=BLOCK)


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _blocks(first: int, n_tokens: int) -> list[int]:
    return list(range(first, first + -(-n_tokens // BLOCK)))


@torch.no_grad()
def _hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids])).logits[0].float()


def test_prompt_logits_match(pair: tuple[torch.nn.Module, Path]) -> None:
    hf, model_dir = pair
    ids = _prompt(19, 1)
    ours = _executor(model_dir).last_logits(
        [SeqWork("a", ids, 0, _blocks(0, 19), True)], all_positions=True)
    torch.testing.assert_close(ours, _hf_logits(hf, ids), **TOL)


def test_decode_steps_and_greedy_generation_match(pair: tuple[torch.nn.Module, Path]
                                                  ) -> None:
    hf, model_dir = pair
    ex = _executor(model_dir)
    ids = _prompt(13, 2)
    blocks = _blocks(5, 13 + 8)
    ours_seq, hf_seq = list(ids), list(ids)
    start, new = 0, list(ids)
    for _ in range(8):
        logits = ex.last_logits([SeqWork("a", new, start, blocks, True)])[0]
        ref = _hf_logits(hf, hf_seq)[-1]
        torch.testing.assert_close(logits, ref, **TOL)
        start += len(new)
        new = [int(logits.argmax())]
        ours_seq += new
        hf_seq.append(int(ref.argmax()))
    assert ours_seq == hf_seq


def test_prefix_hit_and_chunked_prefill_equal_cold(pair: tuple[torch.nn.Module, Path]
                                                   ) -> None:
    _, model_dir = pair
    ex = _executor(model_dir)
    shared, tail = _prompt(16, 3), _prompt(7, 4)
    prompt = shared + tail
    cold = ex.last_logits([SeqWork("cold", prompt, 0, _blocks(0, 23), True)])
    # a first request leaves the shared 4 blocks cached ...
    ex.last_logits([SeqWork("warm", [*shared, 9, 9], 0, _blocks(10, 18), True)])
    # ... and a second one reuses them (hit on a block boundary), new blocks for the tail
    hit_blocks = _blocks(10, 16) + _blocks(20, 7)
    hit = ex.last_logits([SeqWork("hit", tail, 16, hit_blocks, True)])
    torch.testing.assert_close(hit, cold, **TOL)
    # chunked prefill with chunks that end mid-block
    blocks = _blocks(30, 23)
    for lo in range(0, 20, 5):
        ex.last_logits([SeqWork("chunked", prompt[lo:lo + 5], lo, blocks, False)])
    chunked = ex.last_logits([SeqWork("chunked", prompt[20:], 20, blocks, True)])
    torch.testing.assert_close(chunked, cold, **TOL)


def test_mixed_batch_equals_separate_steps(pair: tuple[torch.nn.Module, Path]) -> None:
    _, model_dir = pair
    a, b = _prompt(9, 5), _prompt(6, 6)
    alone = _executor(model_dir)
    la = alone.last_logits([SeqWork("a", a, 0, _blocks(0, 10), True)])
    lb = alone.last_logits([SeqWork("b", b, 0, _blocks(4, 6), True)])
    batched = _executor(model_dir)
    batched.last_logits([SeqWork("a", a[:8], 0, _blocks(0, 10), False)])
    both = batched.last_logits([SeqWork("a", a[8:], 8, _blocks(0, 10), True),
                                SeqWork("b", b, 0, _blocks(4, 6), True)])
    torch.testing.assert_close(both, torch.cat([la, lb]), **TOL)


def test_triton_backend_matches_torch_backend(pair: tuple[torch.nn.Module, Path]) -> None:
    _, model_dir = pair
    ids = _prompt(11, 7)
    results = []
    for backend in ("torch", "triton"):
        ex = _executor(model_dir, backend)
        first = ex.last_logits([SeqWork("a", ids[:8], 0, _blocks(0, 12), False)],
                               all_positions=True)
        rest = ex.last_logits([SeqWork("a", ids[8:], 8, _blocks(0, 12), True)],
                              all_positions=True)
        results.append(torch.cat([first, rest]))
    torch.testing.assert_close(results[1], results[0], atol=2e-5, rtol=2e-5)


def test_execute_greedy_and_seeded_sampling(pair: tuple[torch.nn.Module, Path]) -> None:
    _, model_dir = pair
    ex = _executor(model_dir)
    ids = _prompt(10, 8)
    greedy = ex.execute(Batch((SeqWork("g", ids, 0, _blocks(0, 10), True),
                               SeqWork("skip", ids[:3], 0, _blocks(3, 3), False))))
    assert set(greedy.next_tokens) == {"g"} and greedy.seconds > 0
    expected = int(ex.last_logits([SeqWork("g", ids, 0, _blocks(0, 10), True)])[0].argmax())
    assert greedy.next_tokens["g"] == expected
    prefill_only = ex.execute(Batch((SeqWork("p", ids[:5], 0, _blocks(6, 5), False),)))
    assert prefill_only.next_tokens == {}
    assert ex.execute(Batch(())).next_tokens == {}
    draws = [ex.execute(Batch((SeqWork("t", ids, 0, _blocks(0, 10), True, seed=s,
                                       temperature=1.5),))).next_tokens["t"]
             for s in (1, 1, 2, 3, 4, 5)]
    assert draws[0] == draws[1]
    assert len(set(draws)) > 1
    assert ex.eos_token_id in (1, 3)
