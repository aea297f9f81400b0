"""Pooling requests (embeddings) in the engine core: they end when their prompt is
computed, with no output token, charged as a prefill by the sim cost model, and they use
and fill the prefix cache like any prompt."""

from __future__ import annotations

import pytest

from engine.cost_model import CostModel
from engine.request import SamplingParams
from tests.support.engine_cores import TINY_GPU, TINY_MODEL, make_core, run_all

POOL = SamplingParams(pooling=True)


def test_a_pooling_request_finishes_after_its_prefill_with_no_token() -> None:
    core = make_core(num_blocks=16, block_size=4)
    prompt = list(range(10, 23))  # 13 tokens
    core.add_request(core.make_request("e", prompt, POOL), now=1.0)
    step = core.step(now=1.0)
    core.check_integrity()
    assert not core.has_unfinished()
    (out,) = step.outputs
    assert out.new_token_ids == () and out.finish_reason == "stop"
    assert out.num_prompt_tokens == 13 and out.num_output_tokens == 0
    assert out.first_token_time is None and out.first_scheduled_time == 1.0
    assert out.finish_time == pytest.approx(1.0 + step.seconds)
    # charged as a prefill of its 13 tokens: the cost model's time for that step
    assert step.seconds == CostModel(TINY_MODEL, TINY_GPU).step_seconds([(0, 13)])
    stats = core.stats
    assert stats.generation_tokens == 0 and stats.prompt_tokens == 13
    assert stats.num_requests_finished == 1 and core.kv.pool.num_free_blocks == 16


def test_pooling_hits_the_prefix_cache_and_leaves_its_blocks_cached() -> None:
    core = make_core(num_blocks=16, block_size=4)
    prompt = list(range(10, 23))
    core.add_request(core.make_request("a", prompt, POOL))
    first = run_all(core)["a"][-1]
    core.add_request(core.make_request("b", prompt, POOL))
    again = run_all(core)["b"][-1]
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == 12  # hits stop short of the prompt's last token
    # a completion of the same prompt finds it too
    core.add_request(core.make_request("c", prompt, SamplingParams(max_tokens=2)))
    assert run_all(core)["c"][-1].num_cached_tokens == 12


def test_long_pooling_prompts_are_chunked_and_batched_with_decodes() -> None:
    core = make_core(num_blocks=64, block_size=4, max_num_batched_tokens=8)
    core.add_request(core.make_request("gen", [5, 6, 7], SamplingParams(max_tokens=6,
                                                                       ignore_eos=True)))
    core.add_request(core.make_request("emb", list(range(100, 130)), POOL))
    outs = run_all(core)
    assert len(outs["emb"]) == 1 and outs["emb"][0].finish_reason == "stop"
    assert outs["gen"][-1].num_output_tokens == 6
    assert core.stats.num_steps >= 30 // 8


def test_a_pooling_prompt_may_fill_the_whole_context() -> None:
    core = make_core(num_blocks=64, block_size=4, max_model_len=32)
    core.add_request(core.make_request("full", list(range(32)), POOL))
    assert run_all(core)["full"][-1].num_prompt_tokens == 32
    with pytest.raises(ValueError, match="maximum context length is 32"):
        core.add_request(core.make_request("over", list(range(33)), POOL))
    with pytest.raises(ValueError, match="at least one output token"):
        core.add_request(core.make_request("gen", list(range(32)), SamplingParams()))
    with pytest.raises(ValueError, match="KV cache"):
        make_core(num_blocks=4, block_size=4).validate(20, 0, pooling=True)
