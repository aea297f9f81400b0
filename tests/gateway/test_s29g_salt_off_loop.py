"""Under ``tenancy.isolate`` a large routed body is written again with its tenant's
cache salt on a thread, as it was parsed there (and as a pass-through body is): 16 MiB
of small items held the event loop some 70 ms per request. A small one is salted on the
loop."""

from __future__ import annotations

import orjson

from gateway.config import parse_config
from gateway.state import build_state
from gateway.tenancy import Tenancy
from kvwire.request_edge import PARSE_ON_THREAD_BYTES
from tests.support.loop_check import TakenIn, taken_in

SALTING = Tenancy.isolate.__code__


def _salted_on_loop(body: bytes) -> TakenIn:
    """(the salting calls on the event loop's thread, what was taken in)."""
    state = build_state(parse_config({
        "replicas": [{"id": "a", "url": "http://127.0.0.1:9"}],
        "tenancy": {"isolate": True, "secret": "s" * 32},
        "trusted_proxies": ["127.0.0.1/32"]}))
    return taken_in(state, body, "/v1/completions", "completions", SALTING)


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
