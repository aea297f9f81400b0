"""A replica that begins its answer and then trickles it (a byte now and then, or SSE
comment lines and no events) is held to the gateway's timeouts: a non-streamed body that
has begun comes whole within ``idle_s``, and a stream's comments are no progress."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.idle_watch import IdleWatch
from gateway.proxy import _comments_only
from tests.support.fault_gateways import gateway
from tests.support.metrics import samples
from tests.support.servers import ThreadServer

Serve = Callable[..., ThreadServer]
ASGI = Callable[..., Any]
TRICKLE_FOR_S = 3.0  # a trickle's length: it ends (cut) after this, unless the gateway left
EVENT = {"id": "x", "object": "text_completion", "created": 0, "model": "sim-model",
         "choices": [{"index": 0, "text": "t", "finish_reason": None}]}
LAST = {**EVENT, "choices": [{"index": 0, "text": "t", "finish_reason": "stop"}]}
TIMEOUTS = {"idle_s": 0.5, "first_byte_s": 2}  # the gateway's, unless a test says
WHOLE = {**LAST, "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def replica(how: str) -> ASGI:
    """A replica whose completions begin at once and then trickle (``how``): ``body`` a
    JSON body's first byte, then a space every 0.05 s; ``long_body`` 4 KB of it first;
    ``comments`` a stream's first event, then a comment line every 0.05 s; ``keepalive``
    a whole stream with comment lines between its events; ``gzip_stream`` a stream
    gzip-encoded (by a compressing hop), an event every 0.05 s for 1 s, then its end;
    ``whole`` a whole JSON answer.
    A trickle ends after ``TRICKLE_FOR_S`` or when the gateway hangs up."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] != "/v1/completions":
            body = b'{"object":"list","data":[{"id":"sim-model"}]}' \
                if scope["path"] == "/v1/models" else b""
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        while (await receive()).get("more_body"):
            pass
        streamed = how in ("comments", "keepalive", "gzip_stream")
        kind = b"text/event-stream" if streamed else b"application/json"
        headers = [(b"content-type", kind)]
        if how == "gzip_stream":
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def part(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        if how == "whole":
            await send({"type": "http.response.body", "body": json.dumps(WHOLE).encode()})
            return
        if how == "gzip_stream":
            gzip = zlib.compressobj(wbits=31)
            for _ in range(20):  # 1 s in all, twice idle_s
                await part(gzip.compress(b"data: " + json.dumps(EVENT).encode() + b"\n\n")
                           + gzip.flush(zlib.Z_SYNC_FLUSH))
                await asyncio.sleep(0.05)
            await send({"type": "http.response.body", "body": gzip.compress(
                b"data: " + json.dumps(LAST).encode() + b"\n\ndata: [DONE]\n\n")
                + gzip.flush()})
            return
        if how == "keepalive":
            await part(b"data: " + json.dumps(EVENT).encode() + b"\n\n")
            for _ in range(3):
                await asyncio.sleep(0.05)
                await part(b": keep-alive\n\n")
            await part(b"data: " + json.dumps(LAST).encode() + b"\n\n")
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            return
        if how == "comments":
            await part(b"data: " + json.dumps(EVENT).encode() + b"\n\n")
            tick = b": ping\n\n"
        else:
            await part(b'{"pad": "' + b"p" * 4096 + b'", ' if how == "long_body" else b"{")
            tick = b" "
        for _ in range(int(TRICKLE_FOR_S / 0.05)):
            try:  # the gateway hanging up ends it
                if (await asyncio.wait_for(receive(), 0.05))["type"] == "http.disconnect":
                    return
            except TimeoutError:
                pass
            await part(tick)
        await send({"type": "http.response.body", "body": b""})

    return app


def post(gw: ThreadServer, stream: bool = False) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/completions", timeout=10,
                      json={"model": "sim-model", "prompt": "x", "stream": stream})


def metric(gw: ThreadServer, name: str, **labels: str) -> float:
    return sum(value for (n, have), value in samples(httpx.get(f"{gw.url}/metrics").text)
               .items() if n == name and set(labels.items()) <= set(have))


