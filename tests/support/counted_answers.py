"""A replica's streamed answer written byte for byte (for ``foreign_raw.raw_replica``), and
how the gateway in front of it counted the requests: what tests of a stream's end (whole,
cut, or failed though its ``[DONE]`` came) send and read."""

from __future__ import annotations

import httpx

from tests.support.gateway_harness import Gateway
from tests.support.waiting import wait_until


def chunked(*events: bytes) -> bytes:
    """A 200 event-stream answer whose body is ``events``, one HTTP chunk each."""
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
            + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n")


def counted(gw: Gateway) -> dict[str, float]:
    """The gateway's ``kvgate_requests_total`` summed by status, the statuses counted."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{gw.url}/metrics").text.splitlines():
        if line.startswith("kvgate_requests_total{") and float(line.split()[-1]):
            status = line.split('status="')[1].split('"')[0]
            out[status] = out.get(status, 0.0) + float(line.split()[-1])
    return out


def answered(gw: Gateway) -> float:
    """The requests the gateway counted answered (its duration histogram's count)."""
    return sum(float(line.split()[-1])
               for line in httpx.get(f"{gw.url}/metrics").text.splitlines()
               if line.startswith("kvgate_request_duration_seconds_count"))


def one_counted(gw: Gateway) -> dict[str, float]:
    """``counted`` once the gateway counted its one request."""
    wait_until(lambda: sum(counted(gw).values()) == 1, 5, "the request counted")
    return counted(gw)
