"""A gateway copy tells a peer whose link just came up the stored responses it knows of
(``Peers.known_answers``): the newest that fit ``CATCH_UP_BYTES``, oldest first; none
with ``peers.tell_responses`` false."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator

import pytest

from gateway import peers as peers_module
from gateway.peer_wire import Answered, answered_frame
from policies.base import RouteRequest
from tests.support.peer_copies import PeerCopy, linked_pair
from tests.support.waiting import wait_until_async

KNOWN = [Answered(f"resp_{i}", f"r{i % 4}", "acme" if i % 2 else None) for i in range(1200)]


@contextlib.asynccontextmanager
async def _linked(tell: bool = True) -> AsyncIterator[tuple[PeerCopy, list[Answered]]]:
    """A sender knowing ``KNOWN`` (telling responses: ``tell``), once its link to a
    receiver that listened first is up; what the receiver hears."""
    heard: list[Answered] = []

    def prepare(sender: PeerCopy, receiver: PeerCopy) -> None:
        sender.peers.known_answers = lambda: list(KNOWN)
        sender.peers.config = dataclasses.replace(sender.peers.config, tell_responses=tell)
        receiver.peers.on_answered = heard.append

    async with linked_pair(prepare) as (sender, _):
        yield sender, heard


async def _heard_before_the_next() -> tuple[PeerCopy, list[Answered]]:
    """What the receiver heard when the link came up: everything before a response told
    after it (frames arrive in order)."""
    async with _linked() as (sender, heard):
        sender.peers.answered("resp_new", "r3", "acme")
        await wait_until_async(lambda: heard and heard[-1].response == "resp_new", 5.0,
                               "the response answered after the link came up")
    return sender, heard[:-1]


async def test_a_peer_linked_later_hears_the_responses_answered_before() -> None:
    sender, heard = await _heard_before_the_next()
    assert heard == KNOWN
    assert sender.peers.counts.frames_sent == len(KNOWN) + 1


async def test_only_the_newest_that_fit_are_told(monkeypatch: pytest.MonkeyPatch) -> None:
    size = len(answered_frame("resp_1000", "r0", None))
    monkeypatch.setattr(peers_module, "CATCH_UP_BYTES", 100 * size)
    _, heard = await _heard_before_the_next()
    assert 90 <= len(heard) <= 100
    assert heard == KNOWN[-len(heard):]


async def test_with_tell_responses_off_none_is_told_on_linking() -> None:
    async with _linked(tell=False) as (sender, heard):
        sender.peers.routed(RouteRequest(tokens=(), prompt_tokens=0, chunks=(1, 2, 3),
                                         chunk_tokens=16.0), "r1")  # a frame that is told
        await wait_until_async(lambda: sender.peers.counts.frames_sent == 1, 5.0,
                               "the route sent")
    assert heard == []
