"""Gateway copies telling each other what they route (``gateway.peers``): the wire, and
two copies' ``Peers`` over real loopback TCP."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
from collections.abc import AsyncIterator, Callable

import pytest

from gateway import peers as peers_module
from gateway.config import GatewayConfig, parse_config
from gateway.fleet import Fleet
from gateway.peer_config import PeersConfig
from gateway.peer_wire import (
    DONE,
    FIRST_BYTE,
    HEAD_BYTES,
    LISTENER_HELLO_BYTES,
    NONCE_BYTES,
    STATUS_BAD_SECRET,
    STATUS_OK,
    RoutedElsewhere,
    Sent,
    Settled,
    WireError,
    check_listener,
    frame_length,
    parse_frame,
    routed_frame,
    sender_proof,
    sent_frame,
    seq_frame,
)
from gateway.peers import (
    HANDSHAKE_HOLD_S,
    HANDSHAKE_S,
    MAX_HANDSHAKES,
    MAX_HANDSHAKES_PER_ADDRESS,
    _PeerTable,
)
from gateway.state import build_state
from policies.base import Routed, RouteRequest
from policies.config import ConfigError
from policies.prompt_chunks import text_chunks
from tests.support.peer_copies import REPLICAS, SECRET, PeerCopy, linked_pair
from tests.support.waiting import wait_until_async


def _parse(frame: bytes) -> object:
    length, kind = frame_length(frame[:HEAD_BYTES])
    assert length == len(frame) - HEAD_BYTES
    return parse_frame(kind, frame[HEAD_BYTES:], 5.0)


def _document(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(100_000)}" for _ in range(800))


def _request(text: str, **fields: object) -> RouteRequest:
    return RouteRequest(tokens=(), prompt_tokens=len(text) // 4, model="m",
                        chunks=text_chunks(text, 64), chunk_tokens=16.0, arrival_s=0.0,
                        **fields)  # type: ignore[arg-type]


def test_frames_read_back_as_written() -> None:
    req = _request(_document(1), tenant="acme", cache_salt="s1", affinity_key="conv-7",
                   anchor_chunks=3)
    got = _parse(routed_frame(req, "r2"))
    assert isinstance(got, RoutedElsewhere) and got.replica == "r2"
    assert list(got.request.chunks) == list(req.chunks)
    assert (got.request.model, got.request.tenant, got.request.cache_salt,
            got.request.affinity_key, got.request.anchor_chunks, got.request.prompt_tokens,
            got.request.chunk_tokens, got.request.arrival_s) == \
        ("m", "acme", "s1", "conv-7", 3, req.prompt_tokens, 16.0, 5.0)
    assert got.request.tokens == ()  # never the prompt's token ids
    assert _parse(sent_frame(9, "r-é", 1234)) == Sent(9, "r-é", 1234)
    assert _parse(seq_frame(FIRST_BYTE, 9)) == Settled(FIRST_BYTE, 9)
    assert _parse(seq_frame(DONE, 2**40)) == Settled(DONE, 2**40)


def test_an_adapters_base_model_reads_back() -> None:
    # without it a peer's or another worker's route of an adapter made a policy state of
    # its own for the adapter, where the gateway's own routes go to its base model's
    req = _request(_document(2), base_model="llama")
    got = _parse(routed_frame(dataclasses.replace(req, model="lora-a"), "r1"))
    assert isinstance(got, RoutedElsewhere)
    assert (got.request.model, got.request.base_model, got.request.adapter) == \
        ("lora-a", "llama", True)
    plain = _parse(routed_frame(_request(_document(2)), "r1"))
    assert isinstance(plain, RoutedElsewhere) and plain.request.base_model is None


def test_a_request_of_no_piece_hashes_reads_back_and_odd_piece_worths_are_refused() -> None:
    # every policy but cost and those hashing text pieces builds requests of no pieces
    # (chunk_tokens 0): the receiver refused them and dropped the link at every request
    bare = RouteRequest(tokens=(), prompt_tokens=40, model="m", arrival_s=0.0)
    got = _parse(routed_frame(bare, "r1"))
    assert isinstance(got, RoutedElsewhere) and got.replica == "r1"
    assert list(got.request.chunks) == [] and got.request.chunk_tokens == 0
    for worth, chunks in ((0.0, True), (1e308, True), (float("nan"), True), (16.0, False)):
        req = dataclasses.replace(_request(_document(2) if chunks else ""),
                                  chunk_tokens=worth)
        with pytest.raises(WireError, match="tokens per chunk"):
            _parse(routed_frame(req, "r1"))


@pytest.mark.parametrize("mangle, error", [
    (lambda f: f[:HEAD_BYTES + 5], "malformed frame of kind 1"),  # the body cut short
    (lambda f: f[:-1], "replica id of 1 bytes, header says 2"),
    (lambda f: b"\x00\x00\x00\x00" + f[4:], "outside"),  # length 0
    (lambda f: b"\xff\xff\xff\x7f" + f[4:], "outside"),  # 2 GB
    (lambda f: f[:4] + b"\x63" + f[5:], "unknown frame kind 99"),
])
def test_a_malformed_frame_is_named(mangle: Callable[[bytes], bytes], error: str) -> None:
    frame = mangle(sent_frame(1, "r0", 10))
    with pytest.raises(WireError, match=error):
        length, kind = frame_length(frame[:HEAD_BYTES])
        parse_frame(kind, frame[HEAD_BYTES:HEAD_BYTES + length], 0.0)


def test_a_routed_frame_with_a_non_string_field_is_refused() -> None:
    frame = routed_frame(_request("x" * 200), "r0").replace(b'"model":"m"', b'"model":7  ')
    with pytest.raises(WireError, match="'model' is int"):
        _parse(frame)


def test_peers_need_a_long_secret_and_addresses_that_parse() -> None:
    base = {"replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}]}
    with pytest.raises(ConfigError, match="secret of at least 16"):
        parse_config({**base, "peers": {"listen": "127.0.0.1:0"}})
    with pytest.raises(ConfigError, match="got 5"):
        parse_config({**base, "peers": {"listen": "127.0.0.1:0", "secret": "short"}})
    with pytest.raises(ConfigError, match=r"addresses\[1\]: 'gw-b' is not host:port"):
        parse_config({**base, "peers": {"addresses": ["gw-a:8002", "gw-b"],
                                        "secret": SECRET}})
    with pytest.raises(ConfigError, match="queue_bytes must be at least"):
        parse_config({**base, "peers": {"listen": "127.0.0.1:0", "secret": SECRET,
                                        "queue_bytes": 1000}})
    assert not parse_config(base).peers.on  # off unless configured


@pytest.fixture
async def pair() -> AsyncIterator[tuple[PeerCopy, PeerCopy]]:
    """``b`` listens; ``a`` sends to it."""
    async with linked_pair() as copies:
        yield copies


async def test_a_peer_sees_the_prefill_another_copy_left_pending(
        pair: tuple[PeerCopy, PeerCopy]) -> None:
    a, b = pair
    pending = a.fleet.sent("r1", 1500)
    await wait_until_async(lambda: b.queued("r1") == (1500, 1), 5.0,
                           "b sees a's pending prefill")
    assert b.queued("r0") == (0, 0)
    a.fleet.first_byte(pending)
    await wait_until_async(lambda: b.queued("r1") == (0, 1), 5.0, "b sees a's first byte")
    a.fleet.done(pending)
    await wait_until_async(lambda: b.queued("r1") == (0, 0), 5.0, "b sees a's request end")
    b.fleet.sent("r2", 10)  # b's own are not echoed back (b has no link)
    assert b.peers.counts.frames_sent == 0 and a.peers.counts.frames_received == 0


async def test_a_peer_learns_where_another_copy_sent_a_document(
        pair: tuple[PeerCopy, PeerCopy]) -> None:
    a, b = pair
    text = _document(3)
    views = b.fleet.views()
    assert not any(s.matched_tokens for s in b.policy.choose(_request(text), views).scores)
    req = _request(text)
    a.policy.observe(Routed(req, "r3"))
    a.peers.routed(req, "r3")
    await wait_until_async(lambda: b.peers.counts.frames_received == 1, 5.0,
                           "b hears a's route")
    d = b.policy.choose(_request(text + " and a question"), views)
    assert d.chosen == "r3" and d.reason == "cache_match"
    assert d.matched_tokens >= req.prompt_tokens // 2


async def test_a_route_to_a_replica_the_peer_does_not_route_to_is_skipped(
        pair: tuple[PeerCopy, PeerCopy], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = pair
    observed: list[str] = []
    monkeypatch.setattr(b.policy, "observe", lambda event: observed.append(event.replica))
    a.peers.routed(_request(_document(4)), "gone")
    a.peers.routed(_request(_document(5)), "r2")
    await wait_until_async(lambda: b.peers.counts.frames_received == 2, 5.0,
                           "b hears both routes")
    assert observed == ["r2"]


async def test_a_peer_that_leaves_takes_its_pending_prefill_with_it(
        pair: tuple[PeerCopy, PeerCopy]) -> None:
    a, b = pair
    a.fleet.sent("r0", 700)
    await wait_until_async(lambda: b.queued("r0") == (700, 1), 5.0,
                           "b sees a's pending prefill")
    await a.peers.stop()
    await wait_until_async(lambda: b.queued("r0") == (0, 0), 5.0,
                           "b lets go of a's requests")


async def test_a_copy_with_another_secret_is_refused_and_changes_nothing() -> None:
    b = PeerCopy([])
    await b.peers.start()
    a = PeerCopy([b.address()], secret="another-secret-entirely")
    await a.peers.start()
    try:
        # the listener proves the secret first: the sender finds it does not match and
        # sends nothing
        await wait_until_async(lambda: a.peers.counts.refused >= 1, 5.0, "a refuses b")
        a.fleet.sent("r0", 700)
        await asyncio.sleep(0.1)
        assert b.queued("r0") == (0, 0) and b.peers.counts.peers_in == 0
        assert a.peers.counts.links_up == 0 and a.peers.counts.frames_sent == 0
    finally:
        await a.peers.stop()
        await b.peers.stop()


async def _raw_sender(b: PeerCopy, secret: str = SECRET
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
    """A connection to ``b`` that proves ``secret`` by hand: (reader, writer, status)."""
    assert b.peers.address is not None
    reader, writer = await asyncio.open_connection(*b.peers.address)
    nonce, me = os.urandom(NONCE_BYTES), os.urandom(16)
    writer.write(nonce + me)
    hello = await reader.readexactly(LISTENER_HELLO_BYTES)
    proven = check_listener(SECRET.encode(), nonce, me, hello)
    assert proven is not None  # b proved the secret it holds
    writer.write(sender_proof(secret.encode(), proven[0], me, proven[1]))
    (status,) = await reader.readexactly(1)
    return reader, writer, status


async def test_a_sender_that_cannot_prove_the_secret_is_refused() -> None:
    b = PeerCopy([])
    await b.peers.start()
    try:
        _, writer, status = await _raw_sender(b, secret="another-secret-entirely")
        assert status == STATUS_BAD_SECRET and b.peers.counts.refused == 1
        writer.close()
    finally:
        await b.peers.stop()


async def test_connections_that_never_prove_the_secret_do_not_keep_peers_out() -> None:
    # one address holds open more connections than there are handshake places, saying
    # nothing: past its share they are closed at once, and a real peer still links
    b = PeerCopy([])
    await b.peers.start()
    assert b.peers.address is not None
    idle = []
    try:
        for _ in range(MAX_HANDSHAKES + 4):
            idle.append(await asyncio.open_connection(
                b.peers.address[0], b.peers.address[1], local_addr=("127.0.0.2", 0)))
        await asyncio.sleep(0.1)
        closed = 0
        for reader, _ in idle:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    closed += await reader.read(1) == b""
        assert closed == len(idle) - MAX_HANDSHAKES_PER_ADDRESS
        a = PeerCopy([b.address()])
        await a.peers.start()
        try:
            await wait_until_async(lambda: a.peers.counts.links_up == 1, 5.0, "a's link to b")
        finally:
            await a.peers.stop()
    finally:
        for _, writer in idle:
            writer.close()
        await b.peers.stop()


async def test_silent_connections_from_many_addresses_give_their_places_up(
        caplog: pytest.LogCaptureFixture) -> None:
    # every handshake place taken by connections that say nothing, from as many
    # addresses as it takes: a real peer still links, long before they time out
    b = PeerCopy([])
    await b.peers.start()
    assert b.peers.address is not None
    idle = []
    try:
        for i in range(MAX_HANDSHAKES):
            idle.append(await asyncio.open_connection(
                b.peers.address[0], b.peers.address[1],
                local_addr=(f"127.0.1.{2 + i // MAX_HANDSHAKES_PER_ADDRESS}", 0)))
        await asyncio.sleep(HANDSHAKE_HOLD_S + 0.1)
        a = PeerCopy([b.address()])
        await a.peers.start()
        try:
            await wait_until_async(lambda: a.peers.counts.links_up == 1, HANDSHAKE_S / 2,
                                   "a's link to b while its places were taken")
        finally:
            await a.peers.stop()
        # refused handshakes are logged once per while, not each
        with caplog.at_level(logging.WARNING, logger="kvgate.peers"):
            for _ in range(5):
                _, writer, status = await _raw_sender(b, secret="another-secret-entirely")
                assert status == STATUS_BAD_SECRET
                writer.close()
        refused = [r for r in caplog.records if "did not prove the secret" in r.message]
        assert len(refused) == 1 and b.peers.counts.refused == 5
    finally:
        for _, writer in idle:
            writer.close()
        await b.peers.stop()


async def test_a_listener_that_cannot_prove_the_secret_hears_nothing() -> None:
    heard: list[bytes] = []

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(32)
        writer.write(os.urandom(LISTENER_HELLO_BYTES))  # no proof it could make
        heard.append(await reader.read(4096))
        writer.close()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    a = PeerCopy([f"127.0.0.1:{port}"])
    await a.peers.start()
    try:
        await wait_until_async(lambda: a.peers.counts.refused >= 1, 5.0, "a refuses it")
        await wait_until_async(lambda: heard, 5.0, "the impostor to give up")
        assert heard == [b""] and a.peers.counts.links_up == 0
    finally:
        await a.peers.stop()
        server.close()
        await server.wait_closed()


async def test_a_copy_reached_at_two_addresses_is_linked_once() -> None:
    b = PeerCopy([], listen="0.0.0.0:0")
    await b.peers.start()
    port = b.address().rsplit(":", 1)[1]
    # two loopback addresses of one listener, as a dual-stack Service or two names give
    a = PeerCopy([f"127.0.0.1:{port}", f"127.0.0.2:{port}"])
    await a.peers.start()
    try:
        await wait_until_async(lambda: a.peers.counts.links_up == 1, 5.0, "a's link to b")
        await asyncio.sleep(0.3)  # the other address had its chance
        assert a.peers.counts.links_up == 1 and b.peers.counts.peers_in == 1
        a.fleet.sent("r0", 1500)
        await wait_until_async(lambda: b.queued("r0") == (1500, 1), 5.0, "b hears a")
        await asyncio.sleep(0.1)
        assert b.queued("r0") == (1500, 1)  # counted once
    finally:
        await a.peers.stop()
        await b.peers.stop()


async def test_a_silent_peer_is_taken_as_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers_module, "SILENT_S", 0.3)
    b = PeerCopy([])
    await b.peers.start()
    try:
        _, writer, status = await _raw_sender(b)
        assert status == STATUS_OK
        writer.write(sent_frame(1, "r0", 800))  # then nothing: its node died, no FIN
        await wait_until_async(lambda: b.queued("r0") == (800, 1), 5.0, "b hears it")
        await wait_until_async(lambda: b.queued("r0") == (0, 0), 5.0,
                               "b lets go of the silent peer's request")
        assert b.peers.counts.peers_in == 0
        writer.close()
    finally:
        await b.peers.stop()


@pytest.fixture
def fast_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers_module, "SILENT_S", 0.5)
    monkeypatch.setattr(peers_module, "HEARTBEAT_S", 0.1)


async def test_a_quiet_link_stays_up_on_heartbeats(fast_heartbeats: None,
                                                   pair: tuple[PeerCopy, PeerCopy]) -> None:
    a, b = pair
    a.fleet.sent("r0", 300)
    await asyncio.sleep(1.0)  # twice the silence allowed, with nothing but heartbeats
    assert b.queued("r0") == (300, 1) and b.peers.counts.peers_in == 1
    # about ten heartbeats went by: the frame counts are the one SENT frame's
    assert a.peers.counts.frames_sent == 1 and b.peers.counts.frames_received == 1


@pytest.mark.parametrize("bound", ["queue_frames", "queue_bytes"])
async def test_a_peer_too_far_behind_is_disconnected_not_left_with_load(
        pair: tuple[PeerCopy, PeerCopy], bound: str) -> None:
    a, b = pair
    # room for two of the frames queued below (set past validation, which asks at least
    # a frame's limit of queue_bytes)
    room = {"queue_frames": 2} if bound == "queue_frames" else \
        {"queue_bytes": 2 * len(sent_frame(1, "r1", 10)) + 1}
    a.peers.config = PeersConfig(listen="127.0.0.1:0", addresses=[b.address()],
                                 secret=SECRET, **room)
    first = a.fleet.sent("r0", 100)
    await wait_until_async(lambda: b.queued("r0") == (100, 1), 5.0, "b hears a")
    for _ in range(3):  # three frames queued before the writer runs: one too many
        a.fleet.sent("r1", 10)
    a.fleet.done(first)  # its DONE is lost with the connection, and b lets go anyway
    await wait_until_async(lambda: b.queued("r0") == (0, 0) and b.queued("r1") == (0, 0),
                           5.0, "b lets go of everything a had pending")
    await wait_until_async(lambda: a.peers.counts.links_up == 1, 5.0, "a links again")
    a.fleet.sent("r2", 7)
    await wait_until_async(lambda: b.queued("r2") == (7, 1), 5.0, "b hears a again")


def test_a_seq_seen_twice_and_an_unknown_replica_leave_no_load() -> None:
    fleet = Fleet(list(REPLICAS))
    table = _PeerTable(fleet)
    table.sent(Sent(7, "r0", 1000))
    table.sent(Sent(7, "r0", 1000))
    table.sent(Sent(8, "gone", 1000))  # a replica this copy does not route to
    assert fleet.get("gone") is None and 8 not in table.pending  # nothing kept for it
    table.settled(Settled(DONE, 7))
    view = next(v for v in fleet.views() if v.id == "r0")
    assert (view.queued_tokens, view.in_flight) == (0, 0)
    assert table.pending == {}


async def test_a_copy_listed_among_its_own_peers_skips_itself() -> None:
    b = PeerCopy([])
    await b.peers.start()
    a = PeerCopy([b.address()])
    # a's own listener joins its addresses once bound, as a headless Service lists it
    await a.peers.start()
    try:
        own = a.address()
        a.peers.config = PeersConfig(listen="127.0.0.1:0", addresses=[b.address(), own],
                                     secret=SECRET)
        await a.peers._resolve()
        await wait_until_async(lambda: any(link.is_self for link in a.peers._links.values()),
                               5.0, "a finds itself")
        await wait_until_async(lambda: a.peers.counts.links_up == 1, 5.0, "a's link to b")
        a.fleet.sent("r0", 5)
        await wait_until_async(lambda: b.queued("r0") == (5, 1), 5.0, "b hears a")
        assert a.queued("r0") == (5, 1)  # counted once: never heard back from itself
        assert a.peers.counts.peers_in == 0
    finally:
        await a.peers.stop()
        await b.peers.stop()


async def test_the_gateway_builds_its_peers_from_the_config() -> None:
    config = GatewayConfig(replicas=list(REPLICAS),
                           peers=PeersConfig(listen="127.0.0.1:0", secret=SECRET))
    gw = build_state(config)
    assert gw.peers is not None and gw.fleet.outbox is gw.peers
    gw.router.close()
