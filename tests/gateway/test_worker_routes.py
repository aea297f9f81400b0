"""The routes a box's worker processes tell each other (``gateway.worker_routes``), over the
socket pairs the supervisor makes: a route one worker makes teaches the other's policy."""

from __future__ import annotations

import asyncio

from gateway.peer_wire import routed_frame
from gateway.worker_routes import WorkerRoutes, route_pair
from policies.base import Routed, RouteRequest
from policies.cost import Cost
from tests.support.route_documents import FLEET, document, paired_workers


def _holds(policy: Cost, request: RouteRequest) -> dict[str, int]:
    decision = policy.choose(request, FLEET)
    return {s.replica: s.matched_tokens for s in decision.scores if s.matched_tokens}


def test_a_route_one_worker_makes_teaches_the_others_policy() -> None:
    async def run() -> None:
        a, b = paired_workers()
        try:
            doc = document(1)
            chosen = a.policy.choose(doc, FLEET).chosen
            a.policy.observe(Routed(doc, chosen))
            assert _holds(b.policy, doc) == {}  # nothing told yet
            a.routed(doc, chosen)
            others = [document(seed) for seed in (5, 6)]
            for other in others:  # sent with the first, in one message
                a.routed(other, "r3")
            for _ in range(50):
                await asyncio.sleep(0.01)
                if b.received:
                    break
            assert (a.sent, b.received, b.malformed) == (3, 3, 0)
            held = _holds(b.policy, doc)
            assert list(held) == [chosen] and held[chosen] >= 60 * 16
            assert all(list(_holds(b.policy, other)) == ["r3"] for other in others)
            assert _holds(b.policy, document(2)) == {}
        finally:
            a.stop()
            b.stop()

    asyncio.run(run())


def test_a_full_inbox_drops_routes_and_a_malformed_message_is_skipped() -> None:
    async def run() -> None:
        a, b = paired_workers(start_b=False)
        try:
            # b stalls (never started: reads nothing): a's sends fill its inbox, then are
            # dropped
            doc = document(3)
            for _ in range(2_000):
                a.routed(doc, "r0")
            assert a.sent + a.dropped == 0  # sent together, after FLUSH_S
            await asyncio.sleep(0.1)
            assert a.dropped > 0 and a.sent + a.dropped == 2_000
            # a reader skips what is not a whole frame and reads on
            (inbox, to_inbox) = route_pair()
            c = WorkerRoutes(inbox, [], Cost())
            c.start()
            to_inbox.send(b"\x05\x00")
            to_inbox.send(routed_frame(doc, "r1")[:-3])
            to_inbox.send(routed_frame(doc, "r1"))
            for _ in range(50):
                await asyncio.sleep(0.01)
                if c.received:
                    break
            assert (c.malformed, c.received) == (2, 1)
            assert list(_holds(c.policy, doc)) == ["r1"]
            c.stop()
            to_inbox.close()
        finally:
            a.stop()
            b.stop()

    asyncio.run(run())


class _Fails(Cost):
    """A policy whose observe fails on its first route."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def observe(self, event: object) -> None:  # type: ignore[override]
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a policy's defect")
        super().observe(event)  # type: ignore[arg-type]


def test_a_policy_failing_on_a_route_loses_none_of_the_others() -> None:
    async def run() -> None:
        inbox, to_inbox = route_pair()
        policy = _Fails()
        reader = WorkerRoutes(inbox, [], policy)
        reader.start()
        docs = [document(seed) for seed in (7, 8, 9)]
        to_inbox.send(b"".join(routed_frame(doc, "r2") for doc in docs))  # one message
        for _ in range(50):
            await asyncio.sleep(0.01)
            if reader.received == 3:
                break
        assert (reader.received, policy.calls, reader.malformed) == (3, 3, 0)
        assert [list(_holds(policy, doc)) for doc in docs] == [[], ["r2"], ["r2"]]
        # every other worker gone: its inbox at its end is read no more (it spun)
        to_inbox.close()
        for _ in range(50):
            await asyncio.sleep(0.01)
            if not reader.reading:
                break
        assert not reader.reading
        reader.stop()

    asyncio.run(run())
