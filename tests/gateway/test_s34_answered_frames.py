"""A stored response's replica and tenant, told between a box's workers (``ANSWERED``
frames): sent at once, with the routes waiting, read by the other worker's next catch-up;
a malformed one is refused by name."""

from __future__ import annotations

import asyncio

import pytest

from gateway.peer_wire import (
    ANSWERED,
    MAX_FRAME,
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
    # a tenant as long as a tenant header may be (64 KiB) is told whole
    tenant = "t" * 65536
    assert _parsed(answered_frame("resp_3", "r0", tenant)) == Answered("resp_3", "r0", tenant)
    with pytest.raises(WireError, match="exceeds"):
        answered_frame("resp_" + "x" * MAX_FRAME, "r0", None)


@pytest.mark.parametrize(("body", "match"), [
    (b"[]", "not an object"),
    (b'{"id": "resp_1"}', "replica None"),
    (b'{"id": 5, "replica": "r0"}', "id 5"),
    (b'{"id": "resp_1", "replica": "r0", "tenant": 7}', "'tenant' is int"),
    (b"{" + b" " * 4000 + b"}", "id None"),
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


def test_without_routes_told_answers_are_still_told_and_counted_apart() -> None:
    async def run() -> None:
        inbox_a, to_a = route_pair()
        inbox_b, to_b = route_pair()
        heard: list[Answered] = []
        a = WorkerRoutes(inbox_a, [to_b], Cost(), tell_routes=False)
        b = WorkerRoutes(inbox_b, [to_a], Cost(), on_answered=heard.append)
        a.start()
        b.start()
        try:
            a.routed(document(1), "r2")  # --no-worker-routes: never told
            a.answered("resp_9", "r2", None)
            await asyncio.sleep(0.02)  # past FLUSH_S: a route would have gone by now
            b.catch_up()
            assert heard == [Answered("resp_9", "r2", None)]
            assert (a.sent, b.received) == (0, 0)  # the routes' counts: none
            assert (a.answers_told, b.answers_received) == (1, 1)
        finally:
            a.stop()
            b.stop()

    asyncio.run(run())


def test_an_answer_a_stalled_worker_cannot_take_is_counted_and_warned_of(
        caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        inbox_a, to_a = route_pair()
        inbox_b, to_b = route_pair()
        a = WorkerRoutes(inbox_a, [to_b], Cost())
        b = WorkerRoutes(inbox_b, [to_a], Cost())  # never started: reads nothing
        a.start()
        try:
            tenant = "t" * 60_000
            for i in range(200):  # ~12 MB: past what the stalled inbox holds
                a.answered(f"resp_{i}", "r0", tenant)
            assert a.answers_dropped > 0
            assert a.answers_told + a.answers_dropped == 200
            assert (a.sent, a.dropped) == (0, 0)  # no route among them
        finally:
            a.stop()
            b.stop()

    with caplog.at_level("WARNING", logger="kvgate.workers"):
        asyncio.run(run())
    warned = [r.getMessage() for r in caplog.records if "stored responses" in r.getMessage()]
    assert len(warned) == 1, warned  # once a minute at most
