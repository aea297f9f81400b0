"""The torch executor's prompt log probabilities equal a plain torch computation over the
whole prompt's logits at once (``log_softmax`` of every position, the next token's value,
its rank and the top k), however the prefill is chunked, the rows are sliced, or a cached
prefix waits: a request asking for them computes every position."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.core import EngineCore
from engine.executor import SeqWork
from engine.executors.torch_executor import TorchExecutor
from engine.model.tiny import write_tiny_model
from engine.request import SamplingParams, TokenLogprob
from tests.support.torch_cores import torch_core

SHARED = [(7 * i + 3) % 250 + 5 for i in range(32)]  # two blocks of 16
PROMPT = [*SHARED, 11, 250, 42, 9, 77, 3, 18]
K = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", seed=3)


def _core(model_dir: Path, max_num_batched_tokens: int) -> EngineCore:
    return torch_core(model_dir, max_num_batched_tokens=max_num_batched_tokens)


def _reference(model_dir: Path) -> list[TokenLogprob]:
    """Every prompt position's logits at once, then log_softmax: position j's for token
    j + 1."""
    core = _core(model_dir, 8192)
    executor = core.executor
    assert isinstance(executor, TorchExecutor)
    logits = executor.last_logits([SeqWork("ref", PROMPT, 0, list(range(3)), True)],
                                  all_positions=True)
    logp = torch.log_softmax(logits.double(), dim=-1)
    out = []
    for j, token in enumerate(PROMPT[1:]):
        row = logp[j]
        values, ids = torch.topk(row, K)
        out.append(TokenLogprob(float(row[token]), tuple(zip(ids.tolist(), values.tolist(),
                                                             strict=True)),
                                int((row >= row[token]).sum())))
    return out


def _run(core: EngineCore, rid: str, prompt: list[int], k: int | None) -> tuple:
    core.add_request(core.make_request(rid, prompt, SamplingParams(
        max_tokens=2, ignore_eos=True, prompt_logprobs=k)))
    outs = []
    while core.has_unfinished():
        outs.extend(o for o in core.step().outputs if o.request_id == rid)
        core.check_integrity()
    return outs[0].num_cached_tokens, outs[0].prompt_logprobs


def test_prompt_logprobs_match_a_whole_prompt_log_softmax(model_dir: Path) -> None:
    expected = _reference(model_dir)
    core = _core(model_dir, max_num_batched_tokens=8)  # 39 tokens in five chunks
    executor = core.executor
    assert isinstance(executor, TorchExecutor)
    executor.prompt_logprob_elements = 3 * executor.config.vocab_size  # 3 rows a slice
    _run(core, "warm", [*SHARED, 1, 2], None)  # caches the shared blocks
    cached, got = _run(core, "scored", PROMPT, K)
    assert cached == 0 and got is not None and len(got) == len(PROMPT) - 1
    for g, e in zip(got, expected, strict=True):
        assert g.logprob == pytest.approx(e.logprob, abs=1e-4)
        assert g.rank == e.rank
        assert [t for t, _ in g.top] == [t for t, _ in e.top]
        assert [v for _, v in g.top] == pytest.approx([v for _, v in e.top], abs=1e-4)
    # a plain request after it reads the blocks it cached
    assert _run(core, "after", [*SHARED, 5], None)[0] == 32
