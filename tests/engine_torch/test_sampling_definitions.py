"""The torch executor's top-k, top-p and min-p cuts against vLLM's definitions, written
here from them (logits space: min-p on the full distribution, top-k by the k-th logit,
top-p on the softmax of what top-k kept), and a seeded request's draws are its own
whatever it is batched with."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from engine.core import EngineCore
from engine.executors.torch_executor import truncate
from engine.model.tiny import write_tiny_model
from engine.request import SamplingParams
from tests.support.torch_cores import torch_core


def vllm_kept(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> set[int]:
    """The tokens vLLM's sampler can draw from ``logits`` (temperature applied)."""
    logits = logits.clone().double()
    if min_p > 0:
        probs = logits.softmax(-1)
        logits[probs < min_p * probs.max()] = -math.inf
    ordered, order = logits.sort(descending=False)
    if top_k > 0:
        ordered[ordered < ordered[len(ordered) - top_k]] = -math.inf
    if top_p < 1:
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - top_p
        drop[-1] = False  # at least one
        ordered[drop] = -math.inf
    return {int(order[i]) for i in range(len(order)) if ordered[i] > -math.inf}


def test_top_p_cuts_what_top_k_kept_renormalised() -> None:
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    # top-k 2 keeps 0.4 and 0.3, i.e. 4/7 and 3/7: 4/7 alone reaches top_p 0.5
    kept = truncate(probs, SamplingParams(top_k=2, top_p=0.5))
    assert kept.tolist() == pytest.approx([0.4, 0.0, 0.0, 0.0])
    assert vllm_kept(probs.log(), 2, 0.5, 0.0) == {0}
    # min-p 0.6 keeps 0.4 and 0.3 (not below 0.24); 0.4 is 4/7 of them, past top_p 0.55
    kept = truncate(probs, SamplingParams(min_p=0.6, top_p=0.55))
    assert kept.tolist() == pytest.approx([0.4, 0.0, 0.0, 0.0])
    assert vllm_kept(probs.log(), 0, 0.55, 0.6) == {0}


@pytest.mark.parametrize("seed", range(6))
def test_truncate_keeps_what_vllm_keeps(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(50, generator=gen) * (1 + seed)
    probs = logits.softmax(-1)
    for top_k, top_p, min_p in itertools.product((0, 1, 3, 17), (1.0, 0.9, 0.5, 0.1),
                                                 (0.0, 0.05, 0.3)):
        params = SamplingParams(top_k=top_k, top_p=top_p, min_p=min_p)
        kept = truncate(probs, params)
        assert set(kept.nonzero()[:, 0].tolist()) == vllm_kept(logits, top_k, top_p, min_p), \
            (top_k, top_p, min_p)
        assert torch.equal(kept[kept > 0], probs[kept > 0])  # kept as they were


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> EngineCore:
    return torch_core(write_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", seed=2,
                                       hidden_size=32, heads=2, kv_heads=1,
                                       intermediate_size=32, layers=1))


def _run(core: EngineCore, requests: dict[str, tuple[list[int], SamplingParams]]
         ) -> dict[str, list[int]]:
    for rid, (prompt, params) in requests.items():
        core.add_request(core.make_request(rid, prompt, params))
    out: dict[str, list[int]] = {rid: [] for rid in requests}
    while core.has_unfinished():
        for o in core.step().outputs:
            out[o.request_id].extend(o.new_token_ids)
    return out


def test_a_seeded_request_draws_the_same_alone_or_batched(core: EngineCore) -> None:
    seeded = SamplingParams(max_tokens=6, ignore_eos=True, temperature=1.3, seed=11,
                            top_p=0.95, top_k=50, min_p=0.01)
    prompt = [7, 300, 41, 2048, 9, 15]
    alone = _run(core, {"a1": (prompt, seeded)})["a1"]
    other = SamplingParams(max_tokens=9, ignore_eos=True, temperature=1.0)
    batched = _run(core, {"b0": ([5, 6, 7, 8, 9, 10, 11], other), "b1": (prompt, seeded),
                          "b2": ([100, 200], other)})["b1"]
    assert len(alone) == 6 and batched == alone
    reseeded = SamplingParams(max_tokens=6, ignore_eos=True, temperature=1.3, seed=12,
                              top_p=0.95, top_k=50, min_p=0.01)
    assert any(_run(core, {f"c{i}": (prompt, reseeded)})[f"c{i}"] != alone
               for i in range(3)) or len(set(alone)) == 1
