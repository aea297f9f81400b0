"""Every status the gateway refuses or fails a request with has its ``requests`` series
from the start, at 0: a rate or an alert over a series that appears only with its first
sample misses that sample."""

from __future__ import annotations

from collections.abc import Iterator

import httpx

import gateway.app  # noqa: F401  (every error class the gateway answers with, imported)
from gateway.metrics import REJECTED, UNANSWERED
from kvwire.openai_schema import OpenAIError
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway


def _kinds(cls: type[OpenAIError]) -> Iterator[type[OpenAIError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _kinds(sub)


def test_every_error_status_is_a_series_from_the_start(serve: Serve) -> None:
    statuses = {str(kind.status) for kind in _kinds(OpenAIError)}
    assert statuses - {*REJECTED, *UNANSWERED} == set()
    replica = serve(fake_replica(Behaviour("r0")))
    gw = start_gateway(serve, [("r0", replica.url)])
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    for status in REJECTED:
        assert (f'kvgate_requests_total{{replica="none",route="none",status="{status}"}} 0.0'
                in text), status
