"""While its answer streams, a request holds nothing of its parsed body: a parsed body
takes some 24 times its bytes, and a long stream of a long prompt held it for minutes."""

from __future__ import annotations

import gc
import threading
import uuid

import httpx

from gateway.request_parse import ParsedRequest
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway


def _parsed_alive(user: str) -> int:
    """This test's requests parsed and still alive (other tests' may be too). ``type``,
    not ``isinstance``: that reads ``__class__``, which some objects alive in a process
    that imported torch answer with a deprecation warning."""
    gc.collect()
    return sum(1 for o in gc.get_objects()
               if type(o) is ParsedRequest and o.body.get("user") == user)


def test_a_streaming_answer_holds_no_parsed_body(serve: Serve) -> None:
    release = threading.Event()
    replica = Behaviour("a", release=release)
    gw = start_gateway(serve, [("a", serve(fake_replica(replica)).url)])
    user = f"holds-no-body-{uuid.uuid4().hex}"
    body = {"model": "sim-model", "prompt": "a long document " * 200, "stream": True,
            "user": user}
    try:
        with httpx.Client(timeout=30) as client, \
                client.stream("POST", f"{gw.url}/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data:")  # the stream is open and waiting
            alive = _parsed_alive(user)
            release.set()
            rest = list(lines)
    finally:
        release.set()
    assert any("[DONE]" in line for line in rest)
    assert alive == 0
