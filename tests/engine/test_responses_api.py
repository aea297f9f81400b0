"""OpenAI's Responses API on the engine, through the official client: a response object
or its events, stored conversations continued by ``previous_response_id``, and through
the gateway to the replica that stored them."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.gateway_harness import Serve, start_gateway

MODEL = "tiny-sim"


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def test_a_response_and_its_continuation(live: LiveEngine) -> None:
    first = live.client.responses.create(model=MODEL, instructions="be brief",
                                         input="name a colour", max_output_tokens=4)
    assert first.id.startswith("resp_") and first.object == "response"
    assert first.status == "incomplete" and first.incomplete_details is not None
    assert first.output_text and first.usage is not None
    assert first.usage.output_tokens == 4
    # the chat it stands for: the same prompt as a chat completion's
    chat = live.http.post("/tokenize", json={"model": MODEL, "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "name a colour"}]}).json()
    assert first.usage.input_tokens == chat["count"]
    # instructions are not carried on (as OpenAI's): an agent sends them again
    second = live.client.responses.create(model=MODEL, instructions="be brief",
                                          input="and another?", previous_response_id=first.id,
                                          max_output_tokens=4)
    assert second.usage is not None and second.usage.input_tokens > first.usage.input_tokens
    # the stored conversation is the prefix the continuation computes again: cached
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 4
    with pytest.raises(openai.NotFoundError, match="resp_nowhere"):
        live.client.responses.create(model=MODEL, input="x", previous_response_id="resp_nowhere")
    unstored = live.client.responses.create(model=MODEL, input="x", store=False,
                                            max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        live.client.responses.create(model=MODEL, input="y", previous_response_id=unstored.id)
    # store read as vLLM's pydantic reads it, or a 400 naming it
    unstored = live.http.post("/v1/responses", json={"model": MODEL, "input": "x",
                                                     "store": "false", "max_output_tokens": 2})
    assert unstored.status_code == 200 and unstored.json()["store"] is False
    assert live.http.post("/v1/responses", json={
        "model": MODEL, "input": "y", "previous_response_id": unstored.json()["id"]}
        ).status_code == 404
    bad = live.http.post("/v1/responses", json={"model": MODEL, "input": "x", "store": "maybe"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "store"


def test_a_streamed_response_is_its_named_events(live: LiveEngine) -> None:
    events = list(live.client.responses.create(model=MODEL, input="count", stream=True,
                                               max_output_tokens=6))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-1] == "response.incomplete"  # its max_output_tokens reached
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == text and final.usage is not None
    assert final.usage.output_tokens == 6
    raw = live.http.post("/v1/responses", json={"model": MODEL, "input": "x",
                                                "stream": True, "max_output_tokens": 2})
    assert "[DONE]" not in raw.text and raw.text.endswith("\n\n")


def test_a_conversation_through_the_gateway_stays_where_it_is_stored(serve: Serve) -> None:
    engines = [serve_engine(LiveEngine, MODEL) for _ in range(2)]
    try:
        lives = [next(e) for e in engines]
        gw = start_gateway(serve, [(f"e{i}", live.url) for i, live in enumerate(lives)])
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0) as c:
            previous, served = None, set()
            for turn in range(4):  # round robin alone would send every other turn away
                raw = c.responses.with_raw_response.create(
                    model=MODEL, input=f"turn {turn}", previous_response_id=previous,
                    max_output_tokens=2)
                previous = raw.parse().id
                served.add(raw.headers["x-kvgate-replica"])
            assert len(served) == 1
        r = httpx.post(f"{gw.url}/v1/responses", json={"model": MODEL, "input": "x",
                                                       "previous_response_id": "resp_gone"})
        # no replica stores it: asked of each in turn, then the replica's 404
        assert r.status_code == 404 and "resp_gone" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "previous_response_id"
        # a gateway that saw none of them answered (another worker or copy, a restart):
        # each conversation is continued where it is stored, the replicas asked in turn
        other = start_gateway(serve, [(f"e{i}", live.url) for i, live in enumerate(lives)])
        starts = [httpx.post(f"{gw.url}/v1/responses", json={
            "model": MODEL, "input": f"chat {i}", "max_output_tokens": 2}) for i in range(2)]
        assert {s.headers["x-kvgate-replica"] for s in starts} == {"e0", "e1"}
        for start in starts:
            r = httpx.post(f"{other.url}/v1/responses", json={
                "model": MODEL, "input": "go on", "previous_response_id": start.json()["id"],
                "max_output_tokens": 2})
            assert r.status_code == 200, r.text
            assert r.headers["x-kvgate-replica"] == start.headers["x-kvgate-replica"]
    finally:
        for engine in engines:
            engine.close()


def test_a_response_cancelled_on_the_engine_ends_as_a_failed_one(live: LiveEngine) -> None:
    body = {"model": MODEL, "input": "go on", "stream": True, "max_output_tokens": 400}
    with live.http.stream("POST", "/v1/responses", json=body) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # created
        assert live.http.post("/abort_request", json={"abort_all": True}).status_code == 200
        datas = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    last = datas[-1]
    assert last["type"] == "response.failed" and last["response"]["status"] == "cancelled"
    assert last["response"]["error"] is None  # as OpenAI's: its error codes name failures


def test_an_input_image_is_an_image_not_its_addresses_text(live: LiveEngine) -> None:
    image = "data:image/png;base64," + "iVBORw0KGgo" * 20_000  # 220 KB of base64
    ask = [{"role": "user", "content": [{"type": "input_text", "text": "what is this?"},
                                        {"type": "input_image", "image_url": image}]}]
    done = live.client.responses.create(model=MODEL, input=ask,  # type: ignore[arg-type]
                                        max_output_tokens=2)
    assert done.usage is not None
    # the image's placeholder and the question, not tens of thousands of base64 tokens
    assert done.usage.input_tokens < 200
