"""A route another worker told to a replica this worker's fleet does not hold (removed a
moment before) is skipped, counted in ``unknown``, as a peer's is: the policy learnt of a
replica gone."""

from __future__ import annotations

import asyncio

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from policies.base import ReplicaView
from tests.support.route_documents import FLEET, document, paired_workers


def test_a_route_to_a_replica_the_fleet_does_not_hold_is_skipped() -> None:
    fleet = Fleet([ReplicaConfig(id=view.id, url=f"http://127.0.0.1:{9000 + i}")
                   for i, view in enumerate(FLEET)])

    async def run() -> None:
        a, b = paired_workers(b_fleet=fleet)
        try:
            held, gone = document(31), document(32)
            a.routed(held, "r1")
            a.routed(gone, "gone")  # removed from b's fleet a moment before
            a.send_waiting()
            b.catch_up()
            gone_view = ReplicaView("gone", kv_capacity_tokens=40_000)
            for doc, learnt in ((held, ["r1"]), (gone, [])):
                scores = b.policy.choose(doc, [*FLEET, gone_view]).scores
                matched = [s.replica for s in scores if s.matched_tokens]
                assert matched == learnt, matched
            assert (a.sent, b.received, b.unknown, b.malformed) == (2, 2, 1, 0)
        finally:
            a.stop()
            b.stop()

    asyncio.run(run())
