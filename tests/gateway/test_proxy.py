"""The gateway in front of real loopback servers: OpenAI client, retries, timeouts, errors."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.config import parse_config
from gateway.monitor import MAX_MODELS
from gateway.state import build_state
from policies.config import ConfigError
from policies.round_robin import RoundRobin
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import (
    AUTH,
    Gateway,
    Serve,
    metric,
    start_gateway,
    two_replicas,
    wait_for_metric,
)
from tests.support.servers import free_port
from tests.support.waiting import wait_until


@pytest.fixture
def two(serve: Serve) -> tuple[Gateway, Behaviour, Behaviour]:
    return two_replicas(serve)


def client(gw: Gateway, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, **kw)


def test_openai_client_completions_and_chat(two: tuple[Gateway, Behaviour, Behaviour]
                                            ) -> None:
    gw, a, b = two
    c = client(gw)
    done = c.completions.create(model="sim-model", prompt="hello there", max_tokens=3)
    assert done.choices[0].text in ("a ok", "b ok")
    assert done.usage is not None and done.usage.prompt_tokens == 10
    chat = c.chat.completions.create(model="sim-model",
                                     messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content in ("a ok", "b ok")
    # round robin: the two requests went to different replicas
    assert len(a.received) == 1 and len(b.received) == 1

    pieces = [ch.choices[0].delta.content for ch in c.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hi"}], stream=True)]
    assert pieces == ["t0 ", "t1 ", "t2 "]
    texts = [ch.choices[0].text for ch in c.completions.create(
        model="sim-model", prompt="stream me", stream=True)]
    assert texts == ["t0 ", "t1 ", "t2 "]
    # the two answers that reported usage (10 prompt tokens, 4 cached each) are counted
    wait_for_metric(gw, 'kvgate_prompt_tokens_total{route="round_robin"}', 20.0)
    wait_for_metric(gw, 'kvgate_cached_prompt_tokens_total{route="round_robin"}', 8.0)


def test_body_forwarded_unchanged_with_route_headers(
        two: tuple[Gateway, Behaviour, Behaviour]) -> None:
    gw, a, b = two
    raw = b'{"model":"sim-model",  "prompt":"x y z","vendor_field":{"keep":[1,2]}}'
    r = httpx.post(f"{gw.url}/v1/completions", content=raw,
                   headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert r.headers["x-kvgate-replica"] in ("a", "b")
    assert r.headers["x-kvgate-route"] == "round_robin"
    received = a.received + b.received
    assert received == [raw]


def test_replicas_are_asked_for_answers_the_gateway_can_read(
        two: tuple[Gateway, Behaviour, Behaviour]) -> None:
    """A client's gzip is not asked of a replica (or of a compressing hop before it): the
    gateway reads each answer for its end, its errors and its usage."""
    gw, a, b = two
    chat = {"model": "sim-model", "messages": [{"role": "user", "content": "x"}],
            "stream": True}
    for path, body in (("/v1/completions", {"model": "sim-model", "prompt": "x"}),
                       ("/v1/chat/completions", chat)):
        r = httpx.post(f"{gw.url}{path}", json=body,
                       headers={"accept-encoding": "gzip, br"})
        assert r.status_code == 200, r.text
        (seen,) = a.headers + b.headers
        assert seen["accept-encoding"] == "identity", path
        a.headers.clear()
        b.headers.clear()


def test_stream_relayed_as_it_arrives(serve: Serve) -> None:
    held = Behaviour("held", chunks=3, release=threading.Event())
    gw = start_gateway(serve, [("held", serve(fake_replica(held)).url)])
    with httpx.stream("POST", f"{gw.url}/v1/completions",
                      json={"model": "sim-model", "prompt": "p", "stream": True}) as r:
        pieces = r.iter_raw()
        # the replica holds its last chunk until released: a gateway that buffered the
        # stream would deliver nothing before then (and the read would time out)
        first = next(chunk for chunk in pieces if chunk.strip())
        assert b"t0 " in first and b"t2 " not in first
        assert held.release is not None
        held.release.set()
        rest = b"".join(pieces)
    assert b"t2 " in rest and rest.rstrip().endswith(b"data: [DONE]")


def test_retry_next_replica_on_5xx_and_dead(serve: Serve) -> None:
    bad, good = Behaviour("bad", status=500), Behaviour("good")
    dead_port = free_port()
    gw = start_gateway(serve, [("bad", serve(fake_replica(bad)).url),
                               ("dead", f"http://127.0.0.1:{dead_port}"),
                               ("good", serve(fake_replica(good)).url)])
    for _ in range(3):
        r = httpx.post(f"{gw.url}/v1/completions", json={"model": "sim-model", "prompt": "p"})
        assert r.status_code == 200, r.text
        assert r.headers["x-kvgate-replica"] == "good"
    reps = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    assert {r["id"]: r["healthy"] for r in reps}["dead"] is False
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert 'kvgate_retries_total{cause="5xx",replica="bad"}' in metrics


def test_client_errors_are_openai_shaped(two: tuple[Gateway, Behaviour, Behaviour]
                                         ) -> None:
    gw, _, _ = two
    url = f"{gw.url}/v1/completions"
    cases = [
        (b"{not json", 400, "invalid_json", None),
        (b'{"model": 5, "prompt": "x"}', 400, None, "model"),
        (b'{"model": "sim-model", "prompt": ""}', 400, None, "prompt"),
        (b'{"model": "sim-model", "prompt": [1, "a"]}', 400, None, "prompt"),
        (b'{"model": "sim-model", "prompt": [1, 4294967296]}', 400, None, "prompt"),
        (b'{"model": "sim-model", "prompt": "x", "max_tokens": 0}', 400, None, "max_tokens"),
        (b'{"model": "sim-model", "prompt": "x", "max_tokens": -1, "echo": true}', 400, None,
         "max_tokens"),
        (b'{"model": "sim-model", "prompt": "x", "stream": "maybe"}', 400, None, "stream"),
        (b'{"model": "sim-model", "prompt": "x", "cache_salt": ""}', 400, None, "cache_salt"),
        (b'{"model": "nope", "prompt": "x"}', 404, "model_not_found", "model"),
    ]
    for raw, status, code, param in cases:
        r = httpx.post(url, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == status, (raw, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["message"]
        if code:
            assert err["code"] == code
        if param:
            assert err["param"] == param
    # an empty model name is the fleet's one model's, as vLLM reads it
    r = httpx.post(url, json={"model": "", "prompt": "x"})
    assert r.status_code == 200, r.text
    # a completion echoing its prompt may ask for no token (a loglikelihood client's)
    r = httpx.post(url, json={"model": "sim-model", "prompt": "x", "max_tokens": 0,
                              "echo": True})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "sim-model", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(f"{gw.url}/v1/chat/completions",
                   json={"model": "sim-model", "messages": [{"content": "no role"}]})
    assert r.status_code == 400 and "role" in r.json()["error"]["message"]
    # a trailing slash is another path: an error, not a redirect to the client's Host
    r = httpx.post(f"{gw.url}/v1/completions/", json={"model": "sim-model", "prompt": "x"})
    assert r.status_code == 404 and "location" not in r.headers and r.json()["error"]


def test_body_limit(serve: Serve) -> None:
    ok = Behaviour("ok")
    gw = start_gateway(serve, [("ok", serve(fake_replica(ok)).url)], max_body_bytes=1000)
    for url in (f"{gw.url}/v1/completions", f"{gw.admin}/admin/explain"):
        r = httpx.post(url, json={"model": "sim-model", "prompt": "x" * 2000}, headers=AUTH)
        assert r.status_code == 413
        assert "1000" in r.json()["error"]["message"]


def test_no_healthy_replica_is_503_with_retry_after(serve: Serve) -> None:
    gw = start_gateway(serve, [("dead", f"http://127.0.0.1:{free_port()}")])
    assert httpx.get(f"{gw.url}/health").status_code == 200
    ready = httpx.get(f"{gw.url}/ready")
    assert ready.status_code == 503
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": "m", "prompt": "x"})
    assert r.status_code == 503
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "no_healthy_replica"


def test_first_byte_timeout_is_504(serve: Serve) -> None:
    stuck = Behaviour("stuck", first_byte_delay_s=2)
    gw = start_gateway(serve, [("stuck", serve(fake_replica(stuck)).url)],
                       timeouts={"first_byte_s": 0.5})
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": "sim-model", "prompt": "x"},
                   timeout=10)
    # the replica would have answered 200 after 2 s
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "upstream_timeout"


def _replica_scraped(gw: Gateway, rid: str) -> bool:
    seen = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()
    return any(r["id"] == rid and r.get("kv_usage") == 0.25 for r in seen["replicas"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_replica_that_passes_its_health_checks_but_computes_nothing_is_left_after_stall_s(
        serve: Serve, stream: bool) -> None:
    hung, fine = Behaviour("hung", first_byte_delay_s=8), Behaviour("fine")
    gw = start_gateway(serve, [("hung", serve(fake_replica(hung)).url),
                               ("fine", serve(fake_replica(fine)).url)],
                       timeouts={"stall_s": 1.0})
    wait_until(lambda: _replica_scraped(gw, "hung"), 10, "a scrape of the hung replica")
    began = time.monotonic()
    for _ in range(2):  # round robin: one of the two starts on the hung replica
        r = httpx.post(f"{gw.url}/v1/completions", timeout=20,
                       json={"model": "sim-model", "prompt": "x", "stream": stream})
        assert r.status_code == 200
    # its figures stand still: each try there was left after stall_s, not first_byte_s
    # (600 s), and the request answered by the other replica
    assert len(fine.received) == 2 and len(hung.received) >= 1
    assert time.monotonic() - began < 6
    assert metric(gw, 'kvgate_retries_total{cause="timeout",replica="hung"}') \
        == len(hung.received)


def test_a_replica_whose_scrapes_show_it_working_is_waited_for_past_stall_s(serve: Serve
                                                                            ) -> None:
    busy = Behaviour("busy", first_byte_delay_s=2.5, progressing=True)
    gw = start_gateway(serve, [("busy", serve(fake_replica(busy)).url)],
                       timeouts={"stall_s": 0.5})
    wait_until(lambda: _replica_scraped(gw, "busy"), 10, "a scrape of the busy replica")
    r = httpx.post(f"{gw.url}/v1/completions", timeout=20,
                   json={"model": "sim-model", "prompt": "x"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "busy ok"
    assert len(busy.received) == 1


def _streamed_with_idle_timeout(serve: Serve, replica: Behaviour) -> tuple[str, bytes]:
    """A gateway (idle timeout 0.5 s) in front of ``replica``: its URL, and the raw body
    of one streamed completion through it."""
    gw = start_gateway(serve, [(replica.name, serve(fake_replica(replica)).url)],
                       timeouts={"idle_s": 0.5})
    with httpx.stream("POST", f"{gw.url}/v1/completions", timeout=10,
                      json={"model": "sim-model", "prompt": "p", "stream": True}) as r:
        return gw.url, b"".join(r.iter_raw())


def test_idle_timeout_ends_the_stream(serve: Serve) -> None:
    _, body = _streamed_with_idle_timeout(serve, Behaviour("stall", chunk_delay_s=2, chunks=3))
    # ended after the first chunk: the replica would have sent all three and [DONE]
    assert b"t0" in body and b"t1" not in body and b"[DONE]" not in body


def test_a_stalled_stream_of_an_ejected_replica_is_cut_without_waiting_out_the_idle_timeout(
        serve: Serve) -> None:
    hung = Behaviour("hung", chunk_delay_s=4, chunks=3)
    gw = start_gateway(serve, [("hung", serve(fake_replica(hung)).url)],
                       timeouts={"idle_s": 30})
    started = time.monotonic()
    with httpx.stream("POST", f"{gw.url}/v1/completions", timeout=10,
                      json={"model": "sim-model", "prompt": "p", "stream": True}) as r:
        pieces = r.iter_raw()
        first = next(chunk for chunk in pieces if chunk.strip())
        hung.healthy = False  # its health checks fail now: the gateway ejects it
        body = first + b"".join(pieces)
    # cut a health check interval (0.2 s) after the ejection, not 30 s after the last chunk
    # nor when the replica's next chunk came (4 s)
    assert time.monotonic() - started < 3.5
    assert b"t0" in body and b"t1" not in body and b"[DONE]" not in body
    assert b'"code":"upstream_ejected"' in body
    assert metric(gw, 'kvgate_upstream_cuts_total{cause="ejected",replica="hung"}') == 1.0


def test_a_flowing_stream_of_an_ejected_replica_goes_on_to_its_end(serve: Serve) -> None:
    flowing = Behaviour("flowing", chunk_delay_s=0.05, chunks=40)
    gw = start_gateway(serve, [("flowing", serve(fake_replica(flowing)).url)])
    with httpx.stream("POST", f"{gw.url}/v1/completions", timeout=10,
                      json={"model": "sim-model", "prompt": "p", "stream": True}) as r:
        pieces = r.iter_raw()
        first = next(chunk for chunk in pieces if chunk.strip())
        flowing.healthy = False  # ejected within 0.2 s, its chunks 0.05 s apart
        body = first + b"".join(pieces)
        assert metric(gw, 'kvgate_replica_healthy{replica="flowing"}') == 0.0
    assert b"t39" in body and body.endswith(b"data: [DONE]\n\n") and b"error" not in body


def test_a_replica_that_keeps_its_body_open_after_done_ends_a_whole_stream(serve: Serve
                                                                         ) -> None:
    # the idle timeout ends it, but the answer was whole: no error event after [DONE]
    url, body = _streamed_with_idle_timeout(serve, Behaviour("linger", chunks=3, linger_s=3))
    assert body.endswith(b"data: [DONE]\n\n") and b"error" not in body
    metrics = httpx.get(f"{url}/metrics").text
    assert 'kvgate_requests_total{replica="linger",route="round_robin",status="200"} 1.0' \
        in metrics


def streamed_request(gw: Gateway) -> socket.socket:
    """A raw connection to the gateway that has sent one streamed completion (and reads
    only what the test reads)."""
    body = json.dumps({"model": "sim-model", "prompt": "p", "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", gw.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def test_client_disconnect_cancels_upstream(serve: Serve) -> None:
    slow = Behaviour("slow", chunk_delay_s=0.3, chunks=50)
    gw = start_gateway(serve, [("slow", serve(fake_replica(slow)).url)])
    with streamed_request(gw) as sock:
        assert b"200" in sock.recv(4096)
    wait_until(lambda: slow.cancelled, 5, "the upstream stream to be cancelled")
    assert slow.cancelled == 1
    # recorded as the client's leaving, not as a whole answer
    wait_for_metric(gw, 'kvgate_requests_total{replica="slow",route="round_robin",'
                        'status="499"}', 1.0)
    assert not metric(gw, 'kvgate_requests_total{replica="slow",route="round_robin",'
                          'status="200"}')


def test_a_client_that_leaves_while_the_gateway_waits_to_write_to_it_is_counted_499(
        serve: Serve) -> None:
    big = Behaviour("big", chunks=400, pad=65536)  # 26 MB: past every socket buffer
    gw = start_gateway(serve, [("big", serve(fake_replica(big)).url)])
    with streamed_request(gw):
        time.sleep(1.0)  # reads nothing: the gateway's sends wait on it; then it leaves
    wait_until(lambda: big.cancelled, 10, "the replica's stream to be dropped")
    wait_for_metric(gw, 'kvgate_requests_total{replica="big",route="round_robin",'
                        'status="499"}', 1.0)


def test_a_client_that_stops_reading_its_stream_is_dropped_after_idle_s(serve: Serve) -> None:
    big = Behaviour("big", chunks=400, pad=65536)  # 26 MB: past every socket buffer
    gw = start_gateway(serve, [("big", serve(fake_replica(big)).url)],
                       timeouts={"idle_s": 0.5})
    with streamed_request(gw):
        # reads nothing: the gateway's sends wait on it, for idle_s at most
        wait_until(lambda: big.cancelled, 10, "the replica's stream to be dropped")
        wait_for_metric(gw, 'kvgate_requests_total{replica="big",route="round_robin",'
                            'status="499"}', 1.0)


def test_models_ready_metrics_and_admin(serve: Serve) -> None:
    a, b = Behaviour("a", model="m-a", hits=0, queries=0), Behaviour("b", model="m-b")
    ra, rb = serve(fake_replica(a)), serve(fake_replica(b))
    gw = start_gateway(serve, [("a", ra.url)])
    auth = AUTH
    assert httpx.get(f"{gw.url}/admin/replicas", headers=auth).status_code == 404  # not here
    assert httpx.get(f"{gw.admin}/admin/replicas").status_code == 401
    r = httpx.post(f"{gw.admin}/admin/replicas", json={"id": "b", "url": rb.url}, headers=auth)
    assert r.status_code == 201, r.text
    # (named without the credentials it carried)
    for url, named in (("ftp://x", "ftp://x"),
                       ("http://127.0.0.1:9/v1?x=1", "http://127.0.0.1:9/v1?x=1"),
                       ("http://u:p@127.0.0.1:9", "http://***@127.0.0.1:9")):
        bad = httpx.post(f"{gw.admin}/admin/replicas", json={"id": "c", "url": url},
                         headers=auth)
        assert bad.status_code == 400 and named in bad.json()["error"]["message"]
    # the gateway's own secrets (its environment, its files) are not the admin's to send
    # to a URL of theirs; an id the admin API could not address again is refused
    for extra, param in (({"api_key_env": "PATH"}, "api_key_env"),
                         ({"api_key_file": "/etc/hostname"}, "api_key_file")):
        bad = httpx.post(f"{gw.admin}/admin/replicas", headers=auth,
                         json={"id": "c", "url": "http://127.0.0.1:9", **extra})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param
    bad = httpx.post(f"{gw.admin}/admin/replicas", headers=auth,
                     json={"id": "a/b", "url": "http://127.0.0.1:9"})
    assert bad.status_code == 400 and "'a/b'" in bad.json()["error"]["message"]
    deep = b'{"id": "c", "url": "http://127.0.0.1:9", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    for raw, code in ((b'{"id": "c", "url": "http://127.0.0.1:9", "weight": NaN}', "invalid_json"),
                      (b'{"id": "c", "url": "http://127.0.0.1:9", "weight": 1e999}',
                       "invalid_json"),
                      (b'{"id": "c", "url": "http://127.0.0.1:9", "weight": -1}',
                       "invalid_replica"),
                      (deep, "invalid_json")):
        bad = httpx.post(f"{gw.admin}/admin/replicas", content=raw, headers=auth)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == code, bad.text
    assert [r["id"] for r in httpx.get(f"{gw.admin}/admin/replicas", headers=auth)
            .json()["replicas"]] == ["a", "b"]  # none of them was added
    for weight in (float("nan"), float("inf")):  # as YAML's .nan and .inf give them
        with pytest.raises(ConfigError, match=r"weight: expected a finite number"):
            parse_config({"replicas": [{"id": "c", "url": "http://127.0.0.1:9",
                                        "weight": weight}]})
    outside = httpx.post(f"{gw.admin}/admin/replicas", headers=auth,
                         json={"id": "c", "url": "http://10.1.2.3:8000"})
    assert outside.status_code == 403
    assert outside.json()["error"]["code"] == "replica_not_allowed"
    # nor may its KV event endpoints take the gateway elsewhere (or to a local path)
    for key, endpoint in (("kv_events", "tcp://10.1.2.3:5557"),
                          ("kv_events_replay", "tcp://10.9.9.9:5558"),
                          ("kv_events", "ipc:///tmp/some.sock"),
                          ("kv_events", "tcp://127.0.0.1:0;10.1.2.3:5557"),
                          ("kv_events_replay", "tcp://127.0.0.1")):
        outside = httpx.post(f"{gw.admin}/admin/replicas", headers=auth,
                             json={"id": "c", "url": "http://127.0.0.1:9", key: endpoint})
        assert outside.status_code == 403 and outside.json()["error"]["param"] == key
    models = httpx.get(f"{gw.url}/v1/models").json()
    assert sorted(m["id"] for m in models["data"]) == ["m-a", "m-b"]
    # a model routes only to the replicas serving it
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": "m-b", "prompt": "x"})
    assert r.headers["x-kvgate-replica"] == "b"
    ex = httpx.post(f"{gw.admin}/admin/explain", json={"model": "m-a", "prompt": "x"},
                    headers=auth).json()
    assert ex["chosen"] == "a" and ex["reason"] and ex["policy"] == "round_robin"
    a.hits, a.queries = 300, 1000
    wait_for_metric(gw, 'kvgate_replica_token_hit_rate{replica="a"}', 0.3)
    a.hits, a.queries = 900, 2000
    wait_for_metric(gw, 'kvgate_replica_token_hit_rate{replica="a"}', 0.45)
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert 'kvgate_requests_total{replica="b",route="round_robin",status="200"} 1.0' in metrics
    assert "kvgate_routing_decision_seconds_count 1.0" in metrics  # the one proxied
    # the window runs from the first scrape (0 of 0 tokens) to the last (900 of 2000)
    assert 'kvgate_replica_token_hit_rate{replica="a"} 0.45' in metrics
    r = httpx.delete(f"{gw.admin}/admin/replicas/b", headers=auth)
    assert r.status_code == 200
    assert httpx.delete(f"{gw.admin}/admin/replicas/b", headers=auth).status_code == 404
    assert httpx.get(f"{gw.url}/ready").json()["healthy_replicas"] == 1


def test_a_replica_listing_thousands_of_adapters_is_kept_to_the_first_of_them(
        serve: Serve) -> None:
    lora = Behaviour("lora", adapters=5000)
    other = Behaviour("other", model="other-model")
    gw = start_gateway(serve, [("lora", serve(fake_replica(lora)).url),
                               ("other", serve(fake_replica(other)).url)])
    wait_until(lambda: len(httpx.get(f"{gw.url}/v1/models").json()["data"]) > 2, 10,
               "the replica's models")
    ids = [m["id"] for m in httpx.get(f"{gw.url}/v1/models").json()["data"]]
    assert len(ids) == MAX_MODELS + 1 and "sim-model" in ids and "other-model" in ids
    # a model past the first ones is still the replica's to serve, not a 404, and only
    # its: not the replica of another model
    for model in ("sim-model", *["sim-model-lora-4000"] * 4):
        r = httpx.post(f"{gw.url}/v1/completions", json={"model": model, "prompt": "x"})
        assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "lora", r.text
    assert other.received == []
    with pytest.raises(ConfigError, match=r"max_receiving_bytes \(1000\) must be at least"):
        parse_config({"replicas": [{"id": "a", "url": "http://127.0.0.1:9"}],
                      "limits": {"max_receiving_bytes": 1000}})


def test_body_limit_without_content_length(serve: Serve) -> None:
    ok = Behaviour("ok")
    gw = start_gateway(serve, [("ok", serve(fake_replica(ok)).url)], max_body_bytes=1000)

    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"model": "sim-model", "prompt": "'
        for _ in range(10):
            yield b"x" * 200
        yield b'"}'

    r = httpx.post(f"{gw.url}/v1/completions", content=chunks())
    assert r.status_code == 413
    assert ok.received == []


def remove_x_with_a_request_in_flight(gw: Gateway) -> tuple[threading.Thread, list[int]]:
    """Replica x (the gateway's only one, slow to answer) removed while a request is in
    flight there: the thread sending it, and its status once answered."""
    answers: list[int] = []
    t = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{gw.url}/v1/completions", json={"model": "sim-model", "prompt": "p"}).status_code))
    t.start()
    wait_until(lambda: httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH)
               .json()["replicas"][0]["in_flight"], 5, "the request to be in flight to x")
    assert httpx.delete(f"{gw.admin}/admin/replicas/x", headers=AUTH).status_code == 200
    return t, answers


def test_readding_a_replica_keeps_its_accounting_apart(serve: Serve) -> None:
    slow = Behaviour("slow", first_byte_delay_s=0.6)
    url = serve(fake_replica(slow)).url
    gw = start_gateway(serve, [("x", url)])
    t, answers = remove_x_with_a_request_in_flight(gw)
    assert httpx.post(f"{gw.admin}/admin/replicas", json={"id": "x", "url": url},
                      headers=AUTH).status_code == 201
    t.join(5)
    assert answers == [200]
    (x,) = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    assert x["in_flight"] == 0 and x["queued_tokens"] == 0  # not charged for the old one


def test_internal_errors_get_an_openai_body(serve: Serve) -> None:

    class Broken(RoundRobin):
        def choose(self, request, replicas):  # type: ignore[no-untyped-def]
            raise KeyError("boom")

    ok = Behaviour("ok")
    config = parse_config({"replicas": [{"id": "ok", "url": serve(fake_replica(ok)).url}]})
    gw = serve(create_app(config, build_state(config, policy=Broken())))
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": "sim-model", "prompt": "x"})
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal_error"
    assert "KeyError" in r.json()["error"]["message"]


@pytest.mark.parametrize("prompt", ["p", "p " * 150_000], ids=["small", "past_high_water"])
def test_client_leaving_before_the_first_byte_cancels_the_upstream(serve: Serve,
                                                                  prompt: str) -> None:
    # past 64 KiB of unread body uvicorn stops reading; the watch for the client leaving
    # must read on, or the close is never seen
    stuck = Behaviour("stuck", first_byte_delay_s=5)
    gw = start_gateway(serve, [("stuck", serve(fake_replica(stuck)).url)])
    body = json.dumps({"model": "sim-model", "prompt": prompt}).encode()
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:1000])
        if body[1000:]:
            time.sleep(0.3)  # the gateway waits for the rest, which then comes at once
            sock.sendall(body[1000:])
        wait_until(lambda: stuck.received, 5, "the replica to receive the request")
    wait_for_metric(gw, 'kvgate_errors_total{kind="client_disconnect"}', 1.0)
    (replica,) = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    assert replica["in_flight"] == 0 and replica["queued_tokens"] == 0
    assert httpx.get(f"{gw.url}/health").status_code == 200  # the gateway carries on


def test_proxied_requests_leave_nothing_for_the_garbage_collector(serve: Serve) -> None:
    # a request's objects are freed when it ends, not kept in reference cycles (a
    # cancelled watch task's traceback, a callback holding its stream) for the collector
    import gc

    from gateway.proxy import UpstreamStream
    from kvwire.request_edge import ClientWatch

    gw = start_gateway(serve, [("ok", serve(fake_replica(Behaviour("ok", chunks=3))).url)])
    url = f"{gw.url}/v1/completions"
    httpx.post(url, json={"model": "sim-model", "prompt": "warm"})
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for stream in (False, True, False, True):
            r = httpx.post(url, json={"model": "sim-model", "prompt": "p", "stream": stream})
            assert r.status_code == 200
        wait_for_metric(gw, 'kvgate_requests_total{replica="ok",route="round_robin",'
                            'status="200"}', 5.0)
        gc.collect()
        kept = [type(o).__name__ for o in gc.garbage
                if isinstance(o, (UpstreamStream, ClientWatch))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert kept == []


def test_tenants_get_their_own_cache_salt(serve: Serve) -> None:
    rec = Behaviour("rec")
    gw = start_gateway(serve, [("rec", serve(fake_replica(rec)).url)],
                       tenancy={"isolate": True, "secret": "k" * 32, "require_tenant": True},
                       trusted_proxies=["127.0.0.0/8"])
    url = f"{gw.url}/v1/completions"
    for tenant, salt in (("acme", None), ("acme", None), ("globex", None), ("acme", "mine")):
        body = {"model": "sim-model", "prompt": "same prompt", "extra": [1]}
        if salt:
            body["cache_salt"] = salt
        r = httpx.post(url, json=body, headers={"x-kvgate-tenant": tenant})
        assert r.status_code == 200, r.text
    salts = [json.loads(raw)["cache_salt"] for raw in rec.received]
    assert all(len(s) == 64 for s in salts)
    assert salts[0] == salts[1] and len(set(salts)) == 3  # per tenant, and per client salt
    assert all(json.loads(raw)["extra"] == [1] for raw in rec.received)  # fields survive
    r = httpx.post(url, json={"model": "sim-model", "prompt": "x"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_tenant"
    r = httpx.post(f"{gw.admin}/admin/explain", json={"model": "sim-model", "prompt": "x"},
                   headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_tenant"


def test_a_conversation_keeps_its_replica_as_it_grows(serve: Serve) -> None:
    """prefix_affinity keys a chat by its messages up to the first user message, so every
    turn of a conversation lands where the earlier turns left their KV."""
    reps = [Behaviour(f"r{i}") for i in range(4)]
    gw = start_gateway(serve, [(b.name, serve(fake_replica(b)).url) for b in reps],
                       policy={"name": "prefix_affinity", "prefix_tokens": 1024})
    homes = []
    for conv in range(6):
        messages = [{"role": "system", "content": "You answer questions about contracts."},
                    {"role": "user", "content": f"Conversation {conv}: what is clause {conv}?"}]
        seen = set()
        for turn in range(4):
            r = httpx.post(f"{gw.url}/v1/chat/completions",
                           json={"model": "sim-model", "messages": messages})
            assert r.status_code == 200
            seen.add(r.headers["x-kvgate-replica"])
            messages += [{"role": "assistant", "content": f"Answer {turn} " * 20},
                         {"role": "user", "content": f"And follow-up {turn}?"}]
        assert len(seen) == 1, (conv, seen)
        homes.append(seen.pop())
    assert len(set(homes)) > 1  # conversations still spread over the fleet


def test_answer_headers_are_not_doubled(two: tuple[Gateway, Behaviour, Behaviour]) -> None:
    gw, _, _ = two
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": "sim-model", "prompt": "x"})
    for name in ("date", "server", "content-type", "content-length"):
        assert len(r.headers.get_list(name)) <= 1, (name, r.headers.get_list(name))
    assert r.headers["content-type"] == "application/json"


def test_repeated_header_lines_keep_every_value(serve: Serve) -> None:
    lines = (("x-trace", "one"), ("x-trace", "two"),
             ("set-cookie", "a=1; Expires=Wed, 09 Jun 2027"), ("set-cookie", "b=2"))
    b = Behaviour("b", answer_headers=lines)
    gw = start_gateway(serve, [("b", serve(fake_replica(b)).url)])
    for stream in (False, True):
        r = httpx.post(f"{gw.url}/v1/completions",
                       json={"model": "sim-model", "prompt": "x", "stream": stream},
                       headers=[("x-tag", "red"), ("x-tag", "blue"), ("cookie", "a=1"),
                                ("cookie", "b=2"), ("connection", "keep-alive"),
                                ("connection", "x-hop"), ("x-hop", "secret")])
        assert r.status_code == 200, r.text
        # a client's repeated header reaches the replica whole (RFC 9110: one line, the
        # values joined; cookies as RFC 6265 joins them), every Connection line's names
        # left out, and the replica's reach the client: its cookies line by line
        lines = b.header_lines[-1]
        assert ("x-tag", "red, blue") in lines and ("cookie", "a=1; b=2") in lines
        assert "x-hop" not in dict(lines)
        assert r.headers.get_list("x-trace") == ["one, two"]
        assert r.headers.get_list("set-cookie") == ["a=1; Expires=Wed, 09 Jun 2027", "b=2"]


def test_series_exist_before_their_first_count_and_leave_with_their_replica(
        two: tuple[Gateway, Behaviour, Behaviour]) -> None:
    gw, _, _ = two
    before = httpx.get(f"{gw.url}/metrics").text
    for series in ('kvgate_errors_total{kind="rate_limited"} 0.0',
                   'kvgate_requests_total{replica="none",route="none",status="429"} 0.0',
                   'kvgate_requests_total{replica="b",route="round_robin",status="502"} 0.0',
                   'kvgate_retries_total{cause="timeout",replica="a"} 0.0',
                   'kvgate_upstream_cuts_total{cause="broken",replica="b"} 0.0'):
        assert series in before, series
    assert httpx.post(f"{gw.url}/v1/completions",
                      json={"model": "sim-model", "prompt": "x"}).status_code == 200
    assert httpx.delete(f"{gw.admin}/admin/replicas/b", headers=AUTH).status_code == 200
    after = httpx.get(f"{gw.url}/metrics").text
    assert 'replica="b"' not in after and 'replica="a"' in after


def test_a_client_leaving_mid_upload_is_no_internal_error(
        two: tuple[Gateway, Behaviour, Behaviour]) -> None:
    gw, a, b = two
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                     b'{"model": "sim-model", "prompt": "')
    wait_for_metric(gw, 'kvgate_errors_total{kind="client_disconnect"}', 1.0)
    assert metric(gw, 'kvgate_errors_total{kind="internal"}') == 0
    assert metric(gw, 'kvgate_requests_total{replica="none",route="none",status="499"}') == 1
    assert a.received == [] and b.received == []


def _replica_json(gw: Gateway, rid: str) -> dict[str, Any]:
    r = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH)
    assert r.status_code == 200, r.text
    return next(x for x in r.json()["replicas"] if x["id"] == rid)


def test_odd_metric_pages_and_failing_scrapes(serve: Serve) -> None:
    # NaN and infinite samples are skipped (NaN made /admin/replicas answer 500, +Inf
    # froze the replica's figures), a byte that is not UTF-8 spoils no scrape, and a
    # page over scrape.max_bytes is refused
    a = Behaviour("a", queued_tokens=50_000)
    a.metrics_extra = (b"# TYPE vllm:gpu_cache_usage_perc gauge\n"
                       b"vllm:gpu_cache_usage_perc{model_name=\"m\"} NaN\n"
                       b"# TYPE vllm:num_preemptions gauge\n"
                       b"vllm:num_preemptions{model_name=\"m\"} +Inf\n"
                       b"# TYPE odd gauge\nodd{x=\"\xff\xfe\"} 1.0\n")
    gw = start_gateway(serve, [("a", serve(fake_replica(a)).url)],
                       scrape={"interval_s": 0.1, "stale_after_failures": 3,
                               "max_bytes": 64 << 10})
    wait_until(lambda: _replica_json(gw, "a")["queued_tokens"] >= 50_000, 5,
               "the odd page's queue gauge")
    seen = _replica_json(gw, "a")
    assert seen["kv_usage"] == 0.25 and seen["scrape_stale"] is False
    # its scrapes start failing: after three in a row, the last load figures are dropped
    # (they stood for ever, steering requests away from an idle replica)
    a.metrics_status = 500
    wait_until(lambda: _replica_json(gw, "a")["scrape_stale"] is True, 5, "stale figures")
    seen = _replica_json(gw, "a")
    assert seen["queued_tokens"] == 0 and seen["kv_usage"] == 0.0
    assert seen["kv_capacity_tokens"] is not None  # what the replica is, not its load
    a.metrics_status = 200
    wait_until(lambda: _replica_json(gw, "a")["scrape_stale"] is False, 5, "fresh figures")
    assert _replica_json(gw, "a")["queued_tokens"] >= 50_000
    a.metrics_extra = b"# TYPE pad gauge\n" + b"".join(
        b'pad{i="%d"} 1.0\n' % i for i in range(10_000))  # ~150 KB, over the bound
    wait_until(lambda: _replica_json(gw, "a")["scrape_stale"] is True, 5,
               "the oversized page refused")


def test_a_request_without_a_model_is_for_the_fleets_one_model(serve: Serve) -> None:
    # as vLLM serves it with its own model; with several models it must name one
    a, b = Behaviour("a", model="m-a"), Behaviour("b", model="m-b")
    gw = start_gateway(serve, [("a", serve(fake_replica(a)).url)])
    wait_until(lambda: httpx.get(f"{gw.url}/v1/models").json()["data"], 5, "models")
    for path, body in (("/v1/completions", {"prompt": "x"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user",
                                                               "content": "hi"}]})):
        r = httpx.post(f"{gw.url}{path}", json=body)
        assert r.status_code == 200, r.text
        assert json.loads(a.received[-1]) == body  # forwarded as it came
    rb = serve(fake_replica(b))
    assert httpx.post(f"{gw.admin}/admin/replicas", json={"id": "b", "url": rb.url},
                      headers=AUTH).status_code == 201
    wait_until(lambda: len(httpx.get(f"{gw.url}/v1/models").json()["data"]) == 2, 5,
               "both models")
    r = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "several models" in r.json()["error"]["message"]


def test_vllms_other_paths_and_cors(serve: Serve) -> None:
    a = Behaviour("a")
    gw = start_gateway(serve, [("a", serve(fake_replica(a)).url)],
                       cors={"allow_origins": ["https://app.example"]})
    # /invocations (SageMaker's, and vLLM's): a chat or a completion, as the body says
    chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    for body, path in ((chat, "/v1/chat/completions"),
                       ({"model": "sim-model", "prompt": "x"}, "/v1/completions")):
        r = httpx.post(f"{gw.url}/invocations", json=body)
        assert r.status_code == 200 and a.paths[-1] == path, r.text
    # ... any other body (embeddings, rerank: vLLM tells them by the model's task) to the
    # replica's own /invocations, unchanged
    embed = {"model": "sim-model", "input": "some text", "encoding_format": "float"}
    r = httpx.post(f"{gw.url}/invocations", json=embed)
    assert r.status_code == 200 and r.json()["data"][0]["embedding"] == [0.5, -0.5], r.text
    assert a.paths[-1] == "/invocations" and json.loads(a.received[-1]) == embed
    assert r.headers["x-kvgate-route"] == "passthrough"
    # content parts the gateway cannot read, and prompt embeddings, are the replica's to
    # judge (vLLM serves them): forwarded unchanged, not refused
    parts = [{"type": "input_image", "image_url": "https://example.com/cat.png"},
             {"type": "image_url", "uuid": "cached-image-7"},
             {"type": "text", "text": None}, {"type": "text", "text": "what is this?"}]
    for body, path in (
            ({"model": "sim-model", "messages": [{"role": "user", "content": parts}]},
             "/v1/chat/completions"),
            ({"model": "sim-model", "prompt_embeds": "AAAAPw=="}, "/v1/completions")):
        r = httpx.post(f"{gw.url}/invocations", json=body)
        assert r.status_code == 200 and a.paths[-1] == path, r.text
        assert json.loads(a.received[-1]) == body
    assert httpx.get(f"{gw.url}/ping").status_code == 200
    assert httpx.post(f"{gw.url}/ping").status_code == 200
    assert httpx.get(f"{gw.url}/version").json()["version"]
    # a browser's preflight and its request, from a named origin only
    origin = {"origin": "https://app.example"}
    pre = httpx.options(f"{gw.url}/v1/chat/completions", headers={
        **origin, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == "https://app.example"
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=chat, headers=origin)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    other = httpx.post(f"{gw.url}/v1/chat/completions", json=chat,
                       headers={"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    # none by default
    plain = start_gateway(serve, [("a", serve(fake_replica(a)).url)])
    r = httpx.post(f"{plain.url}/v1/chat/completions", json=chat, headers=origin)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": -500, "completion_tokens": 3},
    {"prompt_tokens": 10, "completion_tokens": -3, "prompt_tokens_details": {"cached_tokens": -7}},
    {"prompt_tokens": True, "completion_tokens": 3},
    {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 11}},
])
def test_a_replicas_absurd_usage_is_ignored_not_a_500(serve: Serve, usage: dict[str, Any]
                                                      ) -> None:
    a = Behaviour("a", usage=usage)
    gw = start_gateway(serve, [("a", serve(fake_replica(a)).url)])
    for stream in (False, True):
        r = httpx.post(f"{gw.url}/v1/completions",
                       json={"model": "sim-model", "prompt": "x", "stream": stream})
        assert r.status_code == 200, r.text
    assert metric(gw, 'kvgate_requests_total{replica="a",route="round_robin",status="200"}') == 2


def test_bodies_past_a_mib_are_parsed_and_checked_as_small_ones(
        two: tuple[Gateway, Behaviour, Behaviour]) -> None:
    gw, a, b = two
    turns = [{"role": "user", "content": f"clause {i} " + "x" * 200} for i in range(12_000)]
    chat = {"model": "sim-model", "messages": turns}
    assert len(json.dumps(chat)) > 2 << 20  # parsed on a thread, off the event loop
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=chat, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].endswith("ok")
    assert json.loads((a.received + b.received)[-1])["messages"][-1] == turns[-1]
    # the endpoint told from the body (SageMaker's /invocations), and an error named
    r = httpx.post(f"{gw.url}/invocations", json=chat, timeout=30)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    bad = httpx.post(f"{gw.url}/v1/chat/completions", timeout=30,
                     json={**chat, "messages": [*turns, 42]})
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("messages")


def test_a_model_loaded_at_run_time_is_found_by_its_first_request(serve: Serve) -> None:
    b = Behaviour("b")
    gw = start_gateway(serve, [("b", serve(fake_replica(b)).url)])
    wait_until(lambda: "sim-model" in [m["id"] for m in httpx.get(f"{gw.url}/v1/models")
                                       .json()["data"]], 10, "the replica's models")
    b.adapters = 1  # an adapter loaded on the replica (vLLM's /v1/load_lora_adapter)
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": "sim-model-lora-0",
                                                     "prompt": "x"})
    assert r.status_code == 200, r.text  # looked for again, not refused for 30 s
    # listed as vLLM lists them: an adapter names its base model and where it came from
    cards = {m["id"]: m for m in httpx.get(f"{gw.url}/v1/models").json()["data"]}
    assert cards["sim-model-lora-0"]["parent"] == "sim-model"
    assert cards["sim-model-lora-0"]["root"] == "/adapters/0"
    assert cards["sim-model"]["parent"] is None and cards["sim-model"]["max_model_len"] == 4096
    missing = httpx.post(f"{gw.url}/v1/completions", json={"model": "nope", "prompt": "x"})
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


def test_replica_errors_keep_their_status_when_they_agree(serve: Serve) -> None:
    """Every replica tried answered 500: the client gets 500, told not to retry it (the
    openai client then sends it once); replicas answering different errors: 502."""
    same = [Behaviour(n, status=500) for n in ("a", "b")]
    gw = start_gateway(serve, [(b.name, serve(fake_replica(b)).url) for b in same])
    # closed when done: the error it raised holds it, and its connection, in a cycle
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=2) as c, \
            pytest.raises(openai.InternalServerError) as failed:
        c.completions.create(model="sim-model", prompt="x")
    assert failed.value.status_code == 500
    assert failed.value.response.headers["x-should-retry"] == "false"
    assert len(same[0].received) + len(same[1].received) == 2  # one call, two replicas
    mixed = [Behaviour("c", status=500), Behaviour("d", status=504)]
    gw = start_gateway(serve, [(b.name, serve(fake_replica(b)).url) for b in mixed])
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": "sim-model", "prompt": "x"})
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"


def test_series_of_a_removed_replica_that_a_late_answer_brought_back_leave_at_the_next_change(
        serve: Serve) -> None:
    slow = Behaviour("slow", first_byte_delay_s=0.6)
    url = serve(fake_replica(slow)).url
    other = serve(fake_replica(Behaviour("y"))).url
    gw = start_gateway(serve, [("x", url)])

    def series_of_x() -> list[str]:
        return [line for line in httpx.get(f"{gw.url}/metrics").text.splitlines()
                if 'replica="x"' in line and not line.startswith("#")]

    t, answers = remove_x_with_a_request_in_flight(gw)
    assert series_of_x() == []
    t.join(5)
    assert answers == [200]  # its end counted x's series again ...
    assert series_of_x()
    assert httpx.post(f"{gw.admin}/admin/replicas", json={"id": "y", "url": other},
                      headers=AUTH).status_code == 201
    assert series_of_x() == []  # ... until the fleet's next change


def test_a_replica_added_at_run_time_is_used_only_once_its_first_check_passed(
        serve: Serve) -> None:
    """A replica that accepts connections but does not answer yet (still starting) was
    in the fleet, healthy, while its first health check waited: scraped, and routed to
    by a request for a model no checked replica had listed."""
    gw = start_gateway(serve, [("a", serve(fake_replica(Behaviour("a"))).url)])
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    silent.settimeout(0.05)
    heard: list[bytes] = []
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = silent.accept()
            except TimeoutError:
                continue
            held.append(conn)
            conn.settimeout(5)
            heard.append(conn.recv(65536).split(b"\r\n", 1)[0])  # and never answered

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    added: list[httpx.Response] = []
    adding = threading.Thread(target=lambda: added.append(httpx.post(
        f"{gw.admin}/admin/replicas", headers=AUTH, timeout=10,
        json={"id": "new", "url": f"http://127.0.0.1:{silent.getsockname()[1]}"})))
    try:
        adding.start()
        wait_until(lambda: heard, 5, "the new replica's health check")
        for _ in range(4):  # round robin would send every other one to the new replica
            r = httpx.post(f"{gw.url}/v1/completions", timeout=10,
                           json={"model": "sim-model", "prompt": "p"})
            assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "a"
        adding.join(10)
        assert [a.status_code for a in added] == [201]
        assert all(line.startswith(b"GET /health") for line in heard), heard
        (new,) = [r for r in httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH)
                  .json()["replicas"] if r["id"] == "new"]
        assert new["healthy"] is False
    finally:
        stop.set()
        acceptor.join(10)
        silent.close()
        for conn in held:
            conn.close()


def test_a_replicas_redirects_are_not_followed_by_checks_or_scrapes(serve: Serve) -> None:
    # a replica answering 302 to an address the admin API would refuse had the gateway
    # fetch /health, /v1/models and /metrics there, and publish that model list
    reached: list[str] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body",
                    "body": b'{"object": "list", "data": [{"id": "secret-model"}]}'})

    target = serve(inner).url

    async def redirecting(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 302,
                    "headers": [(b"location", f"{target}{scope['path']}".encode())]})
        await send({"type": "http.response.body", "body": b""})

    gw = start_gateway(serve, [("r0", serve(redirecting).url)])
    wait_until(lambda: "302" in str(httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH)
                                    .json()["replicas"][0]["last_error"]), 5,
               "a health check to fail on the redirect")
    time.sleep(0.5)  # a few check and scrape rounds
    (r0,) = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    assert r0["healthy"] is False
    assert reached == []
    assert "secret-model" not in httpx.get(f"{gw.url}/v1/models").text


def test_a_replicas_cors_headers_never_reach_a_browser(serve: Serve) -> None:
    # vLLM answers any Origin with access-control-allow-origin: *; relayed, it opened a
    # gateway configured with no CORS origins to every web page's simple POSTs
    open_cors = Behaviour("r0", answer_headers=(("access-control-allow-origin", "*"),
                                                ("access-control-allow-credentials", "true")))
    gw = start_gateway(serve, [("r0", serve(fake_replica(open_cors)).url)])
    r = httpx.post(f"{gw.url}/v1/completions", headers={
        "origin": "https://elsewhere.example", "content-type": "text/plain"},
        content=b'{"model": "sim-model", "prompt": "p"}')
    assert r.status_code == 200
    assert not [k for k in r.headers if k.startswith("access-control-")]
    assert "origin" not in open_cors.headers[-1]  # the replica is not asked either
