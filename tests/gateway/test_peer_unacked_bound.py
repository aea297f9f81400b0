"""A peer link's connection carries a bound on unacknowledged bytes: a peer whose node died
without closing is dropped within ``UNACKED_S`` (its heartbeats go unacknowledged), not
after the system's retransmissions give up some 15 minutes later."""

from __future__ import annotations

import asyncio
import socket

import pytest

from gateway import peers
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.peer_config import PeersConfig
from gateway.peers import Peers
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"),
                                reason="TCP_USER_TIMEOUT is Linux's")
SECRET = "a-peer-secret-of-some-length"


async def test_a_links_connection_drops_bytes_unacknowledged_past_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bounded: list[int] = []
    real = peers.unacked_bound

    def seen(writer: asyncio.StreamWriter) -> None:
        real(writer)
        sock = writer.get_extra_info("socket")
        bounded.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))

    monkeypatch.setattr(peers, "unacked_bound", seen)
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:9")])
    b = Peers(PeersConfig(listen="127.0.0.1:0", secret=SECRET), fleet, None)
    await b.start()
    assert b.address is not None
    a = Peers(PeersConfig(addresses=[f"{b.address[0]}:{b.address[1]}"], secret=SECRET),
              Fleet([ReplicaConfig("r0", "http://127.0.0.1:9")]), None)
    await a.start()
    try:
        await wait_until_async(lambda: a.counts.links_up == 1, 5.0, "a's link to b")
        assert bounded == [int(peers.UNACKED_S * 1000)]
        assert peers.UNACKED_S < peers.SILENT_S  # dropped before the receiver gives up
        assert peers.UNACKED_S > 2 * peers.HEARTBEAT_S  # a heartbeat or two may be slow
    finally:
        await a.stop()
        await b.stop()
