"""A stored response's replica and tenant, told between a box's workers (``ANSWERED``
frames): sent at once, with the routes waiting, read by the other worker's next catch-up;
a malformed one is refused by name."""

from __future__ import annotations

import asyncio

import pytest

from gateway.peer_wire import (
    ANSWERED,
    Answered,
    WireError,
    _frame,
    answered_frame,
    frame_length,
    parse_frame,
)
from gateway.worker_routes import WorkerRoutes, route_pair
from policies.cost import Cost
from tests.support.route_documents import document


def _parsed(frame: bytes) -> object:
    length, kind = frame_length(frame[:5])
    return parse_frame(kind, frame[5:5 + length], 0.0)


def test_an_answered_frame_reads_back_as_sent() -> None:
    assert _parsed(answered_frame("resp_1", "r0", "acme")) == Answered("resp_1", "r0", "acme")
    assert _parsed(answered_frame("resp_2", "r1", None)) == Answered("resp_2", "r1", None)
    with pytest.raises(WireError, match="exceeds"):
        answered_frame("resp_" + "x" * 4000, "r0", None)


@pytest.mark.parametrize(("body", "match"), [
    (b"[]", "not an object"),
    (b'{"id": "resp_1"}', "replica None"),
    (b'{"id": 5, "replica": "r0"}', "id 5"),
    (b'{"id": "resp_1", "replica": "r0", "tenant": 7}', "'tenant' is int"),
    (b"{" + b" " * 4000 + b"}", "exceeds"),
])
def test_a_malformed_answered_frame_is_refused_by_name(body: bytes, match: str) -> None:
    with pytest.raises(WireError, match=match):
        _parsed(_frame(ANSWERED, body))


def test_a_worker_tells_the_others_an_answered_response_at_once() -> None:
    async def run() -> None:
        inbox_a, to_a = route_pair()
        inbox_b, to_b = route_pair()
        heard: list[Answered] = []
        a = WorkerRoutes(inbox_a, [to_b], Cost())
        b = WorkerRoutes(inbox_b, [to_a], Cost(), on_answered=heard.append)
        a.start()
        b.start()
        try:
            a.routed(document(1), "r2")  # waits for FLUSH_S: goes with the answer
            a.answered("resp_9", "r2", "acme")
            b.catch_up()  # no wait: it was sent before ``answered`` returned
            assert heard == [Answered("resp_9", "r2", "acme")]
            assert (b.received, b.malformed) == (1, 0)  # the route came with it
        finally:
            a.stop()
            b.stop()

    asyncio.run(run())
