"""The torch executor samples as vLLM does: the sampling fields change what is sampled,
a seed of any 64-bit value or a temperature near 0 cannot stop the engine, and without
a seed each request is sampled afresh."""

from __future__ import annotations

import math

import pytest
import torch

from engine.core import EngineCore
from engine.executors.torch_executor import adjust_logits, truncate
from engine.model.tiny import write_tiny_model
from engine.request import SamplingParams, TokenLogprob
from tests.support.torch_cores import torch_core

PROMPT = [5, 17, 42, 99, 7, 3, 250, 11]


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> EngineCore:
    return torch_core(write_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", seed=1))


def generate(core: EngineCore, **params: object) -> list[int]:
    rid = f"r{generate.count}"  # type: ignore[attr-defined]
    generate.count += 1  # type: ignore[attr-defined]
    core.add_request(core.make_request(rid, PROMPT, SamplingParams(
        max_tokens=8, ignore_eos=True, **params)))  # type: ignore[arg-type]
    tokens: list[int] = []
    while core.has_unfinished():
        for out in core.step().outputs:
            tokens.extend(out.new_token_ids)
    return tokens


generate.count = 0  # type: ignore[attr-defined]


def test_any_64_bit_seed_and_a_temperature_near_zero_sample(core: EngineCore) -> None:
    greedy = generate(core, temperature=0.0)
    for seed in (2**63 - 1, -(2**63), 10**13):
        assert len(generate(core, temperature=1.0, seed=seed)) == 8
    assert generate(core, temperature=1e-40, seed=1) == greedy  # below 1e-5: greedy
    assert generate(core, temperature=1.0, seed=9) == generate(core, temperature=1.0, seed=9)


def test_each_token_comes_with_its_log_probability_under_the_sampled_distribution(
        core: EngineCore) -> None:
    vocab = core.executor.config.vocab_size  # type: ignore[attr-defined]

    def first(**params: object) -> TokenLogprob:
        rid = f"lp{generate.count}"  # type: ignore[attr-defined]
        generate.count += 1  # type: ignore[attr-defined]
        core.add_request(core.make_request(rid, PROMPT, SamplingParams(
            max_tokens=2, ignore_eos=True, logprobs=vocab, **params)))  # type: ignore[arg-type]
        outs = []
        while core.has_unfinished():
            outs.extend(o for o in core.step().outputs if o.request_id == rid)
        assert all(len(o.logprobs) == len(o.new_token_ids) == 1 for o in outs)
        token, lp = outs[0].new_token_ids[0], outs[0].logprobs[0]
        assert dict(lp.top)[token] == pytest.approx(lp.logprob)
        return lp

    greedy = first(temperature=0.0)
    ranked = [v for _, v in greedy.top]
    assert len(ranked) == vocab and ranked == sorted(ranked, reverse=True)
    assert math.fsum(math.exp(v) for v in ranked) == pytest.approx(1.0, abs=1e-4)
    assert greedy.logprob == ranked[0]  # greedy takes the most likely token
    # at temperature 2 the same logits give log_softmax(logits / 2)
    hot = first(temperature=2.0, seed=3)
    logits = torch.tensor([v for _, v in sorted(greedy.top)])
    expected = torch.log_softmax(logits / 2.0, dim=-1)
    got = torch.tensor([v for _, v in sorted(hot.top)])
    assert torch.allclose(got, expected, atol=1e-4)


def test_top_k_top_p_and_min_p_narrow_the_draw(core: EngineCore) -> None:
    greedy = generate(core, temperature=0.0)
    hot = {"temperature": 100.0, "seed": 4}  # nearly flat: any token could come
    assert generate(core, **hot) != greedy
    for narrow in ({"top_k": 1}, {"top_p": 1e-9}, {"min_p": 1.0}):
        assert generate(core, **hot, **narrow) == greedy, narrow


def test_without_a_seed_each_request_is_sampled_afresh(core: EngineCore) -> None:
    draws = {tuple(generate(core, temperature=100.0)) for _ in range(3)}
    assert len(draws) > 1


def test_logit_bias_steers_the_draw(core: EngineCore) -> None:
    assert generate(core, temperature=0.0, logit_bias=((123, 100.0),)) == [123] * 8


def test_penalties_and_min_tokens_adjust_the_logits() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5, 0.0])
    history = [0, 1, 1, 3]  # prompt [0, 1], output [1, 3]
    rep = adjust_logits(logits, SamplingParams(repetition_penalty=2.0), history, 2,
                        frozenset())
    assert rep.tolist() == [1.0, -4.0, 1.0, 0.25, 0.0]  # seen: positive halved, negative doubled
    pen = adjust_logits(logits, SamplingParams(frequency_penalty=1.0, presence_penalty=0.5),
                        history, 2, frozenset())
    assert pen.tolist() == [2.0, -3.5, 1.0, -1.0, 0.0]  # output counts only
    eos = adjust_logits(logits, SamplingParams(max_tokens=8, min_tokens=3,
                                               stop_token_ids=(2,)), history, 2,
                        frozenset({4}))
    assert eos[2] == eos[4] == -math.inf and eos[0] == 2.0  # 2 outputs < 3
    done = adjust_logits(logits, SamplingParams(max_tokens=8, min_tokens=2), history, 2,
                         frozenset({4}))
    assert done.tolist() == logits.tolist()


