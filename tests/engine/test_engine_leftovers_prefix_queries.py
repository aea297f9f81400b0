"""A request asking for its prompt's log probabilities skips reading the prefix cache:
the served engine leaves its prompt out of ``vllm:prefix_cache_queries`` (as vLLM does),
so it does not dilute the hit rate, while it still counts as prompt tokens."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.metrics import samples

MODEL = "tiny"


@pytest.fixture
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _counter(live: LiveEngine, name: str) -> float:
    found = [v for (n, _labels), v in samples(live.http.get("/metrics").text).items()
             if n == name]
    assert len(found) == 1, (name, found)
    return found[0]


def test_prompt_logprobs_requests_are_no_prefix_cache_queries(live: LiveEngine) -> None:
    prompt = [300 + i for i in range(20)]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    assert live.http.post("/v1/completions", json=body).status_code == 200
    # the prompt is cached now: the one asking for prompt log probabilities reads nothing
    r = live.http.post("/v1/completions", json={**body, "prompt_logprobs": 1})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert live.http.post("/v1/completions", json=body).status_code == 200
    assert _counter(live, "vllm:prompt_tokens_total") == 3 * 20
    assert _counter(live, "vllm:prefix_cache_queries_total") == 2 * 20
    # the third finds the first's 4 full blocks of 4 (the last token is always computed)
    assert _counter(live, "vllm:prefix_cache_hits_total") == 16
