"""Under ``tenancy.isolate`` a large routed body is written again with its tenant's
cache salt on a thread, as it was parsed there (and as a pass-through body is): 16 MiB
of small items held the event loop some 70 ms per request. A small one is salted on the
loop."""

from __future__ import annotations

import asyncio
import sys
from types import FrameType

import orjson
from starlette.requests import Request

from gateway.config import parse_config
from gateway.intake import Intake, take_in
from gateway.state import build_state
from gateway.tenancy import Tenancy
from kvwire.request_edge import PARSE_ON_THREAD_BYTES

SALTING = Tenancy.isolate.__code__


def _salted_on_loop(body: bytes) -> tuple[int, Intake]:
    """(the salting calls on the event loop's thread, what was taken in)."""
    state = build_state(parse_config({
        "replicas": [{"id": "a", "url": "http://127.0.0.1:9"}],
        "tenancy": {"isolate": True, "secret": "s" * 32},
        "trusted_proxies": ["127.0.0.1/32"]}))
    sent = False

    async def receive() -> dict[str, object]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # no disconnect while the body is read
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(b"content-length", str(len(body)).encode())]}
    calls = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call" and frame.f_code is SALTING:
            calls += 1

    async def take() -> Intake:
        sys.setprofile(profile)  # this thread's calls only: the loop's, not a worker's
        try:
            return await take_in(Request(scope, receive), state, "completions")
        finally:
            sys.setprofile(None)

    intake = asyncio.run(take())
    return calls, intake


def test_a_large_body_is_salted_off_the_event_loop() -> None:
    body = orjson.dumps({"model": "m", "prompt": "x", "extra": [0] * PARSE_ON_THREAD_BYTES})
    calls, intake = _salted_on_loop(body)
    assert calls == 0
    assert intake.parsed.cache_salt is not None
    assert orjson.loads(intake.raw)["cache_salt"] == intake.parsed.cache_salt


def test_a_small_body_is_salted_on_the_event_loop() -> None:
    calls, intake = _salted_on_loop(orjson.dumps({"model": "m", "prompt": "x"}))
    assert calls == 1
    assert orjson.loads(intake.raw)["cache_salt"] == intake.parsed.cache_salt
