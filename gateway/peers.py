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
  its text or token ids): the other copies' policies learn from it as from their own. A
  request a policy keyed by its token ids alone (``chunk_chars: 0``) has nothing to tell
  and is not sent. A request this copy tries again on another replica is told again,
  marked as a retry (``peer_wire.ToldRequests``): the others count its share of the
  traffic once, and learn what each try suggests of its replica's cache. A try its
  replica refused before taking the prompt stays told (no frame takes one back). A
  receiver holds nothing per request, so one that skipped the first try (its replica
  one it does not route to, or that its policy keeps nothing of) counts none of the
  request's traffic: rare, as discovery changes (docs/cost.md).

Measured offline (LRU engines, ``loadtests.simulate --gateways 2 --peers``), see
docs/peers.md. Delivery is best effort, and never leaves load counted that was settled: a
connection more than ``queue_frames`` frames or ``queue_bytes`` behind is closed (its
queue dropped and counted), and when a connection closes or falls silent for ``SILENT_S``
(a sender with nothing to say sends a heartbeat every ``HEARTBEAT_S``) the receiver lets
go of everything that peer had pending; a pending request unheard of for ``pending_s`` is
let go too. Frames for a replica the receiving copy does not know are skipped. Each copy
has a random instance id, sent in the handshake: an address that reaches the copy itself
(its own pod behind a headless Service), or a second address of a copy already linked, is
found there and not used. At most ``MAX_HANDSHAKES`` connections may be proving the secret
at once, ``MAX_HANDSHAKES_PER_ADDRESS`` of them from one address; when all places are
taken, a new connection takes the place of the oldest one that has held it past
``HANDSHAKE_HOLD_S`` (a peer proves the secret in one round trip), so connections that
never prove it cannot keep a real peer out however many addresses they come from. A
refused handshake is logged at most once per ``REFUSED_LOG_S``, with the count since. A
link lost (the peer closed it, reset it, or stopped acknowledging) is logged in one line,
without a traceback, and connected again after ``BACKOFF_S[0]`` when it had held for
``HELD_S``; a link lost sooner, or a try that fails, doubles the wait up to ``BACKOFF_S[1]``.
With worker processes
(``serve --workers``) every worker links to the peers and sends its own routes, and all of
them listen on the peers port (``SO_REUSEPORT``: the kernel spreads the peers' connections
over them); they share one instance id, so a link to the box itself is found whichever
worker answers; a peer's pending prefill lands in the box's shared accounting
(``shared_load``), which every worker reads, and its routes teach the policy of the worker
that received them, as the box's own requests teach the worker that served them. """

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.fleet import Fleet, Pending
from gateway.log_throttle import LogThrottle
from gateway.peer_config import PeersConfig, split_address
from gateway.peer_wire import (
    DONE,
    FIRST_BYTE,
    HEAD_BYTES,
    HEARTBEAT_FRAME,
    ID_BYTES,
    LISTENER_HELLO_BYTES,
    MAC_BYTES,
    NONCE_BYTES,
    SENDER_HELLO_BYTES,
    STATUS_BAD_SECRET,
    STATUS_OK,
    Answered,
    Heartbeat,
    RoutedElsewhere,
    Sent,
    Settled,
    ToldRequests,
    WireError,
    answered_frame,
    check_listener,
    check_sender,
    frame_length,
    listener_hello,
    parse_frame,
    sender_proof,
    sent_frame,
    seq_frame,
    told_to_peers,
)
from policies.base import Policy, Routed, RouteRequest

log = logging.getLogger("kvgate.peers")

HANDSHAKE_S = 5.0
WRITE_S = 5.0
HEARTBEAT_S = 5.0  # a quiet sender says it is alive this often
SILENT_S = 20.0  # a connection heard nothing from this long is taken as gone
UNACKED_S = 15.0  # a sender's bytes unacknowledged this long: its peer is gone
BACKOFF_S = (0.2, 5.0)  # first and longest wait before connecting again
HELD_S = 5.0  # a link lost after up this long waits the first back-off again (else doubled)
REFUSED_BACKOFF_S = 30.0  # after a peer refused this copy's secret, or failed to prove it
DUPLICATE_BACKOFF_S = 30.0  # an address of a copy already linked: looked at again after
SWEEP_S = 10.0
MAX_PENDING = 65_536  # a peer's requests pending at once, at most (the oldest let go)
MAX_HANDSHAKES = 64  # connections proving the secret at once (more are closed at once)
MAX_HANDSHAKES_PER_ADDRESS = 4  # ... of them from one address
HANDSHAKE_HOLD_S = 0.5  # a place held this long goes to a new connection when all are taken
REFUSED_LOG_S = 10.0  # refused handshakes are logged at most this often
# the stored responses told to a peer whose link just came up: the newest of them, in
# frames of this many bytes at most in all, written this many frames at a time
CATCH_UP_BYTES = 16 << 20
CATCH_UP_BATCH = 512


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


