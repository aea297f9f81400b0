"""A peer link whose connection fails (the peer reset it, or its node died and the
connection timed out) is a lost link, on uvloop as on asyncio's own loop: one INFO line
without a traceback and the usual back-off, never ``the link failed`` logged as a defect
(uvloop raises ``RuntimeError`` on a write to the closed transport) with the longest wait."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Callable

import pytest
import uvloop

from gateway import peer_wire, peers
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.peer_config import PeersConfig
from gateway.peers import Peers
from tests.support.waiting import wait_until_async

SECRET = "a-peer-secret-of-some-length"
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


async def _links_to_a_resetting_peer(links: int) -> None:
    """A copy links to a peer that proves the secret, then resets each connection."""
    secret = SECRET.encode()
    instance = os.urandom(peer_wire.ID_BYTES)
    linked: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = await reader.readexactly(peer_wire.SENDER_HELLO_BYTES)
        nonce = os.urandom(peer_wire.NONCE_BYTES)
        writer.write(peer_wire.listener_hello(secret, hello, nonce, instance))
        proof = await reader.readexactly(peer_wire.MAC_BYTES)
        assert peer_wire.check_sender(secret, nonce, hello[peer_wire.NONCE_BYTES:], instance,
                                      proof)
        writer.write(bytes([peer_wire.STATUS_OK]))
        await writer.drain()
        linked.append(1)
        sock = writer.get_extra_info("socket")  # closed with a reset, as a dead node's is
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    copy = Peers(PeersConfig(addresses=[f"127.0.0.1:{port}"], secret=SECRET),
                 Fleet([ReplicaConfig("r0", "http://127.0.0.1:9")]), None)
    await copy.start()
    try:
        # the waits: 0.2 s, then 0.4 s (a link lost at once backs off as a failed try)
        await wait_until_async(lambda: len(linked) >= links, 3.0,
                               f"{links} links to the resetting peer")
    finally:
        await copy.stop()
        server.close()
        await server.wait_closed()


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "kvgate.peers"]


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_reset_link_is_lost_quietly_and_backs_off_from_the_first_wait(
        loop: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="kvgate.peers")
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(_links_to_a_resetting_peer(3))
    records = _lines(caplog)
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
    assert all(r.exc_info is None for r in records)
    lost = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert len(lost) >= 2, lost
    assert "the link was lost (ConnectionResetError" in lost[0]
    assert lost[0].endswith("connecting again in 0.2 s"), lost
    assert lost[1].endswith("connecting again in 0.4 s"), lost


def test_a_link_that_held_is_connected_again_after_the_first_wait(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(peers, "HELD_S", 0.0)  # every link counts as one that held
    caplog.set_level(logging.INFO, logger="kvgate.peers")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_links_to_a_resetting_peer(3))
    lost = [r.getMessage() for r in _lines(caplog) if r.levelno == logging.INFO]
    assert len(lost) >= 2, lost
    assert all(line.endswith("connecting again in 0.2 s") for line in lost), lost
