"""``vllm:prompt_tokens`` counts a request's prompt when its prefill completes (its first
token, or a pooling request's output), as vLLM v1's ``IterationStats`` does: not when it
is admitted, so a scrape mid-prefill, or after a request aborted before its first token,
does not count prompt tokens never computed."""

from __future__ import annotations

from prometheus_client import generate_latest

from engine.metrics import EngineMetrics
from kvwire import metric_names as m
from tests.support.engine_cores import add, make_core, run_all
from tests.support.metrics import samples

KEY = (("engine", "0"), ("model_name", "tiny-sim"))


def test_prompt_tokens_counted_at_first_token_not_at_admission() -> None:
    core = make_core(num_blocks=32, max_num_batched_tokens=8, max_num_seqs=1)
    metrics = EngineMetrics(core, "tiny-sim")

    def scraped() -> float:
        return samples(generate_latest(metrics.registry).decode())[
            (m.PROMPT_TOKENS + "_total", KEY)]

    add(core, "a", list(range(20)), max_tokens=2)
    add(core, "b", list(range(50, 56)), max_tokens=2)
    assert core.step(0.0).num_tokens == 8  # a admitted: [0, 8) of its 20 computed
    assert scraped() == 0
    assert core.abort_request("a")  # aborted mid-prefill: its prompt never counted
    assert core.step(0.0).num_tokens == 6
    assert scraped() == 6  # b's prefill done: its first token
    run_all(core)
    assert scraped() == 6 and core.stats.prompt_tokens == 6

    add(core, "c", list(range(100, 120)), max_tokens=1)
    steps = []
    while core.has_unfinished():
        out = core.step(0.0)
        steps.append((len(out.outputs), scraped()))
        core.check_integrity()
    assert steps == [(0, 6), (0, 6), (1, 26)]  # counted with the output of its first token
