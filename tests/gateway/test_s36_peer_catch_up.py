"""A gateway copy tells a peer whose link just came up the stored responses it knows of
(``Peers.known_answers``): the newest that fit ``CATCH_UP_BYTES``, oldest first; none
with ``peers.tell_responses`` false."""

from __future__ import annotations

import dataclasses

import pytest

from gateway import peers as peers_module
from gateway.peer_wire import Answered, answered_frame
from policies.base import RouteRequest
from tests.support.peer_copies import PeerCopy
from tests.support.waiting import wait_until_async

KNOWN = [Answered(f"resp_{i}", f"r{i % 4}", "acme" if i % 2 else None) for i in range(1200)]


async def _heard_on_link(sender: PeerCopy, receiver: PeerCopy) -> list[Answered]:
    heard: list[Answered] = []
    receiver.peers.on_answered = heard.append
    await receiver.peers.start()
    sender.peers.config = dataclasses.replace(sender.peers.config,
                                              addresses=[receiver.address()])
    await sender.peers.start()
    try:
        await wait_until_async(lambda: sender.peers.counts.links_up == 1, 5.0, "the link")
        # a route told after the link came up arrives after everything told before it
        sender.peers.answered("resp_new", "r3", "acme")
        await wait_until_async(lambda: heard and heard[-1].response == "resp_new", 5.0,
                               "the response answered after the link came up")
        return heard[:-1]
    finally:
        await sender.peers.stop()
        await receiver.peers.stop()


async def test_a_peer_linked_later_hears_the_responses_answered_before() -> None:
    sender, receiver = PeerCopy([]), PeerCopy([])
    sender.peers.known_answers = lambda: list(KNOWN)
    assert await _heard_on_link(sender, receiver) == KNOWN
    assert sender.peers.counts.frames_sent == len(KNOWN) + 1


async def test_only_the_newest_that_fit_are_told(monkeypatch: pytest.MonkeyPatch) -> None:
    size = len(answered_frame("resp_1000", "r0", None))
    monkeypatch.setattr(peers_module, "CATCH_UP_BYTES", 100 * size)
    sender, receiver = PeerCopy([]), PeerCopy([])
    sender.peers.known_answers = lambda: list(KNOWN)
    heard = await _heard_on_link(sender, receiver)
    assert 90 <= len(heard) <= 100
    assert heard == KNOWN[-len(heard):]


async def test_with_tell_responses_off_none_is_told_on_linking() -> None:
    sender, receiver = PeerCopy([]), PeerCopy([])
    sender.peers.known_answers = lambda: list(KNOWN)
    sender.peers.config = dataclasses.replace(sender.peers.config, tell_responses=False)
    heard: list[Answered] = []
    receiver.peers.on_answered = heard.append
    await receiver.peers.start()
    sender.peers.config = dataclasses.replace(sender.peers.config,
                                              addresses=[receiver.address()])
    await sender.peers.start()
    try:
        await wait_until_async(lambda: sender.peers.counts.links_up == 1, 5.0, "the link")
        sender.peers.routed(RouteRequest(tokens=(), prompt_tokens=0, chunks=(1, 2, 3),
                                         chunk_tokens=16.0), "r1")  # a frame that is told
        await wait_until_async(lambda: receiver.peers.counts.frames_received == 1, 5.0,
                               "the route, the first frame heard")
    finally:
        await sender.peers.stop()
        await receiver.peers.stop()
    assert heard == []
