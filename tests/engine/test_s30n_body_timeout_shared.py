"""The gateway and the engine time a request body with one read (``read_body``'s
``timeout_s``): a body that stops midway is the same 408 ``body_timeout`` from either,
with one message naming the seconds, and its bytes go back to the budget."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from starlette.requests import Request

from engine.server import EngineServer
from gateway.config import parse_config
from gateway.intake import read_timed_body
from gateway.state import build_state
from kvwire.openai_schema import RequestTimeout
from kvwire.request_edge import HeldBodyBytes, read_body
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core

# a time whose seconds ``str`` and ``:g`` spell differently (0.12345678 and 0.123457)
TIMEOUT_S = 0.12345678
MESSAGE = "request body not received within 0.123457 s"


def _stalled() -> Request:
    """A POST of a 5,000-byte body whose client sends 3,000 bytes of it and no more."""
    sent = False

    async def receive() -> dict[str, object]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()
        sent = True
        return {"type": "http.request", "body": b"a" * 3000, "more_body": True}

    return Request({"type": "http", "method": "POST", "path": "/v1/completions",
                    "headers": [(b"content-length", b"5000")]}, receive)


def _refused(read: Callable[[Request], Awaitable[bytes]]) -> RequestTimeout:
    async def run() -> RequestTimeout:
        with pytest.raises(RequestTimeout) as refused:
            await read(_stalled())
        return refused.value

    return asyncio.run(run())


def test_a_stalled_body_is_refused_alike_by_the_edge_the_gateway_and_the_engine() -> None:
    budget = HeldBodyBytes(1 << 20, server="engine", setting="--max-held-body-bytes")
    edge = _refused(lambda request: read_body(request, 1 << 20, budget,
                                              timeout_s=TIMEOUT_S))
    assert budget.held == 0

    gw = build_state(parse_config({"replicas": [{"id": "a", "url": "http://127.0.0.1:9"}],
                                   "limits": {"body_timeout_s": TIMEOUT_S}}))
    gateway = _refused(lambda request: read_timed_body(request, gw))
    assert gw.admission.bodies.held == 0

    server = EngineServer(make_core(), load_tokenizer(None), model_name="tiny",
                          sleep_modeled_time=False)
    server.body_timeout_s = TIMEOUT_S

    async def held(request: Request) -> bytes:
        async with server.held_body(request) as raw:
            return raw

    engine = _refused(held)
    assert server.bodies.held == 0

    for error in (edge, gateway, engine):
        assert (error.status, error.kind, error.body()["error"]["code"]) \
            == (408, "body_timeout", "body_timeout")
        assert error.message == MESSAGE
