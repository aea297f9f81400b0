"""The gateway in front of replicas it did not write: what vLLM and SGLang really send."""

from __future__ import annotations

import gzip
import json
import logging

import httpx
import pytest
import zmq

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from policies.kv_index import KVIndex
from tests.support import foreign_vllm as vllm
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.foreign_raw import raw_replica
from tests.support.gateway_harness import Gateway, Serve, metric, start_gateway
from tests.support.servers import free_port
from tests.support.waiting import wait_until, wait_until_async

CHAIN = list(range(48))  # three blocks of 16
OTHER = list(range(100, 116))


async def test_blocks_offloaded_to_cpu_and_evicted_there_stay_on_the_gpu() -> None:
    """vLLM's KV offloading publishes its CPU copies, and their eviction, on the GPU's
    stream under the same hashes: neither is a change to the GPU's prefix cache."""
    ctx = zmq.Context()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1", kv_events=endpoint)])
    index = KVIndex(16)
    sub = KVEventSubscriber(fleet, index, reconcile_s=0.05)
    await sub.start()
    hashes: list[int | bytes] = [2**63 + 1, 2, b"\x07" * 32]
    try:
        first = vllm.kv_message(0, [vllm.block_stored(hashes, None, CHAIN)])
        await wait_until_async(lambda: index.match([*CHAIN, 1], ["r0"]) == {"r0": 3}, 10,
                               "the GPU's blocks in the index",
                               retry=lambda: pub.send_multipart(first))
        pub.send_multipart(vllm.kv_message(1, [vllm.offloaded(hashes)]))
        pub.send_multipart(vllm.kv_message(2, [vllm.block_removed(hashes[1:], "CPU")]))
        pub.send_multipart(vllm.kv_message(3, [vllm.block_stored([9], None, OTHER)]))
        await wait_until_async(lambda: index.match([*OTHER, 1], ["r0"]) == {"r0": 1}, 10,
                               "the messages after the offload applied")
        assert index.match([*CHAIN, 1], ["r0"]) == {"r0": 3}
        assert sub.malformed == 0
        pub.send_multipart(vllm.kv_message(4, [vllm.block_removed(hashes[1:])]))
        await wait_until_async(lambda: index.match([*CHAIN, 1], ["r0"]) == {"r0": 1}, 10,
                               "the GPU's eviction applied")
    finally:
        await sub.stop()
        pub.close()
        ctx.term()


def _chat(gw: Gateway, stream: bool = True) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/chat/completions", timeout=10, json={
        "model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})


def _healthy(gw: Gateway, *replicas: str) -> None:
    """Wait until every one of ``replicas`` is in (round robin then takes them in order)."""
    def all_in() -> bool:
        return all(metric(gw, f'kvgate_replica_healthy{{replica="{rid}"}}') == 1.0
                   for rid in replicas)

    wait_until(all_in, 10, f"replicas {replicas} healthy")


def _vllm_pair(serve: Serve, a: vllm.Script, b: vllm.Script) -> Gateway:
    ra, rb = serve(vllm.vllm_app(a)), serve(vllm.vllm_app(b))
    gw = start_gateway(serve, [("a", ra.url), ("b", rb.url)])
    _healthy(gw, "a", "b")
    return gw


def test_a_stream_that_opens_with_a_5xx_error_event_is_tried_on_the_next_replica(
        serve: Serve) -> None:
    """vLLM answers 200 and tells an engine failure as the stream's first event: the
    client has seen nothing yet, so it is a 5xx like any other."""
    died = vllm.error_body("EngineCore encountered an issue", 500)
    a, b = vllm.Script(stream_error=died), vllm.Script()
    gw = _vllm_pair(serve, a, b)
    answer = _chat(gw)
    assert answer.status_code == 200 and answer.headers["x-kvgate-replica"] == "b"
    assert '"error"' not in answer.text and answer.text.endswith("data: [DONE]\n\n")
    assert a.received == 1 and b.received == 1
    a.stream_error = b.stream_error = died  # every replica: the client gets the message
    failed = _chat(gw)
    assert failed.status_code == 500
    assert "EngineCore encountered an issue" in failed.json()["error"]["message"]