def test_a_non_streamed_body_trickled_after_its_first_byte_gets_a_504(serve: Serve) -> None:
    gw = gateway(serve, [serve(replica("body"))], timeouts=TIMEOUTS)
    r = post(gw)
    assert r.status_code == 504, r.text
    error = r.json()["error"]
    assert error["code"] == "upstream_timeout"
    assert "'r0'" in error["message"] and "timeouts.idle_s (0.5 s)" in error["message"]


def test_a_trickled_body_is_tried_on_the_next_replica(serve: Serve) -> None:
    gw = gateway(serve, [serve(replica("body")), serve(replica("whole"))], timeouts=TIMEOUTS)
    for _ in range(2):  # round robin starts on either
        r = post(gw)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"
    assert metric(gw, "kvgate_retries_total", cause="idle_timeout", replica="r0") >= 1


def test_a_long_body_trickled_past_what_is_held_is_cut(serve: Serve) -> None:
    # its first KB is held and the client gets its 200: then the rest must come whole
    # within what is left of idle_s, or the connection is dropped
    gw = gateway(serve, [serve(replica("long_body"))],
                 timeouts={**TIMEOUTS, "buffer_bytes": 1024})
    with pytest.raises(httpx.RemoteProtocolError):
        post(gw)
    assert metric(gw, "kvgate_upstream_cuts_total", cause="idle_timeout") == 1


def test_a_stream_of_nothing_but_comments_is_cut_by_idle_s(serve: Serve) -> None:
    gw = gateway(serve, [serve(replica("comments"))], timeouts=TIMEOUTS)
    r = post(gw, stream=True)
    assert r.status_code == 200 and b": ping" in r.content  # relayed, yet no progress
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert "[DONE]" not in events[-1]
    assert json.loads(events[-1][6:])["error"]["code"] == "upstream_idle_timeout"


def test_comments_between_events_reach_the_client_and_the_stream_ends_whole(
        serve: Serve) -> None:
    gw = gateway(serve, [serve(replica("keepalive"))], timeouts={**TIMEOUTS, "idle_s": 2})
    r = post(gw, stream=True)
    assert r.status_code == 200 and r.text.count(": keep-alive") == 3
    assert r.text.endswith("data: [DONE]\n\n") and "error" not in r.text


def test_an_encoded_stream_whose_events_keep_coming_is_relayed_whole(serve: Serve) -> None:
    # relayed as bytes (no events read in them): each read is progress, held to idle_s
    # read by read as a stream is, never to idle_s in all as a non-streamed body
    gw = gateway(serve, [serve(replica("gzip_stream"))], timeouts=TIMEOUTS)
    r = post(gw, stream=True)
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
    assert r.text.count("data: ") == 22 and r.text.endswith("data: [DONE]\n\n"), r.text
    assert metric(gw, "kvgate_upstream_cuts_total") == 0


async def test_a_wait_that_began_before_its_read_ends_when_its_own_time_is_up() -> None:
    # a body's reads add up: a read that begins with most of idle_s spent by the reads
    # before it is cut when the rest runs out, not a whole idle_s after it began
    watches: list[IdleWatch] = []

    async def read() -> None:
        watch = IdleWatch(30.0)
        watches.append(watch)
        try:
            watch.waiting(29.9)
            await asyncio.sleep(3)  # the read: the replica sends nothing
        finally:
            watch.stop()

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(read())
    assert watches[0].fired


@pytest.mark.parametrize("before, chunk, only", [
    (b"", b": ping\n\n", True),
    (b"data: 1\n\n", b": ping\n\n:\n\n", True),
    (b"data: 1\n\n: pi", b"ng\n\n", True),  # a comment's rest
    (b"data: 1\n\n", b"data: 2\n\n", False),
    (b"data: 1\n\n", b": ping\n\ndata: 2\n\n", False),
    (b"data: 1\n\n", b"\n", True),
    (b"data: {\"a\": ", b"1}\n\n", False),  # an event's rest
    (b":" + b"x" * 8191, b": ping\n\n", False),  # a line begun before the kept bytes
    (b"data: 1\n", b"\n", False),  # the blank line that ends an event
    (b"data: 1\r\n", b"\r\n: ping\r\n", False),
    (b": ping\n", b"\n", True),
])
def test_comment_only_reads_are_told_from_reads_with_an_event(before: bytes, chunk: bytes,
                                                              only: bool) -> None:
    assert _comments_only(before, chunk) is only