class _Overflow(ConnectionError):
    """The peer fell too far behind: the connection is closed, so the peer lets go of
    everything this copy had pending there instead of missing the settling frames."""


class _Link:
    """This copy's connection to one peer address: frames queue while it is up, and one
    task writes them; it connects again after a failure."""

    def __init__(self, host: str, port: int, peers: Peers) -> None:
        self.host, self.port = host, port
        self.peers = peers
        self.queue: deque[bytes] = deque()
        self.queued_bytes = 0
        self.overflow = False
        self.wake = asyncio.Event()
        self.up = False
        self.remote: bytes | None = None  # the peer's instance id, once linked
        self.is_self = False
        self.up_at: float | None = None  # when the connection now ending was linked
        self.task: asyncio.Task[None] | None = None

    def push(self, frame: bytes) -> None:
        """Queue ``frame`` (the link is up: ``Peers._broadcast`` asks only those)."""
        if self.overflow:
            self.peers.counts.frames_dropped += 1
            return
        cfg = self.peers.config
        if len(self.queue) >= cfg.queue_frames or self.queued_bytes + len(frame) > cfg.queue_bytes:
            self.overflow = True  # the writer closes the connection
            self.wake.set()
            self.peers.counts.frames_dropped += 1
            return
        self.queue.append(frame)
        self.queued_bytes += len(frame)
        self.wake.set()

    async def run(self) -> None:
        backoff = BACKOFF_S[0]
        while True:
            wait = backoff
            self.up_at = None
            try:
                wait = await self._session() or BACKOFF_S[0]
                backoff = BACKOFF_S[0]
            except PermissionError as exc:
                log.error("peer %s:%d: %s", self.host, self.port, exc)
                wait = REFUSED_BACKOFF_S
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                up_at = self.up_at
                if up_at is not None and time.monotonic() - up_at >= HELD_S:
                    wait = BACKOFF_S[0]  # a link that held is tried again soon
                backoff = min(BACKOFF_S[1], wait * 2)
                if up_at is not None:  # lost: one line; a failed try to connect: none
                    log.info("peer %s:%d: the link was lost (%s); connecting again in %g s",
                             self.host, self.port, _why(exc), wait)
                else:
                    log.debug("peer %s:%d: %s", self.host, self.port, _why(exc))
            except Exception:  # a defect here must not end the link for good
                log.exception("peer %s:%d: the link failed", self.host, self.port)
                backoff = BACKOFF_S[1]
            if self.is_self:
                return  # the address is this copy's own
            await asyncio.sleep(wait)

    async def _session(self) -> float | None:
        """One connection, until it fails; a wait before the next when it was not used
        (a second address of a copy already linked)."""
        peers = self.peers
        async with asyncio.timeout(HANDSHAKE_S):
            reader, writer = await asyncio.open_connection(self.host, self.port)
        unacked_bound(writer)
        try:
            async with asyncio.timeout(HANDSHAKE_S):
                nonce = os.urandom(NONCE_BYTES)
                _send(writer, nonce + peers.instance)
                hello = await reader.readexactly(LISTENER_HELLO_BYTES)
                proven = check_listener(peers.secret, nonce, peers.instance, hello)
                if proven is None:
                    peers.counts.refused += 1
                    raise PermissionError("the peer did not prove the secret (the copies' "
                                          "peers.secret differ, or it is not a kvgate peer)")
                listener_nonce, remote = proven
                if remote == peers.instance:
                    self.is_self = True
                    return None
                if peers.linked(remote):
                    return DUPLICATE_BACKOFF_S  # linked through another address already
                self.remote = remote  # claimed before any wait: a second address backs off
                _send(writer, sender_proof(peers.secret, listener_nonce, peers.instance, remote))
                (status,) = await reader.readexactly(1)
            if status != STATUS_OK:
                peers.counts.refused += 1
                raise PermissionError("refused this copy's secret: the copies' peers.secret "
                                      "differ")
            closed = asyncio.ensure_future(reader.read(1))  # the peer sends nothing more
            closed.add_done_callback(_retrieve)
            self.up, self.up_at = True, time.monotonic()
            peers.counts.links_up += 1
            try:
                await self._tell_known(writer)
                await self._write(writer, closed)
            finally:
                self.up, self.overflow = False, False
                peers.counts.links_up -= 1
                peers.counts.frames_dropped += len(self.queue)
                self.queue.clear()
                self.queued_bytes = 0
                closed.cancel()
        finally:
            self.remote = None
            writer.close()
        return None

    async def _tell_known(self, writer: asyncio.StreamWriter) -> None:
        """Tell the peer just linked the stored responses this copy knows of
        (``Peers.known_answers``), so that a copy linked after they were answered (it
        started later, or its link was down) refuses another tenant's continuation of them
        too: the newest that fit ``CATCH_UP_BYTES``, sent oldest first (the peer keeps them
        in the order it heard them), ``CATCH_UP_BATCH`` frames a write."""
        peers = self.peers
        if peers.known_answers is None or not peers.config.tell_responses:
            return
        frames: list[bytes] = []
        room = CATCH_UP_BYTES
        for told in reversed(peers.known_answers()):
            try:
                frame = answered_frame(told.response, told.replica, told.tenant)
            except WireError:  # (an id and tenant over a frame's limit)
                peers.counts.frames_dropped += 1
                continue
            room -= len(frame)
            if room < 0:
                break
            frames.append(frame)
        frames.reverse()
        for start in range(0, len(frames), CATCH_UP_BATCH):
            batch = frames[start:start + CATCH_UP_BATCH]
            _send(writer, b"".join(batch))
            async with asyncio.timeout(WRITE_S):
                await writer.drain()
            peers.counts.frames_sent += len(batch)

    async def _write(self, writer: asyncio.StreamWriter, closed: asyncio.Future[bytes]) -> None:
        counts = self.peers.counts
        while not closed.done():
            waiting = asyncio.ensure_future(self.wake.wait())
            try:
                await asyncio.wait((waiting, closed), timeout=HEARTBEAT_S,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
            self.wake.clear()
            if self.overflow:
                raise _Overflow(f"more than {self.peers.config.queue_frames} frames or "
                                f"{self.peers.config.queue_bytes} bytes behind")
            if closed.done():
                break  # the peer closed the connection, or it failed
            frames = list(self.queue)  # none: a heartbeat (not counted as a frame sent)
            self.queue.clear()
            self.queued_bytes = 0
            _send(writer, b"".join(frames) if frames else HEARTBEAT_FRAME)
            async with asyncio.timeout(WRITE_S):
                await writer.drain()
            counts.frames_sent += len(frames)
        failed = None if closed.cancelled() else closed.exception()
        if failed is not None:
            raise ConnectionResetError(f"the connection failed: {failed}") from failed
        raise ConnectionResetError("the peer closed the connection")


def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write ``data``, or raise ``ConnectionResetError`` when the connection is closed
    already (its reader saw it fail): uvloop's transport raises ``RuntimeError`` then."""
    if writer.is_closing():
        raise ConnectionResetError("the connection is closed")
    writer.write(data)


def _why(exc: BaseException) -> str:
    """``exc`` in a log line: its type, and its message when it has one."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def unacked_bound(writer: asyncio.StreamWriter) -> None:
    """A peer that died without closing (its node gone) is noticed within
    ``UNACKED_S``: the system drops a connection whose sent bytes (at least a heartbeat
    every ``HEARTBEAT_S``) stay unacknowledged that long; else only its retransmissions
    giving up, about 15 minutes later, ended the link, its frames counted sent meanwhile."""
    sock = writer.get_extra_info("socket")
    option = getattr(socket, "TCP_USER_TIMEOUT", None)  # Linux's
    if sock is not None and option is not None:
        sock.setsockopt(socket.IPPROTO_TCP, option, int(UNACKED_S * 1000))


def _retrieve(future: asyncio.Future[bytes]) -> None:
    """Take a finished future's exception (a reset connection), so none goes unheard."""
    if not future.cancelled():
        future.exception()


class Peers:
    """This copy's links to its peers and its listener for theirs (see the module)."""

    def __init__(self, config: PeersConfig, fleet: Fleet, policy: Policy,
                 box: bytes | None = None) -> None:
        """``box``: the instance id of a worker process's box (``serve --workers``): every
        worker of it listens on the one port (``SO_REUSEPORT``), and each sends its own
        routes."""
        secret = config.checked_secret()  # read again: it may have changed since the load
        self.config = config
        self.fleet = fleet
        self.policy = policy
        self.secret = secret.encode()
        self.instance = os.urandom(ID_BYTES) if box is None else box
        self._reuse_port = box is not None
        self.counts = PeerCounts()
        self._links: dict[tuple[str, int], _Link] = {}
        # each of ``addresses`` -> what it last resolved to
        self._answers: dict[str, set[tuple[str, int]]] = {}
        self._seq = 0
        self._told = ToldRequests()  # the requests whose route the links were told
        self._server: asyncio.Server | None = None
        self._resolver: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._tables: set[_PeerTable] = set()
        self._serving: set[asyncio.Task[None]] = set()
        # connections not yet proven, and the address each came from
        # connections proving the secret, oldest first: (their address, accepted at)
        self._handshaking: dict[asyncio.Task[None], tuple[str, float]] = {}
        self._refused_log = LogThrottle(REFUSED_LOG_S)
        self._untold_log = LogThrottle(REFUSED_LOG_S)  # stored responses too long to tell
        self.address: tuple[str, int] | None = None  # where the listener is bound
        # with worker processes: tells the box's other workers a peer's route
        # (``worker_routes``), which only this worker's link received: the request, its
        # replica, and whether it is a retry (``again``)
        self.forward: Callable[[RouteRequest, str, bool], None] | None = None
        # a stored response a peer saw answered (``ANSWERED``): its replica and tenant,
        # kept where this copy refuses another tenant's continuation of it
        self.on_answered: Callable[[Answered], None] | None = None
        # the stored responses this copy knows of now (its own, its box's workers' and its
        # peers'), the least recently used first: told to each peer when its link comes up
        self.known_answers: Callable[[], list[Answered]] | None = None

    def linked(self, remote: bytes) -> bool:
        """Whether a link to the copy with instance id ``remote`` is up (or proving
        itself)."""
        return any(link.remote == remote for link in self._links.values())

    # -- what this copy sends ---------------------------------------------------------------
    def routed(self, request: RouteRequest, replica: str) -> None:
        """This copy sends ``request`` to ``replica`` (its policy observed ``Routed``),
        unless ``told_to_peers`` says no route of it is; told as a retry when a route of
        the same request object was told before."""
        if self.counts.links_up and told_to_peers(request):
            try:
                self._broadcast(self._told.frame(request, replica))
            except WireError as exc:  # (a long affinity key or replica id): no link told
                self.counts.frames_dropped += self.counts.links_up
                log.debug("not sent to peers: %s", exc)

    def answered(self, response: str, replica: str, tenant: str | None) -> None:
        """This copy saw the stored response ``response`` answered by ``replica`` for
        ``tenant``: told to every peer linked now (``tell_responses``), so that whichever
        copy a continuation reaches refuses another tenant's. A peer linked later, or whose
        link is down now, is told when its link comes up (``known_answers``)."""
        if not (self.config.tell_responses and self.counts.links_up):
            return
        try:
            frame = answered_frame(response, replica, tenant)
        except WireError as exc:  # (an id and tenant over a frame's limit): no link told
            self.counts.frames_dropped += self.counts.links_up
            held = self._untold_log.due()
            if held is not None:
                more = f" ({held} more in the last {REFUSED_LOG_S:g} s)" if held else ""
                log.warning("a stored response not told to peers: %s%s", exc, more)
            return
        self._broadcast(frame)

    def sent(self, pending: Pending, replica: str) -> None:
        """``Fleet`` outbox: prefill left pending on ``replica``."""
        self._seq += 1
        pending.seq = self._seq
        if self.counts.links_up:
            self._broadcast(sent_frame(self._seq, replica, pending.tokens))

    def settled(self, pending: Pending, done: bool) -> None:
        """``Fleet`` outbox: the first byte came (``done``: the request ended)."""
        if self.counts.links_up:
            self._broadcast(seq_frame(DONE if done else FIRST_BYTE, pending.seq))

    def _broadcast(self, frame: bytes) -> None:
        for link in self._links.values():
            if link.up:
                link.push(frame)

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        if cfg.listen is not None:
            host, port = split_address(cfg.listen, "peers.listen", any_port=True)
            self._server = await asyncio.start_server(self._accept, host, port,
                                                      reuse_port=self._reuse_port or None)
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
        answers: dict[str, set[tuple[str, int]]] = {}
        for address in self.config.addresses:
            host, port = split_address(address, "peers.addresses")
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning("peer address %s did not resolve: %s", address, exc)
                # what it resolved to before stays (only its own: not what the other
                # names no longer give, which would pile up while it fails)
                answers[address] = self._answers.get(address, set())
                continue
            answers[address] = {(str(info[4][0]), int(info[4][1])) for info in infos}
        self._answers = answers
        found = set().union(*answers.values())
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
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        # one address holds at most a few of the places: connections that never prove the
        # secret, renewed as they time out, must not keep real peers from linking
        waiting = self._handshaking
        now = time.monotonic()
        if sum(h == host for h, _ in waiting.values()) >= MAX_HANDSHAKES_PER_ADDRESS:
            writer.close()
            return
        if len(waiting) >= MAX_HANDSHAKES:  # the oldest gives its place up, if held long
            oldest, (_, since) = next(iter(waiting.items()))
            if now - since < HANDSHAKE_HOLD_S:
                writer.close()
                return
            del waiting[oldest]
            oldest.cancel()
        # counted from here, not from the task's first step: a burst of connections is
        # accepted before any of their tasks runs
        task = asyncio.create_task(self._serve(reader, writer), name="kvgate-peer-in")
        self._serving.add(task)
        waiting[task] = (host, now)
        task.add_done_callback(self._serving.discard)
        task.add_done_callback(self._handshaken)

    def _handshaken(self, task: asyncio.Task[None]) -> None:
        """``task``'s connection proved the secret, failed to, or ended: its place is free."""
        self._handshaking.pop(task, None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        table = _PeerTable(self.fleet)
        try:
            try:
                async with asyncio.timeout(HANDSHAKE_S):
                    hello = await reader.readexactly(SENDER_HELLO_BYTES)
                    nonce = os.urandom(NONCE_BYTES)
                    _send(writer, listener_hello(self.secret, hello, nonce, self.instance))
                    proof = await reader.readexactly(MAC_BYTES)
            finally:
                self._handshaken(asyncio.current_task())  # type: ignore[arg-type]
            sender = hello[NONCE_BYTES:]
            if not check_sender(self.secret, nonce, sender, self.instance, proof):
                self.counts.refused += 1
                self._log_refused(peer)
                _send(writer, bytes([STATUS_BAD_SECRET]))
                return
            _send(writer, bytes([STATUS_OK]))
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

    def _log_refused(self, peer: object) -> None:
        """A handshake refused: logged at most once per ``REFUSED_LOG_S`` (a flood of
        wrong secrets wrote a line each), with how many were refused since."""
        since = self._refused_log.due()
        if since is None:
            return
        more = f" ({since} more refused in the last {REFUSED_LOG_S:g} s)" if since else ""
        log.warning("a peer at %s did not prove the secret: refused%s", peer, more)

    async def _receive(self, reader: asyncio.StreamReader, table: _PeerTable) -> None:
        counts, fleet = self.counts, self.fleet
        while True:
            async with asyncio.timeout(SILENT_S):  # a sender sends heartbeats when quiet
                length, kind = frame_length(await reader.readexactly(HEAD_BYTES))
                body = await reader.readexactly(length)
            frame = parse_frame(kind, body, time.monotonic())
            if isinstance(frame, Heartbeat):
                continue  # the peer is alive: no frame to count
            counts.frames_received += 1
            if isinstance(frame, RoutedElsewhere):
                if fleet.get(frame.replica) is None:
                    continue  # a replica this copy does not route to (not yet, or no more)
                try:
                    # told once: no Unrouted or Finished follows here
                    self.policy.observe(Routed(frame.request, frame.replica, revocable=False,
                                               again=frame.again))
                except Exception:  # the policy's defect: the link and the rest stand
                    log.exception("the policy failed on a peer's route to %s", frame.replica)
                if self.forward is not None:  # the box's other workers learn it too
                    self.forward(frame.request, frame.replica, frame.again)
            elif isinstance(frame, Sent):
                table.sent(frame)
            elif isinstance(frame, Settled):
                table.settled(frame)
            elif isinstance(frame, Answered) and self.on_answered is not None:
                try:
                    self.on_answered(frame)
                except Exception:  # the state's defect: the link and the rest stand
                    log.exception("keeping a peer's stored response %r failed",
                                  frame.response)


class _PeerTable:
    """One peer connection's requests pending in this copy's fleet, by the peer's seq."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        # oldest first; an OrderedDict takes its first entry in constant time, where a dict
        # scans past every entry deleted before it (let go of 60,000: over a second)
        self.pending: OrderedDict[int, Pending] = OrderedDict()

    def sent(self, frame: Sent) -> None:
        if self.fleet.get(frame.replica) is None:
            return  # a replica this copy does not route to
        old = self.pending.pop(frame.seq, None)
        if old is not None:  # a seq seen twice: the first is settled, never leaked
            self.fleet.done(old)
        if len(self.pending) >= MAX_PENDING:
            self.fleet.done(self.pending.popitem(last=False)[1])
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
        table = self.pending
        while table:
            seq, pending = next(iter(table.items()))
            if pending.sent_at >= cutoff:
                return
            del table[seq]
            self.fleet.done(pending)
