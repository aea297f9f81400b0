"""OpenAI's Responses API through the gateway: routed as the chat it carries, a
continuation sent where its response is stored, its usage and failures read."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from gateway.config import parse_config
from gateway.request_parse import parse_body
from gateway.responses_request import RESPONSE_HOMES, response_id
from gateway.state import build_state
from kvwire.bounded_memo import BoundedMemo
from kvwire.openai_schema import BadRequest
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Gateway, Serve, metric, start_gateway
from tests.support.waiting import wait_until

INSTRUCTIONS = "You are a contracts assistant. Answer from the agreement. " * 60
TOOLS = [{"type": "function", "name": "lookup", "description": "find a clause",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
         {"type": "web_search"}]


def test_a_responses_body_reads_as_its_chat() -> None:
    body = {"model": "m", "instructions": "be brief", "tools": TOOLS, "input": [
        {"role": "developer", "content": "cite clauses"},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "the term?"},
                     {"type": "input_image", "image_url": "https://x/y.png"}]},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": {"clause": 7}}]}
    parsed = parse_body(json.dumps(body).encode(), "responses")
    assert parsed.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "cite clauses"},
        {"role": "user", "content": [{"type": "text", "text": "the term?"}, {
            "type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"clause":7}'}]
    assert parsed.tools == [{"type": "function", "function": {
        "name": "lookup", "description": "find a clause", "parameters": TOOLS[0]["parameters"]}}]
    assert parse_body(b'{"model": "m", "input": "hi"}', "responses").messages == [
        {"role": "user", "content": "hi"}]
    for bad, param in (({"input": 3}, "input"), ({"input": [{"role": "boss"}]},
                                                   "input[0].role"),
                       ({"input": "x", "max_output_tokens": 0}, "max_output_tokens")):
        with pytest.raises(BadRequest) as err:
            parse_body(json.dumps({"model": "m", **bad}).encode(), "responses")
        assert err.value.param == param


def test_response_ids_are_read_and_their_homes_bounded() -> None:
    assert response_id(b'{"id":"resp_a1","object":"response"') == "resp_a1"
    assert response_id(b'event: response.created\ndata: {"response":{"id": "resp_b2"') \
        == "resp_b2"
    assert response_id(b'{"id":"my-request-7","object":"response"') == "my-request-7"
    assert response_id(b'{"object":"response","status":"failed"}') is None
    # not UTF-8: no id a client could send back (it failed the request, whose stream and
    # place were then never let go)
    assert response_id(b'{"id":"resp_\xff\xfe","object":"response"') is None
    gw = build_state(parse_config({"replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}]}))
    gw.router.close()
    assert gw.response_homes.capacity == RESPONSE_HOMES  # the latest ones kept, no more
    homes: BoundedMemo[str, str] = BoundedMemo(2)
    for i, replica in enumerate("abc"):
        homes.put(f"resp_{i}", replica)
    assert len(homes) == 2 and homes.get("resp_0", None) is None
    assert homes.get("resp_2", None) == "c"


def _fleet(serve: Serve, policy: str, n: int = 3) -> tuple[Gateway, list[Behaviour]]:
    replicas = [Behaviour(f"r{i}") for i in range(n)]
    gw = start_gateway(serve, [(b.name, serve(fake_replica(b)).url) for b in replicas],
                       policy={"name": policy})
    return gw, replicas


def test_an_agents_turns_go_where_its_instructions_and_tools_are_cached(serve: Serve) -> None:
    gw, replicas = _fleet(serve, "prefix_affinity")
    served = set()
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0) as client:
        for turn in range(6):
            raw = client.responses.with_raw_response.create(
                model="sim-model", instructions=INSTRUCTIONS,
                tools=TOOLS,  # type: ignore[arg-type]
                input=f"question {turn}: what is the notice period?")
            assert raw.headers["x-kvgate-route"] != "passthrough"
            served.add(raw.headers["x-kvgate-replica"])
            assert raw.parse().output_text == "t0 t1 t2"
    assert len(served) == 1
    (home,) = served
    body = json.loads(next(b for b in replicas if b.name == home).received[-1])
    assert body["instructions"] == INSTRUCTIONS and body["tools"] == TOOLS  # as sent


def test_a_continuation_goes_where_its_response_is_stored_and_usage_and_failures_count(
        serve: Serve) -> None:
    gw, replicas = _fleet(serve, "round_robin", n=2)
    first = httpx.post(f"{gw.url}/v1/responses", json={"model": "sim-model", "input": "hi"})
    home, previous = first.headers["x-kvgate-replica"], first.json()["id"]
    for turn in range(4):  # round robin would send each to the next replica
        stream = turn % 2 == 1
        r = httpx.post(f"{gw.url}/v1/responses", json={
            "model": "sim-model", "input": f"and {turn}?", "previous_response_id": previous,
            "stream": stream})
        assert r.status_code == 200 and r.headers["x-kvgate-replica"] == home
        previous = response_id(r.content) or ""
        assert previous.startswith(f"resp_{home}")
    # a response this gateway never saw: routed as any other
    r = httpx.post(f"{gw.url}/v1/responses", json={
        "model": "sim-model", "input": "x", "previous_response_id": "resp_elsewhere"})
    assert r.status_code == 200
    # each answer's input tokens (10, 4 of them cached), whole or streamed
    wait_until(lambda: metric(gw, 'kvgate_prompt_tokens_total{route="round_robin"}') == 60,
               5, "every answer's input tokens counted")
    assert metric(gw, 'kvgate_cached_prompt_tokens_total{route="round_robin"}') == 24
    for replica in replicas:
        replica.response_failed = True
    r = httpx.post(f"{gw.url}/v1/responses", json={"model": "sim-model", "input": "x",
                                                   "stream": True})
    assert r.status_code == 200 and "response.failed" in r.text  # relayed as it came
    failed = r.headers["x-kvgate-replica"]
    series = f'kvgate_requests_total{{replica="{failed}",route="round_robin",status="502"}}'
    wait_until(lambda: metric(gw, series) == 1, 5, "the failed response counted")
    # a stream that ends before its last event was cut: the client is told, as OpenAI's
    # client reads an error (a data event with an "error" object)
    for replica in replicas:
        replica.response_failed, replica.done = False, False
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0) as client, \
            pytest.raises(openai.APIError, match="incomplete"):
        for _ in client.responses.create(model="sim-model", input="x", stream=True):
            pass
    def cuts() -> float:
        return sum(metric(gw, f'kvgate_upstream_cuts_total{{cause="cut_short",replica="{b.name}"}}')
                   or 0.0 for b in replicas)

    wait_until(lambda: cuts() == 1, 5, "the cut counted")


def test_a_continuation_waits_at_its_home_past_the_queue_bound(serve: Serve) -> None:
    # the only replica that can continue a response: elsewhere it fails for sure
    replicas = [Behaviour(f"r{i}") for i in range(2)]
    gw = start_gateway(serve, [(b.name, serve(fake_replica(b)).url) for b in replicas],
                       limits={"max_queued_tokens_per_replica": 1})
    first = httpx.post(f"{gw.url}/v1/responses", json={"model": "sim-model", "input": "hi"})
    home, previous = first.headers["x-kvgate-replica"], first.json()["id"]
    held = next(b for b in replicas if b.name == home)
    held.hold = threading.Event()
    body = {"model": "sim-model", "input": "more", "previous_response_id": previous}
    answers: list[httpx.Response] = []
    senders = [threading.Thread(target=lambda: answers.append(
        httpx.post(f"{gw.url}/v1/responses", json=body, timeout=30))) for _ in range(2)]
    try:
        senders[0].start()
        wait_until(lambda: len(held.received) == 2, 5, "the first continuation at its home")
        senders[1].start()  # its home's queue is past the bound now
        wait_until(lambda: len(held.received) == 3, 5, "the second one at its home too")
    finally:
        held.hold.set()
        for sender in senders:
            sender.join(30)
    assert [a.headers["x-kvgate-replica"] for a in answers] == [home, home]