def test_a_stream_that_tells_an_error_is_counted_failed_not_answered(serve: Serve) -> None:
    """An error event after content (or one coded 4xx, the request's fault) is relayed as
    vLLM sent it, [DONE] and all, and recorded with its code (read whole, though it came
    in two reads), not as an answer."""
    a = vllm.Script(tokens=4, stream_error=vllm.error_body("out of memory", 500),
                    error_after=2, split_error=True)
    b = vllm.Script(stream_error=vllm.error_body("bad logits processor", 400))
    gw = _vllm_pair(serve, a, b)
    for _ in range(2):
        answer = _chat(gw)
        assert answer.status_code == 200 and '"error"' in answer.text
    wait_until(lambda: metric(gw, 'kvgate_requests_total{replica="a",route="round_robin",'
                                  'status="500"}') == 1.0, 10, "a's failure counted")
    assert metric(gw, 'kvgate_requests_total{replica="b",route="round_robin",'
                      'status="400"}') == 1.0
    assert metric(gw, 'kvgate_requests_total{replica="a",route="round_robin",'
                      'status="200"}') == 0.0
    assert metric(gw, 'kvgate_time_to_first_token_seconds_count{model="m",'
                      'reason="round_robin"}') in (None, 0.0)


def test_the_message_of_a_flat_error_body_reaches_the_client(serve: Serve) -> None:
    """vLLM before 0.10.2, and SGLang, answer errors flat: ``{"object": "error",
    "message": ...}``."""
    oom = vllm.error_body("CUDA out of memory", 500, nested=False)
    gw = _vllm_pair(serve, vllm.Script(status=500, error=oom),
                    vllm.Script(status=500, error=oom))
    failed = _chat(gw, stream=False)
    assert failed.status_code == 500
    assert "CUDA out of memory" in failed.json()["error"]["message"]


_ANSWER = json.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                      "choices": [{"index": 0, "message": {"role": "assistant",
                                                           "content": "a whole answer"},
                                   "finish_reason": "stop"}]}).encode()
_HTTP10 = b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n"


def test_a_json_body_that_ends_with_its_connection_is_whole_only_when_it_parses(
        serve: Serve) -> None:
    """An HTTP/1.0 answer (or one with no length and no chunks) ends where the connection
    does, as does one whose replica died mid-body: a cut JSON body is retried, never
    relayed as a 200."""
    with raw_replica(lambda: _HTTP10 + _ANSWER[:40]) as cut, \
            raw_replica(lambda: _HTTP10 + _ANSWER) as whole:
        gw = start_gateway(serve, [("cut", cut), ("whole", whole)])
        _healthy(gw, "cut", "whole")
        for _ in range(2):  # round robin: each replica first once
            answer = _chat(gw, stream=False)
            assert answer.status_code == 200 and answer.headers["x-kvgate-replica"] == "whole"
            assert answer.json()["choices"][0]["message"]["content"] == "a whole answer"


def test_an_encoded_body_that_ends_with_its_connection_is_relayed_as_it_came(
        serve: Serve) -> None:
    """A compressed body's bytes are not JSON: they are relayed unread, as any encoded
    answer is."""
    packed = gzip.compress(_ANSWER)
    head = b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n\r\n"
    with raw_replica(lambda: head + packed) as zipped:
        gw = start_gateway(serve, [("zipped", zipped)])
        _healthy(gw, "zipped")
        answer = _chat(gw, stream=False)
        assert answer.status_code == 200 and answer.headers["content-encoding"] == "gzip"
        assert answer.json()["choices"][0]["message"]["content"] == "a whole answer"


def test_a_replica_whose_metrics_keep_failing_is_told_once_a_run(
        serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    replica = Behaviour("a", metrics_extra=b"# padding\n" * 200)  # past max_bytes below
    with caplog.at_level(logging.DEBUG, logger="kvgate"):
        gw = start_gateway(serve, [("a", serve(fake_replica(replica)).url)],
                           scrape={"interval_s": 0.05, "max_bytes": 1024})
        wait_until(lambda: sum("/metrics failed" in r.getMessage()
                               for r in caplog.records) >= 5, 10, "five failed scrapes")
    told = [r.levelno for r in caplog.records if "/metrics failed" in r.getMessage()]
    assert told[0] == logging.INFO and set(told[1:]) == {logging.DEBUG}
    assert httpx.get(f"{gw.url}/health").status_code == 200