def test_truncate_keeps_the_top_p_mass_and_min_p() -> None:
    probs = torch.tensor([0.1, 0.5, 0.25, 0.15])
    kept = truncate(probs, SamplingParams(top_p=0.7))
    assert kept.tolist() == pytest.approx([0.0, 0.5, 0.25, 0.0])  # 0.5 < 0.7 <= 0.75
    assert truncate(probs, SamplingParams(min_p=0.4)).tolist() == pytest.approx(
        [0.0, 0.5, 0.25, 0.0])  # at least 0.4 x 0.5
    assert truncate(probs, SamplingParams(top_k=2)).tolist() == pytest.approx(
        [0.0, 0.5, 0.25, 0.0])


def test_extreme_penalties_sample_and_the_engine_goes_on(core: EngineCore) -> None:
    # 1e-40 divides positive logits to inf (a NaN softmax, which multinomial refused,
    # stopping the engine); 1e30 multiplies negative ones to -inf
    for params in ({"repetition_penalty": 1e-40}, {"repetition_penalty": 1e-40, "seed": 3},
                   {"repetition_penalty": 1e30, "seed": 3, "top_p": 0.5, "logprobs": 2},
                   {"repetition_penalty": 1e-40, "temperature": 0.0}):
        tokens = generate(core, **{"temperature": 1.0, **params})
        assert len(tokens) == 8, params
    # the prompt's tokens have inf logits under 1e-40: it draws among them alone
    assert set(generate(core, temperature=1.0, repetition_penalty=1e-40, seed=5)) \
        <= set(PROMPT)
    assert core.has_unfinished() is False and len(generate(core, temperature=0.0)) == 8


def test_non_finite_logits_are_read_as_their_limits() -> None:
    from engine.executors.torch_executor import finite_logits, token_logprob

    inf, nan = math.inf, math.nan
    row = finite_logits(torch.tensor([1.0, inf, nan, -inf, inf]))
    probs = (row - row.max()).softmax(-1)
    assert probs.tolist() == [0.0, 0.5, 0.0, 0.0, 0.5]
    assert finite_logits(torch.tensor([nan, nan])).tolist() == [0.0, 0.0]
    lp = token_logprob(torch.tensor([3e38, -3e38, 0.0]), 0, 1e-4, 2)
    assert lp.logprob == 0.0 and all(math.isfinite(v) for _, v in lp.top[:1])
