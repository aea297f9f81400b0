"""A peer's ROUTED frame whose JSON meta is past ``MAX_META`` (what any sender sends at
most) is refused by the receiver, counted and logged as malformed, not parsed and learnt;
the longest meta a sender sends is read."""

from __future__ import annotations

import asyncio
import logging
import os
import struct

import orjson
import pytest

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.peer_config import PeersConfig
from gateway.peer_wire import (
    HEAD_BYTES,
    LISTENER_HELLO_BYTES,
    MAX_META,
    NONCE_BYTES,
    ROUTED,
    STATUS_OK,
    RoutedElsewhere,
    WireError,
    check_listener,
    frame_length,
    parse_frame,
    routed_frame,
    sender_proof,
)
from gateway.peers import Peers
from policies.base import RouteRequest
from policies.round_robin import RoundRobin
from tests.support.waiting import wait_until_async

SECRET = "a-peer-secret-of-some-length"


def _routed(meta_bytes: int) -> bytes:
    """A ROUTED frame, as the wire lays one out, whose meta is ``meta_bytes`` long."""
    meta = orjson.dumps({"replica": "r0", "model": "m", "affinity": ""})
    meta = orjson.dumps({"replica": "r0", "model": "m",
                         "affinity": "k" * (meta_bytes - len(meta))})
    assert len(meta) == meta_bytes
    body = struct.pack("<IdiI", 10, 0.0, -1, len(meta)) + meta
    return struct.pack("<IB", len(body) + 1, ROUTED) + body


def _parse(frame: bytes) -> object:
    length, kind = frame_length(frame[:HEAD_BYTES])
    assert length == len(frame) - HEAD_BYTES
    return parse_frame(kind, frame[HEAD_BYTES:], 5.0)


def test_a_meta_past_the_bound_is_refused() -> None:
    with pytest.raises(WireError, match=f"meta of {MAX_META + 1} bytes exceeds {MAX_META}"):
        _parse(_routed(MAX_META + 1))
    with pytest.raises(WireError, match="meta of 600000 bytes exceeds"):
        _parse(_routed(600_000))
    read = _parse(_routed(MAX_META))
    assert isinstance(read, RoutedElsewhere) and read.replica == "r0"


def test_the_longest_meta_a_sender_sends_is_read() -> None:
    base = len(orjson.dumps({"replica": "r0", "model": "m", "tenant": None, "salt": None,
                             "affinity": "", "base": None}))
    longest = RouteRequest(tokens=[], prompt_tokens=10, model="m",
                           affinity_key="k" * (MAX_META - base))
    read = _parse(routed_frame(longest, "r0"))
    assert isinstance(read, RoutedElsewhere)
    assert read.request.affinity_key == longest.affinity_key
    with pytest.raises(WireError, match="exceeds"):  # one byte more is not sent
        routed_frame(RouteRequest(tokens=[], prompt_tokens=10, model="m",
                                  affinity_key="k" * (MAX_META - base + 1)), "r0")


async def test_a_peer_sending_a_long_meta_is_counted_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kvgate")
    b = Peers(PeersConfig(listen="127.0.0.1:0", secret=SECRET),
              Fleet([ReplicaConfig("r0", "http://127.0.0.1:9")]), RoundRobin())
    await b.start()
    try:
        assert b.address is not None
        reader, writer = await asyncio.open_connection(*b.address)
        nonce, me = os.urandom(NONCE_BYTES), os.urandom(16)
        writer.write(nonce + me)
        proven = check_listener(SECRET.encode(), nonce, me,
                                await reader.readexactly(LISTENER_HELLO_BYTES))
        assert proven is not None
        writer.write(sender_proof(SECRET.encode(), proven[0], me, proven[1]))
        assert (await reader.readexactly(1))[0] == STATUS_OK
        writer.write(_routed(MAX_META + 1))
        await writer.drain()
        await wait_until_async(lambda: b.counts.malformed == 1, 10.0, "the frame refused")
        assert b.counts.frames_received == 0
        assert await reader.read(1) == b""  # and the connection dropped
        writer.close()
        assert f"meta of {MAX_META + 1} bytes exceeds {MAX_META}" in caplog.text
    finally:
        await b.stop()
