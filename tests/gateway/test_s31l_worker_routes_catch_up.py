"""A worker takes the routes the box's other workers told when it next decides
(``WorkerRoutes.catch_up``, called before each decision), rather than being woken by
every message they send: a wake per told route cost each worker more CPU than the route's
own ``observe``. Everything told before a decision is known to it; a worker that decides
nothing still reads its inbox every ``DRAIN_S``."""

from __future__ import annotations

import asyncio

from policies.base import Routed
from tests.support.route_documents import FLEET, document, paired_workers


def test_a_decision_knows_every_route_told_before_it_without_a_wake() -> None:
    async def run() -> None:
        a, b = paired_workers()
        try:
            docs = [document(seed) for seed in (11, 12, 13)]
            for doc in docs:
                a.policy.observe(Routed(doc, "r1"))
                a.routed(doc, "r1")
            a.send_waiting()  # what FLUSH_S does
            # nothing wakes b for a's messages (no reader of its inbox to remove)
            assert not asyncio.get_running_loop().remove_reader(b.inbox.fileno())
            assert b.received == 0
            b.catch_up()  # as the gateway calls it before b's next decision
            assert (a.sent, b.received, b.malformed) == (3, 3, 0)
            for doc in docs:
                scores = b.policy.choose(doc, FLEET).scores
                held = {s.replica: s.matched_tokens for s in scores if s.matched_tokens}
                assert list(held) == ["r1"], held
        finally:
            a.stop()
            b.stop()

    asyncio.run(run())
