"""Gateway copies that tell each other what they route (``peers`` in the config).

Behind a Kubernetes Service each copy gets a random share of the requests. Alone, a copy
sees only its own prefill pending on a replica (the scraped queue lags by the scrape
interval and a prefill takes a fraction of it), so two copies pile one-off prompts on the
same idle replica; and the cost policy's cache model holds only what this copy sent, so
the copies disagree on who holds a document. With peers, each copy sends the others, over
one TCP connection per peer (``peer_wire``):

* every request's prefill sent to a replica until its first byte, and its end: the other
  copies count it in that replica's queue and in flight (``Fleet.sent`` with
  ``relay=False``), as the copy's worker processes share theirs (``shared_load``);
* every request routed (``policies.base.Routed``, with the prompt's piece hashes, never
  its text or token ids): the other copies' policies learn from it as from their own.

Measured offline (LRU engines, ``loadtests.simulate --gateways 2 --peers``), see the
README. Delivery is best effort: a frame for a peer that is down, or one more than
``queue_frames`` behind, is dropped and counted; when a connection drops, the receiver lets
go of everything that peer had pending, and a pending request unheard of for
``pending_s`` is let go too. Each copy has a random instance id: an address that reaches
the copy itself (its own pod behind a headless Service) is found in the handshake and
skipped. Not with worker processes (``serve --workers``): the config is refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import deque
from dataclasses import dataclass

from gateway.fleet import Fleet, Pending
from gateway.peer_config import PeersConfig, split_address
from gateway.peer_wire import (
    DONE,
    FIRST_BYTE,
    HEAD_BYTES,
    HELLO_BYTES,
    ID_BYTES,
    NONCE_BYTES,
    STATUS_BAD_SECRET,
    STATUS_OK,
    STATUS_SELF,
    RoutedElsewhere,
    Sent,
    Settled,
    WireError,
    check_hello,
    frame_length,
    hello_mac,
    parse_frame,
    routed_frame,
    sent_frame,
    seq_frame,
)
from policies.base import Policy, Routed, RouteRequest

log = logging.getLogger("kvgate.peers")

HANDSHAKE_S = 5.0
WRITE_S = 5.0
BACKOFF_S = (0.2, 5.0)  # first and longest wait before connecting again
REFUSED_BACKOFF_S = 30.0  # after a peer refused this copy's secret
SWEEP_S = 10.0
MAX_PENDING = 65_536  # a peer's requests pending at once, at most (the oldest let go)


@dataclass(slots=True)
class PeerCounts:
    """What the metrics export (``kvgate_peer_*``)."""

    frames_sent: int = 0
    frames_dropped: int = 0
    frames_received: int = 0
    malformed: int = 0
    refused: int = 0  # handshakes refused: a wrong secret either way
    links_up: int = 0
    peers_in: int = 0  # connections from peers, authenticated


class _Link:
    """This copy's connection to one peer address: frames queue while it is up, and one
    task writes them; it connects again after a failure."""

    def __init__(self, host: str, port: int, peers: Peers) -> None:
        self.host, self.port = host, port
        self.peers = peers
        self.queue: deque[bytes] = deque()
        self.wake = asyncio.Event()
        self.up = False
        self.is_self = False
        self.task: asyncio.Task[None] | None = None

    def push(self, frame: bytes) -> None:
        counts = self.peers.counts
        if not self.up or len(self.queue) >= self.peers.config.queue_frames:
            counts.frames_dropped += 1
            return
        self.queue.append(frame)
        self.wake.set()

    async def run(self) -> None:
        backoff = BACKOFF_S[0]
        while True:
            wait = backoff
            try:
                if await self._session():
                    return  # the address is this copy's own
                backoff = BACKOFF_S[0]
            except PermissionError as exc:
                log.error("peer %s:%d: %s", self.host, self.port, exc)
                wait = REFUSED_BACKOFF_S
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                log.debug("peer %s:%d: %s", self.host, self.port, exc)
                backoff = min(BACKOFF_S[1], backoff * 2)
            await asyncio.sleep(wait)

    async def _session(self) -> bool:
        """One connection, until it fails; True when the address is this copy's own."""
        peers = self.peers
        async with asyncio.timeout(HANDSHAKE_S):
            reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            async with asyncio.timeout(HANDSHAKE_S):
                nonce = await reader.readexactly(NONCE_BYTES)
                writer.write(peers.instance + hello_mac(peers.secret, nonce, peers.instance))
                (status,) = await reader.readexactly(1)
            if status == STATUS_SELF:
                self.is_self = True
                return True
            if status != STATUS_OK:
                peers.counts.refused += 1
                raise PermissionError("refused this copy's secret: the copies' peers.secret "
                                      "differ")
            closed = asyncio.ensure_future(reader.read(1))  # the peer sends nothing more
            self.up = True
            peers.counts.links_up += 1
            try:
                await self._write(writer, closed)
            finally:
                self.up = False
                peers.counts.links_up -= 1
                self.queue.clear()
                closed.cancel()
        finally:
            writer.close()
        return False

    async def _write(self, writer: asyncio.StreamWriter, closed: asyncio.Future[bytes]) -> None:
        counts = self.peers.counts
        while not closed.done():
            waiting = asyncio.ensure_future(self.wake.wait())
            try:
                await asyncio.wait((waiting, closed), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
            self.wake.clear()
            if self.queue:
                frames = list(self.queue)
                self.queue.clear()
                writer.write(b"".join(frames))
                async with asyncio.timeout(WRITE_S):
                    await writer.drain()
                counts.frames_sent += len(frames)
        raise ConnectionResetError("the peer closed the connection")


class Peers:
    """This copy's links to its peers and its listener for theirs (see the module)."""

    def __init__(self, config: PeersConfig, fleet: Fleet, policy: Policy) -> None:
        secret = config.resolved_secret()
        if secret is None:
            raise ValueError("peers need a secret")
        self.config = config
        self.fleet = fleet
        self.policy = policy
        self.secret = secret.encode()
        self.instance = os.urandom(ID_BYTES)
        self.counts = PeerCounts()
        self._links: dict[tuple[str, int], _Link] = {}
        self._seq = 0
        self._server: asyncio.Server | None = None
        self._resolver: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._tables: set[_PeerTable] = set()
        self._serving: set[asyncio.Task[None]] = set()
        self.address: tuple[str, int] | None = None  # where the listener is bound

    # -- what this copy sends ---------------------------------------------------------------
    def routed(self, request: RouteRequest, replica: str) -> None:
        """This copy sends ``request`` to ``replica`` (its policy observed ``Routed``)."""
        if self._links:
            try:
                self._broadcast(routed_frame(request, replica))
            except WireError as exc:
                log.debug("not sent to peers: %s", exc)

    def sent(self, pending: Pending, replica: str) -> None:
        """``Fleet`` outbox: prefill left pending on ``replica``."""
        self._seq += 1
        pending.seq = self._seq
        if self._links:
            self._broadcast(sent_frame(self._seq, replica, pending.tokens))

    def settled(self, pending: Pending, done: bool) -> None:
        """``Fleet`` outbox: the first byte came (``done``: the request ended)."""
        if self._links:
            self._broadcast(seq_frame(DONE if done else FIRST_BYTE, pending.seq))

    def _broadcast(self, frame: bytes) -> None:
        for link in self._links.values():
            if not link.is_self:
                link.push(frame)

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        if cfg.listen is not None:
            host, port = split_address(cfg.listen, "peers.listen", any_port=True)
            self._server = await asyncio.start_server(self._accept, host, port)
            sockname = self._server.sockets[0].getsockname()
            self.address = (sockname[0], sockname[1])
        self._sweeper = asyncio.create_task(self._sweep(), name="kvgate-peers-sweep")
        if cfg.addresses:
            await self._resolve()
            self._resolver = asyncio.create_task(self._resolve_forever(),
                                                 name="kvgate-peers-resolve")

    async def stop(self) -> None:
        tasks = [t for t in (self._resolver, self._sweeper) if t is not None]
        tasks += [link.task for link in self._links.values() if link.task is not None]
        tasks += list(self._serving)
        if self._server is not None:
            self._server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self._links.clear()

    async def _resolve_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.resolve_s)
            await self._resolve()

    async def _resolve(self) -> None:
        """One link per address the configured names resolve to; links to addresses no
        longer there are closed."""
        loop = asyncio.get_running_loop()
        found: set[tuple[str, int]] = set()
        for address in self.config.addresses:
            host, port = split_address(address, "peers.addresses")
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning("peer address %s did not resolve: %s", address, exc)
                # what it resolved to before stays
                found.update(k for k in self._links if k[1] == port)
                continue
            found.update((str(info[4][0]), int(info[4][1])) for info in infos)
        for key in list(self._links):
            if key not in found:
                link = self._links.pop(key)
                if link.task is not None:
                    link.task.cancel()
        for key in sorted(found - self._links.keys()):
            link = self._links[key] = _Link(*key, self)
            link.task = asyncio.create_task(link.run(), name=f"kvgate-peer-{key[0]}:{key[1]}")

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            cutoff = time.monotonic() - self.config.pending_s
            for table in self._tables:
                table.let_go(cutoff)

    # -- what peers send -----------------------------------------------------------------------
    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer), name="kvgate-peer-in")
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        table = _PeerTable(self.fleet)
        try:
            nonce = os.urandom(NONCE_BYTES)
            writer.write(nonce)
            async with asyncio.timeout(HANDSHAKE_S):
                hello = await reader.readexactly(HELLO_BYTES)
            instance = check_hello(self.secret, nonce, hello)
            if instance is None:
                self.counts.refused += 1
                log.warning("a peer at %s did not prove the secret: refused", peer)
                writer.write(bytes([STATUS_BAD_SECRET]))
                return
            if instance == self.instance:
                writer.write(bytes([STATUS_SELF]))
                return
            writer.write(bytes([STATUS_OK]))
            self.counts.peers_in += 1
            self._tables.add(table)
            try:
                await self._receive(reader, table)
            finally:
                self.counts.peers_in -= 1
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        except WireError as exc:
            self.counts.malformed += 1
            log.warning("peer at %s sent a malformed frame: %s", peer, exc)
        finally:
            self._tables.discard(table)
            table.let_go(float("inf"))
            writer.close()

    async def _receive(self, reader: asyncio.StreamReader, table: _PeerTable) -> None:
        counts = self.counts
        while True:
            length, kind = frame_length(await reader.readexactly(HEAD_BYTES))
            body = await reader.readexactly(length)
            frame = parse_frame(kind, body, time.monotonic())
            counts.frames_received += 1
            if isinstance(frame, RoutedElsewhere):
                self.policy.observe(Routed(frame.request, frame.replica))
            elif isinstance(frame, Sent):
                table.sent(frame)
            elif isinstance(frame, Settled):
                table.settled(frame)


class _PeerTable:
    """One peer connection's requests pending in this copy's fleet, by the peer's seq."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.pending: dict[int, Pending] = {}

    def sent(self, frame: Sent) -> None:
        if len(self.pending) >= MAX_PENDING:
            self.fleet.done(self.pending.pop(next(iter(self.pending))))
        self.pending[frame.seq] = self.fleet.sent(frame.replica, frame.tokens, relay=False)

    def settled(self, frame: Settled) -> None:
        if frame.kind == DONE:
            pending = self.pending.pop(frame.seq, None)
            if pending is not None:
                self.fleet.done(pending)
        else:
            pending = self.pending.get(frame.seq)
            if pending is not None:
                self.fleet.first_byte(pending)

    def let_go(self, cutoff: float) -> None:
        """Settle the requests sent before ``cutoff`` (in order: the oldest first)."""
        while self.pending:
            seq = next(iter(self.pending))
            pending = self.pending[seq]
            if pending.sent_at >= cutoff:
                return
            del self.pending[seq]
            self.fleet.done(pending)

