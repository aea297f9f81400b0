"""A body with neither a length nor chunks ends with its connection, as one whose replica
died mid-body does; a gzip (or deflate) body tells the two apart by its compressed
stream's end. Cut inside it, the client's answer is left unfinished (a stream's) or the
request goes to the next replica (a whole answer, read before the client sees a byte);
a whole one goes through byte for byte."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable

import httpx
import pytest

from gateway.upstream_http import UpstreamClient
from tests.support.foreign_raw import raw_replica
from tests.support.gateway_harness import Serve, metric, start_gateway

EVENTS = b"".join(b'data: {"choices":[{"index":0,"text":"t%d"}]}\n\n' % i
                  for i in range(200)) + b"data: [DONE]\n\n"
ANSWER = json.dumps({"id": "x", "object": "text_completion", "choices": [
    {"index": 0, "text": "whole " * 500, "finish_reason": "stop"}]}).encode()


def _close_delimited(kind: str, body: bytes, encoding: str = "gzip") -> Callable[[], bytes]:
    return lambda: (b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-encoding: %s\r\n"
                    b"connection: close\r\n\r\n%s" % (kind.encode(), encoding.encode(), body))


def _stream(url: str) -> tuple[int, bytes, str | None]:
    """The status, the raw (still encoded) body and how reading it failed, if it did."""
    got = bytearray()
    with httpx.stream("POST", f"{url}/v1/completions", timeout=10,
                      json={"model": "m", "prompt": "x", "stream": True}) as r:
        try:
            for piece in r.iter_raw():
                got += piece
        except httpx.RemoteProtocolError as exc:
            return r.status_code, bytes(got), str(exc)
    return r.status_code, bytes(got), None


@pytest.mark.parametrize("encoding, pack", [("gzip", gzip.compress),
                                            ("deflate", zlib.compress)])
def test_an_encoded_stream_cut_mid_body_is_not_ended_whole(serve: Serve, encoding: str,
                                                           pack: Callable[[bytes], bytes]
                                                           ) -> None:
    packed = pack(EVENTS)
    cut = _close_delimited("text/event-stream", packed[: len(packed) // 2], encoding)
    with raw_replica(cut) as url:
        gw = start_gateway(serve, [("r0", url)], max_attempts=1)
        status, body, failed = _stream(gw.url)
        assert status == 200 and failed is not None  # no terminating chunk: unfinished
        assert body == packed[: len(packed) // 2]  # what came, byte for byte
        assert metric(gw, 'kvgate_upstream_cuts_total{cause="broken",replica="r0"}') == 1


def test_an_encoded_stream_that_ends_whole_goes_through_whole(serve: Serve) -> None:
    # two gzip members, as RFC 1952 allows: whole only at the second's end
    packed = gzip.compress(EVENTS[:500]) + gzip.compress(EVENTS[500:])
    with raw_replica(_close_delimited("text/event-stream", packed)) as url:
        gw = start_gateway(serve, [("r0", url)], max_attempts=1)
        status, body, failed = _stream(gw.url)
        assert (status, failed) == (200, None) and gzip.decompress(body) == EVENTS
        assert metric(gw, 'kvgate_upstream_cuts_total{cause="broken",replica="r0"}') == 0


def test_a_whole_encoded_answer_cut_mid_body_goes_to_the_next_replica(serve: Serve) -> None:
    packed = gzip.compress(ANSWER)
    with raw_replica(_close_delimited("application/json", packed[:-20])) as cut, \
            raw_replica(_close_delimited("application/json", packed)) as whole:
        gw = start_gateway(serve, [("cut", cut), ("whole", whole)])
        for _ in range(2):  # round robin: one of them goes to the cut replica first
            r = httpx.post(f"{gw.url}/v1/completions", timeout=10,
                           json={"model": "m", "prompt": "x"})
            assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "whole"
            assert r.json()["choices"][0]["text"] == "whole " * 500
        assert (metric(gw, 'kvgate_retries_total{cause="broken",replica="cut"}') or 0) >= 1


async def test_a_body_that_inflates_too_far_is_not_judged() -> None:
    # a bomb's end is not followed (it would hold the loop): its close is its end
    bomb = gzip.compress(bytes(8 << 20))
    answer = _close_delimited("application/octet-stream", bomb[: len(bomb) // 2])
    with raw_replica(answer) as url:
        client = UpstreamClient()
        try:
            response = await client.post(f"{url}/v1/completions", b"{}", {})
            got = b""
            while chunk := await response.readany():
                got += chunk
            assert got == bomb[: len(bomb) // 2] and response.is_eof()
            response.release()
        finally:
            await client.close()
