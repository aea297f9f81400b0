"""Prompt log probabilities through the engine core (sim executor): every prompt token
after the first gets one entry, once, however its prefill is chunked or recomputed after a
preemption; such a request finds no prefix hit (cached positions have no logits, as in
vLLM V1) yet caches its blocks for the requests after it."""

from __future__ import annotations

import math

from engine.core import EngineCore
from engine.request import RequestOutput, SamplingParams
from tests.support.engine_cores import make_core, run_all

SPAN = 100  # make_core's sim draws from [100, 200)


def _add(core: EngineCore, rid: str, prompt: list[int], k: int | None, max_tokens: int = 1
         ) -> None:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, prompt_logprobs=k)
    core.add_request(core.make_request(rid, prompt, params))


def _prompt_entries(outs: list[RequestOutput]) -> list[tuple[int, list[int]]]:
    """The (rank, alternative ids) of each prompt entry, which only the first output has."""
    assert all(o.prompt_logprobs is None for o in outs[1:])
    entries = outs[0].prompt_logprobs
    assert entries is not None
    assert all(e.logprob == -math.log(SPAN) for e in entries)
    return [(e.rank or 0, [t for t, _ in e.top]) for e in entries]


def test_a_chunked_prefill_yields_each_prompt_token_once_in_order() -> None:
    core = make_core(num_blocks=32, max_num_batched_tokens=5)  # 23 tokens: five chunks
    prompt = list(range(120, 143))
    _add(core, "a", prompt, k=2)
    _add(core, "plain", [150, 151, 152], k=None)
    outs = run_all(core)
    entries = _prompt_entries(outs["a"])
    # the sim stands a prompt token in as if drawn there: rank 1, the ids after it next
    assert entries == [(1, [t, t + 1]) for t in prompt[1:]]
    assert outs["plain"][0].prompt_logprobs is None


def test_a_request_preempted_mid_prefill_keeps_one_entry_per_prompt_token() -> None:
    prompt = list(range(120, 140))  # 5 blocks of 4, prefilled 3 tokens a step
    alone = make_core(num_blocks=16, max_num_batched_tokens=4)
    _add(alone, "b", prompt, k=1)
    expected = _prompt_entries(run_all(alone)["b"])
    assert len(expected) == len(prompt) - 1

    # a decodes into the blocks b's prefill needs: b is preempted and recomputed, and its
    # chunks bring again the entries it holds already
    core = make_core(num_blocks=6, max_num_batched_tokens=4)
    _add(core, "a", [1] * 4, k=1, max_tokens=16)
    _add(core, "b", prompt, k=1)
    outs = run_all(core)
    assert core.stats.num_preemptions >= 1
    assert _prompt_entries(outs["b"]) == expected


def test_a_request_asking_for_prompt_logprobs_skips_the_cache_but_fills_it() -> None:
    core = make_core(num_blocks=32)
    shared = list(range(110, 122))  # three blocks of 4
    _add(core, "warm", [*shared, 1], k=None)
    run_all(core)
    _add(core, "scored", [*shared, 2, 3], k=0)
    scored = run_all(core)["scored"]
    assert scored[0].num_cached_tokens == 0  # the cached blocks were not read
    assert len(_prompt_entries(scored)) == 13
    fresh = list(range(130, 142))
    _add(core, "first", [*fresh, 1], k=0)
    run_all(core)
    _add(core, "after", [*fresh, 2], k=None)
    assert run_all(core)["after"][0].num_cached_tokens == 12  # its blocks were cached
    core.check_integrity()
