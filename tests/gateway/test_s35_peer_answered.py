"""Gateway copies tell each other the stored responses they see answered (``ANSWERED``):
each one's replica and tenant reach the peer's ``on_answered``, unless
``peers.tell_responses`` is false."""

from __future__ import annotations

import dataclasses

from gateway.peer_wire import Answered
from policies.base import RouteRequest
from tests.support.peer_copies import linked_pair
from tests.support.waiting import wait_until_async


async def test_a_peer_hears_each_stored_responses_replica_and_tenant() -> None:
    async with linked_pair() as (a, b):
        heard: list[Answered] = []
        b.peers.on_answered = heard.append
        a.peers.answered("resp_1", "r2", "acme")
        a.peers.answered("resp_2", "r0", None)
        await wait_until_async(lambda: len(heard) == 2, 5.0, "b to hear both")
        assert heard == [Answered("resp_1", "r2", "acme"), Answered("resp_2", "r0", None)]
        assert b.peers.counts.frames_received == 2
        # one a listener's state fails to keep leaves the link and the next ones standing
        b.peers.on_answered = lambda told: (_ for _ in ()).throw(RuntimeError("full"))
        a.peers.answered("resp_3", "r1", "acme")
        await wait_until_async(lambda: b.peers.counts.frames_received == 3, 5.0,
                               "b to hear the third")
        b.peers.on_answered = heard.append
        a.peers.answered("resp_4", "r1", "evil")
        await wait_until_async(lambda: len(heard) == 3, 5.0, "b to hear the fourth")
        assert heard[-1] == Answered("resp_4", "r1", "evil")
        assert a.peers.counts.links_up == 1


async def test_with_tell_responses_off_no_response_is_told() -> None:
    async with linked_pair() as (a, b):
        heard: list[Answered] = []
        b.peers.on_answered = heard.append
        a.peers.config = dataclasses.replace(a.peers.config, tell_responses=False)
        a.peers.answered("resp_1", "r2", "acme")
        a.peers.routed(RouteRequest(tokens=(), prompt_tokens=0, chunks=(1, 2, 3),
                                    chunk_tokens=16.0), "r1")  # a frame that is told
        await wait_until_async(lambda: b.peers.counts.frames_received == 1, 5.0,
                               "b to hear the route")
        assert heard == []
