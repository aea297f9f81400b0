"""A Responses request's ``include`` is a list of strings, as vLLM's schema takes it: any
other value is a 400 naming the field and the value, and each entry asking for log
probabilities (which this engine does not give on /v1/responses) is refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
LOGPROBS = "message.output_text.logprobs"


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _post(live: LiveEngine, include: Any) -> tuple[int, dict[str, Any]]:
    r = live.http.post("/v1/responses", json={"model": MODEL, "input": "hi",
                                              "max_output_tokens": 2, "include": include})
    return r.status_code, r.json()


@pytest.mark.parametrize(("include", "named"), [
    (LOGPROBS, f"'{LOGPROBS}'"), ({"logs": LOGPROBS}, "{'logs'}"), (3, "got 3")])
def test_an_include_that_is_no_list_is_refused_naming_it(live: LiveEngine, include: Any,
                                                         named: str) -> None:
    status, body = _post(live, include)
    assert status == 400, body
    assert body["error"]["param"] == "include" and named in body["error"]["message"]


def test_each_entry_of_include_is_a_string_and_none_asks_for_logprobs(
        live: LiveEngine) -> None:
    status, body = _post(live, ["reasoning.encrypted_content", 7])
    assert status == 400 and body["error"]["param"] == "include", body
    assert "got 7" in body["error"]["message"]
    status, body = _post(live, [None])
    assert status == 400 and body["error"]["param"] == "include", body
    status, body = _post(live, ["reasoning.encrypted_content", LOGPROBS])
    assert status == 400 and body["error"]["param"] == "include", body
    assert "log probabilities" in body["error"]["message"]
    # what it may ask, or nothing
    for include in (["reasoning.encrypted_content"], [], None):
        status, body = _post(live, include)
        assert status == 200 and body["status"] == "incomplete", body
