"""SGLang's ``/generate`` bounds the alternatives each output token's log probability
comes with (``top_logprobs_num``) as the OpenAI routes bound ``logprobs``: at most 20,
not the whole vocabulary (each token's would be a list as long as it, in memory and in
every streamed event)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.openai_logprobs import MAX_LOGPROBS
from tests.support.engine_servers import LiveEngine, serve_engine


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, "tiny-sim")


def test_top_logprobs_num_past_the_bound_is_refused_naming_it(live: LiveEngine) -> None:
    body = {"text": "the native api", "return_logprob": True,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    ok = live.http.post("/generate", json={**body, "top_logprobs_num": MAX_LOGPROBS})
    assert ok.status_code == 200, ok.text
    tops = ok.json()["meta_info"]["output_top_logprobs"]
    assert len(tops) == 3 and all(len(t) == MAX_LOGPROBS for t in tops)
    vocab = live.server.vocab_size
    for asked in (MAX_LOGPROBS + 1, vocab, [1, vocab]):
        batch = isinstance(asked, list)
        r = live.http.post("/generate", json={
            **body, "text": ["a", "b"] if batch else body["text"], "top_logprobs_num": asked})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "top_logprobs_num"
        bad = asked[-1] if batch else asked
        assert f"[0, {MAX_LOGPROBS}], got {bad}" in error["message"]
