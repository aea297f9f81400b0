"""Routes told between the worker processes of one box (``serve --workers N``).

A policy learns from the requests it routes: ``cost``'s frequency sketch and cache model,
prefix_affinity's key depth, the common prefix. Each worker used to learn from its own
share of the box's traffic only, as unpeered gateway copies do, and lost what such copies
lose (offline, ``loadtests.simulate --scenario contracts-400 --requests 6000 --gateways 2``:
0.664 token hit rate and p95 0.72 s against one copy's 0.706 and 0.43 s). Now each worker
sends every route it makes to the others, in the frame peers send each other
(``peer_wire.routed_frame``: the prompt's piece hashes, never its text), and their policies
learn from it as from their own. Pending load needs no telling: the workers share it in
memory (``shared_load``). A route from a peer (another box) reaches the worker whose link
received it, which passes it on to the others (``Peers.forward``). A request a worker
tries again on another replica is told again, marked as a retry (``peer_wire.ToldRequests``;
a peer's retry is passed on marked as it came): the others count its share of the traffic
once, and learn what each try suggests of its replica's cache. A worker holds nothing per
request told, so one that skipped the first try (its replica one its fleet does not hold,
or that its policy keeps nothing of) counts none of the request's traffic: rare, as
discovery changes (docs/cost.md).

Stored responses: a worker that sees a ``/v1/responses`` answer's id tells the others its
replica and tenant (``answered``: an ``ANSWERED`` frame, sent at once with the routes
waiting, before the client can read the id), so a continuation reaching another worker
goes to the replica that stores it, and another tenant's is refused there as by the worker
that saw it (a replica such as vLLM's continues any tenant's stored response). Told with or
without routes (``tell_routes``, ``--no-worker-routes``).

Transport: one Unix ``SOCK_SEQPACKET`` socket pair per worker, made by the supervisor before
it starts them (``route_pair``). Worker ``i`` reads its own pair's first end; every other worker
holds the second and sends to it. A worker reads its inbox before each of its decisions
(``catch_up``, which its router calls just before the policy chooses: the decision knows
every route told till then, those told while its prompt was tokenized too), and every
``DRAIN_S`` while it decides nothing; every ``FLUSH_S`` while those reads find at least
``BUSY_BYTES`` of routes (its inbox holds ~200 KB: a tenth of a second of 2 MB/s of
routes). The others' messages do not wake it: a wake per message cost a worker more CPU
than the routes it carried (``plain_repeated`` at 100 requests/s, two workers,
prefix_affinity: 0.90-1.0 ms per request against 0.84 ms reading at decisions, and
0.65-0.72 ms for one worker). A worker's routes of the last ``FLUSH_S`` go out together,
one message of whole frames. A message arrives whole or not at all, and sending never
blocks: a worker whose buffer is full (stalled) misses those routes, counted in
``dropped``. A route to a replica the reading worker's fleet does not hold (not yet, or no
more: removed a moment before) is skipped, counted in ``unknown``,
as a peer's is (``Peers``). Nothing leaves the box, and only the supervisor's children hold
the sockets.

Cost: each route costs every other worker its policy's ``observe`` (70 us for ``cost`` on a
6,000-token prompt in a process of its own; a tenth of a busy box's CPU in a profile of two
workers), so with N workers the box observes each request N times. On this 2-core machine
(``python -m loadtests.bench_proxy``'s CPU runs at 100 requests/s, two workers, ``cost``)
that was about 0.45 ms more CPU per request: 1.6 / 2.4 ms per whole / streamed request
against 1.0-1.2 / 1.7-2.0 ms without telling. A route saves more than that on the GPUs:
offline, two copies that share their policy's state hit 0.714 against 0.671 apart
(``contracts-400``), 4% of a 1,500-token prompt's prefill per request.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gateway.log_throttle import LogThrottle
from gateway.peer_wire import (
    HEAD_BYTES,
    MAX_FRAME,
    Answered,
    RoutedElsewhere,
    ToldRequests,
    WireError,
    answered_frame,
    frame_length,
    parse_frame,
    routed_frame,
)
from policies.base import Policy, Routed, RouteRequest

if TYPE_CHECKING:
    from gateway.fleet import Fleet

log = logging.getLogger("kvgate.workers")

DROPPED_LOG_S = 60.0  # at most one warning of dropped routes per this many seconds
FLUSH_S = 0.005  # a worker's routes are sent together at most this long after the first
DRAIN_S = 0.1  # a worker that decides nothing reads the others' routes this often (every
# FLUSH_S while a read finds BUSY_BYTES or more)
BUSY_BYTES = 32 * 1024  # a sixth of what an inbox holds (~200 KB): it fills by bytes
MESSAGE_BYTES = 64 * 1024  # frames per message up to this size (a larger frame alone)


def route_pair() -> tuple[socket.socket, socket.socket]:
    """A worker's (inbox, the others' outbox) pair of connected sockets."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class WorkerRoutes:
    """One worker's end: ``routed`` tells the others; what they tell reaches ``policy``
    (only the routes to replicas ``fleet`` holds, when given). ``answered`` tells them a
    stored response's replica and tenant, which reach ``on_answered`` (even where routes
    are not told: ``tell_routes`` false)."""

    def __init__(self, inbox: socket.socket, outboxes: Sequence[socket.socket],
                 policy: Policy, fleet: Fleet | None = None,
                 on_answered: Callable[[Answered], None] | None = None,
                 tell_routes: bool = True) -> None:
        self.inbox = inbox
        self.outboxes = list(outboxes)
        self.policy = policy
        self.fleet = fleet
        self.on_answered = on_answered
        self.tell_routes = tell_routes  # else only ``answered`` is told
        self.sent = self.received = self.dropped = self.malformed = 0
        # stored responses (``answered``): told to a worker, kept from one, heard of
        self.answers_told = self.answers_dropped = self.answers_received = 0
        self._answers_warned = LogThrottle(DROPPED_LOG_S)
        self.unknown = 0  # routes received to a replica the fleet does not hold: skipped
        self._warned = LogThrottle(DROPPED_LOG_S)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[bytes] = []  # frames not sent yet
        self._told = ToldRequests()  # the requests this worker told a route of
        self._flush: asyncio.TimerHandle | None = None
        self._drain: asyncio.TimerHandle | None = None  # the next read of an idle inbox

    @property
    def reading(self) -> bool:
        """Whether the inbox is read (started, and some other worker still holds its end)."""
        return self._loop is not None

    def start(self) -> None:
        """Read the inbox on the running loop."""
        self._loop = asyncio.get_running_loop()
        self.inbox.setblocking(False)
        for out in self.outboxes:
            out.setblocking(False)
        self._drain = self._loop.call_later(DRAIN_S, self._drain_tick)

    def catch_up(self) -> None:
        """Take what the other workers told since the last read: called before each of
        this worker's decisions, so that it decides knowing every route told so far."""
        if self._loop is not None:
            self._read()

    def _drain_tick(self) -> None:
        """Read the inbox of a worker that decides nothing for a while (its buffer would
        fill and the others' routes be dropped), then again in ``DRAIN_S``, or in
        ``FLUSH_S`` when this read found ``BUSY_BYTES`` or more (routes may come faster
        than its buffer holds for ``DRAIN_S``)."""
        self._drain = None
        if self._loop is None:
            return
        took = self._read()
        if self._loop is not None:
            self._drain = self._loop.call_later(
                FLUSH_S if took >= BUSY_BYTES else DRAIN_S, self._drain_tick)

    def stop(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        self.send_waiting()
        self._stop_reading()
        for sock in (self.inbox, *self.outboxes):
            sock.close()

    def routed(self, request: RouteRequest, replica: str, again: bool | None = None
               ) -> None:
        """This worker sends ``request`` to ``replica`` (its policy observed ``Routed``):
        told to the others within ``FLUSH_S``, as a retry when a route of the same request
        object was told before. ``again``: a peer's route passed on (``Peers.forward``),
        a retry or not as the peer told it."""
        if not self.outboxes or not self.tell_routes:
            return
        try:
            frame = (self._told.frame(request, replica) if again is None
                     else routed_frame(request, replica, again))
        except WireError as exc:
            log.debug("not told to the other workers: %s", exc)
            return
        self._waiting.append(frame)
        if self._flush is None:
            if self._loop is None:  # not started: nothing to wait on
                self.send_waiting()
            else:
                self._flush = self._loop.call_later(FLUSH_S, self.send_waiting)

    def answered(self, response: str, replica: str, tenant: str | None) -> None:
        """This worker saw ``response`` answered by ``replica`` for ``tenant``: told to
        the others now (after the routes waiting, in a message of its own), before its
        client can read the id and continue it on another worker (which reads its inbox
        before each decision). One a worker's full buffer (a stalled worker) or its size
        keeps from it is counted in ``answers_dropped`` and warned of: that worker would
        send another tenant's continuation of it on to the replicas."""
        if not self.outboxes:
            return
        if self._flush is not None:
            self._flush.cancel()
        self.send_waiting()
        try:
            frame = answered_frame(response, replica, tenant)
        except WireError as exc:
            self._answer_dropped(len(self.outboxes), str(exc))
            return
        for out in self.outboxes:
            try:
                out.send(frame)
            except OSError as exc:
                self._answer_dropped(1, str(exc))
            else:
                self.answers_told += 1

    def _answer_dropped(self, count: int, why: str) -> None:
        self.answers_dropped += count
        held = self._answers_warned.due(count)
        if held is not None:
            log.warning("%d stored responses not told to another worker (%s): it does not "
                        "know their tenants", held + count, why)

    def send_waiting(self) -> None:
        """Send the routes waiting, in messages of whole frames, to every other worker."""
        self._flush = None
        frames, self._waiting = self._waiting, []
        messages: list[tuple[bytes, int]] = []  # (message, frames in it)
        start = size = 0
        for i, frame in enumerate(frames):
            if size and size + len(frame) > MESSAGE_BYTES:
                messages.append((b"".join(frames[start:i]), i - start))
                start, size = i, 0
            size += len(frame)
        if frames:
            messages.append((b"".join(frames[start:]), len(frames) - start))
        dropped = 0
        for out in self.outboxes:
            for message, count in messages:
                try:
                    out.send(message)
                except OSError:  # full (a stalled worker), or gone (the box is stopping)
                    dropped += count
                else:
                    self.sent += count
        if dropped:
            self.dropped += dropped
            held = self._warned.due(dropped)
            if held is not None:
                log.warning("%d routes not told to the other workers (their buffers were "
                            "full)", held + dropped)

    def _read(self) -> int:
        """Every message waiting in the inbox, each whole routed frames: their bytes."""
        now = time.monotonic()
        taken = 0
        while True:
            try:
                message = self.inbox.recv(MESSAGE_BYTES + HEAD_BYTES + MAX_FRAME)
            except (BlockingIOError, InterruptedError):
                return taken
            except OSError as exc:  # the inbox is gone: the box is stopping
                log.debug("worker routes: %s", exc)
                return taken
            if not message:  # every sender closed its end: the box is stopping
                self._stop_reading()
                return taken
            self._take(message, now)
            taken += len(message)

    def _stop_reading(self) -> None:
        """No more reads (an inbox at its end stays readable: read again, it spun)."""
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None
        self._loop = None

    def _take(self, message: bytes, now: float) -> None:
        """The frames of one message; the rest of a message is skipped at a malformed
        one (its frames' bounds are lost)."""
        at = 0
        while at < len(message):
            try:
                length, kind = frame_length(message[at:at + HEAD_BYTES])
                body = message[at + HEAD_BYTES:at + HEAD_BYTES + length]
                if len(body) != length:
                    raise WireError(f"a {len(body)}-byte body, its head says {length}")
                frame = parse_frame(kind, body, now)
            except (WireError, ValueError, struct.error) as exc:
                self.malformed += 1
                log.debug("a malformed route from another worker: %s", exc)
                return
            at += HEAD_BYTES + length
            if isinstance(frame, Answered):
                self.answers_received += 1
                if self.on_answered is not None:
                    self.on_answered(frame)
                continue
            if isinstance(frame, RoutedElsewhere):
                self.received += 1
                if self.fleet is not None and self.fleet.get(frame.replica) is None:
                    self.unknown += 1  # not yet, or no more: nothing to learn of it
                    continue
                try:
                    # told once: no Unrouted or Finished follows here
                    self.policy.observe(Routed(frame.request, frame.replica, revocable=False,
                                               again=frame.again))
                except Exception:  # the policy's defect: the message's other routes stand
                    log.exception("the policy failed on another worker's route to %s",
                                  frame.replica)
